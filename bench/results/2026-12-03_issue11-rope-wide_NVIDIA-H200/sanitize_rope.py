"""apply_rope's wide kernel, in place and out of place (both kInPlace instantiations),
with out-of-range positions, partial rotary_dim (pass-through dims) and M-RoPE, at 1, 3
and 600 tokens (600: the prefill plan, 5 heads a thread): the workload for
compute-sanitizer (memcheck, racecheck). Each output against the float64 reference;
exits 1 on a mismatch."""
import sys
import cupy as cp, numpy as np
import cupykern
from cupykern import _dtypes, reference, validation
from cupykern.ops import rope as rope_ops

rng = np.random.default_rng(20261203)
failures = calls = 0
for dtype in (_dtypes.bfloat16, _dtypes.float16, _dtypes.float32):
    for n in (1, 3, 600):
        for nq, nk, head_dim, rotary_dim in ((32, 8, 128, 128), (64, 8, 128, 128), (8, 2, 128, 64)):
            cache = rope_ops.rope_cos_sin_cache(4096, rotary_dim)
            q = cp.asarray(rng.standard_normal((n, nq, head_dim)).astype(np.float32)).astype(dtype)
            k = cp.asarray(rng.standard_normal((n, nk, head_dim)).astype(np.float32)).astype(dtype)
            pos = rng.integers(0, 4096, n)
            pos[::5] = -1  # left unchanged (in place) or copied (out of place)
            pos = cp.asarray(pos)
            want_q, want_k = reference.apply_rope(q, k, pos, cache, check_positions=False)
            for inplace in (False, True):
                qc, kc = q.copy(), k.copy()
                got_q, got_k = cupykern.apply_rope(qc, kc, pos, cache, check_positions=False, inplace=inplace)
                for got, want in ((got_q, want_q), (got_k, want_k)):
                    result = validation.compare_array(got, want, dtype)
                    failures += not result.ok
                calls += 1
                print(f"{_dtypes.short_name(dtype)} n={n} heads {nq}+{nk} rotary {rotary_dim} "
                      f"{'in place' if inplace else 'out of place'}: {result.message}", flush=True)
        # M-RoPE (Qwen2-VL's sections), sectioned and interleaved
        cache = rope_ops.rope_cos_sin_cache(4096, 128)
        q = cp.asarray(rng.standard_normal((n, 28, 128)).astype(np.float32)).astype(dtype)
        k = cp.asarray(rng.standard_normal((n, 4, 128)).astype(np.float32)).astype(dtype)
        pos = cp.asarray(rng.integers(0, 4096, (3, n)))
        for interleaved in (False, True):
            want_q, want_k = reference.apply_rope(q, k, pos, cache, mrope_section=(16, 24, 24),
                                                  mrope_interleaved=interleaved)
            for inplace in (False, True):
                qc, kc = q.copy(), k.copy()
                got_q, got_k = cupykern.apply_rope(qc, kc, pos, cache, inplace=inplace, mrope_section=(16, 24, 24),
                                                   mrope_interleaved=interleaved)
                for got, want in ((got_q, want_q), (got_k, want_k)):
                    result = validation.compare_array(got, want, dtype)
                    failures += not result.ok
                calls += 1
                print(f"{_dtypes.short_name(dtype)} n={n} M-RoPE interleaved={interleaved} "
                      f"{'in place' if inplace else 'out of place'}: {result.message}", flush=True)
print(f"{calls} calls, {failures} failed")
sys.exit(1 if failures else 0)
