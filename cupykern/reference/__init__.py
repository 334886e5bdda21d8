"""float64 NumPy twins of every cupykern kernel: same names, same argument order.

They take NumPy or CuPy arrays and return float64 NumPy arrays; in-place ops return
the tuple of what they would have written. Tests, ``cupykern check``, the sweep and
the benchmarks validate the kernels against these.
"""

from cupykern.reference.activation import gelu_and_mul, silu_and_mul, swiglu
from cupykern.reference.norm import fused_add_rms_norm, layer_norm, rms_norm
from cupykern.reference.rope import apply_rope, qk_rms_norm_rope, rope_cos_sin_cache
from cupykern.reference.row_reduce import row_reduce
from cupykern.reference.softmax import softmax

__all__ = ["apply_rope", "fused_add_rms_norm", "gelu_and_mul", "layer_norm", "qk_rms_norm_rope", "rms_norm",
           "rope_cos_sin_cache", "row_reduce", "silu_and_mul", "softmax", "swiglu"]
