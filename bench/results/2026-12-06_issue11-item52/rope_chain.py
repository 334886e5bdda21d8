"""NOTES item 52, call 4: item 42's rope_chain.py (call 3 there, on an H100) on the H200,
where Liger leads the wide kernel at 4096 tokens by about the same microseconds as at 8192
(item 51, call 2) and ncu (item 52, call 1) finds the same DRAM bytes and DRAM-active cycles
in both: is the fixed cost the chain position -> cos/sin row, which Liger's timed call does
not pay? Variants as item 42's (bf16, in place, cold L2, three interleaved rounds, one
stream for CuPy and torch):
  lib       the library's wide kernel (planned with the token kernels' ends at 1 token an SM,
            as item 44's "lib", since the plan now takes token kernels at 1024 tokens);
  gathered  the same kernel on the rows gathered before (cache[positions], positions 0..n-1);
  nopos     rope.cu with `pos = token` in apply_rope_wide_kernel, on the gathered rows: no
            chain, Liger's reads; bits as lib's;
  liger     LigerRopeFunction on fp32 cos/sin gathered before (peers.py's form).
llama-3.1-8b and -70b at --sizes (default 4096, 8192). --tag names the JSON
(rope_chain_<tag>.json). Seeded (numpy 20261206)."""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import cupykern  # noqa: E402
from bench import variants  # noqa: E402
from cupykern import jit, launcher, models, timing  # noqa: E402
from cupykern.ops import rope as rope_ops  # noqa: E402
from cupykern.registry.rope import _rope_inputs  # noqa: E402
from liger_kernel.ops.rope import LigerRopeFunction  # noqa: E402

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
TAG = sys.argv[sys.argv.index("--tag") + 1] if "--tag" in sys.argv else "run"
SIZES = tuple(int(n) for n in sys.argv[sys.argv.index("--sizes") + 1].split(",")) if "--sizes" in sys.argv \
    else (4096, 8192)
# The token kernels' ends at 1 token an SM and an empty window: the wide kernel at every size.
WIDE = {"ROPE_TOKEN_MAX_TOKENS_PER_SM": 1, "ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM": 1,
        "ROPE_TOKEN_WINDOW_FROM_TOKENS_PER_SM": 1, "ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM": 1}
SRC = jit.source("rope.cu")
HEAD = "apply_rope_wide_kernel("
POS = "const int64_t pos = static_cast<int64_t>(positions[token * positions_stride]);"
at = SRC.index(HEAD, SRC.index("__launch_bounds__(kRopeMaxBlockSize, rope_wide_min_blocks"))
NOPOS_SRC = SRC[:at] + SRC[at:].replace(POS, "const int64_t pos = token;", 1)
assert NOPOS_SRC.count(POS) == SRC.count(POS) - 1


def nopos_kernel(expr, _built={}):
    if expr not in _built:
        _built[expr] = cupy.RawModule(code=NOPOS_SRC, options=jit.COMPILE_OPTIONS,
                                      name_expressions=[expr]).get_function(expr)
    return _built[expr]


def record(q, k, positions, cache):
    with variants.plan_constants(WIDE), launcher.recording() as launched:
        cupykern.apply_rope(q, k, positions, cache, check_positions=False)
    assert launched[-1].template is rope_ops.APPLY_ROPE_WIDE, launched[-1]
    return launched[-1]


seed = 20261206
rng = np.random.default_rng(seed)
stream = cupy.cuda.Stream(non_blocking=True)
results = {"seed": seed, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "points": []}
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    for model_name in ("llama-3.1-70b", "llama-3.1-8b"):
        model = models.get(model_name)
        for n in SIZES:
            i = _rope_inputs(rng, n, 128, cupykern.bfloat16, model=model)
            q, k, positions, cache = i["q"], i["k"], i["positions"], i["cos_sin_cache"]
            q0, k0 = q.copy(), k.copy()
            rows = cupy.ascontiguousarray(cache[positions])
            arange = cupy.arange(n, dtype=positions.dtype)
            lib = record(q, k, positions, cache)
            gat = record(q, k, arange, rows)
            heads = lib.plan.heads_per_thread
            expr = rope_ops.APPLY_ROPE_WIDE.expr("__nv_bfloat16", "float", "long long", True, 8, 0, heads, True)
            nopos = nopos_kernel(expr)
            half = rows.shape[1] // 2
            cos_t = torch.from_dlpack(cupy.concatenate([rows[:, :half]] * 2, axis=1)[None])
            sin_t = torch.from_dlpack(cupy.concatenate([rows[:, half:]] * 2, axis=1)[None])
            qt, kt = torch.from_dlpack(q), torch.from_dlpack(k)

            def liger(qt=qt, kt=kt, cos_t=cos_t, sin_t=sin_t, n=n):
                LigerRopeFunction.apply(qt.view(1, n, -1, 128).transpose(1, 2), kt.view(1, n, -1, 128).transpose(1, 2),
                                        cos_t, sin_t)

            fns = {"lib": lambda r=lib: r.kernel(r.grid, r.block, r.args),
                   "gathered": lambda r=gat: r.kernel(r.grid, r.block, r.args),
                   "nopos": lambda r=gat, f=nopos: f(r.grid, r.block, r.args),
                   "liger": liger}
            outs = {}
            for name in ("lib", "gathered", "nopos"):
                q[...], k[...] = q0, k0
                fns[name]()
                outs[name] = (q.copy(), k.copy())
            bitwise = {name: variants.same_bits(outs[name], outs["lib"]) for name in outs}
            med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=30))
            results["points"].append({"model": model_name, "num_tokens": n, "heads_per_thread": heads,
                                      "block": lib.block, "registers": [lib.kernel.num_regs, nopos.num_regs],
                                      "bitwise": bitwise, "us": med})
            print(f"{model_name} {n}: heads {heads} block {lib.block} regs lib/nopos {lib.kernel.num_regs}/"
                  f"{nopos.num_regs} bitwise {bitwise}", flush=True)
            print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in med.items()), flush=True)
            del i, q, k, q0, k0, outs, fns, rows, cos_t, sin_t, qt, kt
json.dump(results, open(os.path.join(OUT, f"rope_chain_{TAG}.json"), "w"), indent=1)
