"""CPU: the command line (cupykern/cli.py) and the bench scripts' (bench/): usage errors,
models, tune, and sweep's plumbing with the GPU parts (device limits, copy bandwidth,
the engine's measure) replaced by fakes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cupykern import (_dtypes, cli, covering, environment, families, launcher, models, plans, registry, sweep, timing,
                      tuning)
from cupykern.plans import H200_LIMITS
from cupykern.validation import CheckResult
from tests.conftest import HAS_GPU


def invoke(*args, env=None):
    return CliRunner().invoke(cli.main, list(args), env=env)


@pytest.mark.parametrize("args, message", [
    (["sweep", "--model", "gpt-5"], "unknown model 'gpt-5'"),
    (["sweep", "bogus_op"], "unknown op(s) ['bogus_op']"),
    (["sweep", "--num-tokens", "1,x"], "expected comma-separated integers"),
    (["sweep", "--num-tokens", "1,,2"], "expected comma-separated integers"),
    (["sweep", "--num-tokens", "0,4"], "integers from 1 to 2**31 - 1"),
    (["sweep", "--hidden-size", "-3"], "integers from 1 to 2**31 - 1"),
    (["sweep", "--num-tokens", "1,2147483648"], "integers from 1 to 2**31 - 1"),  # helper 63: 1e23 was taken
    (["sweep", "rms_norm", "--hidden-size", str(10**23)], "integers from 1 to 2**31 - 1"),
    (["sweep", "--dtype", "int8"], "unsupported dtype 'int8'"),
    (["sweep", "--dtype", ","], "expected comma-separated dtypes"),
    (["sweep", "--dtype", "bf16,,fp16"], "expected comma-separated dtypes"),
    (["sweep", "--dtype", ""], "expected comma-separated dtypes"),
    (["sweep", "apply_rope", "--hidden-size", "127"], "head_dim must be >= 2 and a multiple of 2"),
    (["sweep", "--hidden-size", "5"], "choose the ops"),
    (["sweep", "--block-size", "100"], "multiples of 32"),
    (["sweep", "--threads-per-row", "48"], "threads per row must be one of"),
    (["sweep", "--vec-width", "3"], "vector widths must be one of"),
    (["sweep", "--grid-stride", "yes"], "expected comma-separated true / false"),
    (["sweep", "--grid-stride", "true,"], "expected comma-separated true / false"),
    (["sweep", "--rows-per-block", "3"], "powers of two"),
    (["sweep", "--block-size", "128", "--rows-per-block", "2"], "give one of them"),
    (["sweep", "--repeat", "0"], "--repeat"),
    # numpy.random.default_rng(-1) raised "expected non-negative integer" on a GPU, after the compile and copy
    (["sweep", "rms_norm", "--seed", "-1"], "--seed"),
    (["check", "--skip-compile", "--seed", "-1"], "--seed"),
    (["sweep", "silu_and_mul", "--tune"], "--tune tunes the row kernels"),
    # helper 67: int() took these as 16; --json "" and a missing directory failed after the sweep's first point
    (["sweep", "--num-tokens", "1_6"], "expected comma-separated integers"),
    (["sweep", "--num-tokens", "9" * 5000], "expected comma-separated integers"),  # helper 68: int()'s digit limit
    (["sweep", "--num-tokens", "\uff11\uff16"], "expected comma-separated integers"),
    (["sweep", "--json", ""], "expected a file path"),
    (["sweep", "--csv", "/nonexistent-cupykern/points.csv"], "/nonexistent-cupykern is not a directory"),
    (["tune", "--show", "--clear"], "without --show and --json"),
    (["tune", "--clear", "--json"], "without --show and --json"),
])
def test_usage_errors_are_not_tracebacks(args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, (TypeError, KeyError, AttributeError))


@pytest.fixture
def no_gpu_compiles(monkeypatch):
    """No GPU; the compile check records what it was given and fails ``failures[0]`` instantiations."""
    monkeypatch.setattr(environment, "gpu_available", lambda: False)
    calls, failures = [], [0]

    def compile_all(arch, instantiations):
        calls.append((arch, instantiations))
        return failures[0]

    monkeypatch.setattr(cli, "_compile_all", compile_all)
    return calls, failures


def test_sweep_without_gpu_runs_the_compile_check(no_gpu_compiles):
    """README's main command is `cupykern sweep`: without a GPU it compiles instead, and its
    exit code is the compile check's (no `|| cupykern check` that could hide a failure)."""
    calls, failures = no_gpu_compiles
    result = invoke("sweep")
    assert result.exit_code == 0, result.output
    assert "No CUDA GPU" in result.output and "compile check instead" in result.output
    assert "compile check passed" in result.output
    assert calls == [("90", covering.instantiations())]  # every family's source, its covering set
    assert sorted(calls[0][1]) == sorted(families.instantiations())
    result = invoke("sweep", "rms_norm", "softmax", "--json", "points.json")
    assert result.exit_code == 0 and calls[-1] == ("90", covering.instantiations({"norm", "softmax"}))
    assert sorted(calls[-1][1]) == ["norm.cu", "softmax.cu"]
    assert "nothing written" in result.output and "no effect on the compile check" not in result.output
    # helper 62: options that shape the timed points were taken without a word
    result = invoke("sweep", "rms_norm", "--block-size", "128", "--hidden-size", "4096")
    assert result.exit_code == 0
    assert "--hidden-size, --block-size: no effect on the compile check" in " ".join(result.output.split())
    failures[0] = 3
    result = invoke("sweep", "apply_rope")
    assert result.exit_code == 1 and "compile check failed" in result.output and list(calls[-1][1]) == ["rope.cu"]


