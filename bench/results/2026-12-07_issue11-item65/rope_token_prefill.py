"""NOTES item 65: item 53's script with the far end (plans.ROPE_TOKEN_FAR_TO_TOKENS_PER_SM,
item 65) emptied in "lib" and kept as committed in "rule".

NOTES item 53: item 44's script with the 8-lane decode heads' own window end
(plans.ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM, item 53) emptied in "lib" beside the
window's, and kept as committed in "rule"; its variants (lib, rule, token_p, token_d,
liger), arguments (--sizes, --models, --band, --tag, --out) and output
(rope_token_prefill_<tag>.json) are item 44's, whose docstring
(bench/results/2026-12-05_issue11-item44_NVIDIA-H100/rope_token_prefill.py) describes them."""
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
from cupykern import jit, launcher, models, plans, timing  # noqa: E402
from cupykern.ops import rope as rope_ops  # noqa: E402
from cupykern.registry.rope import _rope_inputs  # noqa: E402

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
TAG = sys.argv[sys.argv.index("--tag") + 1] if "--tag" in sys.argv else "run"
LEAD = ("__nv_bfloat16", "float", "long long", True, 8)
THREADS_PER_HEAD, HEAD_SLOTS, TOKENS_PER_BLOCK = 22, 23, 24  # apply_rope kernels' argument indices


# "rule": --band N for both band ends, else the two as committed (12 and, since 357eef5, 16).
RULE = (int(sys.argv[sys.argv.index("--band") + 1]),) * 2 if "--band" in sys.argv \
    else (plans.ROPE_TOKEN_MAX_TOKENS_PER_SM, plans.ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM)
SIZES = tuple(int(n) for n in sys.argv[sys.argv.index("--sizes") + 1].split(",")) if "--sizes" in sys.argv \
    else (512, 768, 1024, 1536, 2048, 4096)
MODELS = tuple(sys.argv[sys.argv.index("--models") + 1].split(",")) if "--models" in sys.argv \
    else ("llama-3.1-8b", "llama-3.1-70b", "gemma-2-9b")


# The window (item 49) and the 8-lane decode heads' end (item 53) as committed: "rule" keeps
# them, "lib" empties them (from 1 to 1 tokens an SM).
WINDOW = (plans.ROPE_TOKEN_WINDOW_FROM_TOKENS_PER_SM, plans.ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM,
          plans.ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM)


def record(q, k, positions, cache, band_ends=(1, 1), window=(1, 1, 1), far=0):
    # Since 357eef5 (item 48) the band heads (70b's 6) have their own end, set here beside the
    # prefill heads' so that "lib" stays the wide kernel and --band reaches 70b too; since
    # item 49 the prefill heads' window as well (from 1 to 1 tokens an SM: empty).
    # variants.plan_constants plans again (the recipe of this shape was planned with the
    # other values) and puts the committed values back after.
    ends = dict(zip(("ROPE_TOKEN_MAX_TOKENS_PER_SM", "ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM",
                     "ROPE_TOKEN_WINDOW_FROM_TOKENS_PER_SM", "ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM",
                     "ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM", "ROPE_TOKEN_FAR_TO_TOKENS_PER_SM"),
                    (*band_ends, *window, far), strict=True))
    with variants.plan_constants(ends), launcher.recording() as launched:
        cupykern.apply_rope(q, k, positions, cache, check_positions=False)
    return launched[-1]


def token_args(args, threads_per_head, head_slots):
    return (*args[:THREADS_PER_HEAD], np.int32(threads_per_head), np.int32(head_slots), np.int32(1),
            *args[TOKENS_PER_BLOCK + 1:])


seed = 20261205
rng = np.random.default_rng(seed)
stream = cupy.cuda.Stream(non_blocking=True)
results = {"seed": seed, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "band": RULE,
           "window": WINDOW,
           "points": []}
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    for model_name in MODELS:
        model = models.get(model_name)
        num_heads = model.num_attention_heads + model.num_key_value_heads
        small = _rope_inputs(rng, 16, model.head_dim, cupykern.bfloat16, model=model)
        dec = record(small["q"], small["k"], small["positions"], small["cos_sin_cache"])
        if dec.template is not rope_ops.APPLY_ROPE_TOKEN:
            print(f"{model_name}: the decode plan is not the token kernel ({dec.template}): no token_d", flush=True)
            dec = None
        else:
            dec_tph, dec_slots = int(dec.args[THREADS_PER_HEAD]), int(dec.args[HEAD_SLOTS])
        del small
        for n in SIZES:
            i = _rope_inputs(rng, n, model.head_dim, cupykern.bfloat16, model=model)
            q, k, positions, cache = i["q"], i["k"], i["positions"], i["cos_sin_cache"]
            q0, k0 = q.copy(), k.copy()
            lib = record(q, k, positions, cache)
            rule = record(q, k, positions, cache, RULE, WINDOW, plans.ROPE_TOKEN_FAR_TO_TOKENS_PER_SM)
            fns = {"lib": lambda r=lib: r.kernel(r.grid, r.block, r.args),
                   "rule": lambda r=rule: r.kernel(r.grid, r.block, r.args)}
            regs = {"lib": lib.kernel.num_regs, "rule": rule.kernel.num_regs}
            heads = lib.plan.heads_per_thread
            slots = -(-num_heads // heads)
            lanes = lib.plan.threads_per_head
            if lib.template is rope_ops.APPLY_ROPE_WIDE and heads * slots == num_heads and heads in (2, 3, 5) \
                    and (slots * lanes) % 32 == 0 and slots * lanes <= 256:
                kp = jit.get_kernel(rope_ops.APPLY_ROPE_TOKEN, *LEAD, lanes, heads)
                fns["token_p"] = lambda f=kp, a=token_args(lib.args, lanes, slots), n=n, b=slots * lanes: \
                    f((n,), (b,), a)
                regs["token_p"] = kp.num_regs
            if dec is not None:
                fns["token_d"] = lambda f=dec.kernel, a=token_args(lib.args, dec_tph, dec_slots), n=n, b=dec.block: \
                    f((n,), b, a)
                regs["token_d"] = dec.kernel.num_regs
            outs = variants.outputs_from(fns, (q, k), (q0, k0))
            bitwise = {name: variants.same_bits(outs[name], outs["lib"]) for name in outs}
            fns["liger"] = variants.liger_rope_on_rows(q, k, cupy.ascontiguousarray(cache[positions]), model.head_dim)
            med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=30))
            results["points"].append({"model": model_name, "num_tokens": n, "lib_heads": heads,
                                      "lib_block": lib.block, "rule_token_kernel": rule.template is rope_ops.APPLY_ROPE_TOKEN,
                                      "rule_block": rule.block, "decode_block": dec and dec.block, "registers": regs,
                                      "bitwise": bitwise, "us": med})
            print(f"{model_name} {n}: lib {heads} heads block {lib.block}, rule token kernel "
                  f"{rule.template is rope_ops.APPLY_ROPE_TOKEN} block {rule.block}, decode block {dec and dec.block}; regs {regs} "
                  f"bitwise {bitwise}", flush=True)
            print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in med.items()), flush=True)
            del i, q, k, q0, k0, outs, fns
json.dump(results, open(os.path.join(OUT, f"rope_token_prefill_{TAG}.json"), "w"), indent=1)
