"""Tuned launch configurations of the row kernels: the user cache file written by
``cupykern sweep --tune`` (cupykern/sweep.py chooses the entries) and read by
:func:`cupykern.plans.plan_rows`. This module is the file store and the lookup.

One entry per (GPU name, op, dtype, row size) holds

* one row layout (``threads_per_row``, ``vec_width``, ``vecs_per_thread``), chosen over
  the whole num_tokens ladder (every layout that validates computes the row's one
  reduction tree, kernels_cu/cupykern/reduce.cuh, so a per-bucket layout would keep the
  bits too; the file does not hold one yet; an entry whose layout does not fit the
  tree, e.g. one written before it, is ignored);
* ``rows_per_block`` per num_tokens bucket, which may vary with the batch.

File (JSON), at ``$CUPYKERN_TUNE_FILE`` if set, else ``tuned.json`` in the cupykern
cache directory (cupykern/user_cache.py: ``$CUPYKERN_CACHE_DIR``, else
``~/.cache/cupykern`` on Linux)::

    {"format": "cupykern-tuned/1",
     "entries": [{"gpu": "NVIDIA H200", "op": "rms_norm", "dtype": "bf16", "size": 4096,
                  "threads_per_row": 128, "vec_width": 8, "vecs_per_thread": 4,
                  "rows_per_block": [[1, 1], [16, 1], ..., [16384, 2]],
                  "score": 1.02, "median_us": {"1": 2.1, ...}, "commit": "...", "date": "..."}]}

``rows_per_block`` lists ``[n, rows_per_block]`` for each ladder point n, ascending; a
batch of r rows takes the first bucket with ``r <= n`` (the last one beyond). An entry
whose ``vec_width`` > 1 applies to 16-byte aligned rows only (unaligned rows use the
heuristic). A missing file means no entries; an invalid one too, with one warning naming
it at the first lookup (``cupykern tune --show`` says what is wrong and how to clear it).
Pure Python, no GPU.

The file is read once per process, when an op first plans; :func:`save`, :func:`clear`
and :func:`reload` (after the file or ``CUPYKERN_TUNE_FILE`` / ``CUPYKERN_CACHE_DIR``
changed) update what this process sees, and tell the subscribers (the launcher, whose
cached plans then go).
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import filelock

from cupykern import user_cache
from cupykern._arrays import count  # whole numbers >= 1: not a bool, not 4096.9

FORMAT = "cupykern-tuned/1"
ENV_FILE = "CUPYKERN_TUNE_FILE"


@dataclass(frozen=True)
class TunedEntry:
    gpu: str
    op: str
    dtype: str  # short name: "bf16", "fp16", "fp32"
    size: int
    threads_per_row: int
    vec_width: int
    vecs_per_thread: int
    rows_per_block: tuple = ()  # ((n, rows_per_block), ...) ascending in n
    score: float = 0.0
    median_us: tuple = ()  # ((n, microseconds), ...) of the chosen configuration
    commit: str = ""
    date: str = ""

    @property
    def key(self) -> tuple:
        return (self.gpu, self.op, self.dtype, int(self.size))

    def rows_per_block_for(self, num_rows: int) -> int | None:
        """rows_per_block of the first bucket holding ``num_rows`` (the last one beyond); None if none stored."""
        for n, rows_per_block in self.rows_per_block:
            if num_rows <= n:
                return rows_per_block
        return self.rows_per_block[-1][1] if self.rows_per_block else None

    def as_json(self) -> dict:
        d = asdict(self)
        d["rows_per_block"] = [list(p) for p in self.rows_per_block]
        d["median_us"] = {str(n): t for n, t in self.median_us}
        return d

    @staticmethod
    def from_json(d: dict) -> "TunedEntry":
        """The entry of one JSON object. KeyError for a missing key; ValueError for a count
        that is not a whole number >= 1 (a bool, 4096.9 or -64 too: int() would take them
        as 1, 4096 or a size no row has), a name that is not a string, a timing that is
        not a finite number >= 0 or is keyed by anything but ASCII digits, a score that is
        not finite, or two rows_per_block buckets of one n (helper 76 found NaN, "inf",
        Arabic-Indic digits and repeated buckets taken)."""
        median = d.get("median_us") or {}
        if not isinstance(median, dict):
            raise ValueError(f"'median_us' is {_a_type(median)}, expected an object")
        names = {}
        for key in ("gpu", "op", "dtype", "commit", "date"):
            value = d[key] if key in ("gpu", "op", "dtype") else d.get(key, "")
            if not isinstance(value, str):
                raise ValueError(f"{key!r} is {_a_type(value)}, expected a string")
            names[key] = value
        buckets = tuple(sorted((count(n, "rows_per_block's n", 1), count(r, "rows_per_block", 1))
                               for n, r in d.get("rows_per_block") or ()))
        if len({n for n, _ in buckets}) != len(buckets):
            raise ValueError(f"rows_per_block has two buckets of one n: {[list(b) for b in buckets]}")
        timings = []
        for n, t in median.items():
            if not _DIGITS.fullmatch(n):
                raise ValueError(f"median_us's n: expected ASCII digits, got {n!r}")
            t = _finite(t, f"median_us[{n!r}]")
            if t < 0:
                raise ValueError(f"median_us[{n!r}]: expected a time >= 0, got {t!r}")
            timings.append((count(int(n), "median_us's n", 1), t))
        return TunedEntry(
            gpu=names["gpu"], op=names["op"], dtype=names["dtype"], size=count(d["size"], "size", 1),
            threads_per_row=count(d["threads_per_row"], "threads_per_row", 1),
            vec_width=count(d["vec_width"], "vec_width", 1),
            vecs_per_thread=count(d["vecs_per_thread"], "vecs_per_thread", 1),
            rows_per_block=buckets, score=_finite(d.get("score", 0.0), "score"), median_us=tuple(sorted(timings)),
            commit=names["commit"], date=names["date"])


#: A median_us key: the count in ASCII digits, as as_json writes it.
_DIGITS = re.compile(r"[0-9]+")


def _a_type(value) -> str:
    """"a list", "an int": the article and name of value's type, for messages."""
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _finite(value, name: str) -> float:
    """A JSON number (not a bool, not a string: float() took "inf") as a finite float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return float(value)


def path() -> Path:
    """Where the tuned file lives (see the module docstring)."""
    explicit = os.environ.get(ENV_FILE)
    if explicit:
        return user_cache.expand_user(explicit)
    return user_cache.cache_dir() / "tuned.json"


class TunedFileError(ValueError):
    """The tuned file exists but cannot be read as one (the message names the file, says
    what is wrong and how to clear it, on one line), or it cannot be written or removed
    (``io`` set: the message says which and why). A file that does not hold this format
    at all (``ours`` False: not JSON, another format) may be someone else's: the advice is
    then to delete it by hand or point :data:`ENV_FILE` elsewhere, as :func:`clear` refuses
    to remove it."""

    def __init__(self, file: Path, problem: str, *, io: str | None = None, ours: bool = True):
        if io:  # the file is there and may be fine: another path is the way out
            super().__init__(f"{file}: the tuned-config file cannot be {io} ({problem}); set {ENV_FILE} to "
                             f"another path{'' if io == 'read' else ' this user can write'}")
        elif ours:
            super().__init__(f"{file}: not a valid tuned-config file ({problem}); clear it with "
                             f"`cupykern tune --clear` (or delete the file)")
        else:
            super().__init__(f"{file}: not a tuned-config file ({problem}); if it is a damaged one, delete it; "
                             f"else set {ENV_FILE} to another path")


class TunedFileWarning(UserWarning):
    """An invalid tuned file was ignored: the ops use the heuristics."""


def read(file: Path | None = None) -> dict[tuple, TunedEntry]:
    """Entries of ``file`` (default :func:`path`) by key; {} if it is missing.

    Raises:
        TunedFileError: the file cannot be read (a directory, no permission, not a regular
            file such as a FIFO or a device), is not JSON, has another format, or an entry
            is malformed (which entry, and what is missing or wrong).
    """
    file = Path(file) if file is not None else path()
    if file.exists() and not (file.is_file() or file.is_dir()):  # helper 76: reading a FIFO waited forever
        raise TunedFileError(file, "not a regular file", io="read")
    try:
        data = _tuned_data(file)
    except FileNotFoundError:
        return {}
    except OSError as exc:  # a directory, no permission
        raise TunedFileError(file, exc.strerror or str(exc), io="read") from None
    raw = data.get("entries", [])
    if not isinstance(raw, list):
        raise TunedFileError(file, f"'entries' is {_a_type(raw)}, expected a list")
    entries = []
    for i, d in enumerate(raw):
        if not isinstance(d, dict):
            raise TunedFileError(file, f"entry {i} is {_a_type(d)}, expected an object")
        try:
            entries.append(TunedEntry.from_json(d))
        except KeyError as exc:
            raise TunedFileError(file, f"entry {i} has no {exc.args[0]!r}") from None
        except (ValueError, TypeError, AttributeError, OverflowError) as exc:
            raise TunedFileError(file, f"entry {i}: {exc}") from None
    return {e.key: e for e in entries}


def _tuned_data(file: Path) -> dict:
    """``file`` parsed, TunedFileError (``ours`` False) unless UTF-8 text of a JSON object of
    :data:`FORMAT`; OSError as reading raises it (the callers say what they were doing)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:  # a ValueError: before json's
        raise TunedFileError(file, f"not UTF-8 text: {exc}", ours=False) from None
    except ValueError as exc:
        raise TunedFileError(file, f"not JSON: {exc}", ours=False) from None
    except RecursionError:  # arrays nested thousands deep
        raise TunedFileError(file, "not JSON this reader takes: nested too deep", ours=False) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise TunedFileError(file, f"format {got!r}, expected {FORMAT!r}", ours=False)
    return data


