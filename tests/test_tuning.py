"""CPU: the tuned-config file (cupykern/tuning.py) and how launch.plan_rows uses it."""

from __future__ import annotations

import json

import pytest

from cupykern import _dtypes, launch, tuning
from cupykern.launch import H200_LIMITS

LADDER = (1, 16, 64, 256, 1024, 4096, 16384)


def entry(**kw) -> tuning.TunedEntry:
    fields = dict(gpu="NVIDIA H200", op="rms_norm", dtype="bf16", size=4096, threads_per_row=64, vec_width=8,
                  vecs_per_thread=8, rows_per_block=((64, 1), (16384, 4)), score=1.01,
                  median_us=((1, 2.5), (16384, 70.0)), commit="abc", date="2026-11-30")
    fields.update(kw)
    return tuning.TunedEntry(**fields)


def test_path_env_override_and_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv(tuning.ENV_FILE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tuning.path() == tmp_path / "xdg" / "cupykern" / "tuned.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert tuning.path().parts[-3:] == (".cache", "cupykern", "tuned.json")
    monkeypatch.setenv(tuning.ENV_FILE, str(tmp_path / "mine.json"))
    assert tuning.path() == tmp_path / "mine.json"


def test_round_trip_merge_and_clear(tune_file):
    assert tuning.load() == {}
    first = entry()
    assert tuning.save([first]) == tune_file
    data = json.loads(tune_file.read_text())
    assert data["format"] == tuning.FORMAT and data["entries"][0]["rows_per_block"] == [[64, 1], [16384, 4]]
    assert tuning.load() == {first.key: first}
    other = entry(op="softmax", threads_per_row=128)
    replaced = entry(vecs_per_thread=4)
    tuning.save([other, replaced])
    assert tuning.load() == {replaced.key: replaced, other.key: other}
    assert tuning.clear() and not tune_file.exists()
    assert not tuning.clear()
    assert tuning.lookup("rms_norm", "bf16", 4096, "NVIDIA H200") is None


def test_unreadable_file_is_ignored_with_a_warning(tune_file):
    tune_file.write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable"):
        assert tuning.load() == {}
    tune_file.write_text(json.dumps({"format": "other/9", "entries": []}))
    with pytest.warns(UserWarning):
        assert tuning.load() == {}


def test_lookup_matches_gpu_op_dtype_size(tune_file):
    tuning.save([entry()])
    assert tuning.lookup("rms_norm", "bf16", 4096, "NVIDIA H200") == entry()
    assert tuning.lookup("rms_norm", "bf16", 4096, "NVIDIA H100 80GB HBM3") is None
    assert tuning.lookup("rms_norm", "fp16", 4096, "NVIDIA H200") is None
    assert tuning.lookup("rms_norm", "bf16", 8192, "NVIDIA H200") is None
    assert tuning.lookup("layer_norm", "bf16", 4096, "NVIDIA H200") is None
    with tuning.suspended():
        assert tuning.lookup("rms_norm", "bf16", 4096, "NVIDIA H200") is None
    assert tuning.lookup("rms_norm", "bf16", 4096, "NVIDIA H200") is not None


def test_lookup_follows_the_env_var(tmp_path, tune_file, monkeypatch):
    tuning.save([entry()])
    assert tuning.lookup("rms_norm", "bf16", 4096, "NVIDIA H200") is not None
    monkeypatch.setenv(tuning.ENV_FILE, str(tmp_path / "elsewhere.json"))
    assert tuning.lookup("rms_norm", "bf16", 4096, "NVIDIA H200") is None


def test_rows_per_block_buckets():
    e = entry(rows_per_block=((1, 1), (64, 2), (4096, 4)))
    assert [e.rows_per_block_for(n) for n in (1, 2, 64, 65, 4096, 10**6)] == [1, 2, 2, 4, 4, 4]
    assert entry(rows_per_block=()).rows_per_block_for(5) is None


@pytest.mark.parametrize("num_rows", [1, 64, 65, 100_000])
def test_plan_rows_uses_the_tuned_entry(tune_file, num_rows):
    tuning.save([entry()])
    plan = launch.plan_rows(num_rows, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
    assert plan.origin == "tuned"
    assert plan.layout == launch.RowLayout(64, 8, 8)
    assert plan.rows_per_block == (1 if num_rows <= 64 else 4)
    assert plan.grid[0] == -(-num_rows // plan.rows_per_block)


def _heuristic(num_rows, size, dtype, aligned, limits=H200_LIMITS):
    return launch.plan_rows(num_rows, size, dtype, aligned=aligned, limits=limits)


@pytest.mark.parametrize("num_rows", [1, 7, 4097])
def test_without_an_entry_the_plan_is_the_heuristic(tune_file, num_rows):
    tuning.save([entry(gpu="some other GPU"), entry(op="softmax")])
    for op in ("rms_norm", "layer_norm", None):
        plan = launch.plan_rows(num_rows, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op=op)
        assert plan == _heuristic(num_rows, 4096, _dtypes.bfloat16, True) and plan.origin == "heuristic"


def test_tuned_entry_is_skipped_when_it_cannot_apply(tune_file):
    tuning.save([entry(), entry(op="softmax", vec_width=1, threads_per_row=64)])
    # Vectorised entry, unaligned rows: the heuristic (scalar) layout.
    plan = launch.plan_rows(8, 4096, _dtypes.bfloat16, aligned=False, limits=H200_LIMITS, op="rms_norm")
    assert plan == _heuristic(8, 4096, _dtypes.bfloat16, False)
    # A scalar entry applies to unaligned rows too.
    plan = launch.plan_rows(8, 4096, _dtypes.bfloat16, aligned=False, limits=H200_LIMITS, op="softmax")
    assert plan.origin == "tuned" and plan.layout.threads_per_row == 64
    # Overrides win over the tuned entry.
    plan = launch.plan_rows(8, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm",
                            rows_per_block=2)
    assert plan.origin == "override" and plan.layout == launch.row_layout(4096, _dtypes.bfloat16, True)
    # An entry that does not validate (a hand-edited file) falls back to the heuristic.
    tuning.save([entry(threads_per_row=48)])
    plan = launch.plan_rows(8, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
    assert plan == _heuristic(8, 4096, _dtypes.bfloat16, True)


def test_tuned_layout_does_not_depend_on_num_rows(tune_file):
    # 64 threads x 8 rows exceeds the kernel's block bound (256): that bucket falls back
    # to the default rows_per_block, not to another layout.
    tuning.save([entry(rows_per_block=((64, 1), (16384, 8)))])
    plan = launch.plan_rows(5000, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
    assert plan.origin == "tuned" and plan.rows_per_block == 2
    layouts = {launch.plan_rows(n, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm").layout
               for n in (1, 7, 64, 4097, 100_000)}
    assert len(layouts) == 1


def _m(t, v, r, n, us, vw=8):
    return tuning.Measured(t, vw, v, r, n, us)


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
    e = tuning.choose(measured, ladder, gpu="G", op="rms_norm", dtype="bf16", size=4096)
    assert (e.threads_per_row, e.vec_width, e.vecs_per_thread) == (256, 8, 2)
    assert e.rows_per_block == ((1, 1), (1024, 2), (16384, 2))
    assert dict(e.median_us) == {1: 2.0, 1024: 7.5, 16384: 63.0}
    assert tuning.choose(measured[-2:], ladder, gpu="G", op="rms_norm", dtype="bf16", size=4096) is None


@pytest.mark.parametrize("size", [1, 5, 576, 4096, 8192, 14336, 65536])
@pytest.mark.parametrize("dtype", _dtypes.DTYPES, ids=_dtypes.short_name)
def test_candidate_configs_are_legal_plans(size, dtype):
    aligned = size % _dtypes.vec_width(dtype) == 0
    vec_width = launch.row_layout(size, dtype, aligned).vec_width
    configs = tuning.candidate_configs(size, vec_width, threads_choices=launch.THREADS_PER_ROW_CHOICES,
                                       vecs_choices=launch.VECS_PER_THREAD_CHOICES, min_block=launch.MIN_BLOCK_SIZE,
                                       max_block_of=launch.max_block_size)
    assert configs and len(configs) <= 64
    for config in configs:
        plan = launch.plan_rows(100, size, dtype, aligned=aligned, limits=H200_LIMITS, **config)
        assert plan.layout in launch.row_layouts(dtype)


def test_state_changes_whenever_lookup_may_answer_differently(tune_file, monkeypatch, tmp_path):
    """Plans are memoised on tuning.state() (cupykern/_rowkernel.py): every change that can
    change a lookup must change the state."""
    states = [tuning.state()]
    tuning.save([entry()])
    states.append(tuning.state())
    with tuning.suspended():
        states.append(tuning.state())
    monkeypatch.setenv(tuning.ENV_FILE, str(tmp_path / "other.json"))
    states.append(tuning.state())
    tuning.clear()
    states.append(tuning.state())
    assert len(set(states)) == len(states)


@pytest.mark.gpu
def test_memoised_row_plans_follow_overrides_and_the_tuned_file(tune_file):
    from cupykern import _rowkernel

    bf16 = _dtypes.bfloat16
    gpu = launch.DeviceLimits.of_device().name
    assert _rowkernel.plan(1000, 4096, bf16, True, op="rms_norm").origin == "heuristic"
    with launch.overrides(threads_per_row=256, rows_per_block=1):
        assert _rowkernel.plan(1000, 4096, bf16, True, op="rms_norm").layout.threads_per_row == 256
    tuning.save([entry(gpu=gpu)])
    tuned = _rowkernel.plan(1000, 4096, bf16, True, op="rms_norm")
    assert (tuned.origin, tuned.layout.threads_per_row) == ("tuned", 64)
    tuning.clear()
    assert _rowkernel.plan(1000, 4096, bf16, True, op="rms_norm").origin == "heuristic"
