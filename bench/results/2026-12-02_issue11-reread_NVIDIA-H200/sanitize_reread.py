"""The rereading rms_norm kernels (kReread) on small calls, for compute-sanitizer (NOTES item 28).

plans.REREAD's row limit is lowered to 2 so that calls of 3 and 37 rows take the rereading
launch (their decode layout is the rereading one for these row sizes; rows of 16384 elements,
past REREAD's, hold theirs); each call is checked
against the float64 reference, out of place into a fresh array and in place. Prints each
call's plan and exits 1 if a call disagreed or none reread.
"""
import sys

import cupy
import numpy as np

import cupykern
from cupykern import _dtypes, launcher, plans, reference, validation

plans.REREAD = {"rms_norm": (2, *plans.REREAD["rms_norm"][1:])}  # at 5d74b28, REREAD of two numbers: (2, 512)
rng = np.random.default_rng(20261202)
bad = rereads = 0
for dtype in _dtypes.DTYPES:
    for hidden in (4096, 8192, 16384):
        for rows in (3, 37):
            x = cupy.asarray(rng.standard_normal((rows, hidden)).astype(np.float32)).astype(dtype)
            w = cupy.asarray(rng.standard_normal(hidden).astype(np.float32)).astype(dtype)
            want = reference.rms_norm(x, w)
            for in_place in (False, True):
                y = x.copy()
                with launcher.recording() as launched:
                    got = cupykern.rms_norm(y, w, out=y if in_place else None)
                plan = launched[0].plan
                rereads += plan.reread
                result = validation.compare_array(got, want, dtype, what="out")
                bad += not result.ok
                print(f"{_dtypes.short_name(dtype)} {rows} x {hidden} in_place={in_place} "
                      f"{plan.layout.threads_per_row}x{plan.layout.vecs_per_thread} exact={plan.exact} "
                      f"reread={plan.reread}: {result.message}")
cupy.cuda.Device().synchronize()
print(f"{rereads} rereading calls, {bad} failed")
sys.exit(1 if bad or not rereads else 0)
