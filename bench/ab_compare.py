"""Side by side: the times of `cupykern sweep` JSON files of one A/B (bench/ab.sh).

    python3 bench/ab_compare.py DIR base-a8,new-a8,new-a8again base-r8,new-r8

DIR holds the JSON files: the ``ab/`` of an unpacked ``$OUT/ab.tar.gz`` (bench/ab.sh).

Each comma-separated group is a table: one row per (op, dtype, num_tokens) point all its
files share, the median us of each file, the second's difference from the first, and
% of the same-run copy from 4096 tokens on. A point whose check failed is marked.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PREFILL_TOKENS = 4096  # from here on the sweep times cold L2 and % of copy means something


def load(folder: Path, name: str) -> tuple[dict, float]:
    """{(op, dtype, num_tokens): point} of ``folder/name.json`` and its copy GB/s."""
    document = json.loads((folder / f"{name}.json").read_text())
    return {(p["op"], p["dtype"], p["num_tokens"]): p for p in document["points"]}, document["copy_gbps"]


def table(folder: Path, names: list[str]) -> str:
    runs = [load(folder, name) for name in names]
    lines = ["== " + " vs ".join(f"{name} (copy {copy:.0f} GB/s)" for name, (_, copy) in zip(names, runs))]
    for key in runs[0][0]:
        points = [points.get(key) for points, _ in runs]
        if any(p is None for p in points):
            continue
        op, dtype, num_tokens = key
        times = " ".join(f"{p['median_us']:9.2f}" for p in points)
        delta = f" d={points[1]['median_us'] - points[0]['median_us']:+.3f}" if len(points) > 1 else ""
        copy = ("  " + " ".join(f"{p['pct_of_copy']:5.1f}%" for p in points)) if num_tokens >= PREFILL_TOKENS else ""
        failed = "" if all(p["check_ok"] for p in points) else "  CHECK FAILED"
        lines.append(f"{op:22s} {dtype:5s} {num_tokens:6d} {times}{delta}{copy}{failed}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    folder = Path(argv[0])
    print("\n".join(table(folder, group.split(",")) for group in argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
