"""NOTES item 54: item 53's script (below) with one addition: a preset named
``<preset>@<H>`` is that preset with H heads in all (q heads H - kv heads), so that shapes
of no preset whose decode heads fill the token kernel at 8 lanes (48, 96, 160 heads of 128)
are timed in the window's 8-lane end. Item 53's text follows.

NOTES item 53: item 44's script (below) with the 8-lane decode heads' own window end
(plans.ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM, item 53) emptied in "lib" beside the
window's, and kept as committed in "rule". Item 44's text follows.

NOTES item 44 (item 43's call 3, extended): apply_rope's token kernel (no token loop,
no guards, a block per token) past the decode sizes, where the plan took it below
ROPE_MIN_TOKENS_PER_SM x SMs = 528 tokens on 132 SMs. Bare launches of the library's
kernels with the library's recorded arguments (bf16, in place, cold L2, three interleaved
rounds, one stream for CuPy and torch; bits against the library's):
  lib      the plan without item 44's rule (plans.ROPE_TOKEN_MAX_TOKENS_PER_SM = 1):
           apply_rope_wide_kernel (5 heads a thread for llama-3.1-8b and -70b, 3 for
           gemma-2-9b; at 512 tokens the decode plan's token kernel);
  rule     the plan with the constant as committed (8 when the runs a and b were made, at
           a2301bc; 12 since, whose 1536-token point launches token_p's kernel);
  token_p  apply_rope_token_kernel with the plan's heads a thread, where its launch
           contract holds (8b: 5 heads, 8 slots, 64 threads a token; gemma: 3 heads, 16
           lanes; 70b's 72 heads do not split into 5s);
  token_d  apply_rope_token_kernel as the decode plan launches it (recorded at 16 tokens);
  liger    LigerRopeFunction on fp32 cos/sin gathered before (bench/peers.py's form).
llama-3.1-8b, -70b and gemma-2-9b (head_dim 256) at 512-4096 tokens. Seeded (numpy
20261205). Against item 43's script: 768 and 1536 tokens and gemma added, 8192 dropped, the
"rule" column, and --tag names the JSON (rope_token_prefill_<tag>.json), so that two runs
in one call can be compared. --sizes and --models (comma-separated) replace the token counts
and presets, --band N the "rule" column's ROPE_TOKEN_MAX_TOKENS_PER_SM (NOTES item 48's band
edge; the runs before it used the defaults) and, since 357eef5, ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM
with it ("lib" sets both to 1; without --band "rule" has both as committed). Since item 49
"lib" also empties the prefill heads' window, which "rule" keeps as committed."""
import dataclasses
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


def record(q, k, positions, cache, band_ends=(1, 1), window=(1, 1, 1)):
    # Since 357eef5 (item 48) the band heads (70b's 6) have their own end, set here beside the
    # prefill heads' so that "lib" stays the wide kernel and --band reaches 70b too; since
    # item 49 the prefill heads' window as well (from 1 to 1 tokens an SM: empty).
    plans.ROPE_TOKEN_MAX_TOKENS_PER_SM, plans.ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM = band_ends
    (plans.ROPE_TOKEN_WINDOW_FROM_TOKENS_PER_SM, plans.ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM,
     plans.ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM) = window
    launcher.clear_caches()  # the recipe of this shape was planned with the other value
    with launcher.recording() as launched:
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
        preset, _, total_heads = model_name.partition("@")
        model = models.get(preset)
        if total_heads:  # item 54: the same preset with other heads
            model = dataclasses.replace(model, num_attention_heads=int(total_heads) - model.num_key_value_heads)
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
            rule = record(q, k, positions, cache, RULE, WINDOW)
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
            outs = {}
            for name in list(fns):
                q[...], k[...] = q0, k0
                fns[name]()
                outs[name] = (q.copy(), k.copy())
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
