"""The arguments a launch passes match its kernel's parameter list: count, order, width.

CuPy passes each scalar by address and the driver reads as many bytes as the kernel's
parameter declares, so a np.int32 given for an ``int64_t`` reads four stray bytes, and
nothing on the GPU says so. These kernels take a mix of 32- and 64-bit sizes and strides
(bench/results/NOTES.md, items 19-20). CPU only: the parameter list is read from the PTX
NVRTC makes of the planned instantiation, with the options CuPy uses. The ops: the row
and gated families this applies to, softmax and row_reduce, and RoPE, whose kernels take
the longest lists (apply_rope's both kernels, with and without M-RoPE, the wide one in
place and out of place).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from cupykern import _dtypes, jit, launcher, tuning
from tests.helpers import contiguous, prepare_args

F16, BF16, F32 = _dtypes.float16, _dtypes.bfloat16, np.dtype(np.float32)


def _values(op: str, num_tokens: int, hidden: int, dtype, q_heads: int = 32) -> dict:
    x = contiguous((num_tokens, hidden), dtype)
    weight = contiguous((hidden,), dtype)
    gated = contiguous((num_tokens, 2 * hidden), dtype)
    return {
        "rms_norm": dict(x=x, weight=weight, out=None, eps=1e-6, weight_offset=0.0),
        "fused_add_rms_norm": dict(x=x, residual=contiguous((num_tokens, hidden), dtype), weight=weight, eps=1e-6,
                                   weight_offset=0.0),
        "layer_norm": dict(x=x, weight=weight, bias=weight, out=None, eps=1e-5),
        "softmax": dict(x=x, out=None, temperature=1.0),
        "row_reduce": dict(x=x, op="sum", out=None),
        "silu_and_mul": dict(x=gated, out=None),
        "gelu_and_mul": dict(x=gated, out=None, approximate="none"),
        "swiglu": dict(gate=x, up=x, out=None),
        "silu_and_mul_quant": dict(x=gated, scale=contiguous((1,), F32), out=None),
        "apply_rope": dict(q=contiguous((num_tokens, q_heads, 128), dtype), k=contiguous((num_tokens, 8, 128), dtype),
                           positions=contiguous((num_tokens,), np.dtype(np.int64)),
                           cos_sin_cache=contiguous((8192, 128), F32), q_out=None, k_out=None, is_neox=True,
                           inplace=False, mrope_section=None, mrope_interleaved=False),
        "qk_rms_norm_rope": dict(q=contiguous((num_tokens, 32, 128), dtype), k=contiguous((num_tokens, 8, 128), dtype),
                                 q_weight=contiguous((128,), dtype), k_weight=contiguous((128,), dtype),
                                 positions=contiguous((num_tokens,), np.dtype(np.int64)),
                                 cos_sin_cache=contiguous((8192, 128), F32), eps=1e-6, is_neox=True),
    }[op]


def _launches():
    """One launch per (op, instantiation): decode and prefill sizes, 16-bit and fp32
    (llama-3.1-8b's shapes: 4096 wide, 32 + 8 heads of 128); apply_rope also with 512 q
    heads (past the wide kernel's heads), with M-RoPE sections, and in place (its own
    instantiation of the wide kernel) as well as out of place."""
    seen = {}

    def add(op, values):
        launch = launcher.ops()[op].prepare(prepare_args(op, **values))
        seen.setdefault((op, launch.template.expr(*launch.template_args)), launch)

    with tuning.suspended():
        for op in ("rms_norm", "fused_add_rms_norm", "layer_norm", "softmax", "row_reduce", "silu_and_mul",
                   "gelu_and_mul", "swiglu", "silu_and_mul_quant", "apply_rope", "qk_rms_norm_rope"):
            for dtype in (BF16, F32):
                for num_tokens in (1, 4096):
                    add(op, _values(op, num_tokens, 4096, dtype))
                    if op == "apply_rope":
                        add(op, {**_values(op, num_tokens, 4096, dtype), "inplace": True})
                        add(op, {**_values(op, num_tokens, 4096, dtype), "inplace": True,
                                 "positions": contiguous((3, num_tokens), np.dtype(np.int64)),
                                 "mrope_section": (16, 24, 24)})
        for num_tokens in (1, 64):
            add("apply_rope", _values("apply_rope", num_tokens, 4096, BF16, q_heads=512))
            add("apply_rope", {**_values("apply_rope", num_tokens, 4096, BF16),
                               "positions": contiguous((3, num_tokens), np.dtype(np.int64)),
                               "mrope_section": (16, 24, 24)})
    return seen


def _ptx_parameters(source: str, exprs: list[str]) -> dict[str, list[str]]:
    """{name expression: PTX parameter types of its entry, in order} (``u64``, ``u32``, ``f32``...)."""
    from cupy_backends.cuda.libs import nvrtc

    program = nvrtc.createProgram(jit.source(source), source, (), ())
    for expr in exprs:
        nvrtc.addNameExpression(program, expr)
    nvrtc.compileProgram(program, jit.nvrtc_options("90"))
    ptx = nvrtc.getPTX(program)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    parameters = {}
    for expr in exprs:
        lowered = nvrtc.getLoweredName(program, expr)
        entry = re.search(r"\.entry\s+" + re.escape(lowered) + r"\s*\((.*?)\)", ptx, re.DOTALL)
        parameters[expr] = re.findall(r"\.param\s+\.(\w+)", entry.group(1))
    return parameters


def _ptx_type(value) -> str:
    """The PTX parameter type a scalar argument fills: its kind and width."""
    dtype = np.dtype(type(value))
    kind = {"i": "s", "u": "u", "f": "f"}[dtype.kind]
    return f"{kind}{dtype.itemsize * 8}"


def test_scalars_match_the_kernel_parameters():
    launches = _launches()
    by_source: dict[str, list[str]] = {}
    for (_, expr), launch in launches.items():
        by_source.setdefault(launch.template.source, []).append(expr)
    parameters = {}
    for source, exprs in by_source.items():
        parameters.update(_ptx_parameters(source, exprs))
    assert len(launches) >= 18  # every op at two sizes and two dtypes, less shared instantiations
    rope_kernels = {launch.template.name for (op, _), launch in launches.items() if op == "apply_rope"}
    assert rope_kernels == {"apply_rope_kernel", "apply_rope_wide_kernel", "apply_rope_token_kernel"}
    for (op, expr), launch in launches.items():
        params = parameters[expr]
        pointers, scalars = params[:len(launch.pointers)], params[len(launch.pointers):]
        assert pointers == ["u64"] * len(launch.pointers), (op, expr, params)
        # PTX declares integer parameters unsigned (.u32/.u64): compare widths for them.
        got = [p.replace("s", "u") for p in map(_ptx_type, launch.scalars)]
        assert got == scalars, (op, expr, [type(s).__name__ for s in launch.scalars], params)


@pytest.mark.parametrize("value, expected", [(np.int32(1), "s32"), (np.int64(1), "s64"), (np.float32(1), "f32")])
def test_ptx_type_of_a_scalar(value, expected):
    assert _ptx_type(value) == expected
