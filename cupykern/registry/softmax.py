"""Op spec of softmax."""

from __future__ import annotations

from cupykern import _dtypes, reference
from cupykern.ops import softmax
from cupykern.registry import OpSpec, nbytes, random_device

SOFTMAX = OpSpec(
    name="softmax", family="softmax", size_name="hidden_size",
    make_inputs=lambda rng, n, h, dtype: {"x": random_device(rng, (n, h), dtype, scale=3.0), "out": None},
    run=lambda i: (softmax.softmax(i["x"], out=i.get("out")),),
    reference=lambda i: (reference.softmax(i["x"]),),
    min_bytes=lambda i: nbytes(i["x"]) + i["x"].size * 4,
    output_dtypes=lambda i: (_dtypes.float32,),
)

SPECS = (SOFTMAX,)
