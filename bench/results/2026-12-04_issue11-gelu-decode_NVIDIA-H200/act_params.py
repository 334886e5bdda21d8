"""gelu_and_mul and silu_and_mul at 1-64 tokens: which part of the fixed-size kernel's gain
is its parameter list (NOTES item 36, call B).

Call A: a kernel with d compiled in and two pointers (out, x) took 1.236 us at one token
(8b gelu) where the library's (3 pointers, 4 ints and an int64: 48 bytes of parameters,
gate and up passed as two pointers, row offsets from runtime strides) took 1.290. Variants,
each at the library's launch (vector width, block, a block per (chunk, row)):

* "fixed": d compiled in, parameters (out, x);
* "fixed+pad": the same code with the library's parameter list (out, x, an unused pointer,
  4 ints, an int64), so only the parameter bytes differ from "fixed";
* "packed": d at run time, parameters (out, x, d): rows of [gate | up], 2d apart, out rows
  d apart, as a contiguous x and out have (no per-model compile).

torch.compile's fastest correct formulation (bench/peers.py's measure_torch) in the same
process and graph state. GPU time by graph replay (100 calls a graph, 20 replays), two
passes, the second in reverse order; outputs against the library's bits.
"""
import json
import os
import sys

os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
sys.path.insert(0, os.getcwd())
import cupy as cp
import ml_dtypes
import numpy as np
import torch

import cupykern
from bench import peers
from cupykern import jit, launcher, models, registry
from cupykern.timing import time_graph

SEED = 20261206
rng = np.random.default_rng(SEED)
bf = ml_dtypes.bfloat16
OUT = os.environ.get("OUT", ".")

KERNELS = """
template <int kAct, int kVec>
__device__ __forceinline__ void act_row_slot(__nv_bfloat16* out_row, const __nv_bfloat16* gate_row,
                                             const __nv_bfloat16* up_row, int i) {
  const Vec<__nv_bfloat16, kVec> g = load_vec<__nv_bfloat16, kVec>(gate_row + i);
  const Vec<__nv_bfloat16, kVec> u = load_vec<__nv_bfloat16, kVec>(up_row + i);
  float y[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) y[e] = activate<kAct, true>(element(g, e)) * element(u, e);
  store_rounded<__nv_bfloat16, kVec>(out_row + i, y);
}
template <int kAct, int kVec, int kD>
__global__ void __launch_bounds__(1024) act_fixed(__nv_bfloat16* out, const __nv_bfloat16* x) {
  const unsigned slot = blockIdx.x * blockDim.x + threadIdx.x;
  if (slot >= kD / kVec) return;
  const __nv_bfloat16* row = x + static_cast<int64_t>(blockIdx.y) * (2 * kD);
  act_row_slot<kAct, kVec>(out + static_cast<int64_t>(blockIdx.y) * kD, row, row + kD, slot * kVec);
}
template <int kAct, int kVec, int kD>
__global__ void __launch_bounds__(1024) act_fixed_pad(__nv_bfloat16* out, const __nv_bfloat16* x, const void* unused,
                                                      int a, int b, int c, int e, long long f) {
  const unsigned slot = blockIdx.x * blockDim.x + threadIdx.x;
  if (slot >= kD / kVec) return;
  const __nv_bfloat16* row = x + static_cast<int64_t>(blockIdx.y) * (2 * kD);
  act_row_slot<kAct, kVec>(out + static_cast<int64_t>(blockIdx.y) * kD, row, row + kD, slot * kVec);
}
template <int kAct, int kVec>
__global__ void __launch_bounds__(1024) act_packed(__nv_bfloat16* out, const __nv_bfloat16* x, int d) {
  const unsigned slot = blockIdx.x * blockDim.x + threadIdx.x;
  if (slot >= static_cast<unsigned>(d) / kVec) return;
  const __nv_bfloat16* row = x + static_cast<int64_t>(blockIdx.y) * (2 * d);
  act_row_slot<kAct, kVec>(out + static_cast<int64_t>(blockIdx.y) * d, row, row + d, slot * kVec);
}
"""
SOURCE = jit.source("activation.cu") + KERNELS
functions = {}


