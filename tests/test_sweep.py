"""CPU: the sweep engine (cupykern/sweep.py): the point schema, which cases a sweep
measures, choosing tuned layouts, and measuring a point through the real launcher with
only the GPU replaced (fake device arrays, a fake kernel, an H200's limits), so that
the plan a point reports is checked to be the one launched. On a GPU, the same against
real launches."""

from __future__ import annotations

import dataclasses
import json
import math

import cupy
import numpy as np
import pytest

from cupykern import _dtypes, launcher, plans, registry, sweep, timing
from cupykern.plans import H200_LIMITS
from cupykern.validation import CheckResult
from tests.helpers import fake_launch_device
from tests.helpers import DTYPE_IDS, DTYPES

BF16 = _dtypes.bfloat16


# ----------------------------------------------------------------- the schema
def test_point_fields_hold_errors_memory_and_the_plan():
    assert sweep.POINT_FIELDS[-len(plans.PLAN_FIELDS):] == plans.PLAN_FIELDS
    for name in ("median_us", "p10_us", "p90_us", "method", "min_bytes", "gbps", "pct_of_copy", "check", "check_ok",
                 "model", "max_abs_err", "max_rel_err", "max_ulp_err", "alloc_bytes"):
        assert name in sweep.POINT_FIELDS


def _point(checked: CheckResult, plan_fields=None) -> sweep.Point:
    return sweep.make_point(registry.all_specs()["rms_norm"], impl="cupykern", model="llama-3.1-8b", num_tokens=4,
                            size=4096, dtype=BF16, timed=timing.Timing.of([2.0, 3.0, 4.0], "fake"), checked=checked,
                            min_bytes=4000, copy_gbps=4000.0, alloc_bytes=0, plan_fields=plan_fields)


def test_non_finite_errors_are_written_as_none(tmp_path):
    failed = _point(CheckResult.failed("output 0: NaN pattern differs"))
    assert failed.max_abs_err is None and failed.max_rel_err is None and failed.max_ulp_err is None
    ok = _point(CheckResult(True, 0.5, 1e-3, 2e-3, 1.5, "ok"))
    assert (ok.max_abs_err, ok.max_rel_err, ok.max_ulp_err) == (1e-3, 2e-3, 1.5)
    assert ok.gbps == pytest.approx(4000 / 3e-6 / 1e9) and ok.pct_of_copy == pytest.approx(100 * ok.gbps / 4000)
    document = sweep.result_document("test", environment={"gpu": "G"}, seed=1, copy_gbps=4000.0,
                                     points=[failed, ok], model="llama-3.1-8b")
    data = json.loads(sweep.write_json(tmp_path / "r.json", document).read_text())  # strict JSON: no inf
    assert data["format"] == sweep.RESULT_FORMAT and data["suite"] == "test" and data["seed"] == 1
    assert [list(p) for p in data["points"]] == [list(sweep.POINT_FIELDS)] * 2
    assert data["points"][0]["plan_kind"] is None and data["points"][0]["alloc_bytes"] == 0
    sweep.write_csv(tmp_path / "r.csv", data["points"])
    assert (tmp_path / "r.csv").read_text().splitlines()[0] == ",".join(sweep.POINT_FIELDS)


# ----------------------------------------------------------------- which cases
def test_launch_options_come_from_the_op_declarations():
    assert sweep.launch_options("rms_norm") == plans.ROW_OVERRIDE_KEYS
    assert set(sweep.launch_options("silu_and_mul")) == set(plans.ACTIVATION_OVERRIDE_KEYS)
    assert sweep.launch_options("apply_rope") == ()
    assert [op for op in registry.all_specs() if sweep.tunable(op)] == \
        ["rms_norm", "fused_add_rms_norm", "layer_norm", "softmax", "row_reduce", "rms_norm_quant",
         "fused_add_rms_norm_quant", "rms_norm_dynamic_per_token_quant", "fused_add_rms_norm_dynamic_per_token_quant"]
    options = dict(threads_per_row=[64], vec_width=None, vecs_per_thread=None, rows_per_block=None,
                   block_size=[128, 256])
    assert sweep.ignored_options("silu_and_mul", options) == ["threads_per_row"]
    assert sweep.ignored_options("apply_rope", options) == ["threads_per_row", "block_size"]
    assert sweep.ignored_options("rms_norm", options) == []


