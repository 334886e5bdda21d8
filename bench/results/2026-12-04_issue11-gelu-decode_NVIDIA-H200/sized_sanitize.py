"""The workload for compute-sanitizer on every act_and_mul_sized_kernel the heuristics pick
(NOTES item 36, call E): silu_and_mul and gelu_and_mul (erf and tanh) at every d of
SIZED_D, 1, 3 and 16 tokens, bf16 / fp16 / fp32, each call's kernel checked to be the
sized one, its output against the float64 reference (the registry's tolerances)."""
import os
import sys

sys.path.insert(0, os.getcwd())
import cupy as cp
import numpy as np

import cupykern
from cupykern import _dtypes, launcher, reference, validation
from cupykern.ops import activation

rng = np.random.default_rng(20261207)
failures = 0
for dtype in (_dtypes.bfloat16, np.dtype(np.float16), np.dtype(np.float32)):
    for d in activation.SIZED_D:
        for n in (1, 3, 16):
            x = cp.asarray((rng.standard_normal((n, 2 * d)) * 2).astype(np.float32)).astype(dtype)
            for name, call, ref in (
                    ("silu_and_mul", lambda: cupykern.silu_and_mul(x), lambda h: reference.silu_and_mul(h)),
                    ("gelu_and_mul", lambda: cupykern.gelu_and_mul(x), lambda h: reference.gelu_and_mul(h)),
                    ("gelu_tanh", lambda: cupykern.gelu_and_mul(x, approximate="tanh"),
                     lambda h: reference.gelu_and_mul(h, approximate="tanh"))):
                with launcher.recording() as rec:
                    got = call()
                cp.cuda.Device().synchronize()
                sized = rec[0].template is activation.ACT_AND_MUL_SIZED
                result = validation.compare_array(got, ref(cp.asnumpy(x)), dtype)
                ok = sized and result.ok
                failures += not ok
                print(f"{name:13s} {_dtypes.short_name(dtype)} d={d:5d} {n:2d} tokens: "
                      f"{'sized' if sized else 'GENERAL'} {'ok' if result.ok else 'MISMATCH'}", flush=True)
print(f"{failures} failure(s)")
sys.exit(1 if failures else 0)
