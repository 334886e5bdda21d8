"""prefill_attention beside decode_attention on a prompt's causal attention (GPU).

    python bench/bench_prefill_attention.py              # SmolLM2-135M and Llama-3.1-8B shapes, bf16
    python bench/bench_prefill_attention.py --variants   # also other (lanes per row, warps) choices

A prompt of num_tokens at positions 0 .. num_tokens - 1 over a cache of as many rows
(the model's prefill), one layer's call timed by CUDA-graph replay (warm L2: a layer's
cache is a few MB). Each variant is checked against the float64 reference (sampled
tokens) before it is timed; variants set plans.PREFILL_ATTENTION_LANES_PER_ROW and
PREFILL_ATTENTION_WARPS for the run (batch invariance holds within one choice).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupykern  # noqa: E402
from bench.common import DEFAULT_SEED, HELP_OPTIONS, require_gpu, save  # noqa: E402
from cupykern import _dtypes, environment, launcher, plans, reference, sweep, timing, validation  # noqa: E402

#: (label, num_tokens, num_heads, num_kv_heads, head_dim)
SHAPES = (("smollm2-135m", 512, 9, 3, 64), ("llama-3.1-8b", 512, 32, 8, 128), ("llama-3.1-8b", 2048, 32, 8, 128))
#: (lanes per row, warps) tried with --variants; those whose merge does not fit the
#: kernel's 32 KiB (its static_assert) are left out per head_dim.
VARIANTS = ((2, 4), (1, 4), (4, 4), (2, 8), (4, 8))


def _fits(lanes: int, warps: int, head_dim: int) -> bool:
    return warps * (32 // lanes) * head_dim <= 8192


@click.command(help=__doc__.splitlines()[0], context_settings=HELP_OPTIONS)
@click.option("--variants", is_flag=True, help="also time other (lanes per row, warps) choices")
@click.option("--dtype", "dtype_name", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True,
              help="dtype of q, the KV cache and out: bf16, fp16 or fp32 (those prefill_attention takes).")
@click.option("--seed", type=click.IntRange(min=0), default=DEFAULT_SEED, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the JSON here (it always goes to bench/results/).")
def main(variants, dtype_name, seed, out_dir) -> None:
    require_gpu("bench_prefill_attention.py", "times prefill_attention")
    import cupy

    dtype = _dtypes.parse(dtype_name)
    rng = np.random.default_rng(seed)
    points = []
    saved = plans.PREFILL_ATTENTION_LANES_PER_ROW, plans.PREFILL_ATTENTION_WARPS
    print(f"{'shape':34s} {'kernel':28s} {'us/call':>9s}  check")
    for label, n, heads, kv_heads, head_dim in SHAPES:
        def dev(shape):
            return cupy.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)

        q, k_cache, v_cache = dev((n, heads, head_dim)), dev((n, kv_heads, head_dim)), dev((n, kv_heads, head_dim))
        positions = cupy.arange(n, dtype=np.int32)
        out = cupy.empty_like(q)
        rows = validation.sample_rows(n)[:64]
        want = reference.prefill_attention(q[rows], k_cache, v_cache, positions[rows])
        shape = f"{label} {n}x{heads}/{kv_heads}x{head_dim}"
        runs = [("decode_attention", None)] + [(f"prefill lanes={lanes} warps={warps}", (lanes, warps))
                                               for lanes, warps in (VARIANTS if variants else VARIANTS[:1])
                                               if _fits(lanes, warps, head_dim)]
        for name, choice in runs:
            try:
                if choice is None:
                    def call():
                        cupykern.decode_attention(q, k_cache, v_cache, positions, out=out)
                else:
                    plans.PREFILL_ATTENTION_LANES_PER_ROW, plans.PREFILL_ATTENTION_WARPS = choice
                    launcher.clear_caches()

                    def call():
                        cupykern.prefill_attention(q, k_cache, v_cache, positions, out=out)
                out[...] = np.nan
                call()
                check = validation.compare_array(out[rows], want, dtype)
                t = timing.time_graph(call, ops_per_graph=20)
                print(f"{shape:34s} {name:28s} {t.median_us:9.1f}  {check.message}")
                points.append({"model": label, "num_tokens": n, "num_heads": heads, "num_kv_heads": kv_heads,
                               "head_dim": head_dim, "kernel": name, "median_us": t.median_us,
                               "check_ok": check.ok, "check": check.message})
            finally:
                plans.PREFILL_ATTENTION_LANES_PER_ROW, plans.PREFILL_ATTENTION_WARPS = saved
                launcher.clear_caches()
    result = {"format": sweep.RESULT_FORMAT, "suite": f"prefill_attention_{dtype_name}", "dtype": dtype_name,
              "seed": seed, "points": points, "environment": environment.describe()}
    print(f"wrote {save(result, Path(out_dir) if out_dir else None)}")


if __name__ == "__main__":
    main()
