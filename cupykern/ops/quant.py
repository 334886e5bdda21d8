"""FP8 (E4M3FN) outputs fused into RMSNorm and SiLU-and-mul (kernels_cu/quant.cu).

rms_norm_quant, fused_add_rms_norm_quant, silu_and_mul_quant (static per-tensor
scale), rms_norm_dynamic_per_token_quant, fused_add_rms_norm_dynamic_per_token_quant
(a scale per row, computed in the same kernel). The row machinery is the norm and
activation families' own (kernels_cu/cupykern/rms_norm_rows.cuh, gated_rows.cuh, and
their plan rules); this module adds the FP8 epilogues' intake.

Outputs are ``uint8`` arrays holding E4M3FN bit patterns: CuPy 14.2 registers
``ml_dtypes.bfloat16`` as a device dtype but no float8 type (no ``float8`` in its
compiled modules; no CuPy issue or document found says otherwise), so a device array of
``ml_dtypes.float8_e4m3fn`` is not relied upon. On the host,
``cupy.asnumpy(y).view(ml_dtypes.float8_e4m3fn)`` reads them as FP8 values.
"""

from __future__ import annotations

import numpy as np

from cupykern import _arrays, _dtypes, launcher, plans
from cupykern.jit import KernelTemplate
from cupykern.ops.activation import ACTIVATIONS, gated_output_shape

__all__ = ["fused_add_rms_norm_dynamic_per_token_quant", "fused_add_rms_norm_quant",
           "rms_norm_dynamic_per_token_quant", "rms_norm_quant", "silu_and_mul_quant"]

RMS_NORM_QUANT = KernelTemplate("quant.cu", "rms_norm_quant_kernel")
FUSED_ADD_RMS_NORM_QUANT = KernelTemplate("quant.cu", "fused_add_rms_norm_quant_kernel")
RMS_NORM_DYNAMIC = KernelTemplate("quant.cu", "rms_norm_dynamic_per_token_quant_kernel")
FUSED_ADD_RMS_NORM_DYNAMIC = KernelTemplate("quant.cu", "fused_add_rms_norm_dynamic_per_token_quant_kernel")
ACT_AND_MUL_QUANT = KernelTemplate("quant.cu", "act_and_mul_quant_kernel")

_ROW_TEMPLATES = (RMS_NORM_QUANT, FUSED_ADD_RMS_NORM_QUANT, RMS_NORM_DYNAMIC, FUSED_ADD_RMS_NORM_DYNAMIC)
#: The activations act_and_mul_quant_kernel is instantiated for (kAct values of ACTIVATIONS).
QUANT_ACTIVATIONS = ("silu",)
#: Where the E4M3FN bit patterns are stored (see the module docstring).
STORAGE = np.dtype(np.uint8)
_FLOAT32 = np.dtype(np.float32)
_NO_BOUND = np.float32(np.inf)


def instantiations() -> dict[KernelTemplate, list[str]]:
    """Every instantiation of this family: the norm kernels per dtype x row layout, the
    activation kernel per dtype x activation x vector width x walk."""
    spaces = {t: [t.expr(_dtypes.c_type(d), *layout.template_args()) for d in _dtypes.DTYPES
                  for layout in plans.row_layouts(d)] for t in _ROW_TEMPLATES}
    spaces[ACT_AND_MUL_QUANT] = [ACT_AND_MUL_QUANT.expr(_dtypes.c_type(d), ACTIVATIONS[act], v, grid_stride)
                                 for d in _dtypes.DTYPES for act in QUANT_ACTIVATIONS
                                 for v in plans.activation_vec_widths(d) for grid_stride in (False, True)]
    return spaces


# ----------------------------------------------------------------- intake and plan
def scale_tensor(sig: _arrays.Sig | None, name: str = "scale") -> _arrays.Sig:
    """A static per-tensor scale: a device float32 array of shape (1,)."""
    sig = _arrays.required(sig, name, "a device float32 array of shape (1,)")
    _arrays.check_dtype(sig, _FLOAT32, name, "a per-tensor scale")
    _arrays.check_shape(sig, (1,), name)
    _arrays.element_aligned(sig, name)
    return sig


