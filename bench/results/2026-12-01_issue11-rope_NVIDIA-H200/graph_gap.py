"""Does graph-replay timing charge the host's graph submission to the GPU time? The same
graphs timed as cupykern.timing.time_graph and peers._torch_graph_time do (start event,
launch, end event) and with the GPU held by a spin kernel while the host submits."""
import os, sys, json
sys.path.insert(0, os.getcwd())
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np, ml_dtypes
import cupykern
from cupykern import timing

rng = np.random.default_rng(0)
bf = ml_dtypes.bfloat16
res = []


def graph_of(fn, ops):
    fn(); cp.cuda.get_current_stream().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        for _ in range(ops):
            fn()
        g = s.end_capture()
        g.upload(s)
        for _ in range(3):
            g.launch(s)
    s.synchronize()
    return g, s


def replay_us(g, s, ops, held, replays=20):
    out = []
    for _ in range(replays):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        if held:
            timing.hold_gpu(100e-6, s)
        a.record(s); g.launch(s); b.record(s); b.synchronize()
        out.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / ops)
    return float(np.median(out))


def cupykern_cases():
    x = cp.asarray(rng.standard_normal((1, 2 * 14336)).astype(bf)); out = cp.empty((1, 14336), dtype=x.dtype)
    xr = cp.asarray(rng.standard_normal((1, 4096)).astype(bf)); w = cp.asarray(rng.standard_normal(4096).astype(bf))
    yr = cp.empty_like(xr)
    return {"silu_and_mul 8b x1": lambda: cupykern.silu_and_mul(x, out=out),
            "rms_norm 8b x1": lambda: cupykern.rms_norm(xr, w, 1e-5, out=yr)}


def run(tag, cases):
    for name, fn in cases.items():
        for ops in (100, 1000):
            g, s = graph_of(fn, ops)
            for held in (False, True):
                us = replay_us(g, s, ops, held)
                row = {"when": tag, "case": name, "ops_per_graph": ops, "held": held, "us": us}
                res.append(row); print(row, flush=True)
        print({"when": tag, "case": name, "time_graph": timing.time_graph(fn).median_us}, flush=True)


run("before torch", cupykern_cases())
import torch, torch.nn.functional as F
x_t = torch.randn(1, 2 * 14336, device="cuda").to(torch.bfloat16)
f = torch.compile(lambda t: F.silu(t[..., :14336]) * t[..., 14336:], dynamic=False)
f(x_t); torch.cuda.synchronize()
for ops in (100, 1000):
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3): f(x_t)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        for _ in range(ops): y = f(x_t)
    for _ in range(3): g.replay()
    cur = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    for held in (False, True):
        out = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if held:
                timing.hold_gpu(100e-6, cur)
            a.record(); g.replay(); b.record(); b.synchronize()
            out.append(a.elapsed_time(b) * 1e3 / ops)
        row = {"when": "torch", "case": "torch.compile silu 8b x1", "ops_per_graph": ops, "held": held,
               "us": float(np.median(out))}
        res.append(row); print(row, flush=True)
run("after torch", cupykern_cases())
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "graph_gap.json"), "w"), indent=1)
