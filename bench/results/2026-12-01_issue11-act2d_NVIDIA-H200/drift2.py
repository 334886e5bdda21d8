"""What in a torch CUDA graph makes later CuPy graphs slower, and are torch's own
graphs slowed too? Same buffers throughout; each probe captures new graphs."""
import gc, json, os, time
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np, ml_dtypes
import cupykern
from cupykern.timing import time_graph
import torch
import torch.nn.functional as F
bf = ml_dtypes.bfloat16
rng = np.random.default_rng(0)
d = 14336
x = cp.asarray(rng.standard_normal((1, 2 * d)).astype(bf)); out = cp.empty((1, d), bf)
xr = cp.asarray(rng.standard_normal((16, 4096)).astype(bf)); w = cp.asarray(rng.standard_normal(4096).astype(bf))
outr = cp.empty_like(xr)
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
tx = torch.from_dlpack(x); tout = torch.from_dlpack(out)
def torch_silu():  # one fused-free pair of torch kernels (silu, mul) into out
    torch.mul(F.silu(tx[:, :d]), tx[:, d:], out=tout)
def torch_in_cupy_graph():
    s = torch.cuda.ExternalStream(cp.cuda.get_current_stream().ptr)
    with torch.cuda.stream(s):
        torch_silu()
def torch_graph_time(side_stream=True):
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3): torch_silu()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(100): torch_silu()
    for _ in range(3): g.replay()
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); g.replay(); e1.record(); torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 10)
    return g, float(np.median(ts))
def probe(event):
    r = {"event": event,
         "cupykern silu x1": time_graph(lambda: cupykern.silu_and_mul(x, out=out)).median_us,
         "cupykern rms_norm x16": time_graph(lambda: cupykern.rms_norm(xr, w, 1e-6, out=outr)).median_us,
         "torch silu+mul, CuPy-captured graph": time_graph(torch_in_cupy_graph).median_us}
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
probe("clean")
torch.cuda.empty_cache(); gc.collect(); probe("after empty_cache + gc")
g0 = torch.cuda.CUDAGraph(); s0 = torch.cuda.Stream()
with torch.cuda.stream(s0):
    g0.capture_begin(); g0.capture_end()
probe("after an empty torch graph captured")
gA, tA = torch_graph_time(); print(json.dumps({"torch-captured graph A (silu+mul) us": round(tA, 3)}), flush=True)
probe("after torch graph A")
gB, tB = torch_graph_time(); print(json.dumps({"torch-captured graph B us": round(tB, 3)}), flush=True)
del g0, gA, gB; gc.collect(); torch.cuda.synchronize(); torch.cuda.empty_cache()
probe("after deleting the torch graphs")
