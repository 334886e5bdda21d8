"""CPU: the tuned-config file (cupykern/tuning.py) and how plans.plan_rows uses it.
(Choosing the entries is the sweep engine's: tests/test_sweep.py.)"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from pathlib import Path

import pytest

from cupykern import _dtypes, launcher, plans, tuning, user_cache
from cupykern.plans import H200_LIMITS


def entry(**kw) -> tuning.TunedEntry:
    fields = dict(gpu="NVIDIA H200", op="rms_norm", dtype="bf16", size=4096, threads_per_row=64, vec_width=8,
                  vecs_per_thread=8, rows_per_block=((64, 1), (16384, 4)), score=1.01,
                  median_us=((1, 2.5), (16384, 70.0)), commit="abc", date="2026-11-30")
    fields.update(kw)
    return tuning.TunedEntry(**fields)


def test_path_env_override_and_cache_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(tuning.ENV_FILE, raising=False)
    monkeypatch.delenv(user_cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tuning.path() == tmp_path / "xdg" / "cupykern" / "tuned.json"
    monkeypatch.setenv(user_cache.CACHE_ENV, str(tmp_path / "cache"))
    assert tuning.path() == tmp_path / "cache" / "tuned.json"
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


#: Invalid tuned files and what read() says is wrong with them.
INVALID = [
    ("{not json", "not JSON: Expecting property name"),
    (json.dumps({"format": "other/9", "entries": []}), "format 'other/9', expected 'cupykern-tuned/1'"),
    (json.dumps([1, 2]), "format 'list', expected"),
    (json.dumps({"format": tuning.FORMAT, "entries": {}}), "'entries' is a dict, expected a list"),
    (json.dumps({"format": tuning.FORMAT, "entries": [7]}), "entry 0 is an int, expected an object"),
    (json.dumps({"format": tuning.FORMAT, "entries": [{"op": "rms_norm"}]}), "entry 0 has no 'gpu'"),
    (json.dumps({"format": tuning.FORMAT, "entries": [{**entry().as_json(), "size": "big"}]}),
     "entry 0: size: expected an int >= 1, got 'big'"),
    # helper 67: int() took these as 4096, 1 and a negative size; 1e400 raised OverflowError
    (json.dumps({"format": tuning.FORMAT, "entries": [{**entry().as_json(), "size": 4096.9}]}),
     "entry 0: size: expected an int >= 1, got 4096.9"),
    (json.dumps({"format": tuning.FORMAT, "entries": [{**entry().as_json(), "size": True}]}),
     "entry 0: size: expected an int >= 1, got True"),
    (json.dumps({"format": tuning.FORMAT, "entries": [{**entry().as_json(), "threads_per_row": -64}]}),
     "entry 0: threads_per_row: expected an int >= 1, got -64"),
    (json.dumps({"format": tuning.FORMAT, "entries": [{**entry().as_json(), "rows_per_block": [[1, "a"]]}]}),
     "entry 0: rows_per_block: expected an int >= 1, got 'a'"),
    (json.dumps({"format": tuning.FORMAT, "entries": [{**entry().as_json(), "median_us": [1]}]}),
     "entry 0: 'median_us' is a list, expected an object"),
    ('{"format": "cupykern-tuned/1", "entries": [{"gpu": "G", "op": "rms_norm", "dtype": "bf16", "size": 1e400, '
     '"threads_per_row": 64, "vec_width": 8, "vecs_per_thread": 8}]}', "entry 0: size: expected an int >= 1, got inf"),
    ("[" * 100_000, "nested too deep"),
    # helper 76: taken before: a NaN score, "inf" timings, Arabic-Indic digits, repeated
    # buckets, names that are not strings
    ('{"format": "cupykern-tuned/1", "entries": [' + json.dumps({**entry().as_json(), "score": 0.0})
     .replace('"score": 0.0', '"score": NaN') + ']}', "entry 0: score: expected a finite number, got nan"),
    (json.dumps({"format": tuning.FORMAT, "entries": [{**entry().as_json(), "median_us": {"16": "inf"}}]}),
     "entry 0: median_us['16']: expected a finite number, got 'inf'"),
    (json.dumps({"format": tuning.FORMAT, "entries": [{**entry().as_json(), "median_us": {"16": -1.0}}]}),
     "entry 0: median_us['16']: expected a time >= 0, got -1.0"),
    (json.dumps({"format": tuning.FORMAT, "entries": [{**entry().as_json(), "median_us": {"\u0661\u0666": 2.0}}]}),
     "entry 0: median_us's n: expected ASCII digits"),
    (json.dumps({"format": tuning.FORMAT, "entries": [{**entry().as_json(), "rows_per_block": [[16, 1], [16, 8]]}]}),
     "entry 0: rows_per_block has two buckets of one n: [[16, 1], [16, 8]]"),
    (json.dumps({"format": tuning.FORMAT, "entries": [{**entry().as_json(), "gpu": 7}]}),
     "entry 0: 'gpu' is an int, expected a string"),
    (json.dumps({"format": tuning.FORMAT, "entries": [{**entry().as_json(), "commit": None}]}),
     "entry 0: 'commit' is a NoneType, expected a string"),
]


#: The INVALID texts that do not hold the format at all: maybe not a tuned file, so
#: clear() keeps them (helper 71: `tune --clear` removed whatever CUPYKERN_TUNE_FILE named).
FOREIGN = ("not JSON", "format '", "nested too deep")


@pytest.mark.parametrize("text, problem", INVALID)
def test_invalid_file_says_what_and_how_to_clear_it(tune_file, text, problem):
    tune_file.write_text(text)
    with pytest.raises(tuning.TunedFileError) as info:
        tuning.read()
    message = str(info.value)
    assert problem in message and "\n" not in message
    if any(f in problem for f in FOREIGN):
        assert message.startswith(f"{tune_file}: not a tuned-config file (")
        assert message.endswith("if it is a damaged one, delete it; else set CUPYKERN_TUNE_FILE to another path")
        with pytest.raises(tuning.TunedFileError, match="not a tuned-config file"):
            tuning.clear()
        assert tune_file.read_text() == text
    else:
        assert message.startswith(f"{tune_file}: not a valid tuned-config file (")
        assert message.endswith("clear it with `cupykern tune --clear` (or delete the file)")
        assert tuning.clear() and not tune_file.exists()


def test_a_file_not_utf8_is_invalid_not_a_crash(tune_file):
    tune_file.write_bytes(b"\xff\xfe{}")
    with pytest.raises(tuning.TunedFileError, match="not UTF-8 text"):
        tuning.read()


def test_save_keeps_an_invalid_file_and_says_so(tune_file):
    """helper 67: save() merged over load(), which reads an invalid file as {}, so one bad
    entry cost every good one."""
    tuning.save([entry()])
    data = json.loads(tune_file.read_text())
    data["entries"].append({**entry(op="softmax").as_json(), "rows_per_block": [[1, "a"]]})
    bad = json.dumps(data)
    tune_file.write_text(bad)
    with pytest.raises(tuning.TunedFileError, match="not a valid tuned-config file .*tune --clear"):
        tuning.save([entry(op="layer_norm")])
    assert tune_file.read_text() == bad


def test_save_that_cannot_write_says_where_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "tuned.json"
    target.mkdir()  # os.replace cannot put a file there
    with pytest.raises(tuning.TunedFileError, match=f"{target}: .*cannot be read"):
        tuning.save([entry()], target)
    under_a_file = tmp_path / "plain" / "tuned.json"
    (tmp_path / "plain").write_text("")
    with pytest.raises(tuning.TunedFileError, match="the tuned-config file cannot be written .*CUPYKERN_TUNE_FILE"):
        tuning.save([entry()], under_a_file)
    # os.replace failing: the temporary file goes too.
    monkeypatch.setattr(tuning.os, "replace", lambda *a: (_ for _ in ()).throw(PermissionError(13, "denied")))
    with pytest.raises(tuning.TunedFileError, match="cannot be written"):
        tuning.save([entry()], tmp_path / "ok.json")
    assert not [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] and not (tmp_path / "ok.json").exists()


def test_clear_that_cannot_remove_says_so(tmp_path):
    (tmp_path / "tuned.json").mkdir()
    with pytest.raises(tuning.TunedFileError, match="the tuned-config file cannot be removed"):
        tuning.clear(tmp_path / "tuned.json")


def test_clear_removes_nothing_but_a_tuned_file(tmp_path):
    """helper 71: CUPYKERN_TUNE_FILE=/dev/null `cupykern tune --clear` removed the device
    node, and a FIFO or a notes file went the same way."""
    notes = tmp_path / "notes.txt"
    notes.write_text("precious")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for file, problem in ((notes, "not a tuned-config file (not JSON"), (fifo, "cannot be removed (not a regular")):
        with pytest.raises(tuning.TunedFileError, match=re.escape(problem)):
            tuning.clear(file)
        assert file.exists()
    assert notes.read_text() == "precious" and not (tmp_path / "notes.txt.lock").exists()
    with pytest.raises(tuning.TunedFileError, match="not a tuned-config file"):
        tuning.save([entry()], notes)  # nor written over
    notes.unlink()
    tuning.save([entry()], notes)  # a tuned file under any name is removed
    assert tuning.clear(notes) and not notes.exists()


def test_save_takes_tuned_entries_only(tmp_path):
    """Helper 76: save([1]) raised AttributeError from inside the merge."""
    with pytest.raises(TypeError, match=r"entries: expected TunedEntry objects, got 1"):
        tuning.save([entry(), 1], tmp_path / "tuned.json")
    assert not (tmp_path / "tuned.json").exists()


def test_read_refuses_what_is_not_a_regular_file_without_waiting(tmp_path):
    """helper 76: CUPYKERN_TUNE_FILE naming a FIFO made `cupykern tune` and the first row
    op's plan wait forever on the open; read(), load() and save() now refuse it by name."""
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outcome = {}

    def attempt():
        for name, call in (("read", lambda: tuning.read(fifo)), ("save", lambda: tuning.save([entry()], fifo))):
            try:
                call()
                outcome[name] = "returned"
            except tuning.TunedFileError as exc:
                outcome[name] = str(exc)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outcome["load"] = (tuning.load(fifo), [str(w.message) for w in caught])

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=10)
    if worker.is_alive():  # unblock the open it is stuck in, so the test run goes on
        with open(fifo, "w"):
            pass
        pytest.fail("reading a FIFO as the tuned file waited (it should refuse it at once)")
    assert "not a regular file" in outcome["read"] and "not a regular file" in outcome["save"]
    assert outcome["load"][0] == {} and "not a regular file" in outcome["load"][1][0]


