"""cupykern: fused GPU kernels for LLM inference, CUDA C++ driven from CuPy.

Families (the family name is the grep key in all five places; the list is
``cupykern.families.FAMILIES``, and the public ops below are every family module's
``__all__``):

======================  =====================  ==========================  ==================
family                  kernels_cu/            cupykern/                   reference
======================  =====================  ==========================  ==================
norm                    norm.cu                ops/norm.py                 reference/norm.py
softmax                 softmax.cu             ops/softmax.py              reference/softmax.py
row_reduce              row_reduce.cu          ops/row_reduce.py           reference/row_reduce.py
activation              activation.cu          ops/activation.py           reference/activation.py
quant (FP8 outputs)     quant.cu               ops/quant.py                reference/quant.py
rope                    rope.cu                ops/rope.py                 reference/rope.py
======================  =====================  ==========================  ==================

Shared pieces: ``launcher`` (the one launch path: argument signature -> cached plan ->
launch), ``_arrays`` (argument intake), ``plans`` (launch plan rules), ``jit``
(compile), ``timing`` (CUDA-event timing), ``registry`` (op specs for checks, sweeps and
benches), ``sweep`` (the sweep engine), ``cli``.
"""

from cupykern import families as _families
from cupykern._dtypes import bfloat16

__version__ = "0.1.0"

# apply_rope, fused_add_rms_norm, gelu_and_mul, layer_norm, qk_rms_norm_rope, rms_norm,
# rope_cos_sin_cache, row_reduce, silu_and_mul, softmax, swiglu, ...
_OPS = _families.public_names("ops")
globals().update(_OPS)

__all__ = sorted(["bfloat16", *_OPS])
