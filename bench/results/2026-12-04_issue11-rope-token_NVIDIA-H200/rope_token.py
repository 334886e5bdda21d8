"""NOTES item 39, call A: apply_rope's token kernel (rope.cu::apply_rope_token_kernel, in
place, one token a block, no token loop, no guards) against its wide kernel and Liger's
RoPE (cos/sin fp32 gathered before its timed call, the peers table's form), bf16, three
interleaved rounds; 1-64 tokens by graph replay, from 256 cold L2. Every variant's q and k
are compared bit for bit with the wide kernel's.
  wide     ROPE_TOKEN_HEADS = () (the kernel of 5fe4b27's peers run)
  token    the rule as committed (8b: 2 heads a thread at decode sizes, 5 above; 70b: 3 at
           decode sizes, its prefill shape of 5 heads is not full: the wide kernel)
  token5   8b at decode sizes with 5 heads a thread (64 threads a token)
  token2   8b at prefill sizes with 2 heads a thread (160 threads a token)
  wide3    70b at prefill sizes with 3 heads a thread in the wide kernel (192 threads)
  token3   70b at prefill sizes with 3 heads a thread in the token kernel
fp16: 8b at 4096 and 16384, wide against token.
"""
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import cupykern  # noqa: E402
from bench import peers, variants  # noqa: E402
from cupykern import launcher, models, timing  # noqa: E402
from cupykern.registry.rope import _rope_inputs  # noqa: E402

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
DECODE, PREFILL = (1, 16, 64), (256, 1024, 4096, 16384)
OFF = {"ROPE_TOKEN_HEADS": ()}
CASES = [  # (model, dtype, token counts, {variant: plan constants})
    ("llama-3.1-8b", cupykern.bfloat16, DECODE, {"wide": OFF, "token": {},
                                                  "token5": {"ROPE_WIDE_DECODE_HEADS_PER_THREAD": 5}}),
    ("llama-3.1-8b", cupykern.bfloat16, PREFILL, {"wide": OFF, "token": {},
                                                   "token2": {"ROPE_WIDE_HEADS_CHOICES": (2,), "ROPE_TOKEN_HEADS": (2,)}}),
    ("llama-3.1-70b", cupykern.bfloat16, DECODE, {"wide": OFF, "token": {}}),
    ("llama-3.1-70b", cupykern.bfloat16, PREFILL, {"wide": OFF, "wide3": {**OFF, "ROPE_WIDE_HEADS_CHOICES": (2, 3)},
                                                    "token3": {"ROPE_WIDE_HEADS_CHOICES": (2, 3), "ROPE_TOKEN_HEADS": (2, 3)}}),
    ("llama-3.1-8b", np.float16, (4096, 16384), {"wide": OFF, "token": {}}),
]

import torch  # noqa: E402  (after CuPy: both on the legacy default stream)

peers.enter_torch_graph_state(torch)
liger = peers._liger(torch)["apply_rope"]["cos/sin fp32"]
seed = 20261204
rng = np.random.default_rng(seed)
results = {"seed": seed, "copy_gbps": timing.copy_bandwidth(), "points": []}
print(f"copy {results['copy_gbps']:.0f} GB/s", flush=True)
for model_name, dtype, counts, constants in CASES:
    model = models.get(model_name)
    for n in counts:
        i = _rope_inputs(rng, n, 128, dtype, model=model)
        q0, k0 = i["q"].copy(), i["k"].copy()

        def rope(i=i):
            return cupykern.apply_rope(i["q"], i["k"], i["positions"], i["cos_sin_cache"], check_positions=False)

        fns = {name: variants.under(values, rope) for name, values in constants.items()}
        outputs, kernels = {}, {}
        for name, values in constants.items():
            i["q"][...], i["k"][...] = q0, k0
            with variants.plan_constants(values), launcher.recording() as launched:
                outputs[name] = tuple(a.copy() for a in rope())
            kernels[name] = f"{launched[-1].kernel.name} grid {launched[-1].grid} block {launched[-1].block}"
        bitwise = {name: variants.same_bits(outputs[name], outputs["wide"]) for name in fns}
        timer = timing.time_graph if n <= 64 else (lambda f: timing.time_cold(f, repeat=30))
        timers = dict.fromkeys(fns, timer)
        if dtype == cupykern.bfloat16:
            t = peers._torch_views(torch, i)
            liger.setup(t)
            fns["liger"] = lambda t=t: liger(t)
            timers["liger"] = (lambda f: peers._torch_graph_time(torch, f, 20)) if n <= 64 else timer
        medians = variants.time_rounds(fns, timers)
        point = {"model": model_name, "dtype": str(np.dtype(dtype)), "num_tokens": n, "bitwise": bitwise,
                 "us": medians, "launch": kernels}
        results["points"].append(point)
        print(f"{model_name} {np.dtype(dtype)} {n}: bitwise {bitwise}", flush=True)
        print("   " + "; ".join(f"{f}: {k}" for f, k in kernels.items()), flush=True)
        print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in medians.items()), flush=True)
        del i, q0, k0, outputs, fns
json.dump(results, open(os.path.join(OUT, "rope_token.json"), "w"), indent=1)
