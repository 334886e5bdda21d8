"""Gated activations: silu_and_mul, gelu_and_mul, swiglu (kernels_cu/activation.cu)."""

from __future__ import annotations

import numpy as np

from cupykern import _arrays, _dtypes, jit, launch
from cupykern.jit import KernelTemplate

ACT_AND_MUL = KernelTemplate("activation.cu", "act_and_mul_kernel")

#: kAct of act_and_mul_kernel (kernels_cu/cupykern/activations.cuh: kActSilu, ...).
ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}
#: gelu_and_mul's ``approximate`` (PyTorch's names) -> activation.
GELU_APPROXIMATIONS = {"none": "gelu", "tanh": "gelu_tanh"}


def instantiations() -> dict[KernelTemplate, list[str]]:
    """Every instantiation of this family: dtype x activation x vector width."""
    return {ACT_AND_MUL: [ACT_AND_MUL.expr(_dtypes.c_type(d), act, v) for d in _dtypes.DTYPES
                          for act in ACTIVATIONS.values() for v in sorted({1, _dtypes.vec_width(d)})]}


# ----------------------------------------------------------------- checks without a GPU
def gelu_activation(approximate) -> str:
    """The activation for gelu_and_mul's ``approximate``; ValueError if unknown."""
    if not isinstance(approximate, str) or approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"approximate: expected one of {tuple(GELU_APPROXIMATIONS)}, got {approximate!r}")
    return GELU_APPROXIMATIONS[approximate]