def test_check_without_gpu_compiles_the_covering_set_and_all_with_all(no_gpu_compiles):
    """`cupykern check` compiles the covering set (the first run's minutes); --all every instantiation."""
    calls, _ = no_gpu_compiles
    result = invoke("check")
    assert result.exit_code == 0, result.output
    assert "compiled but not run" in result.output
    assert calls == [("90", covering.instantiations())]
    result = invoke("check", "--all", "--arch", "80")
    assert result.exit_code == 0, result.output
    assert calls[-1] == ("80", families.instantiations())
    assert sum(map(len, calls[0][1].values())) < sum(map(len, calls[-1][1].values())) / 5


def test_compile_table_counts_failures_spills_and_the_heuristics_spills(monkeypatch):
    """`cupykern check`'s table: per source, instantiations, failures, spilling ones, and
    of those the ones covering.heuristic_picks() launches, summed over the source's chunks
    of 64 expressions (the picks planned for the sources that spilled only); the return
    is the failures."""
    from concurrent.futures import ThreadPoolExecutor

    from cupykern import jit
    from rich.console import Console

    a = [f"a<{i}>" for i in range(130)]                  # three chunks: 64, 64, 2
    spills = {e: (8 if i % 10 == 0 else 0) for i, e in enumerate(a)} | {"b<1>": 16}

    def fake_spills(filename, exprs, arch):
        assert arch == "80"
        if filename == "broken.cu":
            raise RuntimeError("broken.cu (sm_80) failed to compile:\nerror")
        return {e: spills[e] for e in exprs}

    monkeypatch.setattr(jit, "nvrtc_spills", fake_spills)
    monkeypatch.setattr(cli, "ProcessPoolExecutor", ThreadPoolExecutor)  # the fake, not pickled
    picked = {"a<0>", "a<1>", "a<70>", "a<129>", "a<120>"}  # 3 of them spill, in all three chunks
    asked = []

    def fake_picks(sources=None):
        asked.append(sources)
        return {"a.cu": picked, "b.cu": set()}

    monkeypatch.setattr(covering, "heuristic_picks", fake_picks)
    monkeypatch.setattr(cli, "console", Console(width=200, force_terminal=False))
    with cli.console.capture() as captured:
        failed = cli._compile_all("80", {"a.cu": a, "b.cu": ["b<1>"], "broken.cu": ["c<1>", "c<2>"]})
    assert failed == 2
    # A table row: │ source │ instantiations │ failed │ spilling │ of them launched by the heuristics │
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in captured.get().splitlines() if "│" in line]
    rows = {c[0]: c[1:] for c in cells if c and c[0].endswith(".cu")}
    assert rows == {"a.cu": ["130", "0", "13", "3"], "b.cu": ["1", "0", "1", "0"], "broken.cu": ["2", "2", "0", "0"]}
    assert asked == [{"a.cu", "b.cu"}]


def test_sweep_without_gpu_checks_usage_first_and_cannot_tune(no_gpu_compiles):
    calls, _ = no_gpu_compiles
    assert invoke("sweep", "bogus_op").exit_code == 2
    result = invoke("sweep", "rms_norm", "--model", "qwen3-8b", "--tune")
    assert result.exit_code == 2 and "--tune times the kernels on this machine's GPU" in result.output
    assert not calls


def test_sweep_help_lists_ops_and_dtypes():
    result = invoke("sweep", "--help")
    assert result.exit_code == 0
    text = " ".join(result.output.split())  # unwrapped
    assert all(op in text for op in registry.all_specs()) and "fp32, fp16, bf16" in text
    for option in ("--num-tokens", "--json", "--csv", "--dtype", "--seed"):
        line = next(ln for ln in result.output.splitlines() if ln.strip().startswith(option))
        assert len(line.split()) > 2, f"{option} has no help text"


def test_models_lists_every_preset():
    result = invoke("models")
    assert result.exit_code == 0, result.output
    for p in models.PRESETS.values():
        assert p.name in result.output and p.hf_repo in result.output
    assert "longrope" in result.output and "gelu_tanh" in result.output
    data = json.loads(invoke("models", "--json").output)
    assert data["llama-3.1-8b"]["rope_scaling"]["rope_type"] == "llama3"
    assert data["gemma-2-9b"]["norm_weight_offset"] == 1.0 and data["qwen3-8b"]["qk_norm"] is True


