"""What keeps rope.cu's qk_rms_norm_rope_token_kernel (under __maxnreg__(96)) 8-10 %
behind call C's stand-alone at 4096 tokens of llama-3.1-8b, at the same registers and
the same bits? NOTES item 38, call F. Patches of the token kernel, each under
__maxnreg__(96) (8b, 5 heads) and free (70b, 3 heads), cold L2, three rounds:
  token       as committed for call E
  nocheck     no position range check (the early return gone: experiment only)
  strides     q / k offsets as the stand-alone's (token * heads + h) * 128
  cache       positions_stride 1 and cache_stride 128 as constants
  all         the three together
  alone       the stand-alone
at 4096 and 16384 tokens.
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


def patched(*, cap, nocheck=False, strides=False, cache=False):
    h, b = head, body
    if cap:
        old = "__global__ void __launch_bounds__(kRopeMaxBlockSize) "
        assert h.endswith(old)
        h = h[:-len(old)] + f"__global__ void __maxnreg__({cap}) "

    def sub(old, new):
        nonlocal b
        assert b.count(old) == 1, old
        b = b.replace(old, new)
    if nocheck:
        sub("  if (pos < 0 || pos >= max_position) return;", "")
    if strides:
        sub("q + token * q_token_stride + static_cast<int64_t>(h) * q_head_stride",
            "q + (token * num_q_heads + h) * 128")
        sub("k + token * k_token_stride + static_cast<int64_t>(h - num_q_heads) * k_head_stride",
            "k + (token * num_kv_heads + h - num_q_heads) * 128")
    if cache:
        sub("positions[token * positions_stride]", "positions[token]")
        sub("cos_sin_cache + pos * cache_stride", "cos_sin_cache + pos * 128")
    return h + b


alone_src = (HERE / "qk_streams.py").read_text().split('SRC = r"""')[1].split('"""')[0]
configs = {"llama-3.1-8b": (40, 5, 8, 96), "llama-3.1-70b": (72, 3, 24, 0)}
seed = 20261204
rng = np.random.default_rng(seed)
results = {"seed": seed, "points": [], "registers": {}}
for model_name, (heads, hpt, slots, cap) in configs.items():
    model = models.get(model_name)
    expr = f"qk_rms_norm_rope_token_kernel<__nv_bfloat16, float, long long, true, 8, 8, {hpt}, false>"
    builds = {"token": patched(cap=cap), "nocheck": patched(cap=cap, nocheck=True),
              "strides": patched(cap=cap, strides=True), "cache": patched(cap=cap, cache=True),
              "all": patched(cap=cap, nocheck=True, strides=True, cache=True)}
    kernels = {name: cupy.RawModule(code=code, options=jit.COMPILE_OPTIONS, name_expressions=[expr]).get_function(expr)
               for name, code in builds.items()}
    alone_name = f"qk_token<{heads}, {hpt}, true>"
    kernels["alone"] = cupy.RawModule(code=alone_src, options=("--std=c++17",),
                                      name_expressions=[alone_name]).get_function(alone_name)
    results["registers"][model_name] = {n: k.num_regs for n, k in kernels.items()}
    print(model_name, results["registers"][model_name], flush=True)
    block = (slots * 8 + 31) // 32 * 32
    for n in (4096, 16384):
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
json.dump(results, open(os.path.join(OUT, "qk_token_bisect.json"), "w"), indent=1)
