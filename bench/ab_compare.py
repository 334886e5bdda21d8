"""Side by side: the times of `cupykern sweep` JSON files of one A/B (bench/ab.sh).

    python3 bench/ab_compare.py DIR base-a8,new-a8,new-a8again base-r8,new-r8

DIR holds the JSON files: the ``ab/`` of an unpacked ``$OUT/ab.tar.gz`` (bench/ab.sh).
Each comma-separated group (names with or without ``.json``) is a table with a row per
point (op, dtype, size, num_tokens) every file of the group has: each file's median us
(3 decimals below 4096 tokens, where the differences that matter are hundredths), each
later file's difference from the first, and % of its run's copy from 4096 tokens on. A
point whose check failed is marked; points some file lacks (a sweep cut short) are
counted, files of different models named.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PREFILL_TOKENS = 4096  # from here on the sweep times cold L2 and % of copy means something


def load(folder: Path, name: str) -> dict:
    """The sweep document ``folder/name.json`` (``name`` with or without ``.json``)."""
    return json.loads((folder / f"{name.removesuffix('.json')}.json").read_text())


def _points(document: dict) -> dict:
    return {(p["op"], p["dtype"], p["size"], p["num_tokens"]): p for p in document["points"]}


def table(folder: Path, names: list[str]) -> str:
    documents = [load(folder, name) for name in names]
    runs = [_points(d) for d in documents]
    lines = ["== " + " | ".join(f"{i}: {name} ({d.get('model')}, copy {d['copy_gbps']:.0f} GB/s)"
                                for i, (name, d) in enumerate(zip(names, documents)))]
    models = {d.get("model") for d in documents}
    if len(models) > 1:
        lines.append(f"   files of different models: {sorted(map(str, models))}")
    shared = [key for key in runs[0] if all(key in run for run in runs[1:])]
    missing = len(set().union(*runs)) - len(shared)
    header = f"{'op':22s} {'dtype':5s} {'size':>6s} {'tokens':>6s} " + " ".join(f"{i:>9d}" for i in range(len(runs)))
    header += "".join(f"  {i}-0 (us)" for i in range(1, len(runs)))
    lines.append(header)
    for key in shared:
        points = [run[key] for run in runs]
        op, dtype, size, num_tokens = key
        digits = 3 if num_tokens < PREFILL_TOKENS else 2
        times = " ".join(f"{p['median_us']:9.{digits}f}" for p in points)
        deltas = "".join(f"  {p['median_us'] - points[0]['median_us']:+9.3f}" for p in points[1:])
        copy = ("  " + " ".join(f"{p['pct_of_copy']:5.1f}%" for p in points)) if num_tokens >= PREFILL_TOKENS else ""
        failed = "" if all(p["check_ok"] for p in points) else "  CHECK FAILED"
        lines.append(f"{op:22s} {dtype:5s} {size:6d} {num_tokens:6d} {times}{deltas}{copy}{failed}")
    if not shared:
        lines.append("   no point in every file")
    if missing:
        lines.append(f"   {missing} point(s) not in every file, left out")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    folder = Path(argv[0])
    try:
        print("\n".join(table(folder, group.split(",")) for group in argv[1:]))
    except (OSError, ValueError, KeyError) as exc:  # a missing or foreign file: one line, not a traceback
        print(f"ab_compare.py: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