def test_tune_show_json_without_a_file_is_json(tune_file):
    result = invoke("tune", "--show", "--json")
    assert result.exit_code == 0 and json.loads(result.output) == {"format": tuning.FORMAT, "entries": []}


def test_sweep_where_every_point_is_skipped_fails(fake_gpu):
    result = invoke("sweep", "rms_norm", "--num-tokens", "8", "--block-size", "64")  # 128 threads per row
    assert result.exit_code == 2 and "Every point was skipped" in result.output


def test_tune_show_and_clear(tune_file):
    result = invoke("tune")
    assert result.exit_code == 0 and "does not exist" in result.output
    tuning.save([tuning.TunedEntry("NVIDIA H200", "rms_norm", "bf16", 4096, 64, 8, 4, ((16384, 2),))])
    result = invoke("tune", "--show")
    assert result.exit_code == 0 and "rms_norm" in result.output and "16384:2" in result.output
    assert json.loads(invoke("tune", "--show", "--json").output)["entries"][0]["threads_per_row"] == 64
    result = invoke("tune", "--clear")
    assert result.exit_code == 0 and "removed" in result.output and not tune_file.exists()


@pytest.mark.parametrize("text", ["{not json", json.dumps({"format": tuning.FORMAT, "entries": [{"op": "x"}]})])
@pytest.mark.parametrize("args", [["tune"], ["tune", "--show"], ["tune", "--show", "--json"]])
def test_tune_show_of_an_invalid_file_is_one_line(tune_file, text, args):
    """The issue: a Python warning with a source line and an empty table, exit 0; or just 'gpu'."""
    tune_file.write_text(text)
    result = invoke(*args)
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "Warning" not in result.output
    if text.startswith("{not"):  # maybe not a tuned file at all: --clear keeps it (helper 71)
        assert f"{tune_file}: not a tuned-config file" in result.output and "delete it" in result.output
        assert invoke("tune", "--clear").exit_code == 1 and tune_file.read_text() == text
    else:
        assert f"{tune_file}: not a valid tuned-config file" in result.output and "tune --clear" in result.output
        assert invoke("tune", "--clear").exit_code == 0 and not tune_file.exists()


@pytest.mark.parametrize("name", ["a[work]b", "m[/x]"])
def test_names_from_outside_print_as_they_are(tune_file, monkeypatch, name):
    """helper 67: rich read "[work]" in a path as a style and dropped it (a wrong path, exit
    0), and "[/x]" or a tuned file's gpu "[/oops]" raised MarkupError."""
    monkeypatch.setenv("CUPYKERN_CACHE_DIR", f"/c/{name}")
    monkeypatch.setenv("COLUMNS", "300")
    result = invoke("info")
    assert result.exit_code == 0 and f"/c/{name}" in result.output, result.output
    tuning.save([tuning.TunedEntry(f"G{name}", "rms_norm", "bf16", 4096, 64, 8, 4, ((16384, 2),), commit=name)])
    result = invoke("tune")
    assert result.exit_code == 0 and f"G{name}" in result.output and result.output.count(name) == 2, result.output


def test_repeated_list_items_are_one_point():
    """helper 67: --num-tokens 16,16 --dtype bf16,bfloat16 --hidden-size 4096,4096 planned 8 identical cases."""
    from cupykern import _dtypes

    assert cli.positive_int_list(None, None, "16,1,16, 64") == [16, 1, 64]
    assert cli._dtype_list(None, None, "bf16,bfloat16,fp32") == [_dtypes.bfloat16, _dtypes.float32]


def test_info_names_the_tuned_file_and_the_cache_dir(tune_file, monkeypatch, tmp_path):
    result = invoke("info", "--json")
    assert json.loads(result.output)["tuned_configs"] == str(tune_file)
    monkeypatch.setenv("CUPYKERN_CACHE_DIR", str(tmp_path / "c"))  # helper 61: info showed no cache dir
    assert json.loads(invoke("info", "--json").output)["cache_dir"] == str(tmp_path / "c")


# ----------------------------------------------------------------- sweep with a fake GPU
def fake_plan(op: str, num_tokens: int, size: int, dtype, overrides: dict):
    """The plan ``op`` would launch on the registry's fresh contiguous inputs on an H200,
    from the real plan rule of its kind (ValueError for illegal overrides, as the call)."""
    limits = plans.DeviceLimits.of_device(0)
    aligned = size % _dtypes.vec_width(dtype) == 0
    kind = launcher.ops()[op].plan_kind
    if kind == "rows":
        return plans.plan_rows(num_tokens, size, dtype, aligned=aligned, limits=limits, op=op, overrides=overrides)
    if kind == "activation":
        return plans.plan_activation(num_tokens, size, dtype, aligned=aligned, limits=limits, overrides=overrides,
                                     op=op)
    return plans.plan_rope(num_tokens, 40, size, size, dtype, max_vec_width=_dtypes.vec_width(dtype),
                           fused_norm=op == "qk_rms_norm_rope", limits=limits, op=op)


