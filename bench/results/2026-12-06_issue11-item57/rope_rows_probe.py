"""NOTES item 57: is apply_rope's gap to Liger on phi-3-mini and smollm2-135m (item 56:
3-15 %) the dependent position -> cos/sin row load? The plan's launch ("lib": random
positions into the whole cos_sin_cache, as every other bench times it) beside:

  rows  the same kernel and launch, reading rows gathered before the call (cache[positions],
        contiguous, num_tokens rows) through positions = arange(num_tokens): the position
        load stays, the rows are the token's own and in order;
  tok   the same rows, and the kernel source with every ``positions[token * positions_stride]``
        read replaced by ``token`` (compiled here from jit.source, same instantiation): no
        position load at all, Liger's form as bench/peers.py and item 56 time it;
  liger Liger's RoPE on the same rows (bench/variants.liger_rope_on_rows).

In place, bf16, cold L2, medians of three rounds of 30 calls. Every variant's bytes are
checked equal to lib's (rows[t] = cache[positions[t]], so the same math on the same values).

    python rope_rows_probe.py [--models phi-3-mini,smollm2-135m] [--sizes 16,64,528,...] [--tag T] [--out DIR]

Writes rope_rows_probe_<tag>.json (seed, device, per point: lib's template, plan, block,
grid, registers, blocks an SM by the occupancy API, bits equal to lib, microseconds per
round)."""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import cupykern  # noqa: E402
from bench import variants  # noqa: E402
from cupykern import jit, launcher, models, timing  # noqa: E402
from cupykern.registry.rope import _rope_inputs  # noqa: E402


def arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


OUT, TAG = arg("--out", os.environ.get("OUT", ".")), arg("--tag", "run")
MODELS = arg("--models", "phi-3-mini,smollm2-135m").split(",")
SIZES = tuple(int(n) for n in arg("--sizes", "16,64,528,1024,2300,4092,16384").split(","))
POSITION_READ = "static_cast<int64_t>(positions[token * positions_stride])"
# apply_rope_kernel, apply_rope_wide_kernel and apply_rope_token_kernel read it so (the
# qk kernels' reads sit behind in_range and change too; they are not launched here).
TOKEN_SOURCE = jit.source("rope.cu").replace(POSITION_READ, "static_cast<int64_t>(token)")
assert jit.source("rope.cu").count(POSITION_READ) >= 3, "rope.cu's position read changed: update POSITION_READ"


def instantiation(kernel):
    """The template arguments jit compiled ``kernel`` with (its cache's key)."""
    return next(key[2] for key, value in jit._kernels.items() if value is kernel)


def token_kernel(template, args):
    expr = template.expr(*args)
    return cupy.RawModule(code=TOKEN_SOURCE, options=jit.COMPILE_OPTIONS, name_expressions=[expr]).get_function(expr)


def with_rows(args, positions, cache, rows, order):
    """lib's arguments reading ``rows`` through ``order`` (arange) instead of ``cache``
    through ``positions``; max_position (the scalar after rotary_dim) set to the rows'
    count. Same cache_stride: both are contiguous rows of rotary_dim."""
    out = list(args)
    i_pos = next(i for i, a in enumerate(out) if a is positions)
    i_cache = next(i for i, a in enumerate(out) if a is cache)
    i_max = i_cache + 6  # num_tokens, q heads, kv heads, head_dim, rotary_dim, max_position
    assert int(out[i_max]) == cache.shape[0], (out[i_max], cache.shape)
    out[i_pos], out[i_cache], out[i_max] = order, rows, type(out[i_max])(rows.shape[0])
    return tuple(out)


seed = 20261207
rng = np.random.default_rng(seed)
stream = cupy.cuda.Stream(non_blocking=True)
results = {"seed": seed, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "commit": os.environ.get("CUPYKERN_COMMIT", "?"), "points": []}
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    for model_name in MODELS:
        model = models.get(model_name)
        for n in SIZES:
            i = _rope_inputs(rng, n, model.head_dim, cupykern.bfloat16, model=model)
            q, k, positions, cache = i["q"], i["k"], i["positions"], i["cos_sin_cache"]
            q0, k0 = q.copy(), k.copy()
            rows = cupy.ascontiguousarray(cache[positions])
            order = cupy.arange(n, dtype=positions.dtype)
            with launcher.recording() as launched:
                cupykern.apply_rope(q, k, positions, cache, check_positions=False)
            r = launched[-1]
            tok = token_kernel(r.template, instantiation(r.kernel))
            rows_args = with_rows(r.args, positions, cache, rows, order)
            fns = {"lib": lambda: r.kernel(r.grid, r.block, r.args),
                   "rows": lambda: r.kernel(r.grid, r.block, rows_args),
                   "tok": lambda: tok(r.grid, r.block, rows_args)}
            outs = variants.outputs_from(fns, (q, k), (q0, k0))
            bitwise = {name: variants.same_bits(outs[name], outs["lib"]) for name in outs}
            fns["liger"] = variants.liger_rope_on_rows(q, k, rows, model.head_dim)
            med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=30))
            point = {"model": model_name, "num_tokens": n, "template": r.template.name,
                     "instantiation": [str(a) for a in instantiation(r.kernel)],
                     "heads_per_thread": r.plan.heads_per_thread, "tokens_per_block": r.plan.tokens_per_block,
                     "block": r.block, "grid": r.grid, "registers": {"lib": r.kernel.num_regs, "tok": tok.num_regs},
                     "blocks_per_sm": jit.blocks_per_sm(r.kernel, r.block[0]),
                     "bitwise": bitwise, "us": med}
            results["points"].append(point)
            print(f"{model_name} {n}: {r.template.name} {r.plan.heads_per_thread}h {r.plan.tokens_per_block}t "
                  f"blk {r.block[0]} grid {r.grid[0]} r{r.kernel.num_regs}/{tok.num_regs} "
                  f"{point['blocks_per_sm']} blocks an SM; bitwise {bitwise}", flush=True)
            print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in med.items()), flush=True)
            del i, q, k, q0, k0, outs, fns, rows, order
json.dump(results, open(os.path.join(OUT, f"rope_rows_probe_{TAG}.json"), "w"), indent=1)
