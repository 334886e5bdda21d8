"""Tuned launch configurations of the row kernels: the user cache file written by
``cupykern sweep --tune`` and read by :func:`cupykern.launch.plan_rows`.

One entry per (GPU name, op, dtype, row size) holds

* one row layout (``threads_per_row``, ``vec_width``, ``vecs_per_thread``), chosen over
  the whole num_tokens ladder, because the per-row reduction order must not depend on
  the batch (``vecs_per_thread`` only sizes the register cache, it does not change
  the order, but it is kept per entry too);
* ``rows_per_block`` per num_tokens bucket, which may vary with the batch.

File (JSON), at ``$CUPYKERN_TUNE_FILE`` if set, else ``$XDG_CACHE_HOME/cupykern/tuned.json``,
else ``~/.cache/cupykern/tuned.json``::

    {"format": "cupykern-tuned/1",
     "entries": [{"gpu": "NVIDIA H200", "op": "rms_norm", "dtype": "bf16", "size": 4096,
                  "threads_per_row": 128, "vec_width": 8, "vecs_per_thread": 4,
                  "rows_per_block": [[1, 1], [16, 1], ..., [16384, 2]],
                  "score": 1.02, "median_us": {"1": 2.1, ...}, "commit": "...", "date": "..."}]}

``rows_per_block`` lists ``[n, rows_per_block]`` for each ladder point n, ascending; a
batch of r rows takes the first bucket with ``r <= n`` (the last one beyond). An entry
whose ``vec_width`` > 1 applies to 16-byte aligned rows only (unaligned rows use the
heuristic). A missing or unreadable file means no entries. Pure Python, no GPU.

The file is read once per process (and again when the path changes); :func:`save`
and :func:`clear` update what this process sees.
"""

from __future__ import annotations

import json
import os
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

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
        median = d.get("median_us") or {}
        return TunedEntry(
            gpu=str(d["gpu"]), op=str(d["op"]), dtype=str(d["dtype"]), size=int(d["size"]),
            threads_per_row=int(d["threads_per_row"]), vec_width=int(d["vec_width"]),
            vecs_per_thread=int(d["vecs_per_thread"]),
            rows_per_block=tuple(sorted((int(n), int(r)) for n, r in d.get("rows_per_block") or ())),
            score=float(d.get("score", 0.0)),
            median_us=tuple(sorted((int(n), float(t)) for n, t in median.items())),
            commit=str(d.get("commit", "")), date=str(d.get("date", "")))


def path() -> Path:
    """Where the tuned file lives (see the module docstring)."""
    explicit = os.environ.get(ENV_FILE)
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "cupykern" / "tuned.json"


def load(file: Path | None = None) -> dict[tuple, TunedEntry]:
    """Entries of ``file`` (default :func:`path`) by key; {} if it is missing. An
    unreadable file is reported with a warning and treated as empty."""
    file = Path(file) if file is not None else path()
    try:
        text = file.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        warnings.warn(f"cupykern: cannot read tuned configs {file}: {exc}; using the heuristics", stacklevel=2)
        return {}
    try:
        data = json.loads(text)
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT!r}")
        entries = [TunedEntry.from_json(d) for d in data.get("entries", [])]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        warnings.warn(f"cupykern: ignoring unreadable tuned configs {file}: {exc}", stacklevel=2)
        return {}
    return {e.key: e for e in entries}


def save(entries, file: Path | None = None) -> Path:
    """Writes ``entries`` (merged over the file's: same key replaced) atomically; returns the path."""
    file = Path(file) if file is not None else path()
    merged = load(file)
    for entry in entries:
        merged[entry.key] = entry
    file.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "entries": [merged[k].as_json() for k in sorted(merged)]}
    tmp = file.with_name(file.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, file)
    _forget()
    return file


def clear(file: Path | None = None) -> bool:
    """Removes the file; True if there was one."""
    file = Path(file) if file is not None else path()
    _forget()
    try:
        file.unlink()
        return True
    except FileNotFoundError:
        return False


# ----------------------------------------------------------------- lookup (per op call)
_cache: dict = {"key": None, "entries": {}, "generation": 0}
_suspended = [0]


def _forget() -> None:
    _cache["key"] = None
    _cache["generation"] += 1


def state() -> tuple:
    """What :func:`lookup`'s answers depend on besides its arguments: equal states give
    equal answers (callers key caches of plans on it)."""
    return (_suspended[0], os.environ.get(ENV_FILE), os.environ.get("XDG_CACHE_HOME"), _cache["generation"])


