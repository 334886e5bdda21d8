"""NOTES item 39, call B (bf16, three interleaved rounds).
(1) qk_rms_norm_rope at decode sizes (graph replay): its token kernel launched bare with the
    wide kernel's recorded arguments (same signature; at 1-64 tokens the wide plan has one
    token a block and every slot full for llama-3.1-8b's 2 heads a thread and -70b's 3)
    against the wide kernel launched bare the same way, and the library call; q and k
    compared bit for bit.
(2) apply_rope at 1024-16384 tokens (cold L2) with the registry's random positions against
    consecutive ones (0 .. n-1, as a prefill's), and Liger's RoPE with cos/sin gathered at
    either (before its timed call): is the gap to Liger the gather of random cache rows?
"""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import cupykern  # noqa: E402
from bench import peers, variants  # noqa: E402
from cupykern import jit, launcher, models, timing  # noqa: E402
from cupykern.ops import rope as rope_ops  # noqa: E402
from cupykern.registry.rope import _rope_inputs  # noqa: E402

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
MODELS = ("llama-3.1-8b", "llama-3.1-70b")

import torch  # noqa: E402

peers.enter_torch_graph_state(torch)
liger = peers._liger(torch)["apply_rope"]["cos/sin fp32"]
seed = 20261205
rng = np.random.default_rng(seed)
results = {"seed": seed, "copy_gbps": timing.copy_bandwidth(), "qk_decode": [], "rope_positions": []}
print(f"copy {results['copy_gbps']:.0f} GB/s", flush=True)

for model_name in MODELS:
    model = models.get(model_name)
    for n in (1, 16, 64):
        i = _rope_inputs(rng, n, 128, cupykern.bfloat16, with_weights=True, model=model)
        q0, k0 = i["q"].copy(), i["k"].copy()

        def qk(i=i):
            return cupykern.qk_rms_norm_rope(i["q"], i["k"], i["q_weight"], i["k_weight"], i["positions"],
                                             i["cos_sin_cache"], i["eps"], check_positions=False)

        with launcher.recording() as launched:
            qk()
        wide = launched[-1]
        assert wide.template is rope_ops.QK_RMS_NORM_ROPE_WIDE and wide.plan.tokens_per_block == 1, wide
        heads = wide.plan.heads_per_thread
        assert wide.plan.head_slots * heads == q0.shape[1] + k0.shape[1] and wide.block[0] % 32 == 0
        token = jit.get_kernel(rope_ops.QK_RMS_NORM_ROPE_TOKEN, "__nv_bfloat16", "float", "long long", True, 8,
                               wide.plan.threads_per_head, heads)
        fns = {"lib": qk,
               "wide_bare": lambda w=wide: w.kernel(w.grid, w.block, w.args),
               "token_bare": lambda w=wide, t=token, n=n: t((n, 1, 1), w.block, w.args)}
        outs = {}
        for name, fn in fns.items():
            i["q"][...], i["k"][...] = q0, k0
            fn()
            outs[name] = (i["q"].copy(), i["k"].copy())
        bitwise = {name: variants.same_bits(outs[name], outs["lib"]) for name in fns}
        med = variants.time_rounds(fns, timing.time_graph)
        results["qk_decode"].append({"model": model_name, "num_tokens": n, "heads_per_thread": heads,
                                     "block": wide.block[0], "registers": {"wide": wide.kernel.num_regs,
                                                                           "token": token.num_regs},
                                     "bitwise": bitwise, "us": med})
        print(f"qk {model_name} {n}: heads {heads} block {wide.block[0]} regs wide {wide.kernel.num_regs} "
              f"token {token.num_regs}; bitwise {bitwise}", flush=True)
        print("   " + "; ".join(f"{f} {' '.join(f'{x:.3f}' for x in v)}" for f, v in med.items()), flush=True)
        del i, q0, k0, outs, fns

for model_name in MODELS:
    model = models.get(model_name)
    for n in (1024, 4096, 16384):
        i = _rope_inputs(rng, n, 128, cupykern.bfloat16, model=model)
        consecutive = dict(i, positions=cupy.arange(n, dtype=cupy.int64))
        fns, timers = {}, {}
        for label, inputs in (("random", i), ("consecutive", consecutive)):
            fns[f"lib {label}"] = lambda x=inputs: cupykern.apply_rope(x["q"], x["k"], x["positions"],
                                                                       x["cos_sin_cache"], check_positions=False)
            t = peers._torch_views(torch, inputs)
            liger.setup(t)
            fns[f"liger {label}"] = lambda t=t: liger(t)
        med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=30))
        results["rope_positions"].append({"model": model_name, "num_tokens": n, "us": med})
        print(f"apply_rope {model_name} {n}: " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}"
                                                         for f, v in med.items()), flush=True)
        del i, consecutive, fns
json.dump(results, open(os.path.join(OUT, "rope_token_b.json"), "w"), indent=1)