def _save_many(file: str, worker: int, count: int, start) -> None:
    start.wait()  # all at once
    for i in range(count):
        tuning.save([entry(size=1024 * (worker * 100 + i + 1))], Path(file))


def test_processes_saving_at_once_keep_every_entry(tmp_path):
    """helper 67: six processes saving 20 entries each kept 88 of 120 (read, merge and
    replace without a lock)."""
    import multiprocessing

    file = tmp_path / "tuned.json"
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(4)
    workers = [ctx.Process(target=_save_many, args=(str(file), w, 30, start)) for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0] * 4
    assert len(tuning.read(file)) == 120


def test_a_home_of_an_unknown_user_is_taken_as_written(monkeypatch):
    """helper 67: Path.expanduser raised RuntimeError for ~nosuchuser, in every op's plan."""
    monkeypatch.setenv(tuning.ENV_FILE, "~nosuchuser-cupykern/tuned.json")
    assert tuning.path() == Path("~nosuchuser-cupykern/tuned.json")
    monkeypatch.setenv(user_cache.CACHE_ENV, "~nosuchuser-cupykern")
    assert user_cache.cache_dir() == Path("~nosuchuser-cupykern")
    assert tuning.load() == {}  # looked up: nothing there
    # helper 68: but written, it made a "~nosuchuser-cupykern" folder in the current directory
    for write in (lambda: tuning.save([entry()]), tuning.clear):
        with pytest.raises(tuning.TunedFileError, match="~nosuchuser-cupykern is no known user's home"):
            write()