def function(expr: str):
    if expr not in functions:
        module = cp.RawModule(code=SOURCE, options=jit.COMPILE_OPTIONS, name_expressions=[expr])
        functions[expr] = module.get_function(expr)
    return functions[expr]


res = {"seed": SEED, "points": [], "torch": torch.__version__}
peers.enter_torch_graph_state(torch)
compiled = peers._torch_compile(torch)
specs = registry.all_specs()
for model_name in ("llama-3.1-8b", "llama-3.1-70b"):
    model = models.get(model_name)
    for op, act, fn in (("gelu_and_mul", 1, cupykern.gelu_and_mul), ("silu_and_mul", 0, cupykern.silu_and_mul)):
        spec = specs[op]
        d = spec.size_for_model(model)
        for n in [int(v) for v in os.environ.get("TOKENS", "1,16,64").split(",")]:
            x = cp.asarray(rng.standard_normal((n, 2 * d)).astype(bf))
            out = cp.empty((n, d), dtype=bf)
            with launcher.recording() as rec:
                fn(x, out=out)
            (L,) = rec
            want = cp.asnumpy(out.view(cp.uint16))
            w, block = L.plan.vec_width, L.block[0]
            grid = (-(-(d // w) // block), n, 1)  # a block per (chunk, row), as the library's at decode sizes
            print(model_name, op, n, "lib plan", L.plan, flush=True)
            pad = (out, x, x, np.int32(0), np.int32(0), np.int32(0), np.int32(0), np.int64(0))
            variants = {"lib call": None, "lib": (L.function, L.grid, L.args),
                        "fixed": (function(f"act_fixed<{act}, {w}, {d}>"), grid, (out, x)),
                        "fixed+pad": (function(f"act_fixed_pad<{act}, {w}, {d}>"), grid, pad),
                        "packed": (function(f"act_packed<{act}, {w}>"), grid, (out, x, np.int32(d)))}
            times, differ = {k: [] for k in variants}, {}
            torch_times = {form: [] for form in compiled[op]}
            for rep in (0, 1):
                for form, tfn in compiled[op].items():
                    try:
                        point, _ = peers.measure_torch(torch, "torch.compile", tfn, spec, n, d, bf, seed=SEED,
                                                       copy_gbps=1.0, repeat=20, model=model)
                    except peers.Skip:
                        torch_times[form].append(float("inf"))
                        continue
                    torch_times[form].append(point.median_us)
                for name in (list(variants) if rep == 0 else list(variants)[::-1]):
                    if name == "lib call":
                        call = lambda: fn(x, out=out)
                    else:
                        k, g, args = variants[name]
                        call = lambda k=k, g=g, args=args: k(g, (block, 1, 1), args, shared_mem=0)
                    if rep == 0:
                        out.fill(0)
                        call()
                        differ[name] = int((cp.asnumpy(out.view(cp.uint16)) != want).sum())
                    times[name].append(time_graph(call).median_us)
            best = min(min(t) for t in torch_times.values())
            print(f"{model_name} {op} n={n} torch.compile " + ", ".join(f"{f}: {t[0]:.3f} {t[1]:.3f}"
                                                                      for f, t in torch_times.items()), flush=True)
            for name in variants:
                us = times[name]
                res["points"].append({"model": model_name, "op": op, "num_tokens": n, "variant": name, "us": us,
                                      "bits_differing_from_lib": differ[name], "torch_compile_us": torch_times,
                                      "lib_launch": {"vec_width": w, "block": block, "grid": list(grid)}})
                print(f"{model_name:14s} {op:13s} n={n:3d} {name:10s} {us[0]:6.3f} {us[1]:6.3f} us  "
                      f"torch.compile/this {best / min(us):5.3f}  differ {differ[name]}", flush=True)
with open(os.path.join(OUT, "act_params.json"), "w") as fh:
    json.dump(res, fh, indent=1)