def scale_upper_bound(value) -> np.float32:
    """``scale_ub`` as the kernel's float32 (+inf for None): finite, > 0 and normal."""
    if value is None:
        return _NO_BOUND
    bound = _arrays.real(value, "scale_ub", zero_allowed=False)
    if not (np.isfinite(bound) and bound > 0):
        raise ValueError(f"scale_ub: expected a finite value > 0 or None, got {value!r}")
    return bound


def _norm_inputs(a: launcher.Args, fused: bool):
    """x (and residual), weight, eps, weight_offset, checked as rms_norm / fused_add_rms_norm check them."""
    x, rows = _arrays.row_input(a.x)
    residual = res_rows = None
    if fused:
        residual = _arrays.required(a.residual, "residual")
        _arrays.check_dtype(residual, x.dtype, "residual", "the dtype of x")
        _arrays.check_shape(residual, x.shape, "residual")
        _arrays.element_aligned(residual, "residual")
        res_rows = _arrays.written_rows(residual, "residual")
    weight = _arrays.vector(a.weight, "weight", x.dtype, rows.hidden_size, what="the dtype of x")
    return x, rows, residual, res_rows, weight, _arrays.eps(a.eps), _arrays.finite(a.weight_offset, "weight_offset")


def _prepare_norm(fused: bool, dynamic: bool):
    """The prepare of the four RMSNorm quant ops."""
    op = ("fused_add_" if fused else "") + "rms_norm_" + ("dynamic_per_token_quant" if dynamic else "quant")
    template = {(False, False): RMS_NORM_QUANT, (True, False): FUSED_ADD_RMS_NORM_QUANT,
                (False, True): RMS_NORM_DYNAMIC, (True, True): FUSED_ADD_RMS_NORM_DYNAMIC}[fused, dynamic]

    def prepare(a: launcher.Args) -> launcher.Launch:
        x, rows, residual, res_rows, weight, eps, weight_offset = _norm_inputs(a, fused)
        if dynamic:
            scale_ub = scale_upper_bound(a.scale_ub)
        else:
            scale_tensor(a.scale)
        out, allocate = launcher.output(a.out, "out", x.shape, STORAGE)
        out_rows = _arrays.written_rows(out, "out")
        scales = scales_rows = None
        if dynamic:
            scales, allocate_scales = launcher.output(a.scales, "scales", (*x.shape[:-1], 1), _FLOAT32)
            scales_rows = _arrays.written_rows(scales, "scales")
            allocate += allocate_scales
        returns = ("out", "scales") if dynamic else ("out", "residual") if fused else "out"
        if rows.num_rows == 0:
            return launcher.Launch(None, allocate=allocate, returns=returns)
        aligned = _arrays.vector_aligned(_dtypes.vec_width(x.dtype), (x, rows.row_stride),
                                         (residual, res_rows.row_stride if fused else 0),
                                         (out, out_rows.row_stride), (weight, 0))
        plan = plans.plan_rows(rows.num_rows, rows.hidden_size, x.dtype, aligned=aligned, limits=a.limits, op=op,
                               overrides=a.overrides)
        pointers = ("out", *(("scales",) if dynamic else ()), "x", *(("residual",) if fused else ()), "weight",
                    *(() if dynamic else ("scale",)))
        strides = (rows.row_stride, *((res_rows.row_stride,) if fused else ()), out_rows.row_stride,
                   *((scales_rows.row_stride,) if dynamic else ()))
        scalars = (np.int64(rows.num_rows), np.int64(rows.hidden_size), *map(np.int64, strides), eps, weight_offset,
                   *((scale_ub,) if dynamic else ()))
        disjoint = [launcher.Disjoint("x", "out", a_rows=rows, b_rows=out_rows),
                    launcher.Disjoint("weight", "out")]
        if not dynamic:  # every block reads the scale while others write out (and residual)
            disjoint.append(launcher.Disjoint("scale", "out"))
        if fused:
            disjoint += [launcher.Disjoint("x", "residual", a_rows=rows, b_rows=res_rows),
                         launcher.Disjoint("residual", "out", a_rows=res_rows, b_rows=out_rows),
                         launcher.Disjoint("weight", "residual")]
            if not dynamic:
                disjoint.append(launcher.Disjoint("scale", "residual"))
        if dynamic:
            disjoint += [launcher.Disjoint(name, "scales") for name in ("x", "weight", "out")]
            if fused:
                disjoint.append(launcher.Disjoint("residual", "scales"))
        return launcher.Launch(template, (_dtypes.c_type(x.dtype), *plan.layout.template_args()), plan,
                               pointers=pointers, scalars=scalars, allocate=allocate, returns=returns,
                               disjoint=tuple(disjoint))
    return prepare