@pytest.fixture
def fake_gpu(monkeypatch):
    """Sweep's GPU parts replaced: an H200's limits, fixed copy bandwidth, and an engine
    measure that records its calls (with the overrides in force), reports the plan the
    real plan rule gives and prices it (256 threads per row fastest). The engine's own
    read-back of launched plans is tested with a fake device in tests/test_sweep.py."""
    calls = []

    def fake_measure(spec, num_tokens, size, dtype, *, seed, copy_gbps, model=None, impl="cupykern", run=None,
                     repeat=None):
        chosen = launcher.current_overrides()
        plan = fake_plan(spec.name, num_tokens, size, _dtypes.parse(dtype), chosen)
        calls.append(dict(op=spec.name, num_tokens=num_tokens, size=size, model=model, repeat=repeat, **chosen))
        fields = plan.fields()
        threads, rows_per_block = fields["threads_per_row"] or 128, fields["rows_per_block"] or 1
        median = (1.0 + num_tokens / 100) * (1.0 if threads == 256 else 1.5) * (1 + 0.1 * rows_per_block)
        return sweep.make_point(spec, impl=impl, model=model.name, num_tokens=num_tokens, size=size, dtype=dtype,
                                timed=timing.Timing.of([median], "fake"),
                                checked=CheckResult(True, 0.5, 1e-3, 2e-3, 1.0, "ok"), min_bytes=1000,
                                copy_gbps=copy_gbps, alloc_bytes=0, plan_fields=fields)

    monkeypatch.setattr(environment, "gpu_available", lambda: True)
    monkeypatch.setattr(plans.DeviceLimits, "of_device", staticmethod(lambda device_id: H200_LIMITS))
    monkeypatch.setattr(sweep, "current_device_id", lambda: 0)
    monkeypatch.setattr(timing, "copy_bandwidth", lambda: 4000.0)
    monkeypatch.setattr(environment, "describe", lambda: {"date": "2026-11-30T00:00:00+00:00", "commit": "test",
                                                          "gpu": "NVIDIA H200"})
    monkeypatch.setattr(sweep, "measure", fake_measure)
    return calls


def test_sweep_takes_sizes_and_constants_from_the_model(fake_gpu, tmp_path, tune_file):
    out = tmp_path / "s.json"
    result = invoke("sweep", "--num-tokens", "1,64", "--repeat", "3", "--json", str(out), "--csv",
                    str(tmp_path / "s.csv"))
    assert result.exit_code == 0, result.output
    sizes = {c["op"]: c["size"] for c in fake_gpu}
    assert sizes["rms_norm"] == 4096 and sizes["silu_and_mul"] == 14336 and sizes["apply_rope"] == 128
    assert all(c["repeat"] == 3 and c["model"] is models.get("llama-3.1-8b") for c in fake_gpu)
    data = json.loads(out.read_text())
    assert (data["format"], data["suite"], data["model"], data["seed"]) == (sweep.RESULT_FORMAT, "sweep",
                                                                            "llama-3.1-8b", 20261129)
    points = data["points"]
    # Decode-size ops (at most 16 tokens) skip 64.
    assert len(points) == sum(s.takes_tokens(1) + s.takes_tokens(64) for s in registry.all_specs().values())
    assert all(list(p) == list(sweep.POINT_FIELDS) for p in points)
    assert all(p["alloc_bytes"] == 0 and p["max_ulp_err"] == 1.0 and p["model"] == "llama-3.1-8b" for p in points)
    norm = next(p for p in points if p["op"] == "rms_norm")
    assert (norm["plan_kind"], norm["threads_per_row"], norm["rows_per_block"], norm["origin"]) == \
        ("rows", 256, 1, "heuristic")  # 1 token: the decode layout of 4096 bf16
    silu = next(p for p in points if p["op"] == "silu_and_mul")
    assert (silu["plan_kind"], silu["origin"], silu["threads_per_row"], silu["vec_width"]) == \
        ("activation", "heuristic", None, 2)  # 4-byte vectors at one token
    rope = next(p for p in points if p["op"] == "apply_rope")
    assert (rope["plan_kind"], rope["origin"], rope["threads_per_row"]) == ("rope", "heuristic", None)
    assert rope["threads_per_head"] and rope["head_slots"] and rope["tokens_per_block"]
    assert (tmp_path / "s.csv").read_text().count("\n") == 1 + len(points)

    fake_gpu.clear()
    result = invoke("sweep", "rms_norm", "gelu_and_mul", "apply_rope", "--model", "gemma-2-9b", "--num-tokens", "4")
    assert result.exit_code == 0, result.output
    assert {c["op"]: c["size"] for c in fake_gpu} == {"rms_norm": 3584, "gelu_and_mul": 14336, "apply_rope": 256}


