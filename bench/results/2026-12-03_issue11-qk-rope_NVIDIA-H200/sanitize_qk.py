"""qk_rms_norm_rope's wide kernel (2 / 3 / 4 heads a thread at compile time) with
out-of-range positions, partial rotary_dim (pass-through dims), head_dim 256 (16 lanes a
head) and the scalar path, at 1, 3 and 600 tokens (600: the prefill plan): the workload
for compute-sanitizer (memcheck, racecheck). Each output against the float64
reference; exits 1 on a mismatch."""
import sys
import cupy as cp, numpy as np
import cupykern
from cupykern import _dtypes, reference, validation
from cupykern.ops import rope as rope_ops

rng = np.random.default_rng(20261203)
failures = calls = 0
for dtype in (_dtypes.bfloat16, _dtypes.float16, _dtypes.float32):
    for n in (1, 3, 600):
        for nq, nk, head_dim, rotary_dim in ((32, 8, 128, 128), (64, 8, 128, 128), (8, 2, 128, 64),
                                             (16, 4, 256, 256), (5, 1, 64, 32)):
            cache = rope_ops.rope_cos_sin_cache(4096, rotary_dim)
            q = cp.asarray(rng.standard_normal((n, nq, head_dim)).astype(np.float32)).astype(dtype)
            k = cp.asarray(rng.standard_normal((n, nk, head_dim)).astype(np.float32)).astype(dtype)
            qw = cp.asarray((1 + 0.1 * rng.standard_normal(head_dim)).astype(np.float32)).astype(dtype)
            kw = cp.asarray((1 + 0.1 * rng.standard_normal(head_dim)).astype(np.float32)).astype(dtype)
            pos = rng.integers(0, 4096, n)
            pos[::5] = -1  # left unchanged
            pos = cp.asarray(pos)
            want_q, want_k = reference.qk_rms_norm_rope(q, k, qw, kw, pos, cache, 1e-6, check_positions=False)
            for view in ("contiguous", "misaligned"):
                if view == "contiguous":
                    qc, kc = q.copy(), k.copy()
                else:  # one element off: the scalar kernels
                    qb = cp.empty(q.size + 1, dtype)
                    kb = cp.empty(k.size + 1, dtype)
                    qc, kc = qb[1:].reshape(q.shape), kb[1:].reshape(k.shape)
                    qc[...], kc[...] = q, k
                got_q, got_k = cupykern.qk_rms_norm_rope(qc, kc, qw, kw, pos, cache, 1e-6, check_positions=False)
                for got, want in ((got_q, want_q), (got_k, want_k)):
                    result = validation.compare_array(got, want, dtype)
                    failures += not result.ok
                calls += 1
                print(f"{_dtypes.short_name(dtype)} n={n} heads {nq}+{nk} head_dim {head_dim} rotary {rotary_dim} "
                      f"{view}: {result.message}", flush=True)
print(f"{calls} calls, {failures} failed")
sys.exit(1 if failures else 0)
