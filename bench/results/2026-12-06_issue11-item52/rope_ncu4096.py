"""NOTES item 52: apply_rope at 4096 tokens (llama-3.1-8b: 32 + 8 heads, -70b: 64 + 8;
head_dim 128, bf16, in place) beside Liger's RoPE under Nsight Compute, where the H200's
peers run has cupykern at 0.94 / 0.92 of Liger and item 51's map Liger 2.8-3.9 % ahead
of the wide kernel (item 42's ncu reading, on an H100, had the two level at 4096). Each
kernel launched once in the profiled range, every cache flushed before it (ncu
--cache-control all, the peers' cold L2):
  lib      apply_rope as planned (the wide kernel at 4096);
  token_p  the token kernel in the plan's prefill heads (8b 5, 70b the band's 6), planned
           with both band ends at 40 tokens an SM;
  token_d  the token kernel in the decode layout's heads (recorded at 16 tokens), on lib's
           arguments;
  liger    LigerRopeFunction on fp32 cos/sin gathered before (bench/peers.py's form).
Run by rope_ncu4096.sh. Seeded (numpy 20261206)."""
import sys
from pathlib import Path

import cupy
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import cupykern  # noqa: E402
from bench import variants  # noqa: E402
from cupykern import launcher, models  # noqa: E402
from cupykern.ops import rope as rope_ops  # noqa: E402
from cupykern.registry.rope import _rope_inputs  # noqa: E402

THREADS_PER_HEAD, HEAD_SLOTS, TOKENS_PER_BLOCK = 22, 23, 24  # apply_rope kernels' argument indices
NUM_TOKENS = int(sys.argv[sys.argv.index("--num-tokens") + 1]) if "--num-tokens" in sys.argv else 4096


def record(q, k, positions, cache, band_end=None):
    values = {} if band_end is None else {"ROPE_TOKEN_MAX_TOKENS_PER_SM": band_end,
                                          "ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM": band_end}
    with variants.plan_constants(values), launcher.recording() as launched:
        cupykern.apply_rope(q, k, positions, cache, check_positions=False)
    return launched[-1]


def token_args(args, threads_per_head, head_slots):
    return (*args[:THREADS_PER_HEAD], np.int32(threads_per_head), np.int32(head_slots), np.int32(1),
            *args[TOKENS_PER_BLOCK + 1:])


rng = np.random.default_rng(20261206)
calls, keep = [], []
for model_name in ("llama-3.1-8b", "llama-3.1-70b"):
    model = models.get(model_name)
    small = _rope_inputs(rng, 16, model.head_dim, cupykern.bfloat16, model=model)
    dec = record(small["q"], small["k"], small["positions"], small["cos_sin_cache"])
    assert dec.template is rope_ops.APPLY_ROPE_TOKEN, dec.template
    i = _rope_inputs(rng, NUM_TOKENS, model.head_dim, cupykern.bfloat16, model=model)
    q, k, positions, cache = i["q"], i["k"], i["positions"], i["cos_sin_cache"]
    lib = record(q, k, positions, cache)
    tok = record(q, k, positions, cache, band_end=40)
    assert tok.template is rope_ops.APPLY_ROPE_TOKEN, tok.template
    dargs = token_args(lib.args, int(dec.args[THREADS_PER_HEAD]), int(dec.args[HEAD_SLOTS]))
    print(f"{model_name} {NUM_TOKENS}: lib {lib.template} {lib.plan.heads_per_thread} heads grid {lib.grid} "
          f"block {lib.block} regs {lib.kernel.num_regs}; token_p block {tok.block} regs {tok.kernel.num_regs}; "
          f"token_d block {dec.block} regs {dec.kernel.num_regs}", flush=True)
    keep.append(i)
    calls += [
        (f"lib {model_name} {NUM_TOKENS}", lambda r=lib: r.kernel(r.grid, r.block, r.args)),
        (f"token_p {model_name} {NUM_TOKENS}", lambda r=tok: r.kernel(r.grid, r.block, r.args)),
        (f"token_d {model_name} {NUM_TOKENS}",
         lambda f=dec.kernel, a=dargs, b=dec.block: f((NUM_TOKENS,), b, a)),
        (f"liger {model_name} {NUM_TOKENS}",
         variants.liger_rope_on_rows(q, k, cupy.ascontiguousarray(cache[positions]), model.head_dim)),
    ]

for _ in range(5):
    for _, fn in calls:
        fn()
cupy.cuda.runtime.deviceSynchronize()
torch.cuda.synchronize()
cupy.cuda.profiler.start()
for name, fn in calls:
    torch.cuda.nvtx.range_push(name)
    fn()
    torch.cuda.nvtx.range_pop()
    cupy.cuda.runtime.deviceSynchronize()
    torch.cuda.synchronize()
cupy.cuda.profiler.stop()
print("profiled:", [name for name, _ in calls], flush=True)
