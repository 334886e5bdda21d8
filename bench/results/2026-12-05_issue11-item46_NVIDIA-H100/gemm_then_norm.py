"""NOTES item 46, call 7: does a model's real predecessor change which carveout the norms
should ask for? In a prefill a GEMM (cuBLAS) writes the rows a norm
reads. CUDA graphs of 50 x [GEMM, rms_norm] and of 50 x [GEMM] alone, replayed (fp16; the
GEMM x (n, 1024) @ w.T, w (hidden, 1024), by cupykern.llm.blas.matmul_nt, writing the
norm's input), the norm's kernel at
preferred_shared_memory_carveout -1 (the library's launch), 100 and 0; the norm's share is
the difference per pair. Also the fused add (its residual a second array). llama-3.1-8b
and -70b hidden sizes, 256 and 1024 rows; five interleaved rounds; graphs by
cupykern.timing.time_graph (a pair a call, 50 calls a graph). Its first run (call 7) replayed
hand-made graphs of the same 50 pairs; this one (call 8) the library's timer. Seed 20261205; writes
gemm_then_norm.json under --out (default $OUT)."""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import cupykern  # noqa: E402
from cupykern import launcher, timing  # noqa: E402
from cupykern.llm import blas  # noqa: E402

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
SEED, PAIRS, CARVEOUTS = 20261205, 50, (-1, 100, 0)
rng = np.random.default_rng(SEED)
stream = cupy.cuda.Stream(non_blocking=True)
results = {"seed": SEED, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "points": []}


def measure(name, op, gemm, hidden, n):
    """The rounds of one (op, hidden, n): GEMM alone, GEMM + norm and the norm alone at each carveout."""
    with launcher.recording() as launched:
        op()
    kernel = launched[-1].kernel
    us = {"gemm alone": []}
    for rnd in range(5):
        order = CARVEOUTS[rnd % 3:] + CARVEOUTS[:rnd % 3]
        us["gemm alone"].append(timing.time_graph(gemm, ops_per_graph=PAIRS).median_us)
        for c in order:
            kernel.preferred_shared_memory_carveout = c
            us.setdefault(f"gemm + norm, carveout {c}", []).append(
                timing.time_graph(lambda: (gemm(), op()), ops_per_graph=PAIRS).median_us)
            us.setdefault(f"norm alone, carveout {c}", []).append(timing.time_graph(op, ops_per_graph=PAIRS).median_us)
    kernel.preferred_shared_memory_carveout = -1
    med = {k: float(np.median(v)) for k, v in us.items()}
    share = {c: med[f"gemm + norm, carveout {c}"] - med["gemm alone"] for c in CARVEOUTS}
    results["points"].append({"op": name, "hidden_size": hidden, "num_tokens": n, "us": us,
                              "norm_share_after_gemm_us": share})
    print(f"{name} {n} x {hidden}: gemm {med['gemm alone']:.2f}; after the gemm "
          + "; ".join(f"c{c} {share[c]:.2f}" for c in CARVEOUTS) + "; alone "
          + "; ".join(f"c{c} {med[f'norm alone, carveout {c}']:.2f}" for c in CARVEOUTS)
          + " us (rounds: " + "; ".join(f"{k} {' '.join(f'{v:.2f}' for v in vals)}" for k, vals in us.items())
          + ")", flush=True)


with stream:
    for hidden in (4096, 8192):
        for n in (256, 1024):
            x = cupy.asarray(rng.standard_normal((n, 1024)), dtype=cupy.float16)
            w = cupy.asarray(rng.standard_normal((hidden, 1024)) / 32, dtype=cupy.float16)
            y = cupy.empty((n, hidden), cupy.float16)
            residual = cupy.asarray(rng.standard_normal((n, hidden)), dtype=cupy.float16)
            weight = cupy.ones((hidden,), cupy.float16)
            out = cupy.empty((n, hidden), cupy.float16)

            def gemm():  # CuPy's matmul refuses stream capture; cupykern.llm's cuBLAS call does not
                blas.matmul_nt(x, w, out=y)

            ops = {"rms_norm": lambda: cupykern.rms_norm(y, weight, 1e-6, out=out),
                   "fused_add_rms_norm": lambda: cupykern.fused_add_rms_norm(y, residual, weight, 1e-6)}
            for name, op in ops.items():
                try:
                    measure(name, op, gemm, hidden, n)
                except Exception as exc:  # noqa: BLE001 - e.g. cuBLAS refusing the capture
                    print(f"{name} {n} x {hidden}: {exc.__class__.__name__}: {exc}", flush=True)
json.dump(results, open(os.path.join(OUT, "gemm_then_norm.json"), "w"), indent=1)
