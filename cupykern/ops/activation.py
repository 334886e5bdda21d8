"""Gated activations: silu_and_mul, gelu_and_mul, swiglu (kernels_cu/activation.cu)."""

from __future__ import annotations

import numpy as np

from cupykern import _arrays, _dtypes, launcher, models, plans
from cupykern.jit import KernelTemplate

__all__ = ["gelu_and_mul", "silu_and_mul", "swiglu"]

ACT_AND_MUL = KernelTemplate("activation.cu", "act_and_mul_kernel")
#: act_and_mul_kernel's block per work item with d compiled in (activation.cu): what
#: silu_and_mul and gelu_and_mul launch at decode sizes for the d of :data:`SIZED_D`.
ACT_AND_MUL_SIZED = KernelTemplate("activation.cu", "act_and_mul_sized_kernel")

#: The d (intermediate_size) act_and_mul_sized_kernel is built for: every preset's of
#: cupykern.models. With d as a constant a decode-size call took 0.03-0.06 us less than
#: with d as an argument (bench/results/NOTES.md, item 36); other d take act_and_mul_kernel.
SIZED_D = tuple(sorted({preset.intermediate_size for preset in models.PRESETS.values()}))

#: kAct of act_and_mul_kernel (kernels_cu/cupykern/activations.cuh: kActSilu, ...).
ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}
#: gelu_and_mul's ``approximate`` (PyTorch's names) -> activation.
GELU_APPROXIMATIONS = {"none": "gelu", "tanh": "gelu_tanh"}


def instantiations() -> dict[KernelTemplate, list[str]]:
    """Every instantiation of this family: dtype x activation x vector width x walk, and
    the sized kernel's dtype x activation x decode vector width x :data:`SIZED_D`."""
    return {ACT_AND_MUL: [ACT_AND_MUL.expr(_dtypes.c_type(d), act, v, grid_stride) for d in _dtypes.DTYPES
                          for act in ACTIVATIONS.values() for v in plans.activation_vec_widths(d)
                          for grid_stride in (False, True)],
            ACT_AND_MUL_SIZED: [ACT_AND_MUL_SIZED.expr(_dtypes.c_type(d), act, v, size) for d in _dtypes.DTYPES
                                for act in ACTIVATIONS.values() for v in plans.activation_decode_vec_widths(d)
                                for size in SIZED_D]}


# ----------------------------------------------------------------- intake and plan
def gelu_activation(approximate) -> str:
    """The activation for gelu_and_mul's ``approximate``; ValueError if unknown."""
    return GELU_APPROXIMATIONS[_arrays.choice(approximate, GELU_APPROXIMATIONS, "approximate")]


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


def _act_and_mul_launch(a: launcher.Args, activation: str, gate: _arrays.Sig, gate_rows: _arrays.Rows, gate_pointer,
                        up: _arrays.Sig, up_rows: _arrays.Rows, up_pointer, out: _arrays.Sig, out_rows: _arrays.Rows,
                        allocate: tuple, disjoint: tuple, fused: bool = False) -> launcher.Launch:
    """The launch of ``out = act(gate) * up`` once gate, up and out are checked.
    ``gate_pointer``/``up_pointer`` name their arrays, or (name, byte offset) for the
    second half of a fused row (``fused``: x = [gate | up], which act_and_mul_sized_kernel
    takes where :func:`_takes_sized` says)."""
    dtype = gate.dtype
    gate_name = gate_pointer if isinstance(gate_pointer, str) else gate_pointer[0]
    up_name = up_pointer if isinstance(up_pointer, str) else up_pointer[0]
    _arrays.distinct_rows(out_rows, "out")
    if out_rows.num_rows == 0:
        return launcher.Launch(None, allocate=allocate, returns="out")
    # Before the plan: checks, so the float64 twins (launcher.Op.check) raise them too.
    row_strides = (_arrays.int32_row_stride(gate_rows, gate_name), _arrays.int32_row_stride(up_rows, up_name),
                   _arrays.int32_row_stride(out_rows, "out"))
    if isinstance(up_pointer, tuple):  # up starts inside gate's row: its alignment follows from gate's
        up = up._replace(align=(gate.align + up_pointer[1]) % 16)
    aligned = _arrays.vector_aligned(_dtypes.vec_width(dtype), (gate, gate_rows.row_stride), (up, up_rows.row_stride),
                                     (out, out_rows.row_stride))
    plan = plans.plan_activation(out_rows.num_rows, out_rows.hidden_size, dtype, aligned=aligned, limits=a.limits,
                                 overrides=a.overrides, op=a.op_name)
    if fused and _takes_sized(plan, dtype, gate_rows, out_rows):
        return launcher.Launch(
            ACT_AND_MUL_SIZED, (_dtypes.c_type(dtype), ACTIVATIONS[activation], plan.vec_width, out_rows.hidden_size),
            plan, pointers=("out", gate_name), allocate=allocate, returns="out", disjoint=disjoint)
    return launcher.Launch(
        ACT_AND_MUL, (_dtypes.c_type(dtype), ACTIVATIONS[activation], plan.vec_width, plan.grid_stride), plan,
        pointers=("out", gate_pointer, up_pointer),
        scalars=(np.int32(out_rows.hidden_size), *row_strides, np.int64(out_rows.num_rows)),
        allocate=allocate, returns="out", disjoint=disjoint)


