"""Shared bench driver: run cases through cupykern.measure, print a rich table, save JSON.

A case is (op name, num_tokens, size, dtype). Each is checked against the float64
reference, then timed (graph replay for decode sizes, cold-L2 events otherwise),
beside the plain-CuPy composition of the same math when one exists, and beside a
device-to-device copy measured at the start of the same run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compositions import COMPOSITIONS, LABELS  # noqa: E402
from cupykern import environment, measure, timing  # noqa: E402
from cupykern.registry import all_specs  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEFAULT_SEED = 20261129


def run_cases(name: str, cases, *, seed: int = DEFAULT_SEED, out_dir: Path | None = None,
              compositions=COMPOSITIONS) -> dict:
    """Measures every case; returns and saves {"environment", "copy_gbps", "points"}."""
    console = Console(width=160)
    specs = all_specs()
    env = environment.describe()
    copy_gbps = timing.copy_bandwidth()
    console.print(f"[bold]{name}[/] on {env.get('gpu')}: device-to-device copy {copy_gbps:.0f} GB/s (same run)")
    points = []
    for op, num_tokens, size, dtype in cases:
        spec = specs[op]
        impls = [("cupykern", None)]
        if op in compositions:
            impls.append((LABELS.get(op, "cupy composition"), compositions[op]))
        for impl, run in impls:
            point = measure.measure(spec, num_tokens, size, dtype, seed=seed, copy_gbps=copy_gbps, impl=impl, run=run)
            points.append(point)
            if not point.check_ok:
                console.print(f"[red]CHECK FAILED[/] {op} {impl} {num_tokens}x{size} {dtype}: {point.check}")
    result = {"suite": name, "seed": seed, "environment": env, "copy_gbps": copy_gbps,
              "points": [p.as_dict() for p in points]}
    print_table(console, result)
    save(result, out_dir)
    return result


def print_table(console: Console, result: dict) -> None:
    table = Table(title=f"{result['suite']}: copy {result['copy_gbps']:.0f} GB/s, seed {result['seed']}")
    for column in ("op", "impl", "tokens", "size", "dtype", "median us", "GB/s", "% copy", "timing", "check"):
        table.add_column(column, justify="right" if column not in ("op", "impl", "timing", "check") else "left")
    for p in result["points"]:
        check = "[green]ok[/]" if p["check_ok"] else f"[red]{p['check']}[/]"
        table.add_row(p["op"], p["impl"], str(p["num_tokens"]), str(p["size"]), p["dtype"], f"{p['median_us']:.2f}",
                      f"{p['gbps']:.0f}", f"{p['pct_of_copy']:.1f}", p["method"], check)
    console.print(table)


def save(result: dict, out_dir: Path | None) -> Path:
    env = result["environment"]
    gpu = str(env.get("gpu", "nogpu")).replace(" ", "-")
    name = f"{env['date'][:10]}_{result['suite']}_{gpu}_{env['commit']}.json"
    for folder in {RESULTS_DIR, *( [out_dir] if out_dir else [])}:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(result, indent=1))
    return RESULTS_DIR / name


def exit_code(result: dict) -> int:
    return 0 if all(p["check_ok"] for p in result["points"]) else 1


def main(name: str, description: str, cases, quick_cases=None) -> None:
    """Command line of a bench script: ``[--out DIR] [--seed S] [--quick]``; exits 1 on a failed check."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    if quick_cases is not None:
        parser.add_argument("--quick", action="store_true", help="the smaller case list")
    args = parser.parse_args()
    if not environment.gpu_available():
        parser.exit(2, f"{name} bench times kernels and needs a CUDA GPU; none is visible (try `cupykern check`)\n")
    chosen = quick_cases if getattr(args, "quick", False) else cases
    sys.exit(exit_code(run_cases(name, list(chosen), seed=args.seed, out_dir=args.out)))