def test_crossed_options():
    assert sweep.crossed({"a": None, "b": None}) == [{}]
    assert sweep.crossed({"a": [1, 2], "b": None, "c": [3]}) == [{"a": 1, "c": 3}, {"a": 2, "c": 3}]


def test_plan_cases_apply_each_option_to_the_ops_that_take_it():
    options = dict(threads_per_row=None, vec_width=[1, 8], vecs_per_thread=None, rows_per_block=None,
                   block_size=[256])
    cases = sweep.plan_cases(["rms_norm", "silu_and_mul", "apply_rope"], sizes={"rms_norm": [4096],
                             "silu_and_mul": [14336], "apply_rope": [128]}, dtypes=["bf16"], num_tokens=[1, 64],
                             options=options)
    by_op = {}
    for case in cases:
        by_op.setdefault(case.op, []).append((case.num_tokens, case.overrides))
    assert by_op["rms_norm"] == by_op["silu_and_mul"] == [
        (1, {"vec_width": 1, "block_size": 256}), (64, {"vec_width": 1, "block_size": 256}),
        (1, {"vec_width": 8, "block_size": 256}), (64, {"vec_width": 8, "block_size": 256})]
    assert by_op["apply_rope"] == [(1, {}), (64, {})]
    assert all(case.dtype == BF16 for case in cases)


# ----------------------------------------------------------------- choosing (--tune)
def _m(t, v, r, n, us, vw=8):
    return sweep.Measured(t, vw, v, r, n, us)


def test_choose_keeps_one_layout_over_the_ladder():
    ladder = (1, 1024, 16384)
    measured = [
        # layout A: fastest at 16384 only
        _m(128, 4, 1, 1, 3.0), _m(128, 4, 1, 1024, 10.0), _m(128, 4, 1, 16384, 60.0),
        # layout B: a bit slower at 16384, much faster at 1 and 1024; two rows_per_block
        _m(256, 2, 1, 1, 2.0), _m(256, 2, 1, 1024, 8.0), _m(256, 2, 1, 16384, 66.0),
        _m(256, 2, 2, 1024, 7.5), _m(256, 2, 2, 16384, 63.0),
        # layout C: fastest everywhere it ran, but missing 16384
        _m(64, 8, 2, 1, 1.0), _m(64, 8, 2, 1024, 5.0),
    ]
    e = sweep.choose(measured, ladder, gpu="G", op="rms_norm", dtype="bf16", size=4096)
    assert (e.threads_per_row, e.vec_width, e.vecs_per_thread) == (256, 8, 2)
    assert e.rows_per_block == ((1, 1), (1024, 2), (16384, 2))
    assert dict(e.median_us) == {1: 2.0, 1024: 7.5, 16384: 63.0}
    assert sweep.choose(measured[-2:], ladder, gpu="G", op="rms_norm", dtype="bf16", size=4096) is None


def test_tuned_entries_come_from_validated_row_points():
    def point(op, n, threads, us, ok=True, kind="rows"):
        return {"op": op, "dtype": "bf16", "size": 4096, "num_tokens": n, "plan_kind": kind, "check_ok": ok,
                "threads_per_row": threads, "vec_width": 8, "vecs_per_thread": 4, "rows_per_block": 1,
                "median_us": us}
    points = [point("rms_norm", 1, 128, 2.0), point("rms_norm", 64, 128, 3.0),
              point("rms_norm", 1, 256, 1.0), point("rms_norm", 64, 256, 1.0, ok=False),  # failed: cannot win
              point("softmax", 1, 128, 2.0),  # not at every num_tokens
              point("silu_and_mul", 1, None, 1.0, kind="activation"), point("silu_and_mul", 64, None, 1.0,
                                                                            kind="activation")]
    entries, untuned = sweep.tuned_entries(points, [1, 64], gpu="G", commit="c", date="d")
    (entry,) = entries
    assert (entry.op, entry.threads_per_row, entry.gpu, entry.commit) == ("rms_norm", 128, "G", "c")
    assert untuned == [("softmax", "bf16", 4096)]


