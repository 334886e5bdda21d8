"""Every op of the registry once, on small inputs: the workload for compute-sanitizer.

    compute-sanitizer --tool memcheck python bench/sanitize.py
    compute-sanitizer --tool racecheck python bench/sanitize.py

Each op runs at 3 tokens and 1 token (--num-tokens: other counts; rows past half the
GPU's threads, e.g. 4096 of 4096 elements, reach the prefill layouts) in bf16 and fp32 (--dtypes) with its registry inputs
(rows, heads and cos/sin tables of the default sizes, and of the presets its registry
entry names for `cupykern check`: M-RoPE), plus misaligned and strided views
of the row ops, so the scalar tail and vector paths both run under the checker, and
prefill_attention on SmolLM2's heads with padding and shuffled positions. Exits 1
if an output disagrees with the float64 reference.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupykern  # noqa: E402
from bench.common import HELP_OPTIONS, dtype_list, model_names, positive_int_list, require_gpu  # noqa: E402
from cupykern import _dtypes, models, reference, validation  # noqa: E402
from cupykern.registry import all_specs  # noqa: E402


@click.command(help=__doc__.splitlines()[0], context_settings=HELP_OPTIONS)
@click.option("--families", default=None, help="Comma-separated families to run (default: all).")
@click.option("--num-tokens", "num_tokens_list", default="1,3", show_default=True, callback=positive_int_list,
              help="Token counts each op runs at (a prefill size, e.g. 4096, reaches the prefill layouts).")
@click.option("--dtypes", default="bf16,fp32", show_default=True, callback=dtype_list,
              help="Storage dtypes each op runs in, comma-separated (bf16, fp16, fp32).")
@click.option("--models", "extra_models", default=None, callback=model_names,
              help="More presets, comma-separated (e.g. smollm2-135m): each op also runs at their row sizes "
                   "(model-aware ops with their heads too), which can take other launch plans.")
def main(families, num_tokens_list, dtypes, extra_models) -> None:
    chosen = set(families.split(",")) if families else None
    known = {spec.family for spec in all_specs().values()}
    if chosen is not None and not chosen <= known:  # checked before the GPU is: a typo ran nothing
        raise click.BadParameter(f"unknown families {sorted(chosen - known)}; known: {sorted(known)}",
                                 param_hint="--families")
    require_gpu("sanitize.py", "runs every op")
    import cupy

    failures = 0
    # Each op with its default inputs, and with those of the presets `cupykern check` adds
    # (M-RoPE) and of --models, at the preset's row size.
    extra = [models.get(name) for name in extra_models or ()]
    cases = [(spec, spec.name, spec.check_sizes[0]) for spec in all_specs().values()]
    for spec in all_specs().values():
        # An op that takes no preset constants (softmax, layer_norm, row_reduce, the
        # activations, gemv, ...) runs once more for each row size the presets add to its
        # default, which can take another layout (softmax at 70b's 8192: 256 x 4).
        sizes = {spec.check_sizes[0]}
        for model in map(models.get, spec.check_models):
            cases.append((spec.for_model(model), f"{spec.name} ({model.name})", spec.size_for_model(model)))
        for model in extra:
            size = spec.size_for_model(model)
            if spec.model_aware or size not in sizes:
                sizes.add(size)
                cases.append((spec.for_model(model), f"{spec.name} ({model.name})", size))
    for spec, label, size in cases:
        if chosen is not None and spec.family not in chosen:
            continue
        if (why := spec.size_error(size)) is not None:  # e.g. attention at gemma-2's head_dim 256
            print(f"{label:20s} skipped: {why}")
            continue
        for dtype in dtypes:
            for num_tokens in num_tokens_list:
                if not spec.takes_tokens(num_tokens):
                    print(f"{label:20s} {num_tokens} tokens: skipped (takes at most {spec.max_tokens})")
                    continue
                result = validation.check_op(spec, num_tokens, size, dtype, seed=num_tokens)
                failures += not result.ok
                print(f"{label:20s} {_dtypes.short_name(dtype)} {num_tokens} tokens: {result.message}")
    rng = np.random.default_rng(0)
    for hidden in (5, 127, 1000) if chosen is None or "norm" in chosen else ():  # scalar tails, misaligned starts, strided rows
        wide = cupy.asarray(rng.standard_normal((3, hidden + 9)).astype(np.float32)).astype(_dtypes.bfloat16)
        x, w = wide[:, 1:1 + hidden], cupy.ones(hidden, dtype=_dtypes.bfloat16)
        result = validation.compare_array(cupykern.rms_norm(x, w), reference.rms_norm(x, w), _dtypes.bfloat16)
        failures += not result.ok
        print(f"rms_norm strided {hidden}: {result.message}")
    # prefill_attention beyond its registry inputs: GQA 3 and head_dim 64 (SmolLM2), a
    # partial last tile, shuffled and repeated positions, padding (-1) and positions past
    # the cache, q a view of a fused QKV buffer.
    for head_dim, heads, kv_heads in ((64, 9, 3), (128, 8, 2)) if chosen is None or "attention" in chosen else ():
        for dtype in (_dtypes.bfloat16, _dtypes.float32):
            qkv = cupy.asarray(rng.standard_normal((17, heads + 2 * kv_heads, head_dim)).astype(np.float32)).astype(dtype)
            q = qkv[:, :heads]
            k_cache, v_cache = (cupy.asarray(rng.standard_normal((40, kv_heads, head_dim)).astype(np.float32))
                                .astype(dtype) for _ in range(2))
            positions = cupy.asarray(np.r_[np.arange(20, 32), [-1, 3, 3, 39, 1000]].astype(np.int32))
            out = cupykern.prefill_attention(q, k_cache, v_cache, positions)
            want = reference.prefill_attention(q, k_cache, v_cache, positions)
            result = validation.compare_array(out, want, dtype)
            failures += not result.ok
            print(f"prefill_attention {head_dim} {heads}/{kv_heads} {_dtypes.short_name(dtype)}: {result.message}")
    cupy.cuda.Device().synchronize()
    print(f"{failures} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
