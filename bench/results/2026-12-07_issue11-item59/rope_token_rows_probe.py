"""NOTES item 59: what is left of phi-3-mini's RoPE gap to Liger once the tail is gone?
Item 58 (H100): apply_rope's token kernel at 4 heads a thread (10 blocks an SM) fits
792-1024 tokens in one wave, yet trails Liger there by 6.5-9.8 %. Item 57 found the
position -> cos/sin row chain was not phi's gap on the wide kernel, where the tail hid it;
with no tail it may be. Liger is timed on rows gathered before its call (bench/peers.py's
form), so it has no chain. Variants, each launched by hand from lib's recorded launch:

  lib        the plan (wide kernel, 5 heads a thread, random positions into the whole cache);
  token4/2   apply_rope_token_kernel at 4 / 2 heads a thread, a block per token (item 57's
             rope_token4_probe.py launch);
  token4/2o  the same launches, the kernels compiled as before item 59's fence (their q/k
             loads issued only once the position has arrived; item59_sources.before_fence);
  token4/2r  the same kernels compiled from rope.cu with the position read replaced by the
             token index (item 57's rope_rows_probe.py "tok" source), reading rows gathered
             before the call (cache[positions]): no chain, Liger's form;
  liger      Liger's RoPE on those rows.

In place, bf16, cold L2, medians of three rounds of 30 calls; every variant's bytes are
checked equal to lib's.

    python rope_token_rows_probe.py [--model phi-3-mini] [--sizes 528,...] [--tag T] [--out DIR]

Writes rope_token_rows_probe_<tag>.json (seed, device, commit, per point: each variant's
grid, block, registers, blocks an SM by the occupancy API, bits equal to lib, microseconds
per round)."""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cupykern  # noqa: E402
import item59_sources  # noqa: E402
from bench import variants  # noqa: E402
from cupykern import jit, launcher, models, timing  # noqa: E402
from cupykern.ops.rope import APPLY_ROPE_TOKEN, APPLY_ROPE_WIDE  # noqa: E402
from cupykern.registry.rope import _rope_inputs  # noqa: E402

OUT, TAG = variants.option("--out", os.environ.get("OUT", ".")), variants.option("--tag", "run")
MODEL = variants.option("--model", "phi-3-mini")
SIZES = tuple(int(n) for n in variants.option("--sizes", "528,660,792,800,924,1024,1188,1320,1584,2300,4092").split(","))
TOKEN_HEADS = (4, 2)
# apply_rope's arguments (ops/rope.py::_prepare_apply_rope): 6 pointers, 16 sizes, then
# threads_per_head, head_slots, tokens_per_block, copy_unrotated and 4 of M-RoPE.
POSITIONS, CACHE, NUM_TOKENS, MAX_POSITION = 4, 5, 6, 11
THREADS_PER_HEAD, HEAD_SLOTS, TOKENS_PER_BLOCK, NUM_ARGS = 22, 23, 24, 30
SOURCES = {"o": item59_sources.before_fence(), "r": item59_sources.by_token()}


def token_launch(r, heads, source=None, rows=None, order=None):
    """lib's wide launch ``r`` as apply_rope_token_kernel at ``heads`` a thread, a block a
    token: (kernel, grid, block, args), or None where the heads do not fill whole warps.
    ``source``: "o" or "r" (SOURCES), else the tree's kernel; with "r", ``rows``
    (cache[positions]) and ``order`` (arange), the kernel reading row ``token`` of
    ``rows`` in place of row ``positions[token]`` of the cache."""
    plan = r.plan
    num_heads = int(r.args[7]) + int(r.args[8])
    slots, lanes = num_heads // heads, plan.threads_per_head
    if num_heads % heads or (slots * lanes) % 32 or slots * lanes > 256:
        return None
    assert r.template == APPLY_ROPE_WIDE and len(r.args) == NUM_ARGS and r.args[0].data.ptr == r.args[2].data.ptr  # in place
    assert (int(r.args[THREADS_PER_HEAD]), int(r.args[HEAD_SLOTS]), int(r.args[TOKENS_PER_BLOCK])) == (
        plan.threads_per_head, plan.head_slots, plan.tokens_per_block)
    instantiation = (*variants.template_args(r.kernel)[:5], lanes, heads)
    args = list(r.args)
    args[HEAD_SLOTS], args[TOKENS_PER_BLOCK] = np.int32(slots), np.int32(1)
    if source is None:
        kernel = jit.get_kernel(APPLY_ROPE_TOKEN, *instantiation)
    else:
        kernel = item59_sources.kernel(SOURCES[source], APPLY_ROPE_TOKEN, instantiation)
    if source == "r":
        assert int(args[MAX_POSITION]) == r.args[CACHE].shape[0]
        args[POSITIONS], args[CACHE] = order, rows
        args[MAX_POSITION] = type(args[MAX_POSITION])(rows.shape[0])
    return kernel, (int(r.args[NUM_TOKENS]), 1, 1), (slots * lanes, 1, 1), tuple(args)


seed = 20261209
rng = np.random.default_rng(seed)
stream = cupy.cuda.Stream(non_blocking=True)
results = {"seed": seed, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "commit": os.environ.get("CUPYKERN_COMMIT", "?"), "model": MODEL, "points": []}
model = models.get(MODEL)
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    for n in SIZES:
        i = _rope_inputs(rng, n, model.head_dim, cupykern.bfloat16, model=model)
        q, k, positions, cache = i["q"], i["k"], i["positions"], i["cos_sin_cache"]
        q0, k0 = q.copy(), k.copy()
        rows = cupy.ascontiguousarray(cache[positions])
        order = cupy.arange(n, dtype=positions.dtype)
        with launcher.recording() as launched:
            cupykern.apply_rope(q, k, positions, cache, check_positions=False)
        r = launched[-1]
        assert r.args[POSITIONS] is positions and r.args[CACHE] is cache
        launches = {"lib": (r.kernel, r.grid, r.block, r.args)}
        if r.template == APPLY_ROPE_WIDE:
            for heads in TOKEN_HEADS:
                for suffix, extra in (("", {}), ("o", {"source": "o"}),
                                      ("r", {"source": "r", "rows": rows, "order": order})):
                    t = token_launch(r, heads, **extra)
                    if t is not None:
                        launches[f"token{heads}{suffix}"] = t
        fns = {name: (lambda kn=kn, g=g, b=b, a=a: kn(g, b, a)) for name, (kn, g, b, a) in launches.items()}
        outs = variants.outputs_from(fns, (q, k), (q0, k0))
        bitwise = {name: variants.same_bits(outs[name], outs["lib"]) for name in outs}
        fns["liger"] = variants.liger_rope_on_rows(q, k, rows, model.head_dim)
        med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=30))
        kernels = {name: {"grid": g, "block": b, "registers": kn.num_regs, "blocks_per_sm": jit.blocks_per_sm(kn, b[0])}
                   for name, (kn, g, b, a) in launches.items()}
        kernels["lib"]["template"] = r.template.name
        results["points"].append({"num_tokens": n, "kernels": kernels, "bitwise": bitwise, "us": med})
        print(f"{MODEL} {n}: " + "; ".join(f"{name} blk {v['block'][0]} r{v['registers']} {v['blocks_per_sm']}/SM"
                                           for name, v in kernels.items()) + f"; bitwise {bitwise}", flush=True)
        print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in med.items()), flush=True)
        del i, q, k, q0, k0, outs, fns, launches, rows, order
json.dump(results, open(os.path.join(OUT, f"rope_token_rows_probe_{TAG}.json"), "w"), indent=1)