@pytest.mark.parametrize("size", [1, 5, 576, 4096, 8192, 14336, 65536])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_candidate_configs_are_legal_plans(size, dtype):
    aligned = size % _dtypes.vec_width(dtype) == 0
    vec_width = plans.row_layout(size, dtype, aligned, num_rows=100).vec_width
    configs = sweep.candidate_configs(size, dtype, vec_width)
    assert configs and len(configs) <= 64
    for config in configs:
        plan = plans.plan_rows(100, size, dtype, aligned=aligned, limits=H200_LIMITS, overrides=config)
        assert plan.layout in plans.row_layouts(dtype)
    one_vec = sweep.candidate_configs(size, dtype, vec_width, vecs_choices=(2,))
    assert {c["vecs_per_thread"] for c in one_vec} <= {2}


# ----------------------------------------------------------------- through the launcher, no GPU
class FakeDevice:
    """The GPU replaced under the real launcher: arrays are cupy.ndarrays over memory that
    is never touched, kernels record their launches instead of running, limits are an
    H200's, and the launcher's allocations are counted in ``allocated`` (bytes)."""

    def __init__(self):
        self.next_address = 1 << 20
        self.allocated = 0
        self.kernels = {}

    def array(self, shape, dtype):
        """A C-contiguous cupy.ndarray at a fresh 256-byte aligned address."""
        dtype = np.dtype(dtype)
        nbytes = max(1, math.prod(shape) * dtype.itemsize)
        memory = cupy.cuda.UnownedMemory(self.next_address, nbytes, None, device_id=0)
        self.next_address += -(-nbytes // 256) * 256 + 256
        return cupy.ndarray(shape, dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))

    def empty(self, shape, dtype):
        """The launcher's allocation of an output: counted."""
        out = self.array(tuple(shape), dtype)
        self.allocated += out.nbytes
        return out

    def get_kernel(self, template, *args):
        """One fake kernel per instantiation, as jit.get_kernel keeps one RawKernel each."""
        key = (template, args)
        if key not in self.kernels:
            self.kernels[key] = FakeKernel(template.expr(*args))
        return self.kernels[key]


class FakeKernel:
    def __init__(self, name):
        self.name = name
        self.kernel = self  # the cupy.cuda.Function the launcher calls
        self.launches = []

    def __call__(self, grid, block, args, shared_mem=0):
        self.launches.append((grid, block, args))


@pytest.fixture
def device(monkeypatch, tune_file):
    fake = FakeDevice()
    # What the launcher asks the GPU: the current device, how many there are, the
    # device's limits, the compiled kernel, and memory for outputs.
    fake_launch_device(monkeypatch, get_kernel=fake.get_kernel, empty=fake.empty)
    # What the engine asks the GPU: syncs, the memory pool, the reference check, timing.
    monkeypatch.setattr(sweep, "synchronize", lambda: None)
    monkeypatch.setattr(sweep, "pool_bytes_in_use", lambda: fake.allocated)
    monkeypatch.setattr(sweep, "check_op", fake_check_op)
    monkeypatch.setattr(sweep, "time_call", lambda fn, num_tokens, repeat=None: timing.Timing.of([2.0, 3.0], "fake"))
    launcher.clear_caches()  # no recipe built with a fake kernel may outlive the test
    yield fake
    launcher.clear_caches()


