"""Why is a plain one-token-a-block qk kernel 6-8 % faster than the library's
qk_rms_norm_rope at 4096-16384 tokens (NOTES item 38, call C)? NOTES item 38, call D.

Times, cold L2, three rounds in rotating order, llama-3.1-8b and -70b bf16 at 4096 and
16384 tokens (cupykern.registry.rope's inputs), bits compared with the library's:
  lib          cupykern.qk_rms_norm_rope (8b: 128-thread blocks of 2 tokens, 2 waves
               grid-stride; 70b: 192-thread blocks of 1 token, 2 waves)
  src_plan     rope.cu's qk_rms_norm_rope_wide_kernel built here, the library's launch
  src_tok1     the same kernel, one token a block, a block per token (no waves)
  loop_plan    the kernel with each head's reduction and stores in one loop
  loop_tok1    (qk_fused_loop.diff) in both launches
  alone        call C's stand-alone (qk_streams.py's qk_token<heads, 5 or 3, true>)
  alone_smem   the same with dynamic shared memory that holds an SM to the library's
               resident threads (8b: 8 blocks of 64, 70b: 3 of 192)
Registers of each build from CuPy's num_regs.
"""
import json
import os
import subprocess
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
# The loop variant: rope.cu with qk_fused_loop.diff applied (patch(1) in a scratch copy).
scratch = Path(OUT) / "scratch"
scratch.mkdir(exist_ok=True)
(scratch / "rope.cu").write_text((jit.kernels_dir() / "rope.cu").read_text())
subprocess.run(["patch", "-s", str(scratch / "rope.cu"), str(HERE / "qk_fused_loop.diff")], check=True)
loop_src = src.replace((jit.kernels_dir() / "rope.cu").read_text().split("// ---------------------------------------------------------------- shared pieces")[1],
                       (scratch / "rope.cu").read_text().split("// ---------------------------------------------------------------- shared pieces")[1])
assert loop_src != src
alone_src = (HERE / "qk_streams.py").read_text().split('SRC = r"""')[1].split('"""')[0]

configs = {"llama-3.1-8b": dict(heads=40, hpt=5, slots=8, plan_tpb=2, plan_block=128, plan_grid=1056, blocks_cap=8),
           "llama-3.1-70b": dict(heads=72, hpt=3, slots=24, plan_tpb=1, plan_block=192, plan_grid=792, blocks_cap=3)}
SMEM_PER_SM = 228 * 1024
seed = 20261204
rng = np.random.default_rng(seed)
results = {"seed": seed, "points": [], "registers": {}}
for model_name, cfg in configs.items():
    model = models.get(model_name)
    wide = f"qk_rms_norm_rope_wide_kernel<__nv_bfloat16, float, long long, true, 8, 8, {cfg['hpt']}, false>"
    k_src = cupy.RawModule(code=src, options=jit.COMPILE_OPTIONS, name_expressions=[wide]).get_function(wide)
    k_loop = cupy.RawModule(code=loop_src, options=jit.COMPILE_OPTIONS, name_expressions=[wide]).get_function(wide)
    alone_name = f"qk_token<{cfg['heads']}, {cfg['hpt']}, true>"
    k_alone = cupy.RawModule(code=alone_src, options=("--std=c++17",), name_expressions=[alone_name]).get_function(alone_name)
    alone_block = cfg["heads"] // cfg["hpt"] * 8
    # Dynamic shared memory so that at most blocks_cap blocks fit an SM (1 KiB reserved a block).
    smem = SMEM_PER_SM // cfg["blocks_cap"] - 1024 - 512
    k_alone.max_dynamic_shared_size_bytes = smem
    results["registers"][model_name] = {"src": k_src.num_regs, "loop": k_loop.num_regs, "alone": k_alone.num_regs,
                                        "alone_smem_bytes": smem}
    print(model_name, results["registers"][model_name], flush=True)
    for n in (4096, 16384):
        i = _rope_inputs(rng, n, 128, cupykern.bfloat16, with_weights=True, model=model)
        q, k = i["q"], i["k"]
        q0, k0 = q.copy(), k.copy()
        nq, nkv = q.shape[1], k.shape[1]
        common = (q, k, i["q_weight"], i["k_weight"], i["positions"], i["cos_sin_cache"])

        def wide_call(kern, tpb, block, grid):
            return lambda: kern((grid,), (block,), common + tuple(np.int32(v) for v in (
                n, nq, nkv, 128, 128, i["cos_sin_cache"].shape[0], 1, nq * 128, 128, nkv * 128, 128, 128))
                + (np.float32(i["eps"]), np.int32(cfg["slots"]), np.int32(tpb)))

        tok1_block = (cfg["slots"] * 8 + 31) // 32 * 32
        fns = {"lib": lambda: cupykern.qk_rms_norm_rope(q, k, i["q_weight"], i["k_weight"], i["positions"],
                                                        i["cos_sin_cache"], i["eps"], check_positions=False),
               "src_plan": wide_call(k_src, cfg["plan_tpb"], cfg["plan_block"], cfg["plan_grid"]),
               "src_tok1": wide_call(k_src, 1, tok1_block, n),
               "loop_plan": wide_call(k_loop, cfg["plan_tpb"], cfg["plan_block"], cfg["plan_grid"]),
               "loop_tok1": wide_call(k_loop, 1, tok1_block, n),
               "alone": lambda: k_alone((n,), (alone_block,), common + (np.int32(nq), np.float32(i["eps"]))),
               "alone_smem": lambda: k_alone((n,), (alone_block,), common + (np.int32(nq), np.float32(i["eps"])),
                                             shared_mem=smem)}
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
json.dump(results, open(os.path.join(OUT, "qk_lib_variants.json"), "w"), indent=1)
