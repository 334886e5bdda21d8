"""CPU: the one launch path (cupykern/launcher.py) with stand-in arrays and kernels.

The launcher keys on what a CuPy array exposes (shape, strides, dtype, data.ptr), so a
small stand-in class takes its place here, and jit.get_kernel returns a recorder: the
whole path (key, cache, intake, plan, overlap checks, allocation, argument order)
runs without a GPU.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import pytest

import cupykern
from cupykern import _arrays, _dtypes, jit, launcher, plans, tuning
from tests.helpers import FakeArray

PACKAGE = Path(cupykern.__file__).resolve().parent
REAL_GET_KERNEL = jit.get_kernel  # before the fixtures put the recorder in its place


@pytest.fixture
def fake_gpu(fake_launcher):
    """Stand-in arrays, kernels and device for the launcher (conftest.py); the list of launches."""
    return fake_launcher


def _counting(monkeypatch, op_name):
    op = launcher.ops()[op_name]
    calls = []
    prepare = op.prepare

    def counted(args):
        calls.append(args)
        return prepare(args)

    monkeypatch.setattr(op, "prepare", counted)
    return calls


bf16 = _dtypes.bfloat16


def test_rms_norm_launches_with_the_kernel_argument_order(fake_gpu):
    x, w, out = FakeArray((3, 4096), bf16), FakeArray((4096,), bf16, ptr=1 << 22), FakeArray((3, 4096), bf16, ptr=1 << 23)
    assert cupykern.rms_norm(x, w, 1e-5, out=out) is out
    (launch,) = fake_gpu
    assert launch.template.name == "rms_norm_kernel"
    assert launch.template_args == ("__nv_bfloat16", 256, 8, 2, 32, True)  # the decode layout of 4096 bf16, filled
    assert launch.args[:3] == (out, x, w)
    assert [type(a) for a in launch.args[3:7]] == [np.int32] * 4  # norm.cu's 32-bit arguments
    assert launch.args[3:7] == (3, 4096, 4096, 4096)
    assert launch.args[7] == np.float32(1e-5) and launch.args[8] == np.float32(0.0)
    assert launch.grid == (3, 1, 1) and launch.block == (256, 1, 1)


def test_second_call_with_the_same_signature_hits_the_cache(fake_gpu, monkeypatch):
    prepared = _counting(monkeypatch, "rms_norm")
    w = FakeArray((4096,), bf16, ptr=1 << 22)
    for ptr in (1 << 24, 1 << 25, 1 << 26):  # new arrays, same signature
        cupykern.rms_norm(FakeArray((3, 4096), bf16, ptr=ptr), w, out=FakeArray((3, 4096), bf16, ptr=ptr + 65536))
    assert len(prepared) == 1 and len(fake_gpu) == 3
    # Another alignment class, another eps, another shape: each is planned once.
    cupykern.rms_norm(FakeArray((3, 4096), bf16, ptr=(1 << 24) + 2), w, out=FakeArray((3, 4096), bf16, ptr=1 << 27))
    cupykern.rms_norm(FakeArray((3, 4096), bf16, ptr=1 << 24), w, 1e-5, out=FakeArray((3, 4096), bf16, ptr=1 << 27))
    cupykern.rms_norm(FakeArray((5, 4096), bf16, ptr=1 << 24), w, out=FakeArray((5, 4096), bf16, ptr=1 << 27))
    # The same shape as rows of a wider buffer: its strides are part of the key.
    strided = FakeArray((3, 4096), bf16, ptr=1 << 24, strides=(2 * 8192, 2))
    assert not strided._c_contiguous
    cupykern.rms_norm(strided, w, out=FakeArray((3, 4096), bf16, ptr=1 << 27))
    assert len(prepared) == 5 and fake_gpu[-1].args[5] == 8192  # x's row stride in elements
    assert fake_gpu[3].template_args[2] == 1  # the misaligned x takes the scalar path


def test_out_none_allocates_and_returns_it(fake_gpu):
    x, w = FakeArray((2, 64), np.float32), FakeArray((64,), np.float32, ptr=1 << 22)
    y = cupykern.rms_norm(x, w)
    assert isinstance(y, FakeArray) and y.shape == (2, 64) and y.data.ptr >= 1 << 30
    assert fake_gpu[0].args[0] is y


def test_overlap_is_checked_per_call(fake_gpu):
    w = FakeArray((64,), np.float16, ptr=1 << 22)
    x = FakeArray((4, 64), np.float16, ptr=1 << 24)
    cupykern.rms_norm(x, w, out=x)  # exactly in place: allowed
    with pytest.raises(ValueError, match="out overlaps x"):
        cupykern.rms_norm(x, w, out=FakeArray((4, 64), np.float16, ptr=(1 << 24) + 2))
    # Same signatures, disjoint addresses: the cached recipe launches.
    cupykern.rms_norm(x, w, out=FakeArray((4, 64), np.float16, ptr=1 << 25))
    assert len(fake_gpu) == 2


def test_interleaved_column_slices_are_disjoint(fake_gpu):
    """x and residual as the two halves of one (tokens, 2 * hidden) buffer."""
    w = FakeArray((64,), np.float16, ptr=1 << 22)
    x = FakeArray((8, 64), np.float16, ptr=1 << 24, strides=(256, 2))
    residual = FakeArray((8, 64), np.float16, ptr=(1 << 24) + 128, strides=(256, 2))
    assert cupykern.fused_add_rms_norm(x, residual, w) == (x, residual)
    shifted = FakeArray((8, 64), np.float16, ptr=(1 << 24) + 126, strides=(256, 2))
    with pytest.raises(ValueError, match="residual overlaps x"):
        cupykern.fused_add_rms_norm(x, shifted, w)


def test_fused_gate_up_passes_up_as_an_address_inside_x(fake_gpu):
    x = FakeArray((2, 2 * 11), np.float32, ptr=1 << 24)
    out = cupykern.silu_and_mul(x)
    (launch,) = fake_gpu
    assert launch.args[0] is out and launch.args[1] is x
    assert launch.args[2] == np.uint64((1 << 24) + 11 * 4) and launch.args[2].dtype == np.uint64
    assert launch.template_args == ("float", 0, 1, False)  # d = 11: rows do not stay 16-byte aligned


def test_foreign_and_host_arrays(fake_gpu):
    w = FakeArray((8,), np.float32)
    with pytest.raises(TypeError, match="x: expected a device array.*NumPy"):
        cupykern.rms_norm(np.ones((2, 8), np.float32), w)
    with pytest.raises(TypeError, match="x: expected a device array"):
        cupykern.rms_norm(None, w)
    with pytest.raises(ValueError, match="op: expected one of"):  # the op is checked before x is looked at
        cupykern.row_reduce(np.ones(3, np.float32), "median")


def test_unhashable_scalars_are_checked_and_launched_uncached(fake_gpu):
    x, w = FakeArray((2, 8), np.float32), FakeArray((8,), np.float32, ptr=1 << 22)
    with pytest.raises(TypeError):
        cupykern.rms_norm(x, w, [1e-6])
    cupykern.rms_norm(x, w, np.array(1e-6))  # a 0-d array: unhashable, but a valid eps
    assert fake_gpu[-1].args[-2] == np.float32(1e-6)


def test_errors_name_the_argument_every_time(fake_gpu):
    x = FakeArray((2, 8), np.float32)
    for _ in range(2):  # errors are not cached: the second call raises the same
        with pytest.raises(ValueError, match=r"weight: expected shape \(8,\)"):
            cupykern.rms_norm(x, FakeArray((7,), np.float32))
        with pytest.raises(ValueError, match="eps"):
            cupykern.rms_norm(x, FakeArray((8,), np.float32), -1.0)


def _device_of_capability(monkeypatch, capability: str) -> list:
    """jit.get_kernel as it is, on a stand-in device of compute ``capability``; the list
    of name expressions it asked CuPy to compile (RawModule's stand-in)."""
    import types

    import cupy

    compiled = []

    class Module:
        def __init__(self, code, options, name_expressions):
            compiled.extend(name_expressions)

        def get_function(self, expr):
            return types.SimpleNamespace(kernel=lambda *args, **kwargs: None, expr=expr)

    monkeypatch.setattr(jit, "get_kernel", REAL_GET_KERNEL)
    monkeypatch.setattr(jit, "_kernels", {})
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(cupy.cuda, "Device", lambda *a: types.SimpleNamespace(compute_capability=capability))
    monkeypatch.setattr(cupy, "RawModule", Module)
    return compiled


@pytest.mark.parametrize("capability, refused", [("75", True), ("70", True), ("80", False), ("90", False),
                                                 ("100", False)])
def test_get_kernel_refuses_a_gpu_older_than_sm_80_before_compiling(monkeypatch, capability, refused):
    """README asks for compute capability 8.0 or newer (jit.MIN_ARCH): below it the ops'
    one compile path raises RuntimeError before NVRTC, which would fail on the bfloat16
    code or build kernels no test has run. At 80 and newer it compiles."""
    from cupykern.ops import norm

    compiled = _device_of_capability(monkeypatch, capability)
    if refused:
        with pytest.raises(RuntimeError, match=f"rms_norm_kernel: this GPU's compute capability is {capability}; "
                                               "cupykern needs 80 or newer"):
            jit.get_kernel(norm.RMS_NORM, "float", 256, 4, 1, 32)
        assert compiled == []
    else:
        jit.get_kernel(norm.RMS_NORM, "float", 256, 4, 1, 32)
        assert compiled == [norm.RMS_NORM.expr("float", 256, 4, 1, 32)]


def test_an_op_on_a_gpu_older_than_sm_80_raises_before_compiling(fake_gpu, monkeypatch):
    """The same through a public op: its first call asks get_kernel and raises; nothing is
    compiled or launched."""
    compiled = _device_of_capability(monkeypatch, "75")
    x, weight, out = FakeArray((4, 4096), bf16), FakeArray((4096,), bf16), FakeArray((4, 4096), bf16)
    with pytest.raises(RuntimeError, match="compute capability is 75; cupykern needs 80 or newer"):
        cupykern.rms_norm(x, weight, out=out)
    assert compiled == [] and fake_gpu == []


def test_zero_rows_launch_nothing(fake_gpu):
    x, w = FakeArray((0, 64), np.float32), FakeArray((64,), np.float32)
    assert cupykern.rms_norm(x, w).shape == (0, 64)
    q = FakeArray((0, 4, 64), np.float32)
    assert cupykern.apply_rope(q, None, FakeArray((0,), np.int64), FakeArray((16, 64), np.float32),
                               check_positions=False) == (q, None)
    assert not fake_gpu


def test_overrides_reach_the_plan_and_the_key(fake_gpu, monkeypatch):
    prepared = _counting(monkeypatch, "rms_norm")
    x, w = FakeArray((6000, 4096), bf16), FakeArray((4096,), bf16, ptr=1 << 27)  # prefill: 128 threads per row
    out = FakeArray((6000, 4096), bf16, ptr=1 << 28)
    cupykern.rms_norm(x, w, out=out)
    with launcher.overrides(block_size=256):  # 128 threads per row: 2 rows per block
        cupykern.rms_norm(x, w, out=out)
    cupykern.rms_norm(x, w, out=out)
    assert [lc.block for lc in fake_gpu] == [(128, 1, 1), (256, 1, 1), (128, 1, 1)]
    assert len(prepared) == 2
    with launcher.overrides(block_size=64):
        with pytest.raises(ValueError, match="not threads_per_row 128 times a power of two"):
            cupykern.rms_norm(x, w, out=out)
    q, k = FakeArray((4, 8, 64), bf16), FakeArray((4, 2, 64), bf16, ptr=1 << 23)
    positions, cache = FakeArray((4,), np.int64, ptr=1 << 25), FakeArray((128, 64), np.float32, ptr=1 << 26)
    with launcher.overrides(vec_width=1):
        with pytest.raises(ValueError, match=r"launch overrides \['vec_width'\] do not apply to apply_rope"):
            cupykern.apply_rope(q, k, positions, cache, check_positions=False)
    with pytest.raises(TypeError, match="unknown launch overrides"):
        launcher.overrides(block=3)


def test_a_tuned_file_change_empties_the_caches(fake_gpu, monkeypatch):
    prepared = _counting(monkeypatch, "softmax")
    x = FakeArray((2, 32), np.float32)
    cupykern.softmax(x)
    cupykern.softmax(x)
    tuning.reload()
    cupykern.softmax(x)
    assert len(prepared) == 2


def test_recording_reads_back_the_launched_plan(fake_gpu):
    q, k = FakeArray((4, 8, 64), bf16), FakeArray((4, 2, 64), bf16, ptr=1 << 23)
    positions, cache = FakeArray((4,), np.int64, ptr=1 << 25), FakeArray((128, 64), np.float32, ptr=1 << 26)
    with launcher.recording() as seen:
        cupykern.apply_rope(q, k, positions, cache, check_positions=False)
        cupykern.silu_and_mul(FakeArray((4, 64), bf16, ptr=1 << 27))
    assert [r.op for r in seen] == ["apply_rope", "silu_and_mul"]
    rope_plan = seen[0].plan
    assert isinstance(rope_plan, plans.RopePlan) and rope_plan.fields()["origin"] == "heuristic"
    assert rope_plan.fields()["threads_per_head"] == rope_plan.threads_per_head
    assert seen[0].args[:6] == (q, k, q, k, positions, cache)
    assert isinstance(seen[1].plan, plans.ActivationPlan)
    # What a repeat of the launch needs besides: its dynamic shared memory and its template.
    assert seen[0].shared_mem == rope_plan.shared_mem_bytes
    assert (seen[0].template.name, seen[1].template.name) == ("apply_rope_wide_kernel", "act_and_mul_kernel")
    assert not seen[0].template.dependent_launch


def test_out_of_place_rope_allocates_both_outputs(fake_gpu):
    q, k = FakeArray((4, 8, 64), bf16), FakeArray((4, 2, 64), bf16, ptr=1 << 23)
    positions, cache = FakeArray((4,), np.int32, ptr=1 << 25), FakeArray((128, 32), np.float32, ptr=1 << 26)
    q_out, k_out = cupykern.apply_rope(q, k, positions, cache, inplace=False, check_positions=False)
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out is not q
    assert fake_gpu[0].args[:4] == (q_out, k_out, q, k)
    with pytest.raises(ValueError, match="k overlaps q"):
        cupykern.apply_rope(q, FakeArray((4, 2, 64), bf16, ptr=(1 << 20) + 64), positions, cache,
                            check_positions=False)


def test_grid_stride_plans_launch_whole_waves_of_the_kernel_s_occupancy(fake_gpu, monkeypatch):
    """qk_rms_norm_rope's grid-stride grid comes from the compiled kernel's blocks an SM
    (Launch.regrid with jit.blocks_per_sm: FAKE_BLOCKS_PER_SM under the stand-ins), in
    the launch, its recording and plan_for alike; plan_rope's estimate would give 528.
    llama-3.1-70b's heads, with the token kernel that takes them by default turned off."""
    from tests.helpers import FAKE_BLOCKS_PER_SM

    monkeypatch.setattr(plans, "ROPE_NORM_TOKEN_HEADS", ())
    launcher.clear_caches()  # (fake_gpu clears them again afterwards)
    n = 16384
    q, k = FakeArray((n, 64, 128), bf16), FakeArray((n, 8, 128), bf16, ptr=1 << 32)
    weights = FakeArray((128,), bf16, ptr=1 << 33), FakeArray((128,), bf16, ptr=(1 << 33) + 4096)
    positions, cache = FakeArray((n,), np.int64, ptr=1 << 34), FakeArray((4096, 128), np.float32, ptr=1 << 35)
    with launcher.recording() as seen:
        cupykern.qk_rms_norm_rope(q, k, *weights, positions, cache, check_positions=False)
    want = plans.ROPE_WIDE_NORM_GRID_WAVES * FAKE_BLOCKS_PER_SM * plans.H200_LIMITS.sm_count
    assert FAKE_BLOCKS_PER_SM != plans.ROPE_WIDE_BLOCKS_PER_SM
    assert fake_gpu[0].grid == seen[0].grid == seen[0].plan.grid == (want, 1, 1)
    plan = launcher.ops()["qk_rms_norm_rope"].plan_for((q, k, *weights, positions, cache), (1e-6, True))
    assert plan.grid == (want, 1, 1) and plan.heads_per_thread == 3


def test_a_hit_goes_through_the_op_module_and_the_launcher_only(fake_gpu):
    """After its first call, one rms_norm call runs Python code of two package modules
    (ops/norm.py and launcher.py; the kernel itself is CuPy's)."""
    x, w = FakeArray((1, 4096), bf16), FakeArray((4096,), bf16, ptr=1 << 22)
    out = FakeArray((1, 4096), bf16, ptr=1 << 23)
    cupykern.rms_norm(x, w, out=out)
    seen = set()

    def profile(frame, event, arg):
        if event == "call":
            seen.add(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        cupykern.rms_norm(x, w, out=out)
    finally:
        sys.setprofile(None)
    ours = {Path(f).resolve().relative_to(PACKAGE).as_posix() for f in seen if Path(f).resolve().is_relative_to(PACKAGE)}
    assert ours == {"ops/norm.py", "launcher.py"}


def _package_imports() -> dict[str, set[str]]:
    """module -> the package modules it imports (anywhere in the file, lazy imports included)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        targets = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.startswith("cupykern"))
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cupykern"):
                for a in node.names:  # `from cupykern import jit` names a module; `from cupykern.jit import X` not
                    targets.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in _module_names() else
                                node.module)
    return {m: {t for t in ts if t != m} for m, ts in graph.items()}


def _module_names() -> set[str]:
    names = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_the_package_has_no_import_cycle():
    graph = _package_imports()
    # The package face (cupykern/__init__) and its re-exports load families by name; they
    # are the roots, so leave them out of the cycle search.
    graph = {m: ts - {"cupykern"} for m, ts in graph.items() if m != "cupykern"}
    state: dict[str, int] = {}

    def visit(module, path):
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(path + [module, target])}")
            if not state.get(target):
                visit(target, path + [module])
        state[module] = 2

    for module in sorted(graph):
        if not state.get(module):
            visit(module, [])


def test_equal_scalars_get_one_verdict(fake_gpu):
    """Keys compare scalars with ==: a value equal to an accepted one is accepted cold too,
    and one equal to a rejected one is rejected warm too."""
    x, w = FakeArray((2, 8), np.float32), FakeArray((8,), np.float32, ptr=1 << 22)
    cupykern.rms_norm(x, w, 1 + 0j)  # == 1.0: accepted, as eps=1.0 is
    cupykern.rms_norm(x, w, 1.0)
    q, k = FakeArray((4, 8, 64), bf16), FakeArray((4, 2, 64), bf16, ptr=1 << 23)
    positions, cache = FakeArray((4,), np.int64, ptr=1 << 25), FakeArray((128, 64), np.float32, ptr=1 << 26)
    cupykern.apply_rope(q, k, positions, cache, is_neox=True, check_positions=False)
    for bad in ("False", None, 0.5):
        with pytest.raises(TypeError, match="is_neox: expected a bool"):
            cupykern.apply_rope(q, k, positions, cache, is_neox=bad, check_positions=False)
    assert [lc.template_args[3] for lc in fake_gpu[-1:]] == [True]


def test_written_arrays_whose_rows_overlap_are_refused(fake_gpu):
    x, w = FakeArray((4, 64), np.float32), FakeArray((64,), np.float32, ptr=1 << 22)
    with pytest.raises(ValueError, match="out: rows of 64 elements 0 elements apart overlap"):
        cupykern.rms_norm(x, w, out=FakeArray((4, 64), np.float32, ptr=1 << 23, strides=(0, 4)))
    with pytest.raises(ValueError, match="out: rows of 1 elements 0 elements apart overlap"):
        cupykern.row_reduce(x, "sum", out=FakeArray((4,), np.float32, ptr=1 << 23, strides=(0,)))
    q = FakeArray((4, 8, 64), bf16, strides=(2 * 8 * 64, 0, 2))  # every head of a token on the same bytes
    positions, cache = FakeArray((4,), np.int64, ptr=1 << 25), FakeArray((128, 64), np.float32, ptr=1 << 26)
    with pytest.raises(ValueError, match="q: heads of 64 elements 0 apart"):
        cupykern.apply_rope(q, None, positions, cache, check_positions=False)
    assert not fake_gpu


def test_a_refused_override_value_never_finds_the_recipe_of_an_equal_accepted_one(fake_gpu):
    """True == 1 == 1.0: the recipe cache keys on each override's type as well."""
    x = FakeArray((4, 8192), np.float16)
    with launcher.overrides(grid_stride=True):
        cupykern.silu_and_mul(x)
    for bad in (1, 1.0):
        with launcher.overrides(grid_stride=bad), pytest.raises(ValueError, match="expected True or False"):
            cupykern.silu_and_mul(x)
    with launcher.overrides(vec_width=1):
        cupykern.silu_and_mul(x)
    with launcher.overrides(vec_width=True), pytest.raises(ValueError, match="expected a positive int"):
        cupykern.silu_and_mul(x)
    with launcher.overrides(grid_stride=np.bool_(False)):  # NumPy's bools are bools
        cupykern.silu_and_mul(x)
    assert fake_gpu[-1].template_args[-1] is False


def test_launch_overrides_are_checked_with_zero_rows_too(fake_gpu):
    x, w = FakeArray((0, 64), np.float32), FakeArray((64,), np.float32)
    for bad in (dict(rows_per_block=0), dict(block_size=64.0), dict(threads_per_row="128")):
        with launcher.overrides(**bad), pytest.raises(ValueError, match="launch override .*: expected a positive int"):
            cupykern.rms_norm(x, w)
    q = FakeArray((0, 4, 64), np.float32)
    with launcher.overrides(block_size=128), pytest.raises(ValueError, match="do not apply to apply_rope"):
        cupykern.apply_rope(q, None, FakeArray((0,), np.int64), FakeArray((16, 64), np.float32),
                            check_positions=False)


def test_check_runs_the_intake_only(monkeypatch):
    """Op.check (what the float64 references call): the call's argument errors, and nothing
    planned, compiled or cached; no GPU needed, even for arguments that pass."""
    monkeypatch.setattr(launcher, "_current_device", lambda: None)
    monkeypatch.setattr(plans, "plan_rows", lambda *a, **kw: pytest.fail("planned"))
    op = launcher.ops()["rms_norm"]
    cached = dict(op._recipes)
    x, w = _arrays.Sig.contiguous((4, 64), bf16), _arrays.Sig.contiguous((64,), bf16)
    op.check({"x": x, "weight": w, "eps": 1e-6, "weight_offset": 0.0})  # passes: returns None
    op.check({"x": x._replace(shape=(0, 64)), "weight": w, "eps": 1e-6, "weight_offset": 0.0})
    with pytest.raises(ValueError, match=r"weight: expected shape \(64,\), got \(63,\)"):
        op.check({"x": x, "weight": _arrays.Sig.contiguous((63,), bf16), "eps": 1e-6, "weight_offset": 0.0})
    with pytest.raises(TypeError, match="x: expected a device array .*, got None"):
        op.check({"weight": w, "eps": 1e-6, "weight_offset": 0.0})  # a name left out is None
    with pytest.raises(TypeError, match=r"rms_norm has no argument\(s\) \['epsilon'\]"):
        op.check({"x": x, "weight": w, "epsilon": 1e-6})
    assert op._recipes == cached