def load(file: Path | None = None) -> dict[tuple, TunedEntry]:
    """:func:`read`, but an invalid file is reported with a :class:`TunedFileWarning`
    naming it and treated as empty (the ops then use the heuristics)."""
    try:
        return read(file)
    except TunedFileError as exc:
        warnings.warn(f"cupykern: {exc}; using the heuristics meanwhile", TunedFileWarning, stacklevel=2)
        return {}


def save(entries, file: Path | None = None) -> Path:
    """Writes ``entries`` merged over the file's (an entry of the same key replaced)
    atomically, under a lock, so that processes saving at once (``sweep --tune`` on two
    GPUs of a host) each keep their entries; returns the path.

    Raises:
        TunedFileError: the file exists but is invalid (its entries are not dropped: clear
            it first), or it or its lock cannot be written (a directory, no permission).
        TypeError: an entry that is not a :class:`TunedEntry`.
    """
    entries = list(entries)
    strays = [e for e in entries if not isinstance(e, TunedEntry)]
    if strays:  # helper 76: save([1]) raised AttributeError from inside the merge
        raise TypeError(f"entries: expected TunedEntry objects, got {strays[0]!r}")
    file = _writable(file)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with _lock(file):
            merged = read(file)
            for entry in entries:
                merged[entry.key] = entry
            data = {"format": FORMAT, "entries": [merged[k].as_json() for k in sorted(merged)]}
            tmp = file.with_name(file.name + f".tmp{os.getpid()}")
            try:
                tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
                os.replace(tmp, file)
            finally:
                tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise TunedFileError(file, exc.strerror or str(exc), io="written") from None
    _forget()
    return file