def _prepare_fused(activation: str):
    """The prepare of silu_and_mul / gelu_and_mul: x = [gate | up] along the last axis."""
    def prepare(a: launcher.Args) -> launcher.Launch:
        act = gelu_activation(a.approximate) if activation == "gelu" else activation
        x = _arrays.required(a.x, "x", "a device array (..., 2 * d)")
        _arrays.supported_dtype(x, "x")
        _arrays.element_aligned(x, "x")
        out_shape = gated_output_shape(x.shape, "x")
        rows = _arrays.rows_of(x, "x")
        out, allocate = launcher.output(a.out, "out", out_shape, x.dtype)
        out_rows = _arrays.rows_of(out, "out")
        d = out_shape[-1]
        # gate and up are the two halves of each row of x: same row stride, up d further on.
        half = _arrays.Rows(rows.num_rows, d, rows.row_stride)
        return _act_and_mul_launch(a, act, x, half, "x", x, half, ("x", d * x.itemsize), out, out_rows, allocate,
                                   (launcher.Disjoint("x", "out", a_rows=rows, b_rows=out_rows),), fused=True)
    return prepare


def _takes_sized(plan: plans.ActivationPlan, dtype, half: _arrays.Rows, out_rows: _arrays.Rows) -> bool:
    """Whether act_and_mul_sized_kernel runs ``plan`` on x = [gate | up] (``half``: gate's
    rows): a block per work item in decode vectors, a d of :data:`SIZED_D`, and x's and
    out's rows contiguous (2 d and d elements apart, or one row). The same slots and bits."""
    d = out_rows.hidden_size
    return (not plan.grid_stride and d in SIZED_D and plan.vec_width in plans.activation_decode_vec_widths(dtype)
            and (out_rows.num_rows == 1 or (half.row_stride == 2 * d and out_rows.row_stride == d)))


def _prepare_swiglu(a: launcher.Args) -> launcher.Launch:
    gate = _arrays.required(a.gate, "gate", "a device array (..., d)")
    _arrays.supported_dtype(gate, "gate")
    _arrays.element_aligned(gate, "gate")
    up = _arrays.required(a.up, "up", "a device array (..., d)")
    _arrays.check_dtype(up, gate.dtype, "up", "the dtype of gate")
    _arrays.element_aligned(up, "up")
    check_same_shape(gate.shape, up.shape)
    gate_rows, up_rows = _arrays.rows_of(gate, "gate"), _arrays.rows_of(up, "up")
    out, allocate = launcher.output(a.out, "out", gate.shape, gate.dtype)
    out_rows = _arrays.rows_of(out, "out")
    return _act_and_mul_launch(
        a, "silu", gate, gate_rows, "gate", up, up_rows, "up", out, out_rows, allocate,
        (launcher.Disjoint("gate", "out", allow_same=True, a_rows=gate_rows, b_rows=out_rows),
         launcher.Disjoint("up", "out", allow_same=True, a_rows=up_rows, b_rows=out_rows)))


