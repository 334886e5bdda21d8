"""Call I's SASS: the token kernel (5fe4b27) takes 1368 instructions for 8b's 5 heads
against the stand-alone's 816, with 25 BSSY / BSYNC pairs and 50 branches from its
guards (a slot past head_slots, a head past num_heads, a lane without a unit, an
inactive head). Without them, on shapes that fill every slot and lane? NOTES item 38,
call J. Patches of the token kernel, cold L2, three rounds, 8b and 70b at 1024 / 4096 /
16384 tokens:
  token        as committed (5fe4b27), free (112 / 64 registers)
  full         no guards: every slot holds kHeadsPerThread heads, every lane a unit
               (true of both shapes, full rotary): free
  full_96      full under __maxnreg__(96)
  full_strides full with the stand-alone's q / k offsets ((token * heads + h) * 128)
  alone        the stand-alone
"""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np

import cupykern
from cupykern import jit, models, timing
from cupykern.registry.rope import _rope_inputs

HERE = Path(__file__).resolve().parent
OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
src = jit.source("rope.cu")
start = src.index("qk_rms_norm_rope_token_kernel(")
head, body = src[:start], src[start:]


def patched(*, cap=0, full=False, strides=False):
    h, b = head, body
    if cap:
        old = "__global__ void __launch_bounds__(kRopeMaxBlockSize) "
        assert h.endswith(old)
        h = h[:-len(old)] + f"__global__ void __maxnreg__({cap}) "

    def sub(old, new, count=1):
        nonlocal b
        assert b.count(old) == count, (old, b.count(old))
        b = b.replace(old, new)
    if full:
        sub("    if (slot < head_slots && h < num_heads) {\n", "    {\n")
        sub("      if (has_unit) {\n        xa[j]", "      {\n        xa[j]")
        sub("  if (has_unit) load_cos_sin", "  load_cos_sin")
        sub("    const bool active = slot < head_slots && h < num_heads;\n", "    const bool active = true;\n")
        sub("    if (active && has_unit) {\n", "    {\n")
        sub("    if (!active) continue;\n", "")
        sub("    if (has_unit) {\n      const V wa", "    {\n      const V wa")
    if strides:
        sub("q + token * q_token_stride + static_cast<int64_t>(h) * q_head_stride",
            "q + (token * num_q_heads + h) * 128")
        sub("k + token * k_token_stride + static_cast<int64_t>(h - num_q_heads) * k_head_stride",
            "k + (token * num_kv_heads + h - num_q_heads) * 128")
    return h + b


alone_src = (HERE / "qk_streams.py").read_text().split('SRC = r"""')[1].split('"""')[0]
configs = {"llama-3.1-8b": (40, 5, 8), "llama-3.1-70b": (72, 3, 24)}
seed = 20261204
rng = np.random.default_rng(seed)
results = {"seed": seed, "points": [], "registers": {}}
for model_name, (heads, hpt, slots) in configs.items():
    model = models.get(model_name)
    expr = f"qk_rms_norm_rope_token_kernel<__nv_bfloat16, float, long long, true, 8, 8, {hpt}, false>"
    builds = {"token": patched(), "full": patched(full=True), "full_96": patched(cap=96, full=True),
              "full_strides": patched(full=True, strides=True)}
    kernels = {name: cupy.RawModule(code=code, options=jit.COMPILE_OPTIONS, name_expressions=[expr]).get_function(expr)
               for name, code in builds.items()}
    alone_name = f"qk_token<{heads}, {hpt}, true>"
    kernels["alone"] = cupy.RawModule(code=alone_src, options=("--std=c++17",),
                                      name_expressions=[alone_name]).get_function(alone_name)
    results["registers"][model_name] = {n: k.num_regs for n, k in kernels.items()}
    print(model_name, results["registers"][model_name], flush=True)
    block = (slots * 8 + 31) // 32 * 32
    for n in (1024, 4096, 16384):
        i = _rope_inputs(rng, n, 128, cupykern.bfloat16, with_weights=True, model=model)
        q, k = i["q"], i["k"]
        q0, k0 = q.copy(), k.copy()
        nq, nkv = q.shape[1], k.shape[1]
        common = (q, k, i["q_weight"], i["k_weight"], i["positions"], i["cos_sin_cache"])
        fns = {"lib": lambda: cupykern.qk_rms_norm_rope(q, k, i["q_weight"], i["k_weight"], i["positions"],
                                                        i["cos_sin_cache"], i["eps"], check_positions=False)}
        for name, kern in kernels.items():
            if name == "alone":
                fns[name] = lambda kern=kern: kern((n,), (heads // hpt * 8,), common + (np.int32(nq), np.float32(i["eps"])))
            else:
                fns[name] = lambda kern=kern: kern((n,), (block,), common + tuple(np.int32(v) for v in (
                    n, nq, nkv, 128, 128, i["cos_sin_cache"].shape[0], 1, nq * 128, 128, nkv * 128, 128, 128))
                    + (np.float32(i["eps"]), np.int32(slots), np.int32(1)))
        q[...], k[...] = q0, k0
        fns["lib"]()
        ref_q, ref_k = q.copy(), k.copy()
        bitwise = {}
        for name in list(fns)[1:]:
            q[...], k[...] = q0, k0
            fns[name]()
            bitwise[name] = bool((q.view(cupy.uint16) == ref_q.view(cupy.uint16)).all()
                                 and (k.view(cupy.uint16) == ref_k.view(cupy.uint16)).all())
        med = {f: [] for f in fns}
        order = list(fns)
        for rnd in range(3):
            for f in order[rnd:] + order[:rnd]:
                med[f].append(timing.time_cold(fns[f], repeat=30).median_us)
        results["points"].append({"model": model_name, "num_tokens": n, "bitwise": bitwise, "us": med})
        print(f"{model_name} {n} bitwise {bitwise}", flush=True)
        print(f"{model_name} {n}: " + ", ".join(f"{f} {' '.join(f'{t:.2f}' for t in v)}" for f, v in med.items()), flush=True)
        del q, k, q0, k0, i
json.dump(results, open(os.path.join(OUT, "qk_token_full.json"), "w"), indent=1)
