"""Op spec of row_reduce (checked and benchmarked as "sum")."""

from __future__ import annotations

from cupykern import _dtypes, reference
from cupykern.ops import row_reduce
from cupykern.registry import OpSpec, nbytes, random_device

ROW_REDUCE = OpSpec(
    name="row_reduce", family="row_reduce", size_name="hidden_size",
    make_inputs=lambda rng, n, h, dtype: {"x": random_device(rng, (n, h), dtype), "op": "sum", "out": None},
    run=lambda i: (row_reduce.row_reduce(i["x"], i["op"], out=i.get("out")),),
    reference=lambda i: (reference.row_reduce(i["x"], i["op"]),),
    min_bytes=lambda i: nbytes(i["x"]) + i["x"].shape[0] * 4,
    output_dtypes=lambda i: (_dtypes.float32,),
)

SPECS = (ROW_REDUCE,)
