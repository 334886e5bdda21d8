"""cupykern: fused GPU kernels for LLM inference, CUDA C++ driven from CuPy.

Families (the family name is the grep key in all five places):

======================  =====================  ==========================  ==================
family                  kernels_cu/            cupykern/                   reference
======================  =====================  ==========================  ==================
norm                    norm.cu                ops/norm.py                 reference/norm.py
softmax                 softmax.cu             ops/softmax.py              reference/softmax.py
row_reduce              row_reduce.cu          ops/row_reduce.py           reference/row_reduce.py
activation              activation.cu          ops/activation.py           reference/activation.py
rope                    rope.cu                ops/rope.py                 reference/rope.py
======================  =====================  ==========================  ==================

Shared pieces: ``jit`` (compile), ``launch`` (launch plans), ``_arrays`` (argument
intake), ``timing`` (CUDA-event timing), ``registry`` (op specs for checks,
sweeps and benches), ``cli``.
"""

from cupykern._dtypes import bfloat16
from cupykern.ops.activation import gelu_and_mul, silu_and_mul, swiglu
from cupykern.ops.norm import fused_add_rms_norm, layer_norm, rms_norm
from cupykern.ops.rope import apply_rope, qk_rms_norm_rope, rope_cos_sin_cache
from cupykern.ops.row_reduce import row_reduce
from cupykern.ops.softmax import softmax

__version__ = "0.1.0"

__all__ = ["apply_rope", "bfloat16", "fused_add_rms_norm", "gelu_and_mul", "layer_norm", "qk_rms_norm_rope",
           "rms_norm", "rope_cos_sin_cache", "row_reduce", "silu_and_mul", "softmax", "swiglu"]