_SILU_AND_MUL = launcher.Op("silu_and_mul", arrays=("x", "out"),
                            prepare=_prepare_fused("silu"), plan_kind="activation",
                            launch_options=plans.ACTIVATION_OVERRIDE_KEYS)
_GELU_AND_MUL = launcher.Op("gelu_and_mul", arrays=("x", "out"), scalars=("approximate",),
                            prepare=_prepare_fused("gelu"), plan_kind="activation",
                            launch_options=plans.ACTIVATION_OVERRIDE_KEYS)
_SWIGLU = launcher.Op("swiglu", arrays=("gate", "up", "out"), prepare=_prepare_swiglu, plan_kind="activation",
                      launch_options=plans.ACTIVATION_OVERRIDE_KEYS)


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
        ValueError: the last axis of ``x`` is odd or empty; d of ``2**31 - 16`` or more
            (the kernel's in-row indices are 32-bit); rows of ``x`` or ``out`` ``2**31``
            elements or more apart (its row strides are 32-bit), so with more than one
            row d of ``2**30`` or more even when ``x`` is contiguous (its rows are 2 * d
            apart); wrong ``out`` shape;
            non-unit last stride; rows that do not share one stride; ``out``
            overlapping ``x``; an array on another GPU; a launch override the
            activations do not take, or an illegal one (``cupykern.launcher.overrides``).

    Notes:
        fp32 math, one rounding to the dtype: libdevice ``expf`` and IEEE division
        for float32, the ``__expf``/``__fdividef`` intrinsics for float16/bfloat16,
        whose relative error (below 2**-16) the 16-bit rounding hides
        (``kernels_cu/cupykern/fastmath.cuh``). Finite gates never
        give NaN: a gate of -1e4 gives -0 * up; +inf gives inf * up; NaN stays in its
        element. fp16 products beyond 65504 round to inf. At decode sizes, with d one of
        :data:`SIZED_D` (the presets' intermediate sizes) and contiguous rows, the kernel
        is built with d as a constant (0.03-0.06 us a call less; the same bits).

    References:
        Shazeer, "GLU Variants Improve Transformer", 2020 (arXiv:2002.05202); SiLU,
        Elfwing, Uchibe & Doya 2017 (arXiv:1702.03118) and Hendrycks & Gimpel 2016
        (arXiv:1606.08415); layout and semantics of vLLM's ``silu_and_mul`` and
        FlashInfer's ``silu_and_mul``.
    """
    return _SILU_AND_MUL((x, out))

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
        ``1 + tanh`` cancel. A gate of -inf gives -0 * up, not NaN. Decode sizes of the
        presets' d: as :func:`silu_and_mul`.

    References:
        Hendrycks & Gimpel, "Gaussian Error Linear Units (GELUs)", 2016
        (arXiv:1606.08415); GeGLU, Shazeer 2020 (arXiv:2002.05202); layout of vLLM's
        ``gelu_and_mul`` / ``gelu_tanh_and_mul``; ``approximate`` as in
        ``torch.nn.functional.gelu``; the 16-bit erfc, Press et al., Numerical Recipes
        in C, 2nd ed., 1992, sec. 6.2 (``erfcc``).
    """
    return _GELU_AND_MUL((x, out), (approximate,))

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
            axis, or one of ``2**31 - 16`` elements or more; rows ``2**31`` elements or
            more apart; non-unit last stride; rows that do not share one stride;
            ``out`` partially overlapping ``gate`` or
            ``up``; an array on another GPU; a launch override as :func:`silu_and_mul`.

    Notes:
        fp32 math, one rounding; same extreme-value behaviour as :func:`silu_and_mul`.
        ``swiglu(x[..., :d], x[..., d:])`` equals ``silu_and_mul(x)`` bit for bit.

    References:
        Shazeer, "GLU Variants Improve Transformer", 2020 (arXiv:2002.05202); SiLU,
        Elfwing, Uchibe & Doya 2017 (arXiv:1702.03118).
    """
    return _SWIGLU((gate, up, out))
