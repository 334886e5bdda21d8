"""Compiles torch.compile's out-of-place forms (bench/peers.py's) of the prefill points
where it leads cupykern (peers at 949fe9c) with Inductor's and Triton's caches in
$OUT/tc, so its kernels (source, PTX, launch: num_warps, XBLOCK/RBLOCK) can be read
offline: silu_and_mul 70b 16384 and 8b 4096 tokens, rms_norm 70b 16384 and 1024 and 8b
256, fused_add_rms_norm 70b 256 and 64, softmax 8b 256 (fp32 out). Own process."""
import os
import time
os.environ["TRITON_CACHE_DIR"] = os.path.join(os.environ["OUT"], "tc", "triton")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(os.environ["OUT"], "tc", "inductor")
import torch

def rms(xf, w, eps=1e-5):
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()

def rms_norm(x, w):
    return rms(x.float(), w).to(x.dtype)

def fused_add(x, r, w):
    r = (x.float() + r.float()).to(x.dtype)
    return rms(r.float(), w).to(x.dtype), r

def silu(x):
    d = x.shape[-1] // 2
    return (torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float()).to(x.dtype)

def softmax(x):
    return torch.softmax(x.float(), dim=-1)

bf = dict(device="cuda", dtype=torch.bfloat16)
cases = [
    ("silu_70b_16384", silu, lambda: (torch.randn(16384, 2 * 28672, **bf),)),
    ("silu_8b_4096", silu, lambda: (torch.randn(4096, 2 * 14336, **bf),)),
    ("rms_70b_16384", rms_norm, lambda: (torch.randn(16384, 8192, **bf), torch.randn(8192, **bf))),
    ("rms_70b_1024", rms_norm, lambda: (torch.randn(1024, 8192, **bf), torch.randn(8192, **bf))),
    ("rms_8b_256", rms_norm, lambda: (torch.randn(256, 4096, **bf), torch.randn(4096, **bf))),
    ("fused_70b_256", fused_add, lambda: (torch.randn(256, 8192, **bf), torch.randn(256, 8192, **bf), torch.randn(8192, **bf))),
    ("fused_70b_64", fused_add, lambda: (torch.randn(64, 8192, **bf), torch.randn(64, 8192, **bf), torch.randn(8192, **bf))),
    ("softmax_8b_256", softmax, lambda: (torch.randn(256, 4096, **bf),)),
]
for name, fn, make in cases:
    t = time.time()
    torch._dynamo.reset()
    args = make()
    torch.compile(fn, dynamic=False)(*args)
    torch.cuda.synchronize()
    print(f"{name}: compiled in {time.time() - t:.1f} s", flush=True)
    del args
    torch.cuda.empty_cache()
print("dumped")