def fake_check_op(spec, num_tokens, size, dtype, seed, inputs=None):
    """The validated call without the reference (which reads the arrays back)."""
    spec.run(inputs)
    return CheckResult(True, 0.5, 1e-3, 2e-3, 1.0, "ok")


def fake_inputs(device: FakeDevice, op: str, *, with_out: bool = True):
    """make_inputs of ``op``'s registry spec, on fake device arrays (the registry's shapes)."""
    def make(rng, n, size, dtype, model=None):
        out = (lambda shape, dt=dtype: device.array(shape, dt)) if with_out else (lambda *a, **k: None)
        if op == "rms_norm":
            return {"x": device.array((n, size), dtype), "weight": device.array((size,), dtype), "eps": 1e-6,
                    "out": out((n, size))}
        if op == "row_reduce":
            return {"x": device.array((n, size), dtype), "op": "sum", "out": out((n,), np.float32)}
        if op == "silu_and_mul":
            return {"x": device.array((n, 2 * size), dtype), "out": out((n, size))}
        if op == "apply_rope":
            return {"q": device.array((n, 32, size), dtype), "k": device.array((n, 8, size), dtype),
                    "positions": device.array((n,), np.int64), "cos_sin_cache": device.array((4096, size), np.float32)}
        raise KeyError(op)
    return make


def fake_spec(device, op, **kw):
    return dataclasses.replace(registry.all_specs()[op], make_inputs=fake_inputs(device, op, **kw))


def test_a_point_reports_the_plan_launched(device):
    spec = fake_spec(device, "rms_norm")
    point = sweep.measure(spec, 6000, 4096, "bf16", seed=0, copy_gbps=4000.0)  # prefill: 128 threads per row
    assert (point.plan_kind, point.origin, point.threads_per_row, point.vec_width, point.rows_per_block,
            point.block_size, point.grid) == ("rows", "heuristic", 128, 8, 1, 128, 6000)
    assert (point.check_ok, point.max_ulp_err, point.median_us, point.method) == (True, 1.0, 2.5, "fake")
    (kernel,) = device.kernels.values()
    assert kernel.launches[0][:2] == ((6000, 1, 1), (128, 1, 1))  # what the point says ran did run
    # block_size goes to the plan rule through the overrides: it picks rows_per_block.
    with launcher.overrides(block_size=256):
        point = sweep.measure(spec, 6000, 4096, "bf16", seed=0, copy_gbps=4000.0)
    assert (point.origin, point.threads_per_row, point.rows_per_block, point.block_size, point.grid) == \
        ("override", 128, 2, 256, 3000)
    with launcher.overrides(block_size=256, threads_per_row=64):
        assert sweep.measure(spec, 6000, 4096, "bf16", seed=0, copy_gbps=4000.0).rows_per_block == 4
    with launcher.overrides(block_size=64), pytest.raises(ValueError, match="not threads_per_row 128 times a power of two"):
        sweep.measure(spec, 6000, 4096, "bf16", seed=0, copy_gbps=4000.0)


def test_activation_and_rope_points_report_their_plans(device):
    silu = sweep.measure(fake_spec(device, "silu_and_mul"), 4096, 14336, "bf16", seed=0, copy_gbps=4000.0)
    assert (silu.plan_kind, silu.origin, silu.vec_width, silu.threads_per_row) == ("activation", "heuristic", 8, None)
    with launcher.overrides(block_size=128, vec_width=1):
        silu = sweep.measure(fake_spec(device, "silu_and_mul"), 4096, 14336, "bf16", seed=0, copy_gbps=4000.0)
    assert (silu.origin, silu.block_size, silu.vec_width) == ("override", 128, 1)
    rope = sweep.measure(fake_spec(device, "apply_rope"), 64, 128, "bf16", seed=0, copy_gbps=4000.0)
    expected = plans.plan_rope(64, 40, 128, 128, BF16, max_vec_width=8, fused_norm=False, limits=H200_LIMITS)
    assert rope.plan_kind == "rope"
    assert {k: getattr(rope, k) for k in plans.PLAN_FIELDS} == expected.fields()