def lookup(op: str, dtype_name: str, size: int, gpu: str) -> TunedEntry | None:
    """The entry for (op, dtype short name, row size, GPU name), or None.

    Cheap after the first call: the file is parsed once per path; ``CUPYKERN_TUNE_FILE``
    and ``XDG_CACHE_HOME`` are re-read each call so that a changed path takes effect.
    """
    if _suspended[0]:
        return None
    key = (os.environ.get(ENV_FILE), os.environ.get("XDG_CACHE_HOME"))
    if _cache["key"] != key:
        _cache["entries"] = load()
        _cache["key"] = key
    return _cache["entries"].get((gpu, op, dtype_name, int(size))) if _cache["entries"] else None


@contextmanager
def suspended():
    """No tuned entries are looked up inside (``sweep --tune`` measures the heuristic as is)."""
    _suspended[0] += 1
    try:
        yield
    finally:
        _suspended[0] -= 1


# ----------------------------------------------------------------- choosing (sweep --tune)
@dataclass(frozen=True)
class Measured:
    """One validated timing of a configuration: what :func:`choose` ranks."""

    threads_per_row: int
    vec_width: int
    vecs_per_thread: int
    rows_per_block: int
    num_tokens: int
    median_us: float


def choose(measured, ladder, *, gpu: str, op: str, dtype: str, size: int, commit: str = "",
           date: str = "") -> TunedEntry | None:
    """The entry for one (op, dtype, size) from validated timings, or None.

    A layout competes only if it was measured (and validated) at every num_tokens of
    ``ladder``. Its score is the mean over the ladder of its time (with its best
    rows_per_block) divided by the fastest time of any configuration at that
    num_tokens, so decode and prefill sizes weigh alike; the lowest score wins (ties:
    lowest total time), and its fastest rows_per_block is kept per num_tokens.
    """
    ladder = sorted(set(int(n) for n in ladder))
    best_at: dict = {}
    per_layout: dict = {}
    for m in measured:
        if m.num_tokens not in ladder:
            continue
        layout = (m.threads_per_row, m.vec_width, m.vecs_per_thread)
        best_at[m.num_tokens] = min(best_at.get(m.num_tokens, float("inf")), m.median_us)
        slot = per_layout.setdefault(layout, {})
        if m.num_tokens not in slot or m.median_us < slot[m.num_tokens][0]:
            slot[m.num_tokens] = (m.median_us, m.rows_per_block)
    ranked = []
    for layout, slot in per_layout.items():
        if set(slot) != set(ladder):
            continue
        score = sum(slot[n][0] / best_at[n] for n in ladder) / len(ladder)
        ranked.append((score, sum(slot[n][0] for n in ladder), layout))
    if not ranked:
        return None
    score, _, layout = min(ranked)
    slot = per_layout[layout]
    return TunedEntry(gpu=gpu, op=op, dtype=dtype, size=int(size), threads_per_row=layout[0], vec_width=layout[1],
                      vecs_per_thread=layout[2], rows_per_block=tuple((n, slot[n][1]) for n in ladder),
                      score=round(score, 4), median_us=tuple((n, round(slot[n][0], 3)) for n in ladder),
                      commit=commit, date=date)


def _pow2_range(lo: int, hi: int) -> list[int]:
    out, v = [], 1
    while v <= hi:
        if v >= lo:
            out.append(v)
        v *= 2
    return out


def candidate_configs(size: int, vec_width: int, *, threads_choices, vecs_choices, min_block: int = 128,
                      max_block_of=lambda t: max(t, 256), warp_size: int = 32) -> list[dict]:
    """The default ``--tune`` search space for rows of ``size`` read ``vec_width`` at a time.

    threads_per_row from the fewest that keep at most 32 vectors per thread to the most
    that still give each thread one; vecs_per_thread up to what the row needs; and
    rows_per_block giving blocks of ``min_block`` (the heuristic's) and 256 threads.
    Every dict has the four override keys.
    """
    num_vecs = max(1, -(-size // vec_width))
    next_pow2 = 1 << max(0, (num_vecs - 1).bit_length())
    lo = max(1, 1 << max(0, (-(-num_vecs // 32) - 1).bit_length()))
    configs = []
    for t in _pow2_range(lo, next_pow2):
        if t not in threads_choices:
            continue
        needed = 1 << max(0, (-(-num_vecs // t) - 1).bit_length())
        vecs = [v for v in vecs_choices if v <= max(needed, min(vecs_choices))]
        blocks = sorted({b for b in (min_block, 256, t) if b >= t and b % warp_size == 0 and b <= max_block_of(t)})
        for v in vecs:
            for b in blocks:
                configs.append(dict(threads_per_row=t, vec_width=vec_width, vecs_per_thread=v, rows_per_block=b // t))
    return configs
