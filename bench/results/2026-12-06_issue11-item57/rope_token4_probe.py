"""NOTES item 57 (written in session 43 without a device; first run owed): phi-3-mini's
RoPE tail (32 + 32 heads of 96, 6 lanes a head). From 528 tokens its plan is the wide
kernel at 5 heads a thread, 1-token blocks of 96 threads at 112 registers: 5 blocks an SM
(call 11), so 660 tokens a wave on an H100, and Liger leads by 17-18 % just past a wave.
apply_rope_token_kernel at 4 heads a thread (16 slots of 6 lanes, 96 threads, every head in
one round, as its launch contract asks) compiles to 64 registers (ptxas, sm_90): by the
register file 10 blocks an SM, twice the tokens a wave. Also at 2 heads (32 slots, 192
threads, 54 registers: 6 an SM). The planner never picks these at these sizes; they are
launched here by hand from lib's recorded launch (same arguments; head_slots and the grid
changed, a block per token), beside lib and Liger, in place, bf16, cold L2, medians of
three rounds of 30 calls. Each variant's bytes are checked equal to lib's.

    python rope_token4_probe.py [--model phi-3-mini] [--sizes 528,660,...] [--tag T] [--out DIR]

Writes rope_token4_probe_<tag>.json (seed, device, commit, per point: each variant's
kernel, grid, block, registers, blocks an SM by the occupancy API, bits equal to lib,
microseconds per round)."""
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
from cupykern.ops.rope import APPLY_ROPE_TOKEN, APPLY_ROPE_WIDE  # noqa: E402
from cupykern.registry.rope import _rope_inputs  # noqa: E402


OUT, TAG = variants.option("--out", os.environ.get("OUT", ".")), variants.option("--tag", "run")
MODEL = variants.option("--model", "phi-3-mini")
SIZES = tuple(int(n) for n in variants.option("--sizes", "528,660,792,1024,1320,1584,2300,4092,16384").split(","))
TOKEN_HEADS = (4, 2)  # heads a thread of the token kernels tried (each must divide the heads)
# apply_rope's scalars after its 6 pointers (ops/rope.py::_prepare_apply_rope): 16 sizes,
# then threads_per_head, head_slots, tokens_per_block, copy_unrotated and 4 of M-RoPE.
THREADS_PER_HEAD, HEAD_SLOTS, TOKENS_PER_BLOCK, NUM_ARGS = 22, 23, 24, 30


def token_launch(r, q, heads):
    """lib's wide launch ``r`` as apply_rope_token_kernel at ``heads`` a thread: (kernel,
    grid, block, args), or None where the heads do not divide into whole warps."""
    plan = r.plan
    num_heads = int(r.args[7]) + int(r.args[8])
    slots, lanes = num_heads // heads, plan.threads_per_head
    if num_heads % heads or (slots * lanes) % 32 or slots * lanes > 256:
        return None
    assert r.template == APPLY_ROPE_WIDE and len(r.args) == NUM_ARGS and r.args[0].data.ptr == q.data.ptr  # in place
    assert (int(r.args[THREADS_PER_HEAD]), int(r.args[HEAD_SLOTS]), int(r.args[TOKENS_PER_BLOCK])) == (
        plan.threads_per_head, plan.head_slots, plan.tokens_per_block)
    lead = variants.template_args(r.kernel)[:5]  # dtype, cache type, position type, is_neox, vec width
    kernel = jit.get_kernel(APPLY_ROPE_TOKEN, *lead, lanes, heads)
    args = list(r.args)
    args[HEAD_SLOTS], args[TOKENS_PER_BLOCK] = np.int32(slots), np.int32(1)
    return kernel, (int(r.args[6]), 1, 1), (slots * lanes, 1, 1), tuple(args)


seed = 20261208
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
        with launcher.recording() as launched:
            cupykern.apply_rope(q, k, positions, cache, check_positions=False)
        r = launched[-1]
        launches = {"lib": (r.kernel, r.grid, r.block, r.args)}
        if r.template == APPLY_ROPE_WIDE:
            for heads in TOKEN_HEADS:
                t = token_launch(r, q, heads)
                if t is not None:
                    launches[f"token{heads}"] = t
        fns = {name: (lambda kn=kn, g=g, b=b, a=a: kn(g, b, a)) for name, (kn, g, b, a) in launches.items()}
        outs = variants.outputs_from(fns, (q, k), (q0, k0))
        bitwise = {name: variants.same_bits(outs[name], outs["lib"]) for name in outs}
        fns["liger"] = variants.liger_rope_on_rows(q, k, cupy.ascontiguousarray(cache[positions]), model.head_dim)
        med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=30))
        kernels = {name: {"kernel": kn.name if hasattr(kn, "name") else str(kn), "grid": g, "block": b,
                          "registers": kn.num_regs, "blocks_per_sm": jit.blocks_per_sm(kn, b[0])}
                   for name, (kn, g, b, a) in launches.items()}
        kernels["lib"]["template"] = r.template.name
        results["points"].append({"num_tokens": n, "kernels": kernels, "bitwise": bitwise, "us": med})
        print(f"{MODEL} {n}: " + "; ".join(f"{name} blk {v['block'][0]} r{v['registers']} {v['blocks_per_sm']}/SM"
                                           for name, v in kernels.items()) + f"; bitwise {bitwise}", flush=True)
        print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in med.items()), flush=True)
        del i, q, k, q0, k0, outs, fns, launches
json.dump(results, open(os.path.join(OUT, f"rope_token4_probe_{TAG}.json"), "w"), indent=1)