def test_another_implementation_has_no_plan(device):
    spec = fake_spec(device, "rms_norm")
    point = sweep.measure(spec, 8, 4096, "bf16", seed=0, copy_gbps=4000.0, impl="cupy composition",
                          run=lambda inputs: (inputs["out"],))
    assert point.impl == "cupy composition" and all(getattr(point, k) is None for k in plans.PLAN_FIELDS)


def test_alloc_bytes_counts_what_a_call_allocates(device):
    from cupykern import rms_norm

    x, w = device.array((8, 4096), BF16), device.array((4096,), BF16)
    out = device.array((8, 4096), BF16)
    assert sweep.alloc_bytes(lambda: rms_norm(x, w, out=out)) == 0
    assert sweep.alloc_bytes(lambda: rms_norm(x, w)) == x.nbytes
    # The engine allocates a registry `out` once before measuring, so its points allocate nothing.
    point = sweep.measure(fake_spec(device, "rms_norm", with_out=False), 8, 4096, "bf16", seed=0, copy_gbps=4000.0)
    assert point.alloc_bytes == 0 and device.allocated == 2 * x.nbytes


def test_tune_configs_keep_to_the_options_the_op_takes(device):
    norm, reduce = fake_spec(device, "rms_norm"), fake_spec(device, "row_reduce")
    assert "vecs_per_thread" in sweep.launch_options("rms_norm")
    assert "vecs_per_thread" not in sweep.launch_options("row_reduce")  # one pass: no register cache
    assert {c.get("vecs_per_thread") for c in sweep.tune_configs(reduce, 4096, BF16)} == {None}
    assert {c.get("vecs_per_thread") for c in sweep.tune_configs(norm, 4096, BF16)} > {1, 2}


def test_run_cases_skips_illegal_overrides_only(device, monkeypatch):
    specs = {op: fake_spec(device, op) for op in ("rms_norm",)}
    monkeypatch.setattr(sweep, "all_specs", lambda: specs)
    cases = [sweep.Case("rms_norm", BF16, 4096, 6000, {"block_size": 64}), sweep.Case("rms_norm", BF16, 4096, 6000, {}),
             sweep.Case("rms_norm", BF16, 4096, 6000, {"block_size": 256})]
    outcomes = list(sweep.run_cases(cases, seed=0, copy_gbps=4000.0))
    assert isinstance(outcomes[0], sweep.Skipped) and "threads_per_row 128" in outcomes[0].reason
    assert [o.rows_per_block for o in outcomes[1:]] == [1, 2]


# ----------------------------------------------------------------- on a GPU
@pytest.mark.gpu
def test_measure_on_the_gpu_reports_the_plan_and_memory():
    spec = registry.all_specs()["rms_norm"]
    point = sweep.measure(spec, 8, 4096, "bf16", seed=0, copy_gbps=4000.0, repeat=3)
    assert point.check_ok and point.alloc_bytes == 0 and point.max_ulp_err is not None
    x = cupy.ones((8, 4096), dtype=BF16)
    w = cupy.ones(4096, dtype=BF16)
    plan = launcher.ops()["rms_norm"].plan_for((x, w, None), (1e-6, 0.0))
    assert {k: getattr(point, k) for k in plans.PLAN_FIELDS} == plan.fields()
    from cupykern import rms_norm

    assert sweep.alloc_bytes(lambda: rms_norm(x, w)) == x.nbytes
    assert sweep.alloc_bytes(lambda: rms_norm(x, w, out=cupy.empty_like(x))) == x.nbytes  # out made inside the call
    out = cupy.empty_like(x)
    assert sweep.alloc_bytes(lambda: rms_norm(x, w, out=out)) == 0
    from cupykern import row_reduce

    with launcher.overrides(vecs_per_thread=2), pytest.raises(ValueError, match="do not apply to row_reduce"):
        row_reduce(x, "sum")
