"""The stand-alone's shape as a library kernel (rope.cu::qk_rms_norm_rope_token_kernel,
uncommitted while timed): does it keep the stand-alone's 6-8 % over the library's qk at
4096-16384 tokens? NOTES item 38, call E.

Cold L2, three rounds in rotating order, llama-3.1-8b (5 heads a thread, 64-thread
blocks) and -70b (3 heads, 192 threads) bf16 at 1024, 4096 and 16384 tokens,
cupykern.registry.rope's inputs; bits compared with the library's qk_rms_norm_rope:
  lib        cupykern.qk_rms_norm_rope (the wide kernel, 2 waves)
  token      qk_rms_norm_rope_token_kernel, one token a block (ptxas: 112 / 64 registers)
  token_96   the same under __maxnreg__(96) (no spill)
  token_80   the same under __maxnreg__(80) (8b: spills; 70b: as free)
  alone      call C's stand-alone qk_token<heads, 5 or 3, true>
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
bounds = "__global__ void __launch_bounds__(kRopeMaxBlockSize) qk_rms_norm_rope_token_kernel("
assert src.count(bounds) == 1
builds = {"token": src}
for cap in (96, 80):
    builds[f"token_{cap}"] = src.replace(bounds, f"__global__ void __maxnreg__({cap}) qk_rms_norm_rope_token_kernel(")
alone_src = (HERE / "qk_streams.py").read_text().split('SRC = r"""')[1].split('"""')[0]
configs = {"llama-3.1-8b": (40, 5, 8), "llama-3.1-70b": (72, 3, 24)}
seed = 20261204
rng = np.random.default_rng(seed)
results = {"seed": seed, "points": [], "registers": {}}
for model_name, (heads, hpt, slots) in configs.items():
    model = models.get(model_name)
    expr = f"qk_rms_norm_rope_token_kernel<__nv_bfloat16, float, long long, true, 8, 8, {hpt}, false>"
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
json.dump(results, open(os.path.join(OUT, "qk_token_kernel.json"), "w"), indent=1)