def clear(file: Path | None = None) -> bool:
    """Removes the file (under :func:`save`'s lock, so a save at the same time cannot
    write back what it read before); True if there was one. TunedFileError if it cannot
    be removed (a directory, no permission), and, so that a mistyped :data:`ENV_FILE`
    deletes nothing else, if it is not a regular file or does not hold this format (a
    tuned file with bad entries is removed)."""
    file = _writable(file)
    _forget()
    if not file.exists():  # nothing to take a lock for (filelock would make the folder and the lock file)
        return False
    if not file.is_file():  # helper 71: a FIFO, or /dev/null itself, was unlinked
        raise TunedFileError(file, "not a regular file", io="removed")
    try:
        _tuned_data(file)  # before the lock, which would leave its file beside someone else's
        with _lock(file):
            file.unlink()
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise TunedFileError(file, exc.strerror or str(exc), io="removed") from None


def _writable(file: Path | None) -> Path:
    """``file`` (default :func:`path`), TunedFileError if it names an unknown user's home."""
    file = Path(file) if file is not None else path()
    unknown = user_cache.unknown_home(file)
    if unknown:
        raise TunedFileError(file, unknown, io="written")
    return file


def _lock(file: Path) -> filelock.FileLock:
    """The lock every writer of ``file`` holds: a file beside it."""
    return filelock.FileLock(file.with_name(file.name + ".lock"))


# ----------------------------------------------------------------- lookup (at planning time)
_cache: dict = {"loaded": False, "entries": {}}
_suspended = [0]
_subscribers: list = []


def subscribe(callback) -> None:
    """Calls ``callback()`` whenever what :func:`lookup` answers may have changed."""
    _subscribers.append(callback)


def _forget() -> None:
    _cache["loaded"] = False
    for callback in _subscribers:
        callback()


def reload() -> None:
    """Reads the file again at the next lookup (after it or its path changed outside this process)."""
    _forget()


def lookup(op: str, dtype_name: str, size: int, gpu: str) -> TunedEntry | None:
    """The entry for (op, dtype short name, row size, GPU name), or None.

    The file is parsed at the first lookup after import, :func:`save`, :func:`clear` or
    :func:`reload`.
    """
    if _suspended[0]:
        return None
    if not _cache["loaded"]:
        _cache["entries"] = load()
        _cache["loaded"] = True
    return _cache["entries"].get((gpu, op, dtype_name, int(size))) if _cache["entries"] else None


@contextmanager
def suspended():
    """No tuned entries are looked up inside (``sweep --tune`` measures the heuristic as is)."""
    _suspended[0] += 1
    _forget()
    try:
        yield
    finally:
        _suspended[0] -= 1
        _forget()