def _prepare_silu_and_mul_quant(a: launcher.Args) -> launcher.Launch:
    x = _arrays.required(a.x, "x", "a device array (..., 2 * d)")
    _arrays.supported_dtype(x, "x")
    _arrays.element_aligned(x, "x")
    out_shape = gated_output_shape(x.shape, "x")
    rows = _arrays.rows_of(x, "x")
    scale_tensor(a.scale)
    out, allocate = launcher.output(a.out, "out", out_shape, STORAGE)
    out_rows = _arrays.written_rows(out, "out")
    if out_rows.num_rows == 0:
        return launcher.Launch(None, allocate=allocate, returns="out")
    d = out_shape[-1]
    half = _arrays.Rows(rows.num_rows, d, rows.row_stride)
    # Before the plan: checks, so the float64 twin (launcher.Op.check) raises them too.
    x_stride, out_stride = _arrays.int32_row_stride(half, "x"), _arrays.int32_row_stride(out_rows, "out")
    up = x._replace(align=(x.align + d * x.itemsize) % 16)  # up starts d elements into each row of x
    aligned = _arrays.vector_aligned(_dtypes.vec_width(x.dtype), (x, half.row_stride), (up, half.row_stride),
                                     (out, out_rows.row_stride))
    plan = plans.plan_activation(out_rows.num_rows, d, x.dtype, aligned=aligned, limits=a.limits,
                                 overrides=a.overrides, op=a.op_name)
    return launcher.Launch(
        ACT_AND_MUL_QUANT, (_dtypes.c_type(x.dtype), ACTIVATIONS["silu"], plan.vec_width, plan.grid_stride), plan,
        pointers=("out", "x", ("x", d * x.itemsize), "scale"),
        scalars=(np.int32(d), x_stride, x_stride, out_stride, np.int64(out_rows.num_rows)),
        allocate=allocate, returns="out",
        disjoint=(launcher.Disjoint("x", "out", a_rows=rows, b_rows=out_rows), launcher.Disjoint("scale", "out")))


_ROW_OPTIONS = dict(plan_kind="rows", launch_options=plans.ROW_OVERRIDE_KEYS)
_RMS_NORM_QUANT = launcher.Op("rms_norm_quant", arrays=("x", "weight", "scale", "out"),
                              scalars=("eps", "weight_offset"), prepare=_prepare_norm(False, False), **_ROW_OPTIONS)
_FUSED_ADD_RMS_NORM_QUANT = launcher.Op("fused_add_rms_norm_quant", arrays=("x", "residual", "weight", "scale", "out"),
                                        scalars=("eps", "weight_offset"), prepare=_prepare_norm(True, False),
                                        **_ROW_OPTIONS)
_RMS_NORM_DYNAMIC = launcher.Op("rms_norm_dynamic_per_token_quant", arrays=("x", "weight", "out", "scales"),
                                scalars=("eps", "scale_ub", "weight_offset"), prepare=_prepare_norm(False, True),
                                **_ROW_OPTIONS)
