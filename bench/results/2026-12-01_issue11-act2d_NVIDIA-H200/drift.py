"""Which event makes one graph's replays slower mid-process (NOTES item 17)? Probes the
same three decode graphs (new graph each probe, same buffers) after each event."""
import json, os, sys, time
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np, ml_dtypes
import cupykern
from cupykern.timing import time_graph, time_cold
bf = ml_dtypes.bfloat16
rng = np.random.default_rng(0)
x = cp.asarray(rng.standard_normal((1, 2 * 14336)).astype(bf)); out = cp.empty((1, 14336), bf)
xr = cp.asarray(rng.standard_normal((16, 4096)).astype(bf)); w = cp.asarray(rng.standard_normal(4096).astype(bf))
outr = cp.empty_like(xr)
cases = {"silu 8b x1": lambda: cupykern.silu_and_mul(x, out=out),
         "gelu 8b x1": lambda: cupykern.gelu_and_mul(x, out=out),
         "rms_norm 8b x16": lambda: cupykern.rms_norm(xr, w, 1e-6, out=outr)}
keep = {}
def probe(event, reuse=False):
    for name, f in cases.items():
        us = time_graph(f).median_us
        print(json.dumps({"event": event, "case": name, "us": round(us, 3), "t": round(time.time() % 1000, 1)}), flush=True)
probe("start"); probe("start again")
spin = cp.RawKernel(r'''extern "C" __global__ void spin(long long cycles) {
  long long t0 = clock64(); while (clock64() - t0 < cycles) {} }''', "spin")
spin((132 * 4,), (256,), (np.int64(2_000_000_000 // 20),)); cp.cuda.Device().synchronize()
probe("after a 50 ms spin kernel")
big_x = cp.asarray(rng.standard_normal((4096, 2 * 14336)).astype(bf)); big_out = cp.empty((4096, 14336), bf)
t = time_cold(lambda: cupykern.silu_and_mul(big_x, out=big_out), warmup=3, repeat=20)
print("cold silu 4096:", t.median_us, flush=True)
probe("after cold-L2 timing (L2 flushes)")
for i in range(100):
    time_graph(lambda: cupykern.rms_norm(xr, w, 1e-6, out=outr), replays=2)
probe("after 100 more graphs")
held = []
for i in range(200):
    s = cp.cuda.Stream(non_blocking=True); held.append(s)
probe("after 200 streams created")
with cp.cuda.Stream(non_blocking=True):
    probe("inside a non-blocking outer stream (as peers.py)")
del big_x, big_out; cp.get_default_memory_pool().free_all_blocks()
probe("after freeing the pool")
import torch
torch.zeros(1, device="cuda")
probe("after torch init")
tx = torch.from_dlpack(x)
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    for _ in range(3): torch.nn.functional.silu(tx[:, :14336]) * tx[:, 14336:]
torch.cuda.synchronize()
with torch.cuda.graph(g):
    for _ in range(100): y = torch.nn.functional.silu(tx[:, :14336]) * tx[:, 14336:]
for _ in range(3): g.replay()
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
e0.record(); g.replay(); e1.record(); torch.cuda.synchronize()
print("torch eager silu graph (2 kernels a call):", e0.elapsed_time(e1) * 10, "us", flush=True)
probe("after a torch graph")
probe("end")
