"""NOTES item 47: apply_rope's token kernel at more heads a thread than the plan's
choices, past the decode sizes. Item 42 traced what is left to Liger at 70b's 1024 tokens
to tokens an SM: Liger's program fits 9 (128 threads at 54-56 registers), the wide kernel
4 (128 threads at 112), the token kernel in the decode shape 5 (192 threads at 64). A
thread holding more heads carries its cos/sin (16 registers) over more data, so a token
takes fewer registers in all and more tokens fit an SM. Bare launches of
apply_rope_token_kernel with the library's recorded arguments, heads a thread h, slots =
heads / h, one token a block of slots x 8 lanes (a block need not be whole warps: the
kernel uses no shuffles and no barrier):
  lib      the plan as committed (at d12903b, call 1: 70b the wide kernel, 5 heads; 8b the
           token kernel in 5 heads from 528 to 1583 tokens, the wide kernel above; since
           3fd906d 70b's lib is the token kernel in 6 heads from 528 tokens, to 2111 since
           357eef5);
  tok<h>   the token kernel at h heads a thread (every h dividing the model's heads with
           32 to 256 threads a token);
  liger    LigerRopeFunction on fp32 cos/sin gathered before (bench/peers.py's form).
bf16, in place, cold L2, three interleaved rounds (bench/variants.py), one stream for
CuPy and torch; bits against lib's; registers and local memory as the kernel reports.
Seeded (numpy 20261205). --tag names the JSON (rope_heads_<tag>.json); --sizes and --models
replace the token counts and presets (after calls 1 and 4, which ran the defaults)."""
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
from cupykern.ops import rope as rope_ops  # noqa: E402
from cupykern.registry.rope import _rope_inputs  # noqa: E402

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
TAG = sys.argv[sys.argv.index("--tag") + 1] if "--tag" in sys.argv else "run"
LEAD = ("__nv_bfloat16", "float", "long long", True, 8)
LANES = 8  # head_dim 128, bf16 16-byte vectors: 64 / 8 units a head, one a lane
THREADS_PER_HEAD, HEAD_SLOTS, TOKENS_PER_BLOCK = 22, 23, 24  # apply_rope kernels' argument indices
# --sizes / --models (comma-separated) for the band's edge that NOTES item 47 leaves open;
# calls 1 and 4 ran the defaults.
SIZES = tuple(int(n) for n in sys.argv[sys.argv.index("--sizes") + 1].split(",")) if "--sizes" in sys.argv \
    else (256, 1024, 2048, 4096, 16384)
MODELS = tuple(sys.argv[sys.argv.index("--models") + 1].split(",")) if "--models" in sys.argv \
    else ("llama-3.1-70b", "llama-3.1-8b")


def record(q, k, positions, cache):
    launcher.clear_caches()
    with launcher.recording() as launched:
        cupykern.apply_rope(q, k, positions, cache, check_positions=False)
    return launched[-1]


def token_args(args, head_slots):
    return (*args[:THREADS_PER_HEAD], np.int32(LANES), np.int32(head_slots), np.int32(1),
            *args[TOKENS_PER_BLOCK + 1:])


seed = 20261205
rng = np.random.default_rng(seed)
stream = cupy.cuda.Stream(non_blocking=True)
results = {"seed": seed, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "sizes": SIZES, "points": []}
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    for model_name in MODELS:
        model = models.get(model_name)
        num_heads = model.num_attention_heads + model.num_key_value_heads
        heads_choices = [h for h in range(2, 11) if num_heads % h == 0 and 32 <= num_heads // h * LANES <= 256]
        kernels = {h: jit.get_kernel(rope_ops.APPLY_ROPE_TOKEN, *LEAD, LANES, h) for h in heads_choices}
        print(model_name, "registers / local bytes:",
              {h: (f.num_regs, f.local_size_bytes) for h, f in kernels.items()}, flush=True)
        for n in SIZES:
            i = _rope_inputs(rng, n, model.head_dim, cupykern.bfloat16, model=model)
            q, k, positions, cache = i["q"], i["k"], i["positions"], i["cos_sin_cache"]
            q0, k0 = q.copy(), k.copy()
            lib = record(q, k, positions, cache)
            fns = {"lib": lambda r=lib: r.kernel(r.grid, r.block, r.args)}
            regs = {"lib": lib.kernel.num_regs}
            for h, f in kernels.items():
                slots = num_heads // h
                fns[f"tok{h}"] = lambda f=f, a=token_args(lib.args, slots), n=n, b=slots * LANES: f((n,), (b,), a)
                regs[f"tok{h}"] = f.num_regs
            outs = {}
            for name in list(fns):
                q[...], k[...] = q0, k0
                fns[name]()
                outs[name] = (q.copy(), k.copy())
            bitwise = {name: variants.same_bits(outs[name], outs["lib"]) for name in outs}
            fns["liger"] = variants.liger_rope_on_rows(q, k, cupy.ascontiguousarray(cache[positions]), model.head_dim)
            med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=30))
            results["points"].append({"model": model_name, "num_tokens": n, "lib_template": lib.template.name,
                                      "lib_heads": lib.plan.heads_per_thread, "lib_block": lib.block,
                                      "registers": regs, "bitwise": bitwise, "us": med})
            print(f"{model_name} {n}: lib {lib.template.name} {lib.plan.heads_per_thread} heads block {lib.block}; "
                  f"regs {regs} bitwise {bitwise}", flush=True)
            print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in med.items()), flush=True)
            del i, q, k, q0, k0, outs, fns
json.dump(results, open(os.path.join(OUT, f"rope_heads_{TAG}.json"), "w"), indent=1)