def test_invalid_file_is_ignored_with_one_warning_naming_it(tune_file):
    tune_file.write_text(json.dumps({"format": tuning.FORMAT, "entries": [{"op": "rms_norm"}]}))
    tuning.reload()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # The file is read once: one warning, the heuristics every time.
        found = [tuning.lookup("rms_norm", "bf16", 4096, "NVIDIA H200") for _ in range(3)]
    assert found == [None] * 3
    assert [w.category for w in caught] == [tuning.TunedFileWarning] and str(tune_file) in str(caught[0].message)
    assert "using the heuristics" in str(caught[0].message)
    with pytest.warns(tuning.TunedFileWarning):
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


def test_lookup_follows_the_env_var_after_reload(tmp_path, tune_file, monkeypatch):
    tuning.save([entry()])
    assert tuning.lookup("rms_norm", "bf16", 4096, "NVIDIA H200") is not None
    monkeypatch.setenv(tuning.ENV_FILE, str(tmp_path / "elsewhere.json"))
    tuning.reload()
    assert tuning.lookup("rms_norm", "bf16", 4096, "NVIDIA H200") is None


def test_rows_per_block_buckets():
    e = entry(rows_per_block=((1, 1), (64, 2), (4096, 4)))
    assert [e.rows_per_block_for(n) for n in (1, 2, 64, 65, 4096, 10**6)] == [1, 2, 2, 4, 4, 4]
    assert entry(rows_per_block=()).rows_per_block_for(5) is None