def test_block_size_goes_to_the_plan_rule(fake_gpu, tmp_path, tune_file):
    out = tmp_path / "b.json"
    result = invoke("sweep", "rms_norm", "--num-tokens", "6000", "--block-size", "64,256", "--json", str(out))
    assert result.exit_code == 0, result.output
    # The prefill layout of 4096 bf16 has 128 threads per row: 64 cannot hold a row.
    assert "skipped rms_norm 6000x4096 bf16" in result.output and "not threads_per_row 128 times a power of two" in result.output
    (point,) = json.loads(out.read_text())["points"]
    assert (point["block_size"], point["threads_per_row"], point["rows_per_block"], point["origin"]) == \
        (256, 128, 2, "override")
    # The sweep passes block_size itself: the plan rule maps it to rows_per_block.
    assert fake_gpu[-1]["block_size"] == 256 and "rows_per_block" not in fake_gpu[-1]
    result = invoke("sweep", "rms_norm", "--num-tokens", "8", "--block-size", "256", "--threads-per-row", "64",
                    "--json", str(out))
    assert result.exit_code == 0, result.output
    (point,) = json.loads(out.read_text())["points"]
    assert (point["threads_per_row"], point["rows_per_block"]) == (64, 4)


def test_activation_launch_options(fake_gpu, tmp_path):
    out = tmp_path / "a.json"
    result = invoke("sweep", "silu_and_mul", "--num-tokens", "4096", "--vec-width", "1,4,8",
                    "--block-size", "128", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert [(c["vec_width"], c["block_size"]) for c in fake_gpu] == [(1, 128), (4, 128), (8, 128)]
    points = json.loads(out.read_text())["points"]
    assert [(p["vec_width"], p["block_size"], p["origin"]) for p in points] == \
        [(1, 128, "override"), (4, 128, "override"), (8, 128, "override")]
    result = invoke("sweep", "silu_and_mul", "--num-tokens", "4096", "--dtype", "fp32", "--vec-width", "8",
                    "--json", str(out))
    assert "vec_width must be one of (1, 2, 4) for fp32" in result.output  # skipped, not a traceback


def test_activation_grid_stride_option(fake_gpu, tmp_path):
    out = tmp_path / "g.json"
    result = invoke("sweep", "silu_and_mul", "rms_norm", "--num-tokens", "1", "--grid-stride", "true,False",
                    "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "rms_norm ignores --grid-stride" in result.output
    assert [c["grid_stride"] for c in fake_gpu if c["op"] == "silu_and_mul"] == [True, False]
    points = [p for p in json.loads(out.read_text())["points"] if p["op"] == "silu_and_mul"]
    assert [(p["grid_stride"], p["grid"], p["origin"]) for p in points] == [(True, 14, "override"),
                                                                         (False, 28, "override")]
    # The walk keeps 16-byte vectors; a block per item takes 4-byte ones at one token and 256 threads.
    assert "b128 x8 walk override" in result.output and "b256 x2 item override" in result.output


def test_options_an_op_does_not_take_are_named(fake_gpu):
    result = invoke("sweep", "apply_rope", "silu_and_mul", "rms_norm", "--num-tokens", "4", "--threads-per-row", "64")
    assert result.exit_code == 0, result.output
    assert "apply_rope ignores --threads-per-row (its launch options: none)" in result.output
    assert "silu_and_mul ignores --threads-per-row" in result.output
    # The others are timed with their own plans.
    assert [c["op"] for c in fake_gpu if "threads_per_row" in c] == ["rms_norm"]


@pytest.mark.parametrize("gpu", [True, False])
def test_options_no_chosen_op_takes_are_refused(monkeypatch, gpu):
    """Helper 61: `sweep apply_rope --block-size 128` timed RoPE's own plans, and without a
    GPU said nothing of the option."""
    monkeypatch.setattr(environment, "gpu_available", lambda: gpu)
    result = invoke("sweep", "apply_rope", "gemv", "--num-tokens", "4", "--block-size", "128", "--threads-per-row", "64")
    assert result.exit_code == 2, result.output
    assert ("--threads-per-row, --block-size apply to none of the chosen ops: apply_rope takes none; gemv takes none"
            in result.output)
    result = invoke("sweep", "apply_rope", "--grid-stride", "true")
    assert result.exit_code == 2 and "--grid-stride applies to none of the chosen ops: apply_rope takes none" in result.output
    # Each op's own options are named (helper 63: row_reduce was said to take all five row options).
    result = invoke("sweep", "row_reduce", "--vecs-per-thread", "2")
    assert result.exit_code == 2
    assert ("--vecs-per-thread applies to none of the chosen ops: row_reduce takes --threads-per-row, --vec-width, "
            "--rows-per-block, --block-size") in " ".join(result.output.split())


def test_tune_tunes_an_op_whatever_other_ops_options(monkeypatch):
    """Helper 63: --grid-stride (the activations') made --tune time rms_norm's heuristic
    layout alone, as if a row option had been given."""
    tuned = []
    monkeypatch.setattr(sweep, "tune_configs", lambda spec, size, dtype, **kw: tuned.append(spec.name) or [{}])
    cases = sweep.plan_cases(["rms_norm", "silu_and_mul"], sizes={"rms_norm": [4096], "silu_and_mul": [14336]},
                             dtypes=["bf16"], num_tokens=[1], options={"grid_stride": [True]}, tune=True)
    assert tuned == ["rms_norm"]
    assert [(c.op, c.overrides) for c in cases] == [("rms_norm", {}), ("silu_and_mul", {"grid_stride": True})]


def test_sweep_tune_writes_the_winner(fake_gpu, tune_file):
    result = invoke("sweep", "rms_norm", "silu_and_mul", "--tune", "--num-tokens", "1,1024")
    assert result.exit_code == 0, result.output
    assert tuning.path() == tune_file and tune_file.exists()
    (entry,) = tuning.load().values()
    assert entry.key == ("NVIDIA H200", "rms_norm", "bf16", 4096)
    assert entry.threads_per_row == 256 and entry.vec_width == 8
    assert dict(entry.rows_per_block) == {1: 1, 1024: 1}
    # The candidates were measured with tuning suspended, the heuristic among them.
    assert any(c["op"] == "rms_norm" and "threads_per_row" not in c for c in fake_gpu)
    assert len([c for c in fake_gpu if c["op"] == "silu_and_mul"]) == 2  # not tuned, timed once per num_tokens
    # From now on the op plans with the tuned layout.
    plan = plans.plan_rows(1000, 4096, "bfloat16", aligned=True, limits=H200_LIMITS, op="rms_norm")
    assert plan.origin == "tuned" and plan.layout.threads_per_row == 256
    assert "tuned" in invoke("sweep", "rms_norm", "--num-tokens", "4").output


def test_tune_of_row_reduce_varies_threads_per_row_only(fake_gpu, tune_file, monkeypatch):
    """row_reduce does not take vecs_per_thread: its plan derives it from threads_per_row
    (the reduction tree), as for every row op."""
    result = invoke("sweep", "row_reduce", "--tune", "--num-tokens", "1")
    assert result.exit_code == 0, result.output
    assert not any("vecs_per_thread" in c for c in fake_gpu)
    assert len({c.get("threads_per_row") for c in fake_gpu}) > 2


def test_llm_commands_are_registered():
    assert {"generate", "fetch-model"} <= set(cli.main.commands)


def test_peers_lists_missing_peers_as_skipped(monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench import peers

    monkeypatch.setattr(peers, "_importable", lambda name: "not installed")
    status = peers.availability()
    assert status["cupy composition"] is None
    assert all(status[p] for p in peers.PEER_NAMES[1:])
    rows = peers.ratio_rows([
        {"op": "rms_norm", "num_tokens": 1, "size": 4096, "impl": "cupykern", "median_us": 2.0, "check_ok": True},
        {"op": "rms_norm", "num_tokens": 1, "size": 4096, "impl": "cupy composition", "median_us": 10.0,
         "check_ok": True}], ["cupy composition", "torch eager"])
    assert rows[0]["cupy composition"] == (5.0, True, "") and rows[0]["torch eager"] is None


def test_peers_ratio_is_the_fastest_correct_formulation():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench import peers

    def point(impl, us, ok=True):
        return {"model": "llama-3.1-8b", "op": "apply_rope", "num_tokens": 4096, "size": 128, "impl": impl,
                "median_us": us, "check_ok": ok, "pct_of_copy": 80.0, "pct_of_same_bytes_copy": 92.5}

    points = [point("cupykern", 10.0), point("torch.compile (in place)", 30.0),
              point("torch.compile (out of place)", 9.0), point("liger (cos/sin bf16)", 5.0, ok=False),
              point("liger (cos/sin fp32)", 12.0), point("flashinfer", 4.0, ok=False)]
    row = peers.ratio_rows(points, ["torch.compile", "liger", "flashinfer"])[0]
    assert row["torch.compile"] == (0.9, True, "out of place")
    assert row["liger"] == (1.2, True, "cos/sin fp32")
    assert row["flashinfer"] == (0.4, False, "")  # no correct formulation: shown, never the fastest
    assert row["fastest"] == (0.9, "torch.compile (out of place)")
    table = peers.markdown_table([row], [4096], header="h")
    assert "| llama-3.1-8b | apply_rope | 128 | 0.90 a | 80.0 | 92.5 |" in table
    assert "| % of a copy of the same bytes |" in table.splitlines()[2]
    assert "a: torch.compile (out of place)" in table
    assert peers.split_impl("torch.compile (out of place)") == ("torch.compile", "out of place")
    assert peers.split_impl("F.rms_norm") == ("F.rms_norm", "")


def test_peers_same_bytes_copy_rounds_each_direction_to_4096_bytes(monkeypatch):
    """cudaMemcpy ran 8-20 % slower on the H200 at byte counts off a multiple of 4096
    (NOTES item 37, call D): the reference copy is the rounded count's, once per count."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench import peers

    asked = []
    monkeypatch.setattr(peers.timing, "copy_bandwidth", lambda nbytes: asked.append(nbytes) or 100.0)
    known = {}
    assert peers.same_bytes_copy_gbps(86016512, known) == 100.0  # 43,008,256 a direction
    assert peers.same_bytes_copy_gbps(86016512, known) == 100.0
    peers.same_bytes_copy_gbps(1000, known)
    assert asked == [43008000, 4096]


REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("args, message", [
    (["bench/peers.py", "--num-tokens", "1,x"], "expected comma-separated integers"),
    # helper 76: int() took "1_6", full-width digits and a count past 32 bits; " , " crashed
    (["bench/peers.py", "--num-tokens", "1_6,4"], "expected comma-separated integers, got '1_6,4'"),
    (["bench/peers.py", "--num-tokens", "\uff14"], "expected comma-separated integers"),
    (["bench/sanitize.py", "--num-tokens", "99999999999999999999"], "integers from 1 to 2**31 - 1"),
    (["bench/peers.py", "--models", " , "], "expected comma-separated model names"),
    (["bench/peers.py", "--repeat", "0"], "expected an integer >= 1"),
    (["bench/peers.py", "--dtype", "int8"], "int8"),
    (["bench/peers.py", "--ops", "rms_norm,bogus"], "unknown op ['bogus']"),
    (["bench/peers.py", "--peers", "vllm"], "unknown peer ['vllm']"),
    (["bench/peers.py", "--model", "gpt-5"], "unknown model 'gpt-5'"),
    (["bench/bench_host_overhead.py", "--calls", "0"], "--calls"),
    (["bench/bench_host_overhead.py", "--num-tokens", "x"], "--num-tokens"),
    (["bench/bench_host_overhead.py", "--profile", "bogus"], "unknown op 'bogus'"),
    (["bench/bench_norm.py", "--seed", "x"], "--seed"),
    (["bench/bench_norm.py", "--seed", "-1"], "-1 is not in the range x>=0"),
    (["bench/bench_rope.py", "--variants", "--seed", "-1"], "-1 is not in the range x>=0"),
    (["bench/bench_rope.py", "--quick"], "No such option"),
    (["bench/bench_prefill_attention.py", "--dtype", "int8"], "'int8' is not one of 'bf16', 'fp16', 'fp32'"),
])
def test_bench_scripts_reject_bad_arguments(args, message):
    import subprocess

    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
@pytest.mark.parametrize("script", ["bench/bench_norm.py", "bench/bench_rope.py", "bench/bench_activation.py",
                                    "bench/bench_host_overhead.py", "bench/peers.py", "bench/sanitize.py",
                                    "bench/host_costs.py"])
def test_bench_scripts_without_gpu_say_so(script):
    import subprocess

    done = subprocess.run([sys.executable, script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("script", ["bench/bench_norm.py", "bench/bench_rope.py", "bench/bench_activation.py",
                                    "bench/bench_host_overhead.py", "bench/bench_decode_step.py",
                                    "bench/bench_prefill_attention.py", "bench/peers.py", "bench/sanitize.py",
                                    "bench/host_costs.py", "bench/sass.py"])
def test_bench_scripts_take_h_for_help(script):
    """-h as well as --help, as the cupykern CLI (helper 65: sanitize.py answered
    "No such option '-h'")."""
    import subprocess

    done = subprocess.run([sys.executable, script, "-h"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("Usage:"), done.stderr


@pytest.mark.parametrize("args, message", [
    # helper 67: each ran into the GPU check first (or, on a GPU, into the work)
    (["bench/sanitize.py", "--families", "bogus"], "unknown families ['bogus']"),
    (["bench/bench_decode_step.py", "--position", "100", "--max-tokens", "10"], "below --max-tokens 10"),
    (["bench/peers.py", "--seed", "-1"], "'--seed'"),
    (["bench/bench_host_overhead.py", "--seed", "-1"], "'--seed'"),
    (["bench/sass.py", "rope.cu", "x", "--arch", "7"], "expected a compute capability of 80 or newer"),
])
def test_bench_scripts_check_their_options_first(args, message):
    import subprocess

    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_ab_compare_names_a_missing_file(tmp_path):
    import subprocess

    done = subprocess.run([sys.executable, "bench/ab_compare.py", str(tmp_path), "base-a,new-a"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "FileNotFoundError" in done.stderr and "Traceback" not in done.stderr


def test_bench_baselines_cover_the_ops_they_name():
    sys.path.insert(0, str(REPO))
    from bench import common

    assert set(common.COMPOSITIONS) <= set(registry.all_specs())
    assert set(common.LABELS) <= set(common.COMPOSITIONS)


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_rope_cos_sin_cache_without_gpu_says_so():
    import cupykern

    for good in ((64, 8), (0, 128)):  # zero positions is a valid (empty) table
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            cupykern.rope_cos_sin_cache(*good)


@pytest.mark.parametrize("args, kwargs, message", [
    ((-1, 128), {}, r"max_position: expected an int in \[0, 2\*\*31\)"),
    ((16, 127), {}, r"rotary_dim: expected an even int in \[2, 2\*\*31\)"),
    # helper 76: NumPy's MemoryError, "array is too big" or "Maximum allowed dimension exceeded"
    ((2**31, 2), {}, r"max_position: expected an int in \[0, 2\*\*31\), got 2147483648"),
    ((2**63, 2), {}, "max_position: expected an int in"),
    ((16, 2**40), {}, "rotary_dim: expected an even int in"),
    ((16, 8), {"base": 1.0}, "base"),
    ((16, 8), {"rope_scaling": {"rope_type": "bogus"}}, "bogus"),
])
def test_rope_cos_sin_cache_checks_arguments_before_the_gpu(monkeypatch, args, kwargs, message):
    import cupykern

    monkeypatch.setattr(environment, "gpu_available", lambda: pytest.fail("asked for the GPU first"))
    with pytest.raises(ValueError, match=message):
        cupykern.rope_cos_sin_cache(*args, **kwargs)
    with pytest.raises(TypeError, match="dtype: unsupported dtype int8"):
        cupykern.rope_cos_sin_cache(16, 8, dtype=np.int8)


@pytest.mark.parametrize("args, message", [
    (["check", "--arch", "abc"], "--arch"),
    (["check", "--arch", "sm_90"], "--arch"),
    # helper 85: sm_75 compiled and exited 0 though README asks for 8.0 or newer
    (["check", "--arch", "75"], "expected a compute capability of 80 or newer"),
])
def test_check_rejects_bad_arch(args, message):
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 2 and message in result.output


def test_check_skip_compile_without_gpu_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(environment, "gpu_available", lambda: False)
    result = CliRunner().invoke(cli.main, ["check", "--skip-compile"])
    assert result.exit_code == 2 and "nothing to do without a GPU" in result.output


@pytest.mark.parametrize("args", [[], ["--arch", "90"], ["--skip-compile"]])
def test_check_refuses_a_gpu_older_than_sm_80(monkeypatch, args):
    """Helper 87: without --arch, check compiled for a T4's 75 and exited 0; a GPU below
    jit.MIN_ARCH is refused before any compile or validation, whatever --arch says."""
    import types

    import cupy

    monkeypatch.setattr(environment, "gpu_available", lambda: True)
    monkeypatch.setattr(cupy.cuda, "Device", lambda *a: types.SimpleNamespace(compute_capability="75"))
    monkeypatch.setattr(cli, "_compile_all", lambda *a: pytest.fail("compiled"))
    monkeypatch.setattr(cli, "_validate_all", lambda *a: pytest.fail("validated"))
    result = CliRunner().invoke(cli.main, ["check", *args])
    assert result.exit_code == 2 and "compute capability is 75; cupykern needs 80 or newer" in result.output


@pytest.mark.parametrize("arch", [90, None, 9.0, b"90"])
def test_check_arch_wants_a_str(arch):
    from cupykern import jit

    with pytest.raises(TypeError, match="arch: expected a str such as '90'"):
        jit.check_arch(arch)


def test_sweep_says_which_token_counts_a_decode_size_op_skips(fake_gpu):
    result = invoke("sweep", "gemv", "rms_norm", "--num-tokens", "1,16,64", "--dtype", "bf16", "--repeat", "1")
    assert "gemv takes at most 16 tokens: skips num_tokens 64" in result.output, result.output
    assert "rms_norm takes at most" not in result.output
    assert {c["num_tokens"] for c in fake_gpu if c["op"] == "gemv"} == {1, 16}


def test_plan_text_marks_the_exact_walk():
    """The sweep table's plan column says where a row kernel walked its leaves without
    bounds; a point of an older file, without the field, reads as the bounded walk."""
    point = dict(plan_kind="rows", threads_per_row=256, vec_width=8, vecs_per_thread=2, rows_per_block=1,
                 origin="heuristic", exact=True)
    assert cli._plan_text(point) == "256x8x2 r1 exact heuristic"
    assert cli._plan_text({**point, "exact": False}) == "256x8x2 r1 heuristic"
    del point["exact"]
    assert cli._plan_text(point) == "256x8x2 r1 heuristic"
