"""Issue 11, item 40: the 256-row points under Nsight Compute. cupykern's rms_norm,
fused_add_rms_norm and softmax at 256 rows (llama-3.1-8b and -70b rows, bf16) beside the
peer that beats them there (Liger's rms_norm, torch.compile's fused add and softmax), each
kernel profiled once after warm-up with every cache flushed (ncu --cache-control all, the
peers' cold L2). Run by ncu_rows256.sh; only the calls between profiler start and stop are
profiled. Seeded (torch.manual_seed(0))."""
import cupy
import torch

import cupykern as ck
from liger_kernel.ops.rms_norm import LigerRMSNormFunction

torch.manual_seed(0)
EPS = 1e-5
calls = []
for model, h in (("70b", 8192), ("8b", 4096)):
    x = torch.randn(256, h, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(256, h, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(h, device="cuda", dtype=torch.bfloat16)
    xc, rc, wc = (cupy.from_dlpack(t) for t in (x, r, w))
    y = cupy.empty_like(xc)
    p = cupy.empty(xc.shape, cupy.float32)

    def fused_add_oop(x, r, w):
        s = x + r
        sf = s.float()
        return (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype), s

    fa = torch.compile(fused_add_oop, dynamic=False)
    sm = torch.compile(lambda x: torch.softmax(x.float(), dim=-1), dynamic=False)
    calls += [
        (f"cupykern rms_norm {model}", lambda xc=xc, wc=wc, y=y: ck.rms_norm(xc, wc, EPS, out=y)),
        (f"liger rms_norm {model}", lambda x=x, w=w: LigerRMSNormFunction.apply(x, w, EPS, 0.0, "gemma")),
        (f"cupykern fused_add_rms_norm {model}",
         lambda xc=xc, rc=rc, wc=wc: ck.fused_add_rms_norm(xc, rc, wc, EPS)),
        (f"torch.compile fused_add_rms_norm {model}", lambda x=x, r=r, w=w, fa=fa: fa(x, r, w)),
        (f"cupykern softmax {model}", lambda xc=xc, p=p: ck.softmax(xc, out=p)),
        (f"torch.compile softmax {model}", lambda x=x, sm=sm: sm(x)),
    ]

for _ in range(5):
    for _, fn in calls:
        fn()
torch.cuda.synchronize()
cupy.cuda.runtime.deviceSynchronize()
cupy.cuda.profiler.start()
for name, fn in calls:
    torch.cuda.nvtx.range_push(name)
    fn()
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
cupy.cuda.profiler.stop()
print("profiled:", [name for name, _ in calls])
