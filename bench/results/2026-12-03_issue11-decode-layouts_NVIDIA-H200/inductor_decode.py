"""What torch.compile launches at the decode points where it beats cupykern (NOTES item 34).

gelu_and_mul / silu_and_mul at one token (8b d = 14336, 70b d = 28672) and
fused_add_rms_norm 70b at 16 and 64 tokens (hidden 8192), bf16, the peers' formulations
(bench/peers.py: fp32 math, one rounding). Each compiled function runs under
torch.profiler; printed: each kernel's name, grid, block, registers per thread and GPU
time. The generated Triton code goes to stderr through TORCH_LOGS=output_code.
"""
import json
import os

import torch
import torch.nn.functional as F

torch.manual_seed(20261204)
dev = "cuda"
bf = torch.bfloat16


def gated(act):
    def f(x):
        d = x.shape[-1] // 2
        return (act(x[..., :d].float()) * x[..., d:].float()).to(x.dtype)
    return f


def gated_into(act):
    def f(x, out):
        d = x.shape[-1] // 2
        return out.copy_(act(x[..., :d].float()) * x[..., d:].float())
    return f


def fused_add(x, r, w):
    rr = (x.float() + r.float()).to(x.dtype)
    rf = rr.float()
    return (rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype), rr


cases = []
for d in (14336, 28672):
    x = torch.randn(1, 2 * d, device=dev, dtype=bf)
    out = torch.empty(1, d, device=dev, dtype=bf)
    for name, act in (("gelu", F.gelu), ("silu", F.silu)):
        cases.append((f"{name} d={d} out of place", torch.compile(gated(act), dynamic=False), (x,)))
        cases.append((f"{name} d={d} into out", torch.compile(gated_into(act), dynamic=False), (x, out)))
for n in (16, 64):
    x = torch.randn(n, 8192, device=dev, dtype=bf)
    r = torch.randn(n, 8192, device=dev, dtype=bf)
    w = torch.randn(8192, device=dev, dtype=bf)
    cases.append((f"fused_add 70b n={n}", torch.compile(fused_add, dynamic=False), (x, r, w)))

results = []
for name, fn, args in cases:
    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*args)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            for _ in range(100):
                fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / 100)
    times.sort()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn(*args)
        torch.cuda.synchronize()
    path = f"/tmp/trace_{len(results)}.json"
    prof.export_chrome_trace(path)
    kernels = []
    for ev in json.load(open(path))["traceEvents"]:
        if ev.get("cat") == "kernel":
            a_ = ev.get("args", {})
            kernels.append({"name": ev["name"][:90], "grid": a_.get("grid"), "block": a_.get("block"),
                            "regs": a_.get("registers per thread"), "smem": a_.get("shared memory"),
                            "us": ev.get("dur")})
    results.append({"case": name, "graph_us_median": times[len(times) // 2], "kernels": kernels[: len(kernels) // 3]})
    print(f"{name:28s} graph {times[len(times) // 2]:.3f} us", json.dumps(kernels[: len(kernels) // 3]), flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "inductor_decode.json"), "w") as fh:
    json.dump(results, fh, indent=1)