def gated_output_shape(shape, name: str = "x") -> tuple:
    """``(..., d)`` for a fused gate_up input of shape ``(..., 2 * d)``; ValueError if the
    last axis is missing, empty or odd."""
    shape = tuple(shape)
    if not shape or shape[-1] == 0 or shape[-1] % 2:
        got = f"shape {shape}" if shape else "a 0-d array"
        raise ValueError(f"{name}: expected shape (..., 2 * d) with d >= 1 (gate then up along the last "
                         f"axis), got {got}")
    return (*shape[:-1], shape[-1] // 2)


def check_same_shape(gate_shape, up_shape) -> None:
    """ValueError unless swiglu's ``gate`` and ``up`` have one shape ``(..., d)``, d >= 1."""
    if tuple(gate_shape) != tuple(up_shape):
        raise ValueError(f"up: expected the shape of gate {tuple(gate_shape)}, got {tuple(up_shape)}")
    if not tuple(gate_shape) or gate_shape[-1] == 0:
        raise ValueError(f"gate: expected shape (..., d) with d >= 1, got {tuple(gate_shape)}")


# ----------------------------------------------------------------- launch
def _act_and_mul(activation: str, gate, gate_row_stride: int, up, up_row_stride: int, out) -> None:
    """Launches act_and_mul_kernel on CuPy's current stream: out = act(gate) * up."""
    import cupy

    out_rows = _arrays.rows_of(out, "out")
    dtype = out.dtype
    aligned = _arrays.vector_aligned(_dtypes.vec_width(dtype), (gate, gate_row_stride), (up, up_row_stride),
                                     (out, out_rows.row_stride))
    overrides = launch.current_overrides()
    plan = launch.plan_activation(out_rows.num_rows, out_rows.hidden_size, dtype, aligned=aligned,
                                  limits=launch.DeviceLimits.of_device(cupy.cuda.Device().id),
                                  block_size=overrides.get("block_size"),
                                  vec_width=overrides.get("vec_width"))
    kernel = jit.get_kernel(ACT_AND_MUL, _dtypes.c_type(dtype), ACTIVATIONS[activation], plan.vec_width)
    kernel(plan.grid, plan.block, (
        out, gate, up, np.int64(out_rows.num_rows), np.int64(out_rows.hidden_size), np.int64(gate_row_stride),
        np.int64(up_row_stride), np.int64(out_rows.row_stride)))


def _fused_gate_up(activation: str, x, out):
    """Validates a fused ``[gate | up]`` input and its output, then launches."""
    x = _arrays.as_device_array(x, "x")
    _arrays.check_supported_dtype(x, "x")
    out_shape = gated_output_shape(x.shape, "x")
    rows = _arrays.rows_of(x, "x")
    out = _arrays.output(out, out_shape, x.dtype)
    _arrays.check_no_overlap(x, "x", out, "out", allow_same=False)
    if rows.num_rows == 0:
        return out
    d = out_shape[-1]
    # gate and up are the two halves of each row of x: same row stride, up d further on.
    _act_and_mul(activation, x[..., :d], rows.row_stride, x[..., d:], rows.row_stride, out)
    return out


# ----------------------------------------------------------------- public API
def silu_and_mul(x, *, out=None):
    """SiLU-gated product of a fused gate_up projection (SwiGLU's MLP activation).

    ``out = silu(x[..., :d]) * x[..., d:]``, ``silu(g) = g / (1 + exp(-g))``

    Parameters:
        x: device array ``(..., 2 * d)``, float16, bfloat16 or float32: the gate
            (first half of the last axis) then the up projection (second half), as
            vLLM's ``silu_and_mul`` takes it. The last axis must be unit-stride; the
            leading axes must flatten to one row stride (x may be a slice of a wider
            buffer).
        out: optional ``(..., d)`` array of x's dtype to write into (unit-stride last
            axis, any row stride); must not overlap ``x``.

    Returns:
        ``out`` (allocated if not given), shape ``(..., d)``, x's dtype.

    Mutates: ``out`` only.

    Raises:
        TypeError: ``x``/``out`` is a NumPy or non-array object, or has an unsupported
            or mismatched dtype.
        ValueError: the last axis of ``x`` is odd or empty; wrong ``out`` shape;
            non-unit last stride; rows that do not share one stride; ``out``
            overlapping ``x``; an array on another GPU.

    Notes:
        fp32 math, one rounding to the dtype: libdevice ``expf`` and IEEE division
        for float32, the ``__expf``/``__fdividef`` intrinsics for float16/bfloat16,
        whose relative error (below 2**-16) the 16-bit rounding hides
        (``kernels_cu/cupykern/fastmath.cuh``). Finite gates never
        give NaN: a gate of -1e4 gives -0 * up; +inf gives inf * up; NaN stays in its
        element. fp16 products beyond 65504 round to inf.

    References:
        Shazeer, "GLU Variants Improve Transformer", 2020 (arXiv:2002.05202); SiLU,
        Elfwing, Uchibe & Doya 2017 (arXiv:1702.03118) and Hendrycks & Gimpel 2016
        (arXiv:1606.08415); layout and semantics of vLLM's ``silu_and_mul`` and
        FlashInfer's ``silu_and_mul``.
    """
    return _fused_gate_up("silu", x, out)


def gelu_and_mul(x, *, approximate: str = "none", out=None):
    """GELU-gated product of a fused gate_up projection (GeGLU's MLP activation).

    ``out = gelu(x[..., :d]) * x[..., d:]`` with, for ``approximate="none"``,
    ``gelu(g) = g * Phi(g) = 0.5 * g * (1 + erf(g / sqrt(2)))`` and, for ``"tanh"``,
    ``gelu(g) = 0.5 * g * (1 + tanh(sqrt(2 / pi) * (g + 0.044715 * g**3)))``.

    Parameters:
        x: device array ``(..., 2 * d)``, float16, bfloat16 or float32, gate then up
            along the last axis (same layout rules as :func:`silu_and_mul`).
        approximate: ``"none"`` (erf form) or ``"tanh"``, PyTorch's names.
        out: optional ``(..., d)`` array of x's dtype; must not overlap ``x``.

    Returns:
        ``out`` (allocated if not given), shape ``(..., d)``, x's dtype.

    Mutates: ``out`` only.

    Raises:
        ValueError: ``approximate`` is not ``"none"`` or ``"tanh"`` (checked first);
            otherwise as :func:`silu_and_mul`.
        TypeError: as :func:`silu_and_mul`.

    Notes:
        fp32 math, one rounding (libdevice ``erfcf``/``expf`` for float32; for 16-bit
        dtypes Numerical Recipes' erfcc and ``__expf``, relative error below 2**-16,
        ``kernels_cu/cupykern/fastmath.cuh``). The erf form is evaluated as ``0.5 * g *
        erfc(-g / sqrt(2))`` and the tanh form as ``g / (1 + exp(-2 u))`` (the same functions),
        which keep their relative accuracy for negative gates where ``1 + erf`` and
        ``1 + tanh`` cancel. A gate of -inf gives -0 * up, not NaN.

    References:
        Hendrycks & Gimpel, "Gaussian Error Linear Units (GELUs)", 2016
        (arXiv:1606.08415); GeGLU, Shazeer 2020 (arXiv:2002.05202); layout of vLLM's
        ``gelu_and_mul`` / ``gelu_tanh_and_mul``; ``approximate`` as in
        ``torch.nn.functional.gelu``; the 16-bit erfc, Press et al., Numerical Recipes
        in C, 2nd ed., 1992, sec. 6.2 (``erfcc``).
    """
    activation = gelu_activation(approximate)
    return _fused_gate_up(activation, x, out)


def swiglu(gate, up, *, out=None):
    """SiLU-gated product of separate gate and up projections.

    ``out = silu(gate) * up``, ``silu(g) = g / (1 + exp(-g))``

    Parameters:
        gate: device array ``(..., d)``, float16, bfloat16 or float32; unit-stride
            last axis, leading axes flattening to one row stride.
        up: same shape and dtype as ``gate``, with its own row stride.
        out: optional ``(..., d)`` array of gate's dtype; may be ``gate`` or ``up``
            itself (in place) but must not partially overlap either.

    Returns:
        ``out`` (allocated if not given), gate's shape and dtype.

    Mutates: ``out`` only.

    Raises:
        TypeError: ``gate``/``up``/``out`` is a NumPy or non-array object, or has an
            unsupported or mismatched dtype.
        ValueError: ``up`` or ``out`` of another shape than ``gate``; an empty last
            axis; non-unit last stride; rows that do not share one stride; ``out``
            partially overlapping ``gate`` or ``up``; an array on another GPU.

    Notes:
        fp32 math, one rounding; same extreme-value behaviour as :func:`silu_and_mul`.
        ``swiglu(x[..., :d], x[..., d:])`` equals ``silu_and_mul(x)`` bit for bit.

    References:
        Shazeer, "GLU Variants Improve Transformer", 2020 (arXiv:2002.05202); SiLU,
        Elfwing, Uchibe & Doya 2017 (arXiv:1702.03118).
    """
    gate = _arrays.as_device_array(gate, "gate")
    _arrays.check_supported_dtype(gate, "gate")
    up = _arrays.as_device_array(up, "up")
    _arrays.check_dtype(up, gate.dtype, "up", "the dtype of gate")
    check_same_shape(gate.shape, up.shape)
    gate_rows = _arrays.rows_of(gate, "gate")
    up_rows = _arrays.rows_of(up, "up")
    out = _arrays.output(out, gate.shape, gate.dtype)
    _arrays.check_no_overlap(gate, "gate", out, "out", allow_same=True)
    _arrays.check_no_overlap(up, "up", out, "out", allow_same=True)
    if gate_rows.num_rows == 0:
        return out
    _act_and_mul("silu", gate, gate_rows.row_stride, up, up_rows.row_stride, out)
    return out
