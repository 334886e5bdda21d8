"""Issue 11, item 42: apply_rope beside Liger's RoPE at 1024 and 4096 tokens under Nsight
Compute (llama-3.1-8b: 32 + 8 heads; -70b: 64 + 8; head_dim 128, bf16, in place), where
Liger stays 3-7 % ahead in the peers runs (items 39-41). cupykern as planned (the wide
kernel at these sizes), Liger with its cos/sin gathered to fp32 rows before the profiled
calls (bench/peers.py's "cos/sin fp32" form, its fastest). Each kernel profiled once after
warm-up with every cache flushed (ncu --cache-control all, the peers' cold L2). Run by
rope_ncu.sh; only the calls between profiler start and stop are profiled. Seeded
(torch.manual_seed(0)); random positions below 131072, as the registry's."""
import cupy
import torch

import cupykern as ck
from cupykern.registry.rope import _host_cache
from liger_kernel.ops.rope import LigerRopeFunction

torch.manual_seed(0)
HEAD_DIM, MAX_POSITION = 128, 131072
cache_host = _host_cache(HEAD_DIM, MAX_POSITION, 500000.0)
cache = torch.from_numpy(cache_host).cuda()
calls = []
for model, q_heads, kv_heads in (("8b", 32, 8), ("70b", 64, 8)):
    for tokens in (1024, 4096):
        q = torch.randn(tokens, q_heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(tokens, kv_heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        positions = torch.randint(0, MAX_POSITION, (tokens,), device="cuda")
        rows = cache[positions]
        cos = torch.cat([rows[:, :64]] * 2, -1)[None].contiguous()
        sin = torch.cat([rows[:, 64:]] * 2, -1)[None].contiguous()
        qc, kc, pc, cc = (cupy.from_dlpack(t) for t in (q, k, positions, cache))
        q2, k2 = q.clone(), k.clone()

        def liger(q=q2, k=k2, cos=cos, sin=sin, tokens=tokens):
            LigerRopeFunction.apply(q.view(1, tokens, -1, HEAD_DIM).transpose(1, 2),
                                    k.view(1, tokens, -1, HEAD_DIM).transpose(1, 2), cos, sin)

        calls += [
            (f"cupykern apply_rope {model} {tokens}",
             lambda qc=qc, kc=kc, pc=pc, cc=cc: ck.apply_rope(qc, kc, pc, cc, check_positions=False)),
            (f"liger rope {model} {tokens}", liger),
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