_FUSED_ADD_RMS_NORM_DYNAMIC = launcher.Op("fused_add_rms_norm_dynamic_per_token_quant",
                                          arrays=("x", "residual", "weight", "out", "scales"),
                                          scalars=("eps", "scale_ub", "weight_offset"),
                                          prepare=_prepare_norm(True, True), **_ROW_OPTIONS)
_SILU_AND_MUL_QUANT = launcher.Op("silu_and_mul_quant", arrays=("x", "scale", "out"),
                                  prepare=_prepare_silu_and_mul_quant, plan_kind="activation",
                                  launch_options=plans.ACTIVATION_OVERRIDE_KEYS)


# ----------------------------------------------------------------- public API
_FORMAT = """The output holds E4M3FN bit patterns (OCP OFP8: 1 sign, 4 exponent bits of bias 7, 3
    mantissa bits; largest finite 448, smallest normal 2**-6, smallest subnormal 2**-9; no
    infinities) in a ``uint8`` array, because CuPy 14 has no float8 device dtype; read it
    on the host as ``cupy.asnumpy(out).view(ml_dtypes.float8_e4m3fn)``."""


def rms_norm_quant(x, weight, scale, eps: float = 1e-6, *, weight_offset: float = 0.0, out=None):
    """RMSNorm quantised to FP8 E4M3FN with a static per-tensor scale, in one kernel.

    ``out = round_e4m3fn(rms_norm(x, weight, eps, weight_offset) * (1 / scale))``

    Parameters:
        x: device array ``(..., hidden_size)``, float16, bfloat16 or float32 (the layout
            rules of :func:`cupykern.rms_norm`).
        weight: ``(hidden_size,)``, x's dtype, unit-stride.
        scale: device float32 array of shape ``(1,)``: the dequantisation scale
            (``x_fp8 * scale`` approximates the normalised value). Read on the device by
            the kernel (a CUDA graph replays with its current value); its value is not
            checked: 0 gives +-448 (NaN where y is 0), a negative scale flips signs.
        eps, weight_offset: as in :func:`cupykern.rms_norm`.
        out: optional ``(..., hidden_size)`` uint8 array to write into; must not overlap
            ``x``, ``weight`` or ``scale``.

    Returns:
        ``out`` (allocated if not given): x's shape, uint8 holding E4M3FN bits.

    Mutates: ``out`` only.

    Raises:
        TypeError: ``x``/``weight``/``scale``/``out`` is a NumPy or non-array object (a
            host ``scale`` too), ``scale`` is not float32, ``out`` is not uint8, or x's
            dtype is unsupported or mismatched by ``weight``.
        ValueError: ``scale`` not of shape (1,); otherwise as :func:`cupykern.rms_norm`
            (shapes, strides, eps, weight_offset, overlaps, another GPU) but for its
            ``2**31`` limits (this kernel's arguments are 64-bit).

    Notes:
        y is computed exactly as :func:`cupykern.rms_norm` computes it (fp32, the same
        code), then multiplied by ``1 / scale`` (rounded to fp32 once per thread) and
        rounded once, to nearest even, to E4M3FN, saturating: finite values beyond 448,
        and infinities, give +-448; NaN stays NaN (``__nv_cvt_float_to_fp8`` with
        ``__NV_SATFINITE``). vLLM's kernel also multiplies by ``1 / scale`` but clamps NaN
        to 448. {format}

    References:
        vLLM ``rms_norm_static_fp8_quant`` (``csrc/layernorm_quant_kernels.cu``) and
        FlashInfer ``rmsnorm_quant`` (semantics); OCP 8-bit Floating Point Specification
        (OFP8) rev. 1.0 (E4M3FN); RMSNorm, arXiv:1910.07467.
    """
    return _RMS_NORM_QUANT((x, weight, scale, out), (eps, weight_offset))


