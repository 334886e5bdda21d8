"""silu_and_mul at decode sizes: cupykern's block-per-item kernel, hand-written variants and
torch.compile's kernel, clean and after a torch graph (the state of drift2.py). Prints
Inductor's Triton source (TORCH_LOGS=output_code goes to stderr)."""
import json, os
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np, ml_dtypes
import cupykern
from cupykern import launcher
from cupykern.timing import time_graph
bf = ml_dtypes.bfloat16
SRC = r'''
#include <cuda_bf16.h>
typedef __nv_bfloat16 T;
struct __align__(16) V8 { T e[8]; };
template <int kVecs>
__device__ void silu(T* out, const T* gate, const T* up, int d, int stride) {
  int row = blockIdx.y;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    int slot = (blockIdx.x * kVecs + k) * blockDim.x + threadIdx.x;
    if (slot * 8 >= d) return;
    V8 g = *(const V8*)(gate + (long long)row * stride + slot * 8);
    V8 u = *(const V8*)(up + (long long)row * stride + slot * 8);
    V8 o;
    for (int i = 0; i < 8; ++i) { float x = __bfloat162float(g.e[i]);
      float y = __fdividef(x, 1.0f + __expf(-x)); y = x == -__int_as_float(0x7f800000) ? -0.0f : y;
      o.e[i] = __float2bfloat16(y * __bfloat162float(u.e[i])); }
    *(V8*)(out + (long long)row * d + slot * 8) = o;
  }
}
extern "C" __global__ void silu1(T* out, const T* gate, const T* up, int d, int stride) { silu<1>(out, gate, up, d, stride); }
extern "C" __global__ void silu2(T* out, const T* gate, const T* up, int d, int stride) { silu<2>(out, gate, up, d, stride); }
'''
mod = cp.RawModule(code=SRC, options=("-std=c++17",))
rng = np.random.default_rng(0)
res = []
def t(phase, name, fn):
    us = time_graph(fn).median_us
    res.append({"phase": phase, "case": name, "us": round(us, 3)})
    print(json.dumps(res[-1]), flush=True)
data = {}
for d in (14336, 28672):
    for n in (1, 16, 64):
        x = cp.asarray(rng.standard_normal((n, 2 * d)).astype(bf)); out = cp.empty((n, d), bf)
        data[d, n] = (x, out)
def cupy_cases(phase):
    for (d, n), (x, out) in data.items():
        t(phase, f"cupykern d{d} n{n}", lambda: cupykern.silu_and_mul(x, out=out))
        for bs in (64, 256):
            with launcher.overrides(block_size=bs):
                t(phase, f"cupykern b{bs} d{d} n{n}", lambda: cupykern.silu_and_mul(x, out=out))
        for k, name in ((1, "silu1"), (2, "silu2")):
            f = mod.get_function(name)
            for bs in (128,):
                gx = -(-d // 8 // bs // k)
                t(phase, f"{name} b{bs} d{d} n{n}", lambda: f((gx, n), (bs,), (out, x, x[:, d:], np.int32(d), np.int32(2 * d))))
cupy_cases("clean")
import torch, torch.nn.functional as F
def form(xt):
    d = xt.shape[-1] // 2
    return F.silu(xt[..., :d].float()).mul(xt[..., d:].float()).to(xt.dtype)
compiled = torch.compile(form, dynamic=False)
def torch_graph(fn):
    side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(100): fn()
    for _ in range(3): g.replay()
    ts = []
    for _ in range(20):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); g.replay(); e1.record(); e1.synchronize(); ts.append(e0.elapsed_time(e1) * 10)
    return float(np.median(ts))
for (d, n), (x, out) in data.items():
    xt = torch.from_dlpack(x)
    y = compiled(xt); torch.cuda.synchronize()
    us = torch_graph(lambda: compiled(xt))
    res.append({"phase": "state", "case": f"torch.compile d{d} n{n}", "us": round(us, 3)}); print(json.dumps(res[-1]), flush=True)
cupy_cases("state")
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "tc.json"), "w"), indent=1)