@pytest.mark.parametrize("num_rows", [1, 64, 65, 100_000])
def test_plan_rows_uses_the_tuned_entry(tune_file, num_rows):
    tuning.save([entry()])
    plan = plans.plan_rows(num_rows, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
    assert plan.origin == "tuned"
    assert plan.layout == plans.RowLayout(64, 8, 8)
    assert plan.rows_per_block == (1 if num_rows <= 64 else 4)
    assert plan.grid[0] == -(-num_rows // plan.rows_per_block)


def _heuristic(num_rows, size, dtype, aligned, op, limits=H200_LIMITS):
    """The heuristic's plan for ``op``: with no tuned file in play (``op`` None), then
    ``op``'s walk (plans.exact_walk; the bounded one for an op without the exact walk)."""
    plan = plans.plan_rows(num_rows, size, dtype, aligned=aligned, limits=limits)
    exact = op in plans.EXACT_WALK and plans.exact_walk(op, plan.layout, num_rows, size, dtype)
    return dataclasses.replace(plan, exact=exact)


@pytest.mark.parametrize("num_rows", [1, 7, 6000])
def test_without_an_entry_the_plan_is_the_heuristic(tune_file, num_rows):
    tuning.save([entry(gpu="some other GPU"), entry(op="softmax")])
    for op in ("rms_norm", "layer_norm", None):
        plan = plans.plan_rows(num_rows, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op=op)
        assert plan == _heuristic(num_rows, 4096, _dtypes.bfloat16, True, op) and plan.origin == "heuristic"


def test_tuned_entry_is_skipped_when_it_cannot_apply(tune_file):
    tuning.save([entry(), entry(op="softmax", vec_width=1, threads_per_row=64)])
    # Vectorised entry, unaligned rows: the heuristic (scalar) layout.
    plan = plans.plan_rows(8, 4096, _dtypes.bfloat16, aligned=False, limits=H200_LIMITS, op="rms_norm")
    assert plan == _heuristic(8, 4096, _dtypes.bfloat16, False, "rms_norm")
    # A scalar entry applies to unaligned rows too.
    plan = plans.plan_rows(8, 4096, _dtypes.bfloat16, aligned=False, limits=H200_LIMITS, op="softmax")
    assert plan.origin == "tuned" and plan.layout.threads_per_row == 64
    # Overrides win over the tuned entry.
    plan = plans.plan_rows(8, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm",
                           overrides={"rows_per_block": 1})
    assert plan.origin == "override" and plan.layout == plans.row_layout(4096, _dtypes.bfloat16, True, num_rows=8)
    # An entry that does not validate (a hand-edited file) falls back to the heuristic.
    tuning.save([entry(threads_per_row=48)])
    plan = plans.plan_rows(8, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
    assert plan == _heuristic(8, 4096, _dtypes.bfloat16, True, "rms_norm")


def test_tuned_layout_does_not_depend_on_num_rows(tune_file):
    # 64 threads x 8 rows exceeds the kernel's block bound (256): that bucket falls back
    # to the default rows_per_block, not to another layout.
    tuning.save([entry(rows_per_block=((64, 1), (16384, 8)))])
    plan = plans.plan_rows(5000, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
    assert plan.origin == "tuned" and plan.rows_per_block == 2
    layouts = {plans.plan_rows(n, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm").layout
               for n in (1, 7, 64, 4097, 100_000)}
    assert len(layouts) == 1


def test_subscribers_hear_of_every_change(tune_file, monkeypatch):
    """The launcher empties its cached plans on these notices (cupykern/launcher.py): every
    change that can change a lookup must send one."""
    heard = []
    monkeypatch.setattr(tuning, "_subscribers", [])
    tuning.subscribe(lambda: heard.append(1))
    tuning.save([entry()])
    assert len(heard) == 1
    with tuning.suspended():
        assert len(heard) == 2
    assert len(heard) == 3
    tuning.reload()
    tuning.clear()
    assert len(heard) == 5


@pytest.mark.gpu
def test_cached_plans_follow_overrides_and_the_tuned_file(tune_file):
    import cupy

    x = cupy.ones((1000, 4096), dtype=_dtypes.bfloat16)
    w = cupy.ones(4096, dtype=_dtypes.bfloat16)
    op = launcher.ops()["rms_norm"]

    def plan():
        return op.plan_for((x, w, None), (1e-6, 0.0))

    gpu = plans.DeviceLimits.of_device(cupy.cuda.runtime.getDevice()).name
    assert plan().origin == "heuristic"
    with launcher.overrides(threads_per_row=256, rows_per_block=1):
        assert plan().layout.threads_per_row == 256
    tuning.save([entry(gpu=gpu)])
    tuned = plan()
    assert (tuned.origin, tuned.layout.threads_per_row) == ("tuned", 64)
    tuning.clear()
    assert plan().origin == "heuristic"