def fused_add_rms_norm_quant(x, residual, weight, scale, eps: float = 1e-6, *, weight_offset: float = 0.0, out=None):
    """Residual add, then RMSNorm quantised to FP8 E4M3FN with a static scale, in one kernel.

    ``residual <- round(x + residual)``; ``out = round_e4m3fn(rms_norm(residual) * (1 / scale))``

    Parameters:
        x: device array ``(..., hidden_size)``, float16, bfloat16 or float32; read only.
        residual: same shape and dtype as ``x``; overwritten with ``x + residual``
            (added in fp32, rounded once to the dtype, exactly as
            :func:`cupykern.fused_add_rms_norm` does; that rounded sum is normalised);
            must not overlap ``x``, ``weight`` or ``scale``.
        weight, eps, weight_offset: as in :func:`cupykern.rms_norm`.
        scale: device float32 ``(1,)``, as in :func:`rms_norm_quant`.
        out: optional ``(..., hidden_size)`` uint8 array; must not overlap the inputs.

    Returns:
        ``(out, residual)``: the E4M3FN bits (uint8, allocated if not given) and the
        updated residual (the same array).

    Mutates: ``out`` and ``residual``; ``x`` is not written (unlike
    :func:`cupykern.fused_add_rms_norm`, the normalised value goes to ``out``).

    Raises:
        TypeError, ValueError: as :func:`rms_norm_quant`, and as
            :func:`cupykern.fused_add_rms_norm` for ``residual``.

    Notes:
        As :func:`rms_norm_quant`. {format}

    References:
        vLLM ``fused_add_rms_norm_static_fp8_quant``; FlashInfer
        ``fused_add_rmsnorm_quant``; OCP OFP8 rev. 1.0.
    """
    return _FUSED_ADD_RMS_NORM_QUANT((x, residual, weight, scale, out), (eps, weight_offset))


def rms_norm_dynamic_per_token_quant(x, weight, eps: float = 1e-6, *, scale_ub=None, weight_offset: float = 0.0,
                                     out=None, scales=None):
    """RMSNorm quantised to FP8 E4M3FN with a scale per row (token), computed in the same kernel.

    ``y = rms_norm(x, weight, eps, weight_offset)``;
    ``scales[t] = max(min(max_i |y[t, i]|, scale_ub) / 448, 1 / (448 * 512))``;
    ``out[t, i] = round_e4m3fn(y[t, i] * (1 / scales[t]))``

    Parameters:
        x, weight, eps, weight_offset: as in :func:`rms_norm_quant`.
        scale_ub: optional upper bound on ``max |y|`` before the division by 448 (vLLM's
            ``scale_ub``; a host number here, not a device tensor): finite, > 0 and at
            least 1.1754944e-38. None: no bound.
        out: optional ``(..., hidden_size)`` uint8 array.
        scales: optional ``(..., 1)`` float32 array (x's leading shape, then 1, as vLLM's
            ``(num_tokens, 1)``) for the scales.

    Returns:
        ``(out, scales)``: E4M3FN bits (uint8) and the dequantisation scales (float32,
        ``out[t] * scales[t]`` approximates ``y[t]``), allocated if not given.

    Mutates: ``out`` and ``scales``.

    Raises:
        TypeError: as :func:`rms_norm_quant` (no ``scale`` here); ``scales`` not float32;
            ``scale_ub`` not a real number.
        ValueError: as :func:`rms_norm_quant`; ``scales`` of another shape; ``scale_ub``
            not finite, <= 0 or below 1.1754944e-38 (the kernels flush it to 0).

    Notes:
        One kernel: y as :func:`cupykern.rms_norm` computes it, a second pass over the
        row held in registers for ``max |y|`` (reduced over the row's threads), then the
        quantisation. The row maximum and the division by 448 are fp32; the floor
        ``1 / (448 * 512)`` is vLLM's ``min_scaling_factor`` and keeps an all-zero row's
        scale positive (its output is all +0). A NaN in a row's y makes that row's
        scale NaN and all its outputs NaN (vLLM's fmax reduction would drop it). Like
        the static ops, y is multiplied by ``1 / scales[t]`` (rounded to fp32); vLLM's
        per-token kernel divides by the scale, which can differ by one E4M3FN unit where
        ``y / scale`` lies within about 2**-23 relative of a rounding boundary. {format}

    References:
        vLLM ``rms_norm_dynamic_per_token_quant``
        (``csrc/quantization/fused_kernels/layernorm_utils.cuh``:
        ``compute_dynamic_per_token_scales``, ``min_scaling_factor``); OCP OFP8 rev. 1.0.
    """
    return _RMS_NORM_DYNAMIC((x, weight, out, scales), (eps, scale_ub, weight_offset))


