"""Benchmark of the RoPE family (issue 3's table; --variants: issue 11's layouts).

apply_rope and qk_rms_norm_rope at num_tokens 1, 64, 1024, 16384 with 32 q heads,
8 kv heads, head_dim 128, random positions, bf16; apply_rope beside a plain-CuPy
composition, qk_rms_norm_rope beside the split "rms_norm then apply_rope".

    python bench/bench_rope.py [--out DIR] [--seed S]
    python bench/bench_rope.py --variants [--out DIR] [--seed S]

--variants times both ops at 1, 16, 64, 4096 and 16384 tokens for the llama-3.1-8b
preset in bf16 under each plan-constant set of VARIANTS (the "steps" kernels of
before, the wide ones and their choices), each point checked against the float64
reference before it is timed (sweep.measure: graph replay below 256 tokens, cold-L2
events above), with % of a device-to-device copy measured at the start of the same run;
writes bench/results/<date>_rope-variants_<gpu>_<commit>.json with the seed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DEFAULT_SEED, HELP_OPTIONS, command, require_gpu, save  # noqa: E402

CASES = [(op, n, 128, "bf16") for op in ("apply_rope", "qk_rms_norm_rope") for n in (1, 64, 1024, 16384)]

#: (name, plan constants of cupykern/plans.py) compared by --variants.
VARIANTS = (
    ("steps", {"ROPE_LAYOUT": "steps"}),
    ("wide", {"ROPE_LAYOUT": "wide"}),
    ("wide-2-heads", {"ROPE_LAYOUT": "wide", "ROPE_WIDE_HEADS_CHOICES": (2,), "ROPE_WIDE_NORM_HEADS_PER_THREAD": 2}),
    ("wide-4-heads", {"ROPE_LAYOUT": "wide", "ROPE_WIDE_HEADS_CHOICES": (4,), "ROPE_WIDE_HEADS_PER_THREAD": 4,
                      "ROPE_WIDE_DECODE_HEADS_PER_THREAD": 4}),
    ("wide-waves-swapped", {"ROPE_LAYOUT": "wide", "ROPE_WIDE_GRID_WAVES": 2, "ROPE_WIDE_NORM_GRID_WAVES": 0}),
)
VARIANT_TOKENS = (1, 16, 64, 4096, 16384)
VARIANT_MODEL = "llama-3.1-8b"


def run_variants(seed: int, out_dir: Path | None) -> int:
    from rich.console import Console
    from rich.table import Table

    from cupykern import environment, launcher, models, plans, sweep, timing
    from cupykern.registry import all_specs

    console = Console(width=160)
    specs, model, env = all_specs(), models.get(VARIANT_MODEL), environment.describe()
    copy_gbps = timing.copy_bandwidth()
    console.print(f"rope variants on {env.get('gpu')}: device-to-device copy {copy_gbps:.0f} GB/s (same run)")
    points, rows, ok = [], [], True
    for name, constants in VARIANTS:
        saved = {k: getattr(plans, k) for k in constants}
        try:
            for k, v in constants.items():
                setattr(plans, k, v)
            launcher.clear_caches()
            for op in ("apply_rope", "qk_rms_norm_rope"):
                for n in VARIANT_TOKENS:
                    point = sweep.measure(specs[op], n, model.head_dim, "bf16", seed=seed, copy_gbps=copy_gbps,
                                          model=model, impl=f"cupykern {name}")
                    points.append(point)
                    ok = ok and point.check_ok
                    rows.append((name, op, n, point))
        finally:
            for k, v in saved.items():
                setattr(plans, k, v)
            launcher.clear_caches()
    table = Table(title=f"rope variants, {VARIANT_MODEL} bf16: copy {copy_gbps:.0f} GB/s, seed {seed}")
    for column in ("variant", "op", "tokens", "median us", "% copy", "timing", "grid", "block", "check"):
        table.add_column(column)
    for name, op, n, p in rows:
        table.add_row(name, op, str(n), f"{p.median_us:.2f}", f"{p.pct_of_copy:.1f}", p.method, str(p.grid),
                      str(p.block_size), "ok" if p.check_ok else f"[red]{p.check}[/]")
    console.print(table)
    result = sweep.result_document("rope-variants", environment=env, seed=seed, copy_gbps=copy_gbps, points=points,
                                   model=VARIANT_MODEL,
                                   variants=[{"name": name, "constants": constants} for name, constants in VARIANTS])
    console.print(f"saved {save(result, out_dir)}")
    return 0 if ok else 1


@click.command(help=__doc__.splitlines()[0], context_settings=HELP_OPTIONS)
@click.option("--variants", is_flag=True, help="time the layouts of VARIANTS instead of the usual table")
@click.option("--seed", type=click.IntRange(min=0), default=DEFAULT_SEED, show_default=True,
              help="seed of the inputs")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None, help="also write the JSON here")
@click.pass_context
def main(ctx, variants, seed, out):
    if not variants:
        ctx.invoke(command("rope", __doc__.splitlines()[0], CASES), out=out, seed=seed)
        return
    require_gpu("the rope bench")
    sys.exit(run_variants(seed, out))


if __name__ == "__main__":
    main()
