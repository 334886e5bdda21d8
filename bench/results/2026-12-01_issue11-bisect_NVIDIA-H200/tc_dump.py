"""Compiles torch.compile's silu_and_mul (1 x 2*14336 and 1 x 2*28672 bf16) and rms_norm
(1 x 4096) with Triton's cache in $OUT/triton, so bisect.py can load the cubins into CuPy
and time them torch-free. Run in its own process (no torch graph here: NOTES item 18)."""
import os
os.environ["TRITON_CACHE_DIR"] = os.path.join(os.environ["OUT"], "triton")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(os.environ["OUT"], "inductor")
import torch
import torch.nn.functional as F

def silu(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]

def rms(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)

for d in (14336, 28672):
    x = torch.randn(1, 2 * d, device="cuda", dtype=torch.bfloat16)
    torch.compile(silu, dynamic=False)(x)
x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
torch.compile(rms, dynamic=False)(x, w)
torch.cuda.synchronize()
print("dumped")