def fused_add_rms_norm_dynamic_per_token_quant(x, residual, weight, eps: float = 1e-6, *, scale_ub=None,
                                               weight_offset: float = 0.0, out=None, scales=None):
    """Residual add, then RMSNorm quantised to FP8 E4M3FN with a scale per row, in one kernel.

    ``residual <- round(x + residual)``; then :func:`rms_norm_dynamic_per_token_quant`
    of ``residual``.

    Parameters:
        x: device array ``(..., hidden_size)``, float16, bfloat16 or float32; read only.
        residual: same shape and dtype as ``x``; overwritten with ``x + residual``
            (fp32 add, one rounding to the dtype, as :func:`cupykern.fused_add_rms_norm`);
            must not overlap ``x`` or ``weight``.
        weight, eps, scale_ub, weight_offset, out, scales: as in
            :func:`rms_norm_dynamic_per_token_quant`.

    Returns:
        ``(out, scales)`` as :func:`rms_norm_dynamic_per_token_quant` (``residual`` is
        updated in place, as vLLM's op with a residual does).

    Mutates: ``out``, ``scales`` and ``residual``.

    Raises:
        TypeError, ValueError: as :func:`rms_norm_dynamic_per_token_quant`, and as
            :func:`cupykern.fused_add_rms_norm` for ``residual``.

    Notes:
        As :func:`rms_norm_dynamic_per_token_quant`. {format}

    References:
        vLLM ``rms_norm_dynamic_per_token_quant`` with ``residual``; OCP OFP8 rev. 1.0.
    """
    return _FUSED_ADD_RMS_NORM_DYNAMIC((x, residual, weight, out, scales), (eps, scale_ub, weight_offset))


def silu_and_mul_quant(x, scale, *, out=None):
    """SiLU-gated product quantised to FP8 E4M3FN with a static per-tensor scale, in one kernel.

    ``out = round_e4m3fn(silu(x[..., :d]) * x[..., d:] * (1 / scale))``

    Parameters:
        x: device array ``(..., 2 * d)``, float16, bfloat16 or float32: gate then up
            along the last axis (the layout rules of :func:`cupykern.silu_and_mul`).
        scale: device float32 ``(1,)``, as in :func:`rms_norm_quant`.
        out: optional ``(..., d)`` uint8 array; must not overlap ``x`` or ``scale``.

    Returns:
        ``out`` (allocated if not given), shape ``(..., d)``, uint8 holding E4M3FN bits.

    Mutates: ``out`` only.

    Raises:
        TypeError: as :func:`cupykern.silu_and_mul`; ``scale`` not a device float32 array;
            ``out`` not uint8.
        ValueError: as :func:`cupykern.silu_and_mul`; ``scale`` not of shape (1,).

    Notes:
        The product is computed as :func:`cupykern.silu_and_mul` computes it (fp32, the
        same code and intrinsics), then multiplied by ``1 / scale`` and rounded once
        to E4M3FN as in :func:`rms_norm_quant`. {format}

    References:
        vLLM ``silu_and_mul_quant`` (``csrc/quantization/activation_kernels.cu``);
        Shazeer 2020 (arXiv:2002.05202); OCP OFP8 rev. 1.0.
    """
    return _SILU_AND_MUL_QUANT((x, scale, out))


for _f in (rms_norm_quant, fused_add_rms_norm_quant, rms_norm_dynamic_per_token_quant,
           fused_add_rms_norm_dynamic_per_token_quant, silu_and_mul_quant):
    _f.__doc__ = _f.__doc__.replace("{format}", _FORMAT)
del _f
