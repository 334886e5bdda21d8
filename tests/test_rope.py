"""Rope family: rope_cos_sin_cache, apply_rope, qk_rms_norm_rope (kernels_cu/rope.cu).

CPU: the rope instantiation space (compiled by tests/test_jit_compile.py) and the
planned kernel's register use, cos/sin tables against independent float64 formulas for
every scaling, argument errors, each op's intake spec on hand-built call signatures,
planner rules, reference properties. GPU (marked): kernels against the float64 reference over dtypes, pairings,
head sizes, partial rotary, GQA/MQA head counts, token counts and layouts (fused QKV
views, misaligned views, k=None, 4-D input), in-place / out-of-place byte checks,
out-of-range positions and CUDA-graph capture.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from functools import lru_cache

import cupy
import numpy as np
import pytest

import cupykern
from cupykern import _dtypes, families, jit, launcher, plans, reference, rope_scaling
from cupykern._arrays import Sig
from cupykern.ops import rope as rope_ops
from tests.helpers import (DTYPES, DTYPE_IDS, as_fake, assert_close, assert_same_error, contiguous,
                           kernel_and_reference_errors, overlap_check, overlap_checker, prepare_args,
                           random_device)

HEAD_DIMS = [64, 80, 96, 128, 256]
#: (num_q_heads, num_kv_heads): Llama-3 GQA, 8:1 GQA, MHA with one head.
HEADS = [(32, 8), (8, 1), (1, 1)]
NUM_TOKENS = [0, 1, 7, 4096]
POSITION_DTYPES = [np.int32, np.int64]
MAX_POSITION = 131072
BASE = 500000.0


# ----------------------------------------------------------------- CPU: instantiations
def test_rope_instantiation_count_is_bounded():
    exprs = families.instantiations()["rope.cu"]
    # steps kernels: 60 apply_rope x 3 M-RoPE layouts (NeoX only for M-RoPE: 60 + 2 x 30) + 80 qk_rms_norm_rope;
    # wide kernels: the same x 4 heads-per-thread choices x in place or not for apply_rope (960)
    # + 80 qk_rms_norm_rope x 4 heads-per-thread choices x pass-through dims or not (640);
    # qk_rms_norm_rope's token kernel: the wide one's bf16 ones of 16-byte vectors without
    # pass-through dims (24 x 4 = 96); apply_rope's: the wide one's in-place 16-bit ones of
    # 16-byte vectors without M-RoPE x 3 row groups x 4 heads-per-thread choices and
    # ROPE_TOKEN_BAND_HEADS (16 x 3 x 5 = 240)
    assert len(exprs) == len(set(exprs)) and len(exprs) <= 2200
    spaces = rope_ops.instantiations()
    assert sorted(exprs) == sorted(e for space in spaces.values() for e in space)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_apply_rope_planned_kernel_does_not_spill(dtype):
    """The Llama-3 shape's instantiations (both pairings) fit the 64-register budget."""
    plan = plans.plan_rope(16384, 40, 128, 128, dtype, max_vec_width=_dtypes.vec_width(dtype), fused_norm=False,
                           limits=plans.H200_LIMITS)
    exprs = [rope_ops.APPLY_ROPE.expr(_dtypes.c_type(dtype), "float", "long long", neox, plan.vec_width, layout)
             for neox, layout in ((True, 0), (False, 0), (True, 1), (True, 2))]  # M-RoPE: NeoX only
    spills = jit.nvrtc_spills("rope.cu", exprs, "90")
    assert not any(spills.values()), {e: n for e, n in spills.items() if n}


# ----------------------------------------------------------------- CPU: planner
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("head_dim, rotary_dim", [(64, 64), (80, 40), (80, 32), (96, 48), (112, 56), (128, 64),
                                                  (256, 256), (130, 2)])
@pytest.mark.parametrize("fused_norm", [False, True])
def test_plan_rope_is_legal(dtype, head_dim, rotary_dim, fused_norm):
    groups = set()
    for num_tokens in (1, 7, 4096, 100000):
        for max_vec in sorted(set(plans.rope_vec_widths(dtype, fused_norm=fused_norm))):
            plan = plans.plan_rope(num_tokens, 40, head_dim, rotary_dim, dtype, max_vec_width=max_vec,
                                   fused_norm=fused_norm, limits=plans.H200_LIMITS)
            assert plan.vec_width <= max_vec and (rotary_dim // 2) % plan.vec_width == 0
            assert head_dim % plan.vec_width == 0
            assert plan.block_size % 32 == 0 and plan.block_size <= plans.ROPE_MAX_BLOCK_SIZE
            assert plan.threads_per_head * plan.head_slots * plan.tokens_per_block <= plan.block_size
            # a block per tokens_per_block tokens, or the wide layout's waves walking them grid-stride
            waves = plans.ROPE_WIDE_NORM_GRID_WAVES if fused_norm else plans.ROPE_WIDE_GRID_WAVES
            per_sm = max(1, plans.ROPE_WIDE_BLOCKS_PER_SM * plans.ROPE_MAX_BLOCK_SIZE // plan.block_size)
            capped = plan.heads_per_thread and waves and plan.grid[0] == waves * per_sm * plans.H200_LIMITS.sm_count
            assert 1 <= plan.grid[0] and (capped or plan.grid[0] * plan.tokens_per_block >= num_tokens)
            if fused_norm:
                assert plan.threads_per_head in plans.ROPE_NORM_THREADS_PER_HEAD
                groups.add((max_vec, plan.vec_width, plan.threads_per_head))
    # qk_rms_norm_rope's reduction group (vector width, lanes) does not depend on the batch.
    assert len(groups) == len({g[0] for g in groups})


# ----------------------------------------------------------------- CPU: cos/sin tables
def _inv_freq_default(d, base):
    return [base ** (-2.0 * i / d) for i in range(d // 2)]


def _table_from(inv_freq, positions, attention_factor=1.0):
    return np.array([[math.cos(p * f) * attention_factor for f in inv_freq]
                     + [math.sin(p * f) * attention_factor for f in inv_freq] for p in positions])


POSITIONS_CHECKED = [0, 1, 2, 17, 4095, 8191, 8192, 65535, 131071]


def _check_table(rope_scaling_dict, inv_freq, attention_factor=1.0, *, d=128, base=BASE, max_position=131072):
    table = reference.rope_cos_sin_cache(max_position, d, base, rope_scaling=rope_scaling_dict)
    assert table.shape == (max_position, d) and table.dtype == np.float64
    expected = _table_from(inv_freq, POSITIONS_CHECKED, attention_factor)
    np.testing.assert_allclose(table[POSITIONS_CHECKED], expected, rtol=0, atol=1e-10)


def test_cache_default_matches_formula():
    _check_table(None, _inv_freq_default(128, BASE))
    _check_table({"rope_type": "default"}, _inv_freq_default(128, BASE))


def test_cache_is_accurate_at_position_one_million():
    d = 64
    table = rope_scaling.cos_sin_table(1_000_001, d, 10000.0, dtype=np.float32)
    want = _table_from(_inv_freq_default(d, 10000.0), [1_000_000])[0]
    # float32 rounding only: half an ulp of values <= 1 is <= 2**-25.
    np.testing.assert_allclose(table[1_000_000].astype(np.float64), want, rtol=0, atol=2.0**-24)


def test_cache_linear_divides_frequencies():
    _check_table({"rope_type": "linear", "factor": 4.0}, [f / 4.0 for f in _inv_freq_default(128, BASE)])
    # older configs spell the key "type"
    _check_table({"type": "linear", "factor": 2}, [f / 2.0 for f in _inv_freq_default(128, BASE)])


def test_cache_dynamic_ntk_stretches_base_for_max_position():
    d, factor, orig = 128, 4.0, 8192
    scaling = {"rope_type": "dynamic", "factor": factor, "original_max_position_embeddings": orig}
    stretched = BASE * (factor * 131072 / orig - (factor - 1)) ** (d / (d - 2))
    _check_table(scaling, _inv_freq_default(d, stretched))
    # a cache no longer than the original context keeps the base
    short = reference.rope_cos_sin_cache(4096, d, BASE, rope_scaling=scaling)
    np.testing.assert_allclose(short, reference.rope_cos_sin_cache(4096, d, BASE), rtol=0, atol=1e-12)


def _llama3_inv_freq(d, base, factor, low, high, orig):
    out = []
    for f in _inv_freq_default(d, base):
        wavelen = 2 * math.pi / f
        if wavelen < orig / high:
            out.append(f)
        elif wavelen > orig / low:
            out.append(f / factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}


def test_cache_llama3_matches_formula_in_every_band():
    inv = _llama3_inv_freq(128, BASE, 8.0, 1.0, 4.0, 8192)
    default = _inv_freq_default(128, BASE)
    kept = sum(a == b for a, b in zip(inv, default))
    divided = sum(math.isclose(a, b / 8.0, rel_tol=1e-15) for a, b in zip(inv, default))
    assert kept > 0 and divided > 0 and kept + divided < 64, "Llama 3.1 has all three bands"
    _check_table(LLAMA31, inv)


@pytest.mark.parametrize("edge", ["high", "low"])
def test_cache_llama3_band_edges_are_continuous(edge):
    """rotary_dim 2: one frequency, inv_freq = 1, wavelength exactly 2 pi; place it on a band edge."""
    low, high, factor = 1.0, 4.0, 8.0
    orig = 2 * math.pi * (high if edge == "high" else low)  # wavelen == orig / high (or / low) exactly
    inv, _ = rope_scaling.rope_parameters(2, BASE, {**LLAMA31, "original_max_position_embeddings": orig},
                                          max_position=1)
    want = 1.0 if edge == "high" else 1.0 / factor  # smooth = 1 at the high edge, 0 at the low edge
    assert inv[0] == pytest.approx(want, rel=1e-15)
    # just inside the neighbouring band gives (nearly) the same value: no jump
    nudged = orig * (1 - 1e-9) if edge == "high" else orig * (1 + 1e-9)
    inv_n, _ = rope_scaling.rope_parameters(2, BASE, {**LLAMA31, "original_max_position_embeddings": nudged},
                                            max_position=1)
    assert inv_n[0] == pytest.approx(want, rel=1e-8)


def _yarn_reference(d, base, factor, orig, beta_fast=32, beta_slow=1):
    def dim_of(rot):
        return d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(dim_of(beta_fast)), 0)
    high = min(math.ceil(dim_of(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    out = []
    for i, f in enumerate(_inv_freq_default(d, base)):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: extrapolate, 1: interpolate
        out.append(f * (1 - ramp) + f / factor * ramp)
    return out, low, high


def test_cache_yarn_ramp_and_attention_factor():
    d, base, factor, orig = 128, 1000000.0, 4.0, 32768
    inv, low, high = _yarn_reference(d, base, factor, orig)
    assert 0 < low < high < d // 2, "the ramp lies inside the frequencies"
    af = 0.1 * math.log(factor) + 1.0
    scaling = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig}
    _check_table(scaling, inv, af, d=d, base=base)
    table = reference.rope_cos_sin_cache(1000, d, base, rope_scaling=scaling)
    np.testing.assert_allclose(table[:, :64] ** 2 + table[:, 64:] ** 2, af * af, rtol=1e-12)
    got, got_af = rope_scaling.rope_parameters(d, base, scaling, max_position=1)
    default = _inv_freq_default(d, base)
    assert got[: int(low)] == pytest.approx(default[: int(low)], rel=1e-14)  # before the ramp: unscaled
    assert got[int(math.ceil(high)):] == pytest.approx([f / factor for f in default[int(math.ceil(high)):]],
                                                       rel=1e-14)  # after it: interpolated
    assert got_af == pytest.approx(af)


def test_cache_yarn_mscale_and_explicit_attention_factor():
    base = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
            "beta_slow": 1}
    _, af = rope_scaling.rope_parameters(64, 10000.0, {**base, "mscale": 1.0, "mscale_all_dim": 1.0}, max_position=1)
    assert af == pytest.approx(1.0)  # DeepSeek-V3: the two mscales cancel
    _, af = rope_scaling.rope_parameters(64, 10000.0, {**base, "mscale": 1.0, "mscale_all_dim": 0.5}, max_position=1)
    assert af == pytest.approx((0.1 * math.log(40) + 1) / (0.05 * math.log(40) + 1))
    _, af = rope_scaling.rope_parameters(64, 10000.0, {**base, "attention_factor": 0.75}, max_position=1)
    assert af == 0.75
    inv, _ = rope_scaling.rope_parameters(64, 10000.0, base, max_position=1)
    assert inv == pytest.approx(_yarn_reference(64, 10000.0, 40.0, 4096)[0], rel=1e-14)


@pytest.mark.parametrize("scaling, words", [
    ({"rope_type": "longrope"}, ["longrope"]),
    ({"type": "su", "factor": 2.0}, ["longrope", "short_factor", "long_factor"]),  # su: LongRoPE's first name
    ({"rope_type": "linear"}, ["factor"]),
    ({"rope_type": "dynamic", "factor": 2.0}, ["original_max_position_embeddings"]),
    ({"rope_type": "llama3", "factor": 8.0}, ["low_freq_factor", "high_freq_factor",
                                              "original_max_position_embeddings"]),
    ({"rope_type": "yarn", "original_max_position_embeddings": 4096}, ["factor"]),
    ({"rope_type": "linear", "factor": -1.0}, ["factor"]),
    ("linear", ["dict"]),
])
def test_cache_rejects_bad_rope_scaling(scaling, words):
    with pytest.raises(ValueError) as info:
        reference.rope_cos_sin_cache(16, 8, rope_scaling=scaling)
    for word in words:
        assert word in str(info.value)


_YARN8 = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}


@pytest.mark.parametrize("scaling, dtype, problem", [
    ({**_YARN8, "beta_fast": 5e-324}, np.float64, "overflow the frequencies"),  # OverflowError before
    ({**_YARN8, "beta_slow": 1e308, "beta_fast": 1e308, "truncate": False}, np.float64,
     "leave the frequencies undefined (math domain error)"),  # a ValueError naming nothing before
    ({"rope_type": "linear", "factor": 1e-308}, np.float64, "not finite in float64"),  # 28 NaN of 128 before
    ({**_YARN8, "attention_factor": 1e39}, np.float32, "not finite in float32"),  # 75 inf of 128 before
])
def test_scaling_values_that_break_the_table_are_named(scaling, dtype, problem):
    """helper 71: extreme rope_scaling values raised OverflowError or returned tables of
    NaN and inf; now a ValueError naming rope_scaling, from the host table the op and its
    float64 twin share (the op's float32 table is checked in float32)."""
    from cupykern import rope_scaling

    with pytest.raises(ValueError, match=r"rope_scaling: .*" + re.escape(problem)):
        rope_scaling.cos_sin_table(16, 8, 10000.0, scaling, dtype=dtype)
    if dtype == np.float64:
        with pytest.raises(ValueError, match="rope_scaling: "):
            reference.rope_cos_sin_cache(16, 8, rope_scaling=scaling)


def test_rope_cos_sin_cache_rejects_bad_arguments_without_gpu():
    with pytest.raises(ValueError, match="rotary_dim"):
        cupykern.rope_cos_sin_cache(16, 7)
    with pytest.raises(ValueError, match="max_position"):
        cupykern.rope_cos_sin_cache(-1, 8)
    with pytest.raises(ValueError, match="unknown rope_type 'nope'"):
        cupykern.rope_cos_sin_cache(16, 8, rope_scaling={"rope_type": "nope"})
    with pytest.raises(TypeError, match="dtype"):
        cupykern.rope_cos_sin_cache(16, 8, dtype=np.int32)


# ----------------------------------------------------------------- CPU: argument errors
def test_apply_rope_rejects_numpy_input():
    q = np.zeros((2, 4, 64), np.float32)
    pos = np.zeros(2, np.int64)
    cache = np.zeros((8, 64), np.float32)
    with pytest.raises(TypeError, match="q: expected a device array"):
        cupykern.apply_rope(q, q, pos, cache)


def test_qk_rms_norm_rope_rejects_numpy_input():
    q = np.zeros((2, 4, 64), np.float32)
    w = np.ones(64, np.float32)
    with pytest.raises(TypeError, match="q: expected a device array"):
        cupykern.qk_rms_norm_rope(q, q, w, w, np.zeros(2, np.int64), np.zeros((8, 64), np.float32))
    # k None is refused by the intake spec, before any array is converted (the positions check,
    # off here, converts every array first and so names the NumPy q instead).
    with pytest.raises(TypeError, match="k: expected a device array"):
        cupykern.qk_rms_norm_rope(q, None, w, w, np.zeros(2, np.int64), np.zeros((8, 64), np.float32),
                                  check_positions=False)


# ----------------------------------------------------------------- CPU: intake spec and plan
F16, F32, BF16 = _dtypes.float16, _dtypes.float32, _dtypes.bfloat16


#: An argument the helpers below fill with a valid signature matching q.
DEFAULT = object()


def _apply(*, q=DEFAULT, k=DEFAULT, positions=DEFAULT, cache=DEFAULT, is_neox=True, inplace=True,
           mrope_section=None, mrope_interleaved=False, **kw):
    """apply_rope's prepare: (4, 8, 128) bf16 q, 2 kv heads, int64 positions, a float32 cache, unless given
    (with mrope_section, default positions (3, num_tokens))."""
    q = contiguous((4, 8, 128), BF16) if q is DEFAULT else q
    shape = (4, 8, 128) if q is None else q.shape
    k = contiguous((*shape[:-2], 2, shape[-1]), BF16 if q is None else q.dtype) if k is DEFAULT else k
    if positions is DEFAULT:
        positions = contiguous(((3,) if mrope_section is not None else ()) + tuple(shape[:-2]), np.int64)
    cache = contiguous((64, shape[-1]), F32) if cache is DEFAULT else cache
    return rope_ops._prepare_apply_rope(prepare_args("apply_rope", q=q, k=k, positions=positions,
                                                     cos_sin_cache=cache, q_out=None, k_out=None, is_neox=is_neox,
                                                     inplace=inplace, mrope_section=mrope_section,
                                                     mrope_interleaved=mrope_interleaved, **kw))


def _qk_norm(*, q=DEFAULT, k=DEFAULT, q_weight=DEFAULT, k_weight=DEFAULT, positions=DEFAULT, cache=DEFAULT,
             eps=1e-6, **kw):
    """qk_rms_norm_rope's prepare, with _apply's defaults and weights of q's head_dim and dtype."""
    q = contiguous((4, 8, 128), BF16) if q is DEFAULT else q
    k = contiguous((*q.shape[:-2], 2, q.shape[-1]), q.dtype) if k is DEFAULT else k
    q_weight = contiguous((q.shape[-1],), q.dtype) if q_weight is DEFAULT else q_weight
    k_weight = contiguous((q.shape[-1],), q.dtype) if k_weight is DEFAULT else k_weight
    positions = contiguous(q.shape[:-2], np.int64) if positions is DEFAULT else positions
    cache = contiguous((64, q.shape[-1]), F32) if cache is DEFAULT else cache
    return rope_ops._prepare_qk_rms_norm_rope(prepare_args(
        "qk_rms_norm_rope", q=q, k=k, q_weight=q_weight, k_weight=k_weight, positions=positions,
        cos_sin_cache=cache, eps=eps, is_neox=True, **kw))


@pytest.mark.parametrize("is_neox", [True, False])
def test_apply_rope_launch_in_place(is_neox):
    launch = _apply(is_neox=is_neox)
    plan = plans.plan_rope(4, 10, 128, 128, BF16, max_vec_width=8, fused_norm=False, limits=plans.H200_LIMITS)
    # the wide layout (plans.ROPE_LAYOUT), 2 heads a thread at decode sizes
    assert launch.template is rope_ops.APPLY_ROPE_WIDE and launch.plan == plan and plan.vec_width == 8
    assert plan.heads_per_thread == plans.ROPE_WIDE_DECODE_HEADS_PER_THREAD
    # ... in its in-place instantiation (the last argument, kInPlace)
    assert launch.template_args == ("__nv_bfloat16", "float", "long long", is_neox, 8, 0, plan.heads_per_thread, True)
    assert launch.pointers == ("q", "k", "q", "k", "positions", "cos_sin_cache")
    assert launch.allocate == () and launch.returns == ("q", "k")
    assert launch.scalars == (4, 8, 2, 128, 128, 64, 1, 8 * 128, 128, 2 * 128, 128, 8 * 128, 128, 2 * 128, 128, 128,
                              plan.threads_per_head, plan.head_slots, plan.tokens_per_block, 0, 0, 0, 0, 0)
    assert [type(v) for v in launch.scalars] == [np.int32] * 24  # 32-bit (rope.cu says why)
    assert [(r.a, r.b, r.allow_same) for r in launch.disjoint] == [
        ("q", "k", False), *((read, written, False) for written in ("q", "k") for read in ("positions", "cos_sin_cache"))]


def test_rope_arguments_are_32_bit():
    """apply_rope's and qk_rms_norm_rope's kernels take their sizes and strides as 32-bit
    ints: 2**31 or more of any, or of q + kv heads, is refused, naming the array."""
    far = 2**31
    for prepare in (_apply, _qk_norm):
        with pytest.raises(ValueError, match=r"q: token stride 2147483648; expected less than 2\*\*31 in magnitude"):
            prepare(q=Sig((4, 8, 128), (far * 2, 256, 2), np.dtype(BF16), 0))
        with pytest.raises(ValueError, match=r"k: head stride 2147483648; expected less than 2\*\*31"):
            prepare(q=contiguous((1, 8, 128), BF16), k=Sig((1, 2, 128), (512, far * 2, 2), np.dtype(BF16), 0))
        with pytest.raises(ValueError, match=r"cos_sin_cache: row stride 2147483648"):
            prepare(cache=Sig((64, 128), (far * 4, 4), np.dtype(F32), 0))
        with pytest.raises(ValueError, match=r"positions: stride 2147483648"):
            prepare(positions=Sig((4,), (far * 8,), np.dtype(np.int64), 0))
        with pytest.raises(ValueError, match=r"^q and k: num_q_heads \+ num_kv_heads 2147483648"):
            prepare(q=contiguous((1, far - 2, 128), BF16), k=contiguous((1, 2, 128), BF16))
        ok = prepare(q=Sig((4, 8, 128), ((far - 1) * 2, 256, 2), np.dtype(BF16), 0))
        assert ok.scalars[7] == far - 1 and type(ok.scalars[7]) is np.int32
    with pytest.raises(ValueError, match=r"^q: num_q_heads \+ num_kv_heads 2147483648"):
        _apply(q=contiguous((1, far, 2), BF16), k=None, cache=contiguous((64, 2), F32))
    # One token out of place: the outputs' token stride is never used, so not limited.
    one = _apply(q=contiguous((1, 2**20, 2**11), BF16), k=None, cache=contiguous((64, 2**11), F32), inplace=False)
    assert one.scalars[11] == 0 and one.scalars[8] == 2**11


def test_apply_rope_out_of_place_allocates_q_out_and_k_out():
    q = Sig((4, 8, 128), (2 * 1536, 2 * 128, 2), np.dtype(F16), 0)  # a fused QKV view: token stride 1536
    k = Sig((4, 2, 128), (2 * 1536, 2 * 128, 2), np.dtype(F16), 0)
    launch = _apply(q=q, k=k, inplace=False)
    assert launch.pointers == ("q_out", "k_out", "q", "k", "positions", "cos_sin_cache")
    assert launch.allocate == (("q_out", (4, 8, 128), F16), ("k_out", (4, 2, 128), F16))
    assert launch.returns == ("q_out", "k_out")
    # The inputs keep their strides; the new outputs are C-contiguous; the last flag says "copy the tail"
    # (to the steps kernel; the wide one reads kInPlace instead).
    assert launch.scalars[7:15] == (1536, 128, 1536, 128, 8 * 128, 128, 2 * 128, 128)
    assert launch.scalars[19] == 1
    # The wide kernel's out-of-place instantiation (kInPlace false).
    assert launch.template is rope_ops.APPLY_ROPE_WIDE and launch.template_args[-1] is False
    # k None: only q_out is allocated, k_out is returned as None.
    alone = _apply(k=None, inplace=False)
    assert alone.allocate == (("q_out", (4, 8, 128), BF16),) and alone.returns == ("q_out", "k_out")
    assert alone.scalars[2] == 0 and alone.disjoint == ()


def test_apply_rope_vector_width_follows_alignment():
    assert _apply().plan.vec_width == 8
    assert _apply(q=contiguous((4, 8, 128), BF16, align=8)).plan.vec_width == 4   # 8-byte accesses
    assert _apply(q=contiguous((4, 8, 128), BF16, align=2)).plan.vec_width == 1
    assert _apply(k=contiguous((4, 2, 128), BF16, align=4)).plan.vec_width == 1
    # The cache is read min(vec_width, 16 bytes) at a time: a float32 cache 8 bytes off allows no vectors,
    # a bfloat16 one 4-element (8-byte) accesses.
    assert _apply(cache=contiguous((64, 128), F32, align=8)).plan.vec_width == 1
    assert _apply(cache=contiguous((64, 128), BF16, align=8)).plan.vec_width == 4
    assert _apply(cache=contiguous((64, 128), BF16)).template_args[1] == "__nv_bfloat16"
    assert _apply(cache=Sig((64, 128), (4 * 130, 4), np.dtype(F32), 0)).plan.vec_width == 1
    # Out of place, the new outputs are aligned: the inputs decide.
    assert _apply(inplace=False).plan.vec_width == 8
    # rotary_dim / 2 = 20 halves: 4-element units at most.
    assert _apply(q=contiguous((4, 8, 80), BF16), cache=contiguous((64, 40), F32)).plan.vec_width == 4


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(k=contiguous((4, 2, 128), F32)), TypeError, r"k: expected dtype bfloat16 \(the dtype of q\)"),
    (dict(k=contiguous((5, 2, 128), BF16)), ValueError, r"k: expected the token axes of q \(4,\), got \(5,\)"),
    (dict(k=contiguous((2, 2, 2, 128), BF16)), ValueError, "k: expected the token axes of q"),
    (dict(k=contiguous((4, 2, 64), BF16)), ValueError, r"k: expected head_dim 128 \(q's\), got 64"),
    (dict(q=contiguous((4, 8, 128), np.float64), k=None), TypeError, "q: unsupported dtype float64"),
    (dict(q=contiguous((4, 128), BF16)), ValueError, r"q: expected shape \(num_tokens, num_heads, head_dim\)"),
    (dict(q=Sig((4, 8, 64), (2048, 256, 4), np.dtype(BF16), 0), k=None, cache=contiguous((8, 64), F32)), ValueError,
     r"q: the last axis \(head_dim\) must be unit-stride"),
    (dict(positions=contiguous((4,), F32)), TypeError, "positions: expected dtype int32 or int64, got float32"),
    (dict(positions=contiguous((4,), np.uint32)), TypeError, "positions: expected dtype int32 or int64"),
    (dict(positions=contiguous((5,), np.int64)), ValueError,
     r"positions: expected shape \(4,\) \(one position per token\), got \(5,\)"),
    (dict(positions=contiguous((4, 1), np.int64)), ValueError, r"positions: expected shape \(4,\)"),
    (dict(positions=None), TypeError, "positions: expected a device array of int32 or int64 positions, got None"),
    (dict(cache=None), TypeError, "cos_sin_cache: expected a device array"),
    (dict(cache=contiguous((8, 7), F32)), ValueError, r"cos_sin_cache: rotary_dim = shape\[1\] must be even"),
    (dict(cache=contiguous((8, 0), F32)), ValueError, "cos_sin_cache: rotary_dim"),
    (dict(cache=contiguous((8, 256), F32)), ValueError, r"rotary_dim \(256\) must be <= head_dim \(128\)"),
    (dict(cache=contiguous((8, 128), F16)), TypeError,
     r"cos_sin_cache: expected dtype float32 or q's dtype bfloat16, got float16"),
    # helper 61: "float32 or q's dtype float32" said the one dtype twice
    (dict(q=contiguous((4, 8, 128), F32), k=None, cache=contiguous((8, 128), F16)), TypeError,
     r"cos_sin_cache: expected dtype float32 \(q's dtype\), got float16"),
    (dict(cache=contiguous((8, 2, 64), F32)), ValueError,
     r"cos_sin_cache: expected shape \(max_position, rotary_dim\)"),
    (dict(cache=Sig((8, 128), (1024, 8), np.dtype(F32), 0)), ValueError,
     "cos_sin_cache: the last axis must be unit-stride"),
])
def test_apply_rope_intake_errors_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        _apply(limits=None, **kwargs)


def test_apply_rope_needs_q():
    with pytest.raises(TypeError, match="q: expected a device array"):
        _apply(q=None, k=None, positions=contiguous((4,), np.int64), limits=None)


def test_apply_rope_zero_tokens_launch_nothing_cpu():
    q, k = contiguous((0, 4, 64), BF16), contiguous((0, 1, 64), BF16)
    launch = _apply(q=q, k=k, positions=contiguous((0,), np.int32), cache=contiguous((8, 64), F32), inplace=False,
                    limits=None)
    assert launch.template is None and launch.returns == ("q_out", "k_out")
    assert launch.allocate == (("q_out", (0, 4, 64), BF16), ("k_out", (0, 1, 64), BF16))
    assert _apply(q=q, k=k, positions=contiguous((0,), np.int32), cache=contiguous((8, 64), F32),
                  limits=None).template is None


@pytest.mark.parametrize("prepare", [_apply, _qk_norm], ids=["apply_rope", "qk_rms_norm_rope"])
@pytest.mark.parametrize("key, value", [("block_size", 128), ("vec_width", 1), ("threads_per_row", 32)])
def test_rope_intake_rejects_launch_overrides(prepare, key, value):
    """The rope plan rule takes no overrides: a sweep's override is an error, never ignored."""
    with pytest.raises(ValueError, match=key):
        prepare(overrides={key: value})
    for name in ("apply_rope", "qk_rms_norm_rope"):
        assert launcher.ops()[name].plan_kind == "rope" and launcher.ops()[name].launch_options == ()


def test_grid_stride_launches_are_regridded_by_the_kernel_s_occupancy(monkeypatch):
    """qk_rms_norm_rope's grid-stride grid is whole waves of the blocks an SM holds of the
    kernel launched (the launcher passes the occupancy API's count to Launch.regrid): plan_rope's
    estimate (ROPE_WIDE_BLOCKS_PER_SM) left llama-3.1-70b's last third of blocks alone (item 33).
    Decode sizes, which no count could cap, apply_rope's block per token group and the token
    kernel's block per token have none (70b's shape takes the token kernel since item 38: the
    wide kernel's waves are checked with it turned off)."""
    token = _qk_norm(q=contiguous((16384, 64, 128), BF16), k=contiguous((16384, 8, 128), BF16))
    assert token.template is rope_ops.QK_RMS_NORM_ROPE_TOKEN and token.regrid is None
    assert token.plan.grid == (16384, 1, 1) and token.plan.tokens_per_block == 1
    monkeypatch.setattr(plans, "ROPE_NORM_TOKEN_HEADS", ())
    sms = plans.H200_LIMITS.sm_count
    launch = _qk_norm(q=contiguous((16384, 64, 128), BF16), k=contiguous((16384, 8, 128), BF16))
    # (70b's 192-thread blocks: 2 * 256 // 192 = 2 an SM by the CPU estimate)
    estimate = plans.ROPE_WIDE_BLOCKS_PER_SM * plans.ROPE_MAX_BLOCK_SIZE // launch.plan.block_size
    assert launch.plan.block_size == 192 and estimate == 2
    assert launch.plan.grid == (plans.ROPE_WIDE_NORM_GRID_WAVES * estimate * sms, 1, 1)
    for per_sm in (1, 3, 4):
        grid = (plans.ROPE_WIDE_NORM_GRID_WAVES * per_sm * sms, 1, 1)
        assert launch.regrid(per_sm) == replace(launch.plan, grid=grid)
    # 2 waves of one block an SM cap 264 blocks: 264 tokens (a block each) need no count, 265 do
    assert _qk_norm(q=contiguous((264, 64, 128), BF16), k=contiguous((264, 8, 128), BF16)).regrid is None
    assert _qk_norm(q=contiguous((265, 64, 128), BF16), k=contiguous((265, 8, 128), BF16)).regrid is not None
    assert _qk_norm().regrid is None
    assert _apply(q=contiguous((16384, 32, 128), BF16)).regrid is None


def test_qk_rms_norm_rope_launch():
    launch = _qk_norm(eps=1e-5)
    plan = plans.plan_rope(4, 10, 128, 128, BF16, max_vec_width=8, fused_norm=True, limits=plans.H200_LIMITS)
    assert launch.template is rope_ops.QK_RMS_NORM_ROPE_WIDE and launch.plan == plan and plan.heads_per_thread
    assert launch.template_args == ("__nv_bfloat16", "float", "long long", True, plan.vec_width, plan.threads_per_head,
                                    plan.heads_per_thread, False)
    assert launch.template_args[-1] is False  # rotary_dim == head_dim: no pass-through dims (a bool, named false)
    assert plan.threads_per_head in plans.ROPE_NORM_THREADS_PER_HEAD
    assert launch.pointers == ("q", "k", "q_weight", "k_weight", "positions", "cos_sin_cache")
    assert launch.allocate == () and launch.returns == ("q", "k")
    assert launch.scalars == (4, 8, 2, 128, 128, 64, 1, 8 * 128, 128, 2 * 128, 128, 128, np.float32(1e-5),
                              plan.head_slots, plan.tokens_per_block)
    assert [type(v) for v in launch.scalars] == [np.int32] * 12 + [np.float32] + [np.int32] * 2
    partial = _qk_norm(cache=contiguous((64, 64), F32))  # rotary_dim 64 of 128: the pass-through instantiation
    assert partial.template is rope_ops.QK_RMS_NORM_ROPE_WIDE and partial.template_args[-1] is True
    # A misaligned weight limits the vector width as q does.
    assert _qk_norm(k_weight=contiguous((128,), BF16, align=2)).plan.vec_width == 1


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(k=None), TypeError, r"k: expected a device array \(num_tokens, num_kv_heads, head_dim\), got None"),
    (dict(q_weight=contiguous((64,), BF16)), ValueError, r"q_weight: expected shape \(128,\)"),
    (dict(k_weight=contiguous((128,), F32)), TypeError, r"k_weight: expected dtype bfloat16 \(the dtype of q\)"),
    (dict(q_weight=Sig((128,), (4,), np.dtype(BF16), 0)), ValueError, "q_weight: must be unit-stride"),
    (dict(q_weight=None), TypeError, "q_weight: expected a device array"),
    (dict(k_weight=None), TypeError, "k_weight: expected a device array"),
    (dict(eps=-1.0), ValueError, "eps: expected a finite value >= 0"),
    (dict(k=contiguous((4, 2, 64), BF16)), ValueError, "k: expected head_dim 128"),
    (dict(positions=contiguous((4,), F32)), TypeError, "positions: expected dtype int32 or int64"),
    (dict(cache=contiguous((8, 129), F32)), ValueError, "cos_sin_cache: rotary_dim"),
])
def test_qk_rms_norm_rope_intake_errors_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        _qk_norm(limits=None, **kwargs)


def test_qk_rms_norm_rope_refuses_a_subnormal_eps():
    with pytest.raises(ValueError, match=r"eps: 1e-40 is below the smallest normal float32 \(1.1754944e-38\)"):
        _qk_norm(limits=None, eps=1e-40)


_Q, _K = np.ones((4, 8, 64), F32), np.ones((4, 2, 64), F32)
_POS, _CACHE = np.arange(4), np.ones((16, 64), F32)
_WEIGHT = np.ones(64, F32)


@pytest.mark.parametrize("op, args, kwargs", [
    ("apply_rope", (None, _K, _POS, _CACHE), {}),
    ("apply_rope", (_Q, _K.astype(F16), _POS, _CACHE), {}),
    ("apply_rope", (_Q, np.ones((3, 2, 64), F32), _POS, _CACHE), {}),
    ("apply_rope", (_Q, _K, _POS.astype(np.float32), _CACHE), {}),
    ("apply_rope", (_Q, _K, _POS.astype(np.float64), _CACHE), {}),  # helper 61: was named float32
    ("apply_rope", (_Q, _K, np.arange(5), _CACHE), {}),
    ("apply_rope", (_Q, _K, None, _CACHE), {}),
    ("apply_rope", (_Q, _K, _POS, np.ones((16, 63), F32)), {}),
    ("apply_rope", (_Q, _K, _POS, np.ones((16, 128), F32)), {}),
    ("apply_rope", (_Q, _K, _POS, _CACHE.astype(F16)), {}),
    ("apply_rope", (np.ones((4, 64), F32), None, _POS, _CACHE), {}),
    ("apply_rope", (np.ones((4, 8, 128), F32)[..., ::2], None, _POS, _CACHE), {}),
    ("apply_rope", (_Q, _K, _POS, _CACHE), {"is_neox": "yes"}),
    # Tokens 2**31 elements apart: the RoPE kernels' strides are 32-bit (as_strided allocates nothing).
    ("apply_rope", (np.lib.stride_tricks.as_strided(_Q, shape=(2, 8, 64), strides=(2**33, 256, 4)), None, _POS[:2],
                    _CACHE), {}),
    ("qk_rms_norm_rope", (np.lib.stride_tricks.as_strided(_Q, shape=(2, 8, 64), strides=(2**33, 256, 4)),
                          _K[:2], _WEIGHT, _WEIGHT, _POS[:2], _CACHE), {}),
    ("qk_rms_norm_rope", (_Q, None, _WEIGHT, _WEIGHT, _POS, _CACHE), {}),
    ("qk_rms_norm_rope", (_Q, _K, _WEIGHT, _WEIGHT, _POS.astype(np.float64), _CACHE), {}),
    ("qk_rms_norm_rope", (_Q, _K, np.ones(32, F32), _WEIGHT, _POS, _CACHE), {}),
    ("qk_rms_norm_rope", (_Q, _K, _WEIGHT, _WEIGHT.astype(F16), _POS, _CACHE), {}),
    ("qk_rms_norm_rope", (_Q, _K, _WEIGHT, _WEIGHT, _POS, _CACHE), {"eps": -1.0}),
    ("qk_rms_norm_rope", (_Q, _K, _WEIGHT, _WEIGHT, _POS, _CACHE), {"eps": 1e-40}),
    ("qk_rms_norm_rope", (np.broadcast_to(_Q[:, :1], (4, 8, 64)), _K, _WEIGHT, _WEIGHT, _POS, _CACHE), {}),
])
def test_reference_refuses_what_the_kernel_refuses(fake_launcher, op, args, kwargs):
    assert_same_error(getattr(cupykern, op), getattr(reference, op), *args, **kwargs, check_positions=False)



_I32 = np.int32
_CACHE_ROWS = np.zeros((16, 2, 64), F32)


@pytest.mark.parametrize("op, args, kwargs, message", [
    ("apply_rope", (_Q.astype(_I32), _K, _POS, _CACHE), {"check_positions": "yes"}, "check_positions: expected a bool"),
    ("qk_rms_norm_rope", (_Q.astype(_I32), _K, _WEIGHT, _WEIGHT, _POS, _CACHE), {"check_positions": 0.5},
     "check_positions: expected a bool"),
    ("rope_kv_append", (_Q.astype(_I32), _K, _K, _POS, _CACHE, _CACHE_ROWS, _CACHE_ROWS), {"check_positions": "no"},
     "check_positions: expected a bool"),
    ("rms_norm_gemv_rope_kv_append", (np.ones((4, 64), _I32), np.ones(64, F32), np.ones((12 * 64, 64), F32), _POS,
                                      _CACHE, _CACHE_ROWS, _CACHE_ROWS), {"check_positions": None},
     "check_positions: expected a bool"),
    ("embedding", (np.zeros(4, F32), np.ones((8, 64), F32)), {"check_ids": "yes"}, "check_ids: expected a bool"),
    ("sample_tokens", (np.zeros((2, 8), _I32),), {"seed": 1.5}, "seed: expected an int"),
])
def test_references_check_flags_before_arrays_as_the_ops(fake_launcher, op, args, kwargs, message):
    """Helper 63: the ops check check_positions, check_ids and a non-int seed before their
    arrays, the references after (another message for the same bad call)."""
    error = assert_same_error(getattr(cupykern, op), getattr(reference, op), *args, **kwargs)
    assert message in str(error)


@pytest.mark.parametrize("q_heads, k_heads", [(0, 2), (8, 0), (0, 0)])
def test_references_take_arrays_without_heads(q_heads, k_heads):
    """No heads in q or k (which the ops accept, launching for the other or not at all):
    the references return arrays of the inputs' shapes, the other's values as without it."""
    q, k = np.arange(4 * q_heads * 64, dtype=F32).reshape(4, q_heads, 64), np.ones((4, k_heads, 64), F32)
    for got in (reference.apply_rope(q, k, _POS, _CACHE), reference.qk_rms_norm_rope(q, k, _WEIGHT, _WEIGHT, _POS, _CACHE)):
        assert got[0].shape == q.shape and got[1].shape == k.shape
    if q_heads:
        np.testing.assert_array_equal(reference.apply_rope(q, k, _POS, _CACHE)[0], reference.apply_rope(q, None, _POS,
                                                                                                          _CACHE)[0])

@pytest.mark.parametrize("op, args", [("apply_rope", (_Q, _K, _POS, _CACHE)),
                                      ("qk_rms_norm_rope", (_Q, _K, _WEIGHT, _WEIGHT, _POS, _CACHE))])
@pytest.mark.parametrize("bad", ["yes", "no", None, 0.5])
def test_check_positions_takes_a_bool(fake_launcher, op, args, bad):
    # A truthy string ran the range check whatever it said (helper 39's review).
    error = assert_same_error(getattr(cupykern, op), getattr(reference, op), *args, check_positions=bad)
    assert isinstance(error, TypeError) and str(error) == f"check_positions: expected a bool, got {bad!r}"


def test_written_heads_may_not_overlap_what_every_block_reads(fake_launcher):
    """In place, every block reads positions and the cache (qk_rms_norm_rope also the
    weights) while other blocks write q and k: any of them inside q or k was launched (a
    race, helper 53). Out of place q and k are only read, so there it is fine, k inside q
    too (helper 57)."""
    from tests.helpers import FakeArray

    q, k = FakeArray((4, 8, 64), F32, ptr=1 << 20), FakeArray((4, 2, 64), F32, ptr=2 << 20)
    positions, cache = FakeArray((4,), np.int64, ptr=3 << 20), FakeArray((16, 64), F32, ptr=4 << 20)
    weight = FakeArray((64,), F32, ptr=5 << 20)
    positions_in_q, positions_in_k = FakeArray((4,), np.int64, ptr=(1 << 20) + 256), \
        FakeArray((4,), np.int64, ptr=(2 << 20) + 256)
    cache_in_k, weight_in_q = FakeArray((2, 64), F32, ptr=(2 << 20) + 512), FakeArray((64,), F32, ptr=(1 << 20) + 256)
    rope, qk = cupykern.apply_rope, cupykern.qk_rms_norm_rope
    for call, message in (
            (lambda: rope(q, k, positions_in_q, cache, check_positions=False), "q overlaps positions"),
            (lambda: rope(q, None, positions_in_q, cache, check_positions=False), "q overlaps positions"),
            (lambda: rope(q, k, positions_in_k, cache, check_positions=False), "k overlaps positions"),
            (lambda: rope(q, k, positions, cache_in_k, check_positions=False), "k overlaps cos_sin_cache"),
            (lambda: qk(q, k, weight_in_q, weight, positions, cache, check_positions=False), "q overlaps q_weight"),
            (lambda: qk(q, k, weight, weight_in_q, positions, cache, check_positions=False), "q overlaps k_weight"),
            (lambda: qk(q, k, weight, weight, positions_in_k, cache, check_positions=False), "k overlaps positions"),
            (lambda: qk(q, k, weight, weight, positions, cache_in_k, check_positions=False),
             "k overlaps cos_sin_cache")):
        with pytest.raises(ValueError, match=f"^{message} in memory$"):
            call()
    assert fake_launcher == []
    rope(q, k, positions_in_q, cache_in_k, inplace=False, check_positions=False)  # read only: launched
    rope(q, FakeArray((4, 2, 64), F32, ptr=1 << 20), positions, cache, inplace=False, check_positions=False)  # k in q
    rope(q, k, positions, cache, check_positions=False)
    qk(q, k, weight, weight, positions, cache, check_positions=False)  # one weight for both: both only read
    assert len(fake_launcher) == 4


def test_reference_takes_what_the_kernel_takes(fake_launcher):
    qkv = np.ones((4, 12, 64), F32)  # q and k as views of one fused QKV buffer
    for op, args in (("apply_rope", (qkv[:, :8], qkv[:, 8:10], _POS, _CACHE)),
                     ("qk_rms_norm_rope", (qkv[:, :8], qkv[:, 8:10], _WEIGHT, _WEIGHT, _POS, _CACHE))):
        # check_positions=False: the kernel's range check reads positions on the device
        # (stand-ins here); the message is shared (test_reference_leaves_out_of_range_tokens_unchanged)
        assert kernel_and_reference_errors(getattr(cupykern, op), getattr(reference, op), *args,
                                           check_positions=False) == (None, None), op
    assert len(fake_launcher) == 2


def test_qk_rms_norm_rope_zero_tokens_launch_nothing_cpu():
    launch = _qk_norm(q=contiguous((0, 4, 64), BF16), k=contiguous((0, 1, 64), BF16),
                      positions=contiguous((0,), np.int32), cache=contiguous((8, 64), F32), limits=None)
    assert launch.template is None and launch.allocate == () and launch.returns == ("q", "k")


def _apply_rope_overlap(monkeypatch, q: Sig, k: Sig, q_ptr: int, k_ptr: int):
    values = {"q": q, "k": k, "positions": contiguous((q.shape[0],), np.int64),
              "cos_sin_cache": contiguous((32, q.shape[-1]), F32), "q_out": None, "k_out": None,
              "is_neox": True, "inplace": True, "mrope_section": None, "mrope_interleaved": False}
    launch = rope_ops._prepare_apply_rope(prepare_args("apply_rope", **values))
    return overlap_check(monkeypatch, rope_ops._APPLY_ROPE, launch, values,
                         {"q": q_ptr, "k": k_ptr, "positions": 1 << 30, "cos_sin_cache": 1 << 31})


def test_q_k_overlap_rule(monkeypatch):
    """Slices of one fused QKV row interleave without sharing elements; overlapping views do."""
    hq, hkv, hd, tokens, item = 4, 2, 16, 5, 2
    row = (hq + 2 * hkv) * hd
    q = Sig((tokens, hq, hd), (row * item, hd * item, item), np.dtype(F16), 0)
    k = Sig((tokens, hkv, hd), (row * item, hd * item, item), np.dtype(F16), 0)
    base = 1 << 20
    q_out, k_out = _apply_rope_overlap(monkeypatch, q, k, base, base + hq * hd * item)
    assert (q_out.data.ptr, k_out.data.ptr) == (base, base + hq * hd * item)
    # k shifted back by one element into q's last head: overlap.
    with pytest.raises(ValueError, match="k overlaps q"):
        _apply_rope_overlap(monkeypatch, q, k, base, base + (hq * hd - 1) * item)
    # k = q[:, :2]: the same memory (rotating it twice would race).
    k_in_q = Sig((3, 2, 64), (512, 128, 2), np.dtype(F16), 0)
    with pytest.raises(ValueError, match="k overlaps q"):
        _apply_rope_overlap(monkeypatch, contiguous((3, 4, 64), F16), k_in_q, base, base)
    # Out of place both are only read: no rule (helper 57: the same views were refused).
    assert _apply(q=contiguous((3, 4, 64), F16), k=k_in_q, inplace=False).disjoint == ()


def test_positions_between_rows_of_fused_qkv(monkeypatch):
    """In place, positions held in the v part of a fused QKV buffer (between q's and k's
    rows) share no element with them: taken; reaching into k's first head is refused and
    names k (helper 57: extents alone refused it and named q)."""
    hq, hkv, hd, tokens, item = 4, 2, 16, 5, 2
    row = (hq + 2 * hkv) * hd * item  # bytes a token
    q = Sig((tokens, hq, hd), (row, hd * item, item), np.dtype(F16), 0)
    k = Sig((tokens, hkv, hd), (row, hd * item, item), np.dtype(F16), 0)
    values = {"q": q, "k": k, "positions": contiguous((tokens,), np.int32),
              "cos_sin_cache": contiguous((32, hd), F32), "q_out": None, "k_out": None,
              "is_neox": True, "inplace": True, "mrope_section": None, "mrope_interleaved": False}
    call = overlap_checker(monkeypatch, rope_ops._APPLY_ROPE,
                           rope_ops._prepare_apply_rope(prepare_args("apply_rope", **values)), values)
    base = 1 << 20
    v_part = base + (hq + hkv) * hd * item  # token 0's v heads: 64 bytes, positions take 20
    pointers = {"q": base, "k": base + hq * hd * item, "cos_sin_cache": 1 << 31}
    assert call({**pointers, "positions": v_part})[0].data.ptr == base
    assert call({**pointers, "positions": v_part + 2 * row + 44})[0].data.ptr == base  # ends at token 3's q
    with pytest.raises(ValueError, match="k overlaps positions"):
        call({**pointers, "positions": v_part - 4})


def test_apply_rope_launch_on_fused_qkv_views():
    """Token and head strides of (tokens, heads, head_dim) slices of a fused QKV row reach the kernel."""
    hq, hkv, hd, item = 4, 2, 16, 2
    row = (hq + 2 * hkv) * hd
    q = Sig((5, hq, hd), (row * item, hd * item, item), np.dtype(np.float16), 0)
    k = Sig((5, hkv, hd), (row * item, hd * item, item), np.dtype(np.float16), (hq * hd * item) % 16)
    launch = _apply(q=q, k=k, cache=contiguous((32, 16), np.float32))
    ints = launch.scalars[:16]
    assert ints[:7] == (5, hq, hkv, hd, 16, 32, 1)  # tokens, heads, head_dim, rotary_dim, cache rows, position stride
    assert ints[7:11] == (row, hd, row, hd)  # q and k token / head strides
    assert ints[11:15] == (row, hd, row, hd)  # in place: the outputs are q and k
    # A 4-D (batch, seq) view with every other sequence position: the token axes flatten.
    q4 = Sig((2, 3, hq, hd), (6 * row * item, 2 * row * item, hd * item, item), np.dtype(np.float16), 0)
    launch = _apply(q=q4, k=None, positions=contiguous((2, 3), np.int32), cache=contiguous((32, 16), np.float32))
    assert launch.scalars[0] == 6 and launch.scalars[7] == 2 * row and launch.scalars[6] == 1
    assert launch.template_args[2] == "int"


# ----------------------------------------------------------------- CPU: reference properties
def _ref_inputs(rng, num_tokens, heads, head_dim):
    return rng.standard_normal((num_tokens, heads, head_dim))


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("head_dim, rotary_dim", [(64, 64), (80, 32)])
def test_reference_rotations_compose(rng, is_neox, head_dim, rotary_dim):
    """Rotating by p then by s equals rotating by p + s (RoPE is a group action)."""
    cache = reference.rope_cos_sin_cache(2048, rotary_dim, 10000.0)
    x = _ref_inputs(rng, 9, 3, head_dim)
    p = rng.integers(0, 1024, 9)
    s = rng.integers(0, 1024, 9)
    twice, _ = reference.apply_rope(reference.apply_rope(x, None, p, cache, is_neox=is_neox)[0], None, s, cache,
                                    is_neox=is_neox)
    once, _ = reference.apply_rope(x, None, p + s, cache, is_neox=is_neox)
    np.testing.assert_allclose(twice, once, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(once[..., rotary_dim:], x[..., rotary_dim:])


@pytest.mark.parametrize("is_neox", [True, False])
def test_reference_dot_product_depends_on_position_difference(rng, is_neox):
    cache = reference.rope_cos_sin_cache(4096, 128, BASE)
    q, k = _ref_inputs(rng, 1, 1, 128), _ref_inputs(rng, 1, 1, 128)

    def score(m, n):
        qr, _ = reference.apply_rope(q, None, np.array([m]), cache, is_neox=is_neox)
        kr, _ = reference.apply_rope(k, None, np.array([n]), cache, is_neox=is_neox)
        return float(np.sum(qr * kr))

    base_score = score(100, 37)
    for shift in (1, 50, 3000):
        assert score(100 + shift, 37 + shift) == pytest.approx(base_score, rel=1e-9, abs=1e-9)
    assert score(100, 38) != pytest.approx(base_score, rel=1e-6)


def test_reference_neox_and_gptj_agree_after_permutation(rng):
    """GPT-J on dims reordered (i, i + half) -> (2i, 2i + 1) equals NeoX, reordered the same way."""
    head_dim, rotary_dim = 96, 64
    half = rotary_dim // 2
    perm = np.arange(head_dim)
    perm[0:rotary_dim:2], perm[1:rotary_dim:2] = np.arange(half), np.arange(half) + half
    cache = reference.rope_cos_sin_cache(512, rotary_dim, 10000.0)
    x = _ref_inputs(rng, 5, 4, head_dim)
    pos = rng.integers(0, 512, 5)
    neox, _ = reference.apply_rope(x, None, pos, cache, is_neox=True)
    gptj, _ = reference.apply_rope(np.ascontiguousarray(x[..., perm]), None, pos, cache, is_neox=False)
    np.testing.assert_allclose(gptj, neox[..., perm], rtol=1e-13, atol=1e-13)


def test_reference_leaves_out_of_range_tokens_unchanged(rng):
    cache = reference.rope_cos_sin_cache(16, 8, 10000.0)
    x = _ref_inputs(rng, 4, 2, 8)
    positions = np.array([-1, 3, 16, 1 << 40])
    with pytest.raises(ValueError, match=r"positions: expected values in \[0, 16\) .* got min -1, max 1099511627776"):
        reference.apply_rope(x, None, positions, cache)  # as the kernel, by default
    out, _ = reference.apply_rope(x, None, positions, cache, check_positions=False)
    np.testing.assert_array_equal(out[[0, 2, 3]], x[[0, 2, 3]])
    assert not np.allclose(out[1], x[1])


def test_reference_qk_norm_is_rms_norm_then_rope(rng):
    q, k = _ref_inputs(rng, 3, 4, 64), _ref_inputs(rng, 3, 2, 64)
    wq, wk = rng.standard_normal(64), rng.standard_normal(64)
    cache = reference.rope_cos_sin_cache(32, 32, 10000.0)
    pos = np.array([0, 5, 31])
    got_q, got_k = reference.qk_rms_norm_rope(q, k, wq, wk, pos, cache, 1e-6, is_neox=False)
    want_q, want_k = reference.apply_rope(reference.rms_norm(q, wq, 1e-6), reference.rms_norm(k, wk, 1e-6), pos,
                                          cache, is_neox=False)
    np.testing.assert_allclose(got_q, want_q, rtol=1e-14)
    np.testing.assert_allclose(got_k, want_k, rtol=1e-14)
    # a head scaled by a constant normalises to the same values (eps = 0)
    scaled_q, _ = reference.qk_rms_norm_rope(q * 7.0, k, wq, wk, pos, cache, 0.0)
    plain_q, _ = reference.qk_rms_norm_rope(q, k, wq, wk, pos, cache, 0.0)
    np.testing.assert_allclose(scaled_q, plain_q, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, bool, object, "bf16"])
def test_cos_sin_table_refuses_a_dtype_that_is_not_floating(dtype):
    """Helper 74: an int or bool table truncated every value to 0 / 1 without a word."""
    with pytest.raises(TypeError, match=r"dtype: expected a floating dtype for the cos/sin table"):
        rope_scaling.cos_sin_table(16, 8, 10000.0, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, _dtypes.bfloat16])
def test_cos_sin_table_takes_floating_dtypes(dtype):
    table = rope_scaling.cos_sin_table(16, 8, 10000.0, dtype=dtype)
    assert table.dtype == np.dtype(dtype)
    np.testing.assert_allclose(table.astype(np.float64)[3, 0], np.cos(3.0), rtol=1e-2)


# ----------------------------------------------------------------- GPU helpers
@lru_cache(maxsize=None)
def _tables(rotary_dim: int, cache_dtype=np.float32):
    """(device cache, host copy) for MAX_POSITION positions, base 500000."""
    host = rope_scaling.cos_sin_table(MAX_POSITION, rotary_dim, BASE, dtype=np.dtype(cache_dtype))
    return cupy.asarray(host), host


def _positions(rng, num_tokens, pos_dtype):
    pos = rng.integers(0, MAX_POSITION, num_tokens).astype(pos_dtype)
    if num_tokens:
        pos[-1] = MAX_POSITION - 1
    return cupy.asarray(pos)


def _bytes(a):
    return cupy.asnumpy(a).tobytes()


def _cases():
    """Full grid at 0, 1 and 7 tokens; a subset at 4096 (float64 references cost ~1 s each there)."""
    for num_tokens in NUM_TOKENS[:3]:
        for dtype in DTYPES:
            for head_dim in HEAD_DIMS:
                for rotary_dim in (head_dim, head_dim // 2):
                    for heads in HEADS:
                        if num_tokens == 0 and (heads != HEADS[0] or rotary_dim != head_dim):
                            continue
                        yield num_tokens, dtype, head_dim, rotary_dim, heads
    yield 4096, _dtypes.bfloat16, 128, 128, (32, 8)
    yield 4096, _dtypes.float16, 128, 64, (8, 1)
    yield 4096, _dtypes.float32, 80, 40, (8, 1)
    yield 4096, _dtypes.bfloat16, 256, 128, (1, 1)


CASES = list(_cases())


def _case_id(case):
    n, dtype, hd, rot, (hq, hkv) = case
    return f"t{n}-{_dtypes.short_name(dtype)}-hd{hd}-rot{rot}-h{hq}x{hkv}"


# ----------------------------------------------------------------- GPU: apply_rope values
@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_apply_rope_matches_reference(rng, case, is_neox):
    num_tokens, dtype, head_dim, rotary_dim, (hq, hkv) = case
    # alternate position dtypes over the grid; test_apply_rope_position_dtypes covers both everywhere it matters
    pos_dtype = POSITION_DTYPES[(head_dim // 16 + hq + int(is_neox)) % 2]
    cache, host_cache = _tables(rotary_dim)
    q = random_device(rng, (num_tokens, hq, head_dim), dtype)
    k = random_device(rng, (num_tokens, hkv, head_dim), dtype)
    pos = _positions(rng, num_tokens, pos_dtype)
    want_q, want_k = reference.apply_rope(q, k, pos, host_cache, is_neox=is_neox)
    q_out, k_out = cupykern.apply_rope(q, k, pos, cache, is_neox=is_neox)
    assert q_out is q and k_out is k
    assert_close(q, want_q, dtype, seed=rng.seed, what="q")
    assert_close(k, want_k, dtype, seed=rng.seed, what="k")


@pytest.mark.gpu
@pytest.mark.parametrize("pos_dtype", POSITION_DTYPES, ids=["int32", "int64"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_apply_rope_position_dtypes(rng, pos_dtype, is_neox):
    """Positions above 65535 and repeats, both position types (int64 read as int32 would pick wrong rows)."""
    dtype = _dtypes.float32
    cache, host_cache = _tables(128)
    q = random_device(rng, (300, 4, 128), dtype)
    k = random_device(rng, (300, 2, 128), dtype)
    pos = rng.integers(65536, MAX_POSITION, 300).astype(pos_dtype)
    pos[::7] = pos[0]
    pos = cupy.asarray(pos)
    want_q, want_k = reference.apply_rope(q, k, pos, host_cache, is_neox=is_neox)
    cupykern.apply_rope(q, k, pos, cache, is_neox=is_neox)
    assert_close(q, want_q, dtype, seed=rng.seed, what="q")
    assert_close(k, want_k, dtype, seed=rng.seed, what="k")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES[1:], ids=DTYPE_IDS[1:])
def test_apply_rope_cache_in_q_dtype(rng, dtype):
    cache, host_cache = _tables(64, dtype)
    q = random_device(rng, (33, 8, 128), dtype)
    k = random_device(rng, (33, 1, 128), dtype)
    pos = _positions(rng, 33, np.int64)
    want_q, want_k = reference.apply_rope(q, k, pos, host_cache)
    cupykern.apply_rope(q, k, pos, cache)
    assert_close(q, want_q, dtype, seed=rng.seed, what="q")
    assert_close(k, want_k, dtype, seed=rng.seed, what="k")


@pytest.mark.gpu
def test_rope_cos_sin_cache_on_device_matches_reference():
    scaling = dict(LLAMA31)
    cache = cupykern.rope_cos_sin_cache(MAX_POSITION, 128, BASE, rope_scaling=scaling)
    assert cache.dtype == np.float32 and cache.shape == (MAX_POSITION, 128) and cache.flags.c_contiguous
    want = reference.rope_cos_sin_cache(MAX_POSITION, 128, BASE, rope_scaling=scaling)
    np.testing.assert_array_equal(cupy.asnumpy(cache), want.astype(np.float32))
    bf16 = cupykern.rope_cos_sin_cache(1024, 64, dtype=_dtypes.bfloat16)
    np.testing.assert_array_equal(cupy.asnumpy(bf16).astype(np.float64),
                                  reference.rope_cos_sin_cache(1024, 64).astype(_dtypes.bfloat16).astype(np.float64))


# ----------------------------------------------------------------- GPU: layouts
def _fused_qkv(rng, num_tokens, hq, hkv, head_dim, dtype, misalign=0):
    width = (hq + 2 * hkv) * head_dim
    flat = random_device(rng, (num_tokens * width + misalign,), dtype)
    buf = flat[misalign:].reshape(num_tokens, width)
    q = buf[:, : hq * head_dim].reshape(num_tokens, hq, head_dim)
    k = buf[:, hq * head_dim:(hq + hkv) * head_dim].reshape(num_tokens, hkv, head_dim)
    v = buf[:, (hq + hkv) * head_dim:]
    assert q.data.ptr == buf.data.ptr and q.strides[0] == width * buf.itemsize, "q must be a view"
    assert k.strides[0] == width * buf.itemsize, "k must be a view"
    return buf, q, k, v


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("misalign", [0, 1], ids=["aligned", "misaligned_by_one"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_apply_rope_on_fused_qkv_views(rng, dtype, misalign, is_neox):
    num_tokens, hq, hkv, head_dim, rotary_dim = 257, 8, 2, 128, 64
    buf, q, k, v = _fused_qkv(rng, num_tokens, hq, hkv, head_dim, dtype, misalign)
    cache, host_cache = _tables(rotary_dim)
    pos = _positions(rng, num_tokens, np.int32)
    want_q, want_k = reference.apply_rope(q, k, pos, host_cache, is_neox=is_neox)
    v_before, q_tail_before, k_tail_before = _bytes(v), _bytes(q[..., rotary_dim:]), _bytes(k[..., rotary_dim:])
    cupykern.apply_rope(q, k, pos, cache, is_neox=is_neox)
    assert_close(q, want_q, dtype, seed=rng.seed, what="q")
    assert_close(k, want_k, dtype, seed=rng.seed, what="k")
    assert _bytes(v) == v_before, "v was written"
    assert _bytes(q[..., rotary_dim:]) == q_tail_before and _bytes(k[..., rotary_dim:]) == k_tail_before


@pytest.mark.gpu
def test_apply_rope_k_none_and_4d_input(rng):
    dtype = _dtypes.bfloat16
    cache, host_cache = _tables(128)
    q = random_device(rng, (3, 11, 8, 128), dtype)
    pos = cupy.asarray(rng.integers(0, MAX_POSITION, (3, 11)))
    want_q, _ = reference.apply_rope(q, None, pos, host_cache)
    q_out, k_out = cupykern.apply_rope(q, None, pos, cache)
    assert k_out is None
    assert_close(q_out, want_q, dtype, seed=rng.seed, what="q")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rotary_dim", [128, 32])
def test_apply_rope_out_of_place_leaves_inputs_untouched(rng, dtype, rotary_dim):
    num_tokens = 65
    buf, q, k, v = _fused_qkv(rng, num_tokens, 4, 2, 128, dtype)
    cache, host_cache = _tables(rotary_dim)
    pos = _positions(rng, num_tokens, np.int64)
    before = _bytes(buf)
    want_q, want_k = reference.apply_rope(q, k, pos, host_cache, is_neox=False)
    q_out, k_out = cupykern.apply_rope(q, k, pos, cache, is_neox=False, inplace=False)
    assert _bytes(buf) == before, "out-of-place call modified its inputs"
    assert q_out.flags.c_contiguous and k_out.flags.c_contiguous
    assert q_out.shape == q.shape and k_out.shape == k.shape
    assert_close(q_out, want_q, dtype, seed=rng.seed, what="q_out")
    assert_close(k_out, want_k, dtype, seed=rng.seed, what="k_out")
    assert _bytes(q_out[..., rotary_dim:]) == _bytes(q[..., rotary_dim:])  # copied exactly


@pytest.mark.gpu
def test_apply_rope_more_than_65535_tokens(rng):
    dtype = _dtypes.float16
    cache, host_cache = _tables(64)
    q = random_device(rng, (70001, 1, 64), dtype)
    k = random_device(rng, (70001, 1, 64), dtype)
    pos = _positions(rng, 70001, np.int64)
    want_q, want_k = reference.apply_rope(q, k, pos, host_cache)
    cupykern.apply_rope(q, k, pos, cache)
    assert_close(q, want_q, dtype, seed=rng.seed, what="q")
    assert_close(k, want_k, dtype, seed=rng.seed, what="k")


# ----------------------------------------------------------------- GPU: positions out of range
BAD_POSITIONS = [-1, MAX_POSITION, MAX_POSITION + 5, -(1 << 31)]


@pytest.mark.gpu
@pytest.mark.parametrize("pos_dtype", POSITION_DTYPES, ids=["int32", "int64"])
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "out_of_place"])
def test_apply_rope_out_of_range_positions(rng, pos_dtype, inplace):
    dtype = _dtypes.bfloat16
    cache, host_cache = _tables(128)
    q = random_device(rng, (40, 8, 128), dtype)
    k = random_device(rng, (40, 2, 128), dtype)
    host_pos = rng.integers(0, MAX_POSITION, 40).astype(pos_dtype)
    bad = np.arange(0, 40, 5)
    host_pos[bad] = np.resize(np.array(BAD_POSITIONS + ([1 << 40] if pos_dtype == np.int64 else [])), bad.size)
    pos = cupy.asarray(host_pos)
    q_before, k_before = cupy.asnumpy(q), cupy.asnumpy(k)
    with pytest.raises(ValueError, match="positions"):
        cupykern.apply_rope(q, k, pos, cache, inplace=inplace)
    assert _bytes(q) == q_before.tobytes(), "a rejected call wrote q"
    with pytest.raises(ValueError, match="positions"):
        reference.apply_rope(q, k, pos, host_cache)
    want_q, want_k = reference.apply_rope(q, k, pos, host_cache, check_positions=False)
    q_out, k_out = cupykern.apply_rope(q, k, pos, cache, inplace=inplace, check_positions=False)
    got_q, got_k = cupy.asnumpy(q_out), cupy.asnumpy(k_out)
    assert got_q[bad].tobytes() == q_before[bad].tobytes() and got_k[bad].tobytes() == k_before[bad].tobytes()
    assert_close(got_q, want_q, dtype, seed=rng.seed, what="q")
    assert_close(got_k, want_k, dtype, seed=rng.seed, what="k")


# ----------------------------------------------------------------- GPU: argument errors
@pytest.mark.gpu
def test_apply_rope_rejects_bad_arguments(rng):
    f32, bf16 = _dtypes.float32, _dtypes.bfloat16
    q = random_device(rng, (4, 2, 64), bf16)
    k = random_device(rng, (4, 1, 64), bf16)
    pos = cupy.zeros(4, np.int64)
    cache, _ = _tables(64)
    with pytest.raises(TypeError, match="k: expected dtype"):
        cupykern.apply_rope(q, k.astype(f32), pos, cache)
    with pytest.raises(TypeError, match="q: unsupported dtype"):
        cupykern.apply_rope(q.astype(np.float64), None, pos, cache)
    with pytest.raises(TypeError, match="positions: expected dtype int32 or int64"):
        cupykern.apply_rope(q, k, pos.astype(np.float32), cache)
    with pytest.raises(TypeError, match="positions"):
        cupykern.apply_rope(q, k, pos.astype(np.uint32), cache)
    with pytest.raises(ValueError, match="positions: expected shape"):
        cupykern.apply_rope(q, k, cupy.zeros(5, np.int64), cache)
    with pytest.raises(ValueError, match="rotary_dim"):
        cupykern.apply_rope(q, k, pos, cupy.zeros((8, 7), f32))
    with pytest.raises(ValueError, match=r"rotary_dim \(128\) must be <= head_dim \(64\)"):
        cupykern.apply_rope(q, k, pos, _tables(128)[0])
    with pytest.raises(TypeError, match="cos_sin_cache: expected dtype"):
        cupykern.apply_rope(q, k, pos, cache.astype(_dtypes.float16))
    with pytest.raises(ValueError, match="unit-stride"):
        cupykern.apply_rope(random_device(rng, (4, 2, 128), bf16)[..., ::2], None, pos, cache)
    with pytest.raises(ValueError, match="k: expected the token axes"):
        cupykern.apply_rope(q, random_device(rng, (5, 1, 64), bf16), pos, cache)
    with pytest.raises(ValueError, match="k: expected head_dim"):
        cupykern.apply_rope(q, random_device(rng, (4, 1, 128), bf16), pos, cache)
    with pytest.raises(TypeError, match="positions: expected a device array"):
        cupykern.apply_rope(q, k, np.zeros(4, np.int64), cache)
    w = random_device(rng, (64,), bf16)
    with pytest.raises(ValueError, match=r"q_weight: expected shape \(64,\)"):
        cupykern.qk_rms_norm_rope(q, k, random_device(rng, (32,), bf16), w, pos, cache)
    with pytest.raises(TypeError, match="k_weight: expected dtype"):
        cupykern.qk_rms_norm_rope(q, k, w, w.astype(f32), pos, cache)


@pytest.mark.gpu
@pytest.mark.parametrize("choices", [dict(block_size=128), dict(vec_width=1), dict(threads_per_row=32)],
                         ids=["block_size", "vec_width", "threads_per_row"])
@pytest.mark.parametrize("check_positions", [True, False])
def test_rope_under_launch_overrides_raises(rng, choices, check_positions):
    """The rope plan takes no overrides: a sweep's choice is an error naming it, never silently ignored."""
    dtype = _dtypes.bfloat16
    cache, _ = _tables(128)
    q = random_device(rng, (8, 4, 128), dtype)
    k = random_device(rng, (8, 2, 128), dtype)
    w = random_device(rng, (128,), dtype, loc=1.0)
    pos = _positions(rng, 8, np.int64)
    q_before, k_before = _bytes(q), _bytes(k)
    (key,) = choices
    with launcher.overrides(**choices):
        with pytest.raises(ValueError, match=key):
            cupykern.apply_rope(q, k, pos, cache, check_positions=check_positions)
        with pytest.raises(ValueError, match=key):
            cupykern.apply_rope(q, k, pos, cache, inplace=False, check_positions=check_positions)
        with pytest.raises(ValueError, match=key):
            cupykern.qk_rms_norm_rope(q, k, w, w, pos, cache, check_positions=check_positions)
    assert _bytes(q) == q_before and _bytes(k) == k_before, "a rejected call wrote q or k"
    # Outside the context the same calls run.
    cupykern.apply_rope(q, k, pos, cache, check_positions=check_positions)


@pytest.mark.gpu
def test_apply_rope_zero_tokens_launches_nothing(rng):
    cache, _ = _tables(64)
    q = cupy.empty((0, 4, 64), _dtypes.bfloat16)
    k = cupy.empty((0, 1, 64), _dtypes.bfloat16)
    pos = cupy.empty((0,), np.int32)
    q_out, k_out = cupykern.apply_rope(q, k, pos, cache, inplace=False)
    assert q_out.shape == (0, 4, 64) and k_out.shape == (0, 1, 64)
    cupykern.qk_rms_norm_rope(q, k, cupy.ones(64, _dtypes.bfloat16), cupy.ones(64, _dtypes.bfloat16), pos, cache)


# ----------------------------------------------------------------- GPU: CUDA graphs
@pytest.mark.gpu
@pytest.mark.parametrize("op", ["apply_rope", "qk_rms_norm_rope"])
def test_rope_under_cuda_graph_capture(rng, op):
    dtype = _dtypes.bfloat16
    cache, host_cache = _tables(128)
    q = random_device(rng, (64, 8, 128), dtype)
    k = random_device(rng, (64, 2, 128), dtype)
    w_q = random_device(rng, (128,), dtype, scale=0.1, loc=1.0)
    w_k = random_device(rng, (128,), dtype, scale=0.1, loc=1.0)
    pos = _positions(rng, 64, np.int64)

    def call(a, b):
        if op == "apply_rope":
            return cupykern.apply_rope(a, b, pos, cache, check_positions=False)
        return cupykern.qk_rms_norm_rope(a, b, w_q, w_k, pos, cache, check_positions=False)

    call(q.copy(), k.copy())  # compile and plan outside the capture
    if op == "apply_rope":
        want_q, want_k = reference.apply_rope(q, k, pos, host_cache)
    else:
        want_q, want_k = reference.qk_rms_norm_rope(q, k, w_q, w_k, pos, host_cache)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        call(q, k)
        graph = stream.end_capture()
    graph.launch(stream=stream)
    stream.synchronize()
    assert_close(q, want_q, dtype, seed=rng.seed, what="q")
    assert_close(k, want_k, dtype, seed=rng.seed, what="k")


# ----------------------------------------------------------------- GPU: qk_rms_norm_rope
def _qk_cases():
    for num_tokens in (1, 7):
        for dtype in DTYPES:
            for head_dim in (64, 80, 128, 256):
                for rotary_dim in (head_dim, head_dim // 2):
                    for heads in HEADS[:2]:
                        yield num_tokens, dtype, head_dim, rotary_dim, heads
    yield 4096, _dtypes.bfloat16, 128, 128, (32, 8)
    yield 4096, _dtypes.float32, 256, 64, (8, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(_qk_cases()), ids=_case_id)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_qk_rms_norm_rope_matches_reference(rng, case, is_neox):
    num_tokens, dtype, head_dim, rotary_dim, (hq, hkv) = case
    cache, host_cache = _tables(rotary_dim)
    q = random_device(rng, (num_tokens, hq, head_dim), dtype, scale=3.0)
    k = random_device(rng, (num_tokens, hkv, head_dim), dtype, scale=0.2)
    w_q = random_device(rng, (head_dim,), dtype, scale=0.1, loc=1.0)
    w_k = random_device(rng, (head_dim,), dtype, scale=0.1, loc=1.0)
    pos = _positions(rng, num_tokens, POSITION_DTYPES[num_tokens % 2])
    want_q, want_k = reference.qk_rms_norm_rope(q, k, w_q, w_k, pos, host_cache, 1e-6, is_neox=is_neox)
    got_q, got_k = cupykern.qk_rms_norm_rope(q, k, w_q, w_k, pos, cache, 1e-6, is_neox=is_neox)
    assert got_q is q and got_k is k
    assert_close(q, want_q, dtype, seed=rng.seed, what="q")
    assert_close(k, want_k, dtype, seed=rng.seed, what="k")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("misalign", [0, 1], ids=["aligned", "misaligned_by_one"])
def test_qk_rms_norm_rope_on_fused_qkv_views(rng, dtype, misalign):
    num_tokens, hq, hkv, head_dim = 129, 16, 4, 128
    buf, q, k, v = _fused_qkv(rng, num_tokens, hq, hkv, head_dim, dtype, misalign)
    cache, host_cache = _tables(head_dim)
    w_q = random_device(rng, (head_dim,), dtype, scale=0.1, loc=1.0)
    w_k = random_device(rng, (head_dim,), dtype, scale=0.1, loc=1.0)
    pos = _positions(rng, num_tokens, np.int64)
    want_q, want_k = reference.qk_rms_norm_rope(q, k, w_q, w_k, pos, host_cache)
    v_before = _bytes(v)
    cupykern.qk_rms_norm_rope(q, k, w_q, w_k, pos, cache)
    assert_close(q, want_q, dtype, seed=rng.seed, what="q")
    assert_close(k, want_k, dtype, seed=rng.seed, what="k")
    assert _bytes(v) == v_before, "v was written"


@pytest.mark.gpu
def test_qk_rms_norm_rope_out_of_range_positions(rng):
    dtype = _dtypes.float16
    cache, host_cache = _tables(64)
    q = random_device(rng, (20, 4, 128), dtype)
    k = random_device(rng, (20, 1, 128), dtype)
    w = random_device(rng, (128,), dtype, scale=0.1, loc=1.0)
    host_pos = rng.integers(0, MAX_POSITION, 20)
    host_pos[[0, 9, 19]] = [-5, MAX_POSITION, 1 << 40]
    pos = cupy.asarray(host_pos)
    q_before = cupy.asnumpy(q)
    with pytest.raises(ValueError, match="positions"):
        cupykern.qk_rms_norm_rope(q, k, w, w, pos, cache)
    want_q, want_k = reference.qk_rms_norm_rope(q, k, w, w, pos, host_cache, check_positions=False)
    cupykern.qk_rms_norm_rope(q, k, w, w, pos, cache, check_positions=False)
    got_q = cupy.asnumpy(q)
    assert got_q[[0, 9, 19]].tobytes() == q_before[[0, 9, 19]].tobytes()
    assert_close(q, want_q, dtype, seed=rng.seed, what="q")
    assert_close(k, want_k, dtype, seed=rng.seed, what="k")


# ----------------------------------------------------------------- CPU: argument edge cases found by a user
@pytest.mark.parametrize("kwargs, match", [
    (dict(max_position=16, rotary_dim=2, rope_scaling={"rope_type": "dynamic", "factor": 2.0,
                                                        "original_max_position_embeddings": 8}), "rotary_dim > 2"),
    (dict(max_position=16, rotary_dim=8, base=10**400), "base"),
    (dict(max_position=16, rotary_dim=8, base="10000"), "base"),
    (dict(max_position=16, rotary_dim=8, base=None), "base"),
    (dict(max_position=True, rotary_dim=8), "max_position"),
    (dict(max_position=16, rotary_dim=8, rope_scaling={"rope_type": ["linear"], "factor": 2.0}), "rope_type"),
    (dict(max_position=16, rotary_dim=8, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                        "original_max_position_embeddings": 8,
                                                        "beta_fast": "32"}), "beta_fast"),
    (dict(max_position=16, rotary_dim=8, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                        "original_max_position_embeddings": 8,
                                                        "attention_factor": -1}), "attention_factor"),
    (dict(max_position=16, rotary_dim=8, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                        "original_max_position_embeddings": 8,
                                                        "truncate": "false"}), "truncate"),
])
def test_cos_sin_table_rejects_bad_scalars_by_name(kwargs, match):
    from cupykern import rope_scaling

    with pytest.raises(ValueError, match=match):
        rope_scaling.cos_sin_table(**kwargs)


def test_rope_cos_sin_cache_names_bad_dtype():
    with pytest.raises(TypeError, match="dtype: unsupported dtype 'fp8'"):
        cupykern.rope_cos_sin_cache(16, 8, dtype="fp8")


@pytest.mark.gpu
def test_overlapping_q_and_k_are_rejected():
    import cupy

    q = cupy.zeros((3, 4, 64), dtype=np.float16)
    cache = cupykern.rope_cos_sin_cache(8, 64)
    positions = cupy.zeros(3, dtype=np.int64)
    with pytest.raises(ValueError, match="k overlaps q"):
        cupykern.apply_rope(q, q[:, :2], positions, cache)
    # Out of place q and k are only read: the same views give what separate copies give.
    q.view(np.uint16)[...] = cupy.arange(q.size, dtype=np.uint16).reshape(q.shape) % 0x3c00
    shared = cupykern.apply_rope(q, q[:, :2], positions, cache, inplace=False)
    separate = cupykern.apply_rope(q.copy(), q[:, :2].copy(), positions, cache, inplace=False)
    for got, want in zip(shared, separate):
        np.testing.assert_array_equal(got.get().view(np.uint16), want.get().view(np.uint16))


# ----------------------------------------------------------------- LongRoPE (Phi-3/3.5 128k)
def _longrope(short, long, original=4096, **extra):
    return {"rope_type": "longrope", "short_factor": list(short), "long_factor": list(long),
            "original_max_position_embeddings": original, **extra}


def test_longrope_long_table_follows_the_published_formula():
    """A table past the original length: inv_freq = 1 / (long_factor * base ** (2i / d)),
    cos and sin times sqrt(1 + ln(L / L0) / ln(L0)) (HF _compute_longrope_parameters),
    computed here independently of cupykern.rope_scaling."""
    rng = np.random.default_rng(3)
    rotary_dim, base, original, rows = 96, 10000.0, 4096, 131072
    short, long = rng.uniform(1, 3, rotary_dim // 2), rng.uniform(1, 60, rotary_dim // 2)
    table = reference.rope_cos_sin_cache(rows, rotary_dim, base, rope_scaling=_longrope(short, long, original))
    scale = math.sqrt(1 + math.log(rows / original) / math.log(original))  # 32x: about 1.19
    for p in (0, 1, 4095, 4096, 100_000, rows - 1):
        angles = [p / (long[i] * base ** (2 * i / rotary_dim)) for i in range(rotary_dim // 2)]
        np.testing.assert_allclose(table[p], np.array([math.cos(a) for a in angles] + [math.sin(a) for a in angles])
                                   * scale, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("original", [1, 0.5, 1.0])
def test_longrope_original_length_of_one_or_less_is_refused(original):
    """The default attention factor divides by ln(original): 1 raised ZeroDivisionError and
    0.5 a bare 'math domain error'."""
    short, long = [1.0] * 4, [2.0] * 4
    with pytest.raises(ValueError, match=r"rope_scaling\['original_max_position_embeddings'\]: .* needs a length > 1"):
        reference.rope_cos_sin_cache(64, 8, 500.0, rope_scaling=_longrope(short, long, original=original))
    # With the attention factor given there is no logarithm of it.
    table = reference.rope_cos_sin_cache(64, 8, 500.0, rope_scaling=_longrope(short, long, original=original,
                                                                               attention_factor=1.0))
    assert np.isfinite(table).all()


def test_longrope_short_table_uses_the_short_factors_and_no_attention_factor():
    short, long = [1.0, 2.0, 4.0, 8.0], [10.0, 20.0, 30.0, 40.0]
    table = reference.rope_cos_sin_cache(64, 8, 500.0, rope_scaling=_longrope(short, long, original=64))
    p, i = 63, 2
    assert table[p, i] == pytest.approx(math.cos(p / (short[i] * 500.0 ** (2 * i / 8))), abs=1e-14)
    # "su", Phi-3's first name for it, is the same scaling; factor and attention_factor override.
    su = {key: value for key, value in _longrope(short, long, original=64).items() if key != "rope_type"}
    assert np.array_equal(table, reference.rope_cos_sin_cache(64, 8, 500.0, rope_scaling={**su, "type": "su"}))
    given = reference.rope_cos_sin_cache(64, 8, 500.0, rope_scaling=_longrope(short, long, 64, factor=16.0))
    np.testing.assert_allclose(given, table * math.sqrt(1 + math.log(16.0) / math.log(64)), rtol=1e-14)
    fixed = reference.rope_cos_sin_cache(64, 8, 500.0, rope_scaling=_longrope(short, long, 64, attention_factor=2.0))
    np.testing.assert_allclose(fixed, table * 2.0, rtol=1e-14)


@pytest.mark.parametrize("scaling, match", [
    (_longrope([1.0] * 3, [1.0] * 4), r"rope_scaling\['short_factor'\]: expected a list of rotary_dim / 2 = 4"),
    (_longrope([1.0] * 4, [1.0, 1.0, -2.0, 1.0]), r"rope_scaling\['long_factor'\]: expected a list"),
    (_longrope([1.0] * 4, "fast"), r"rope_scaling\['long_factor'\]"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 4},
     "needs 'original_max_position_embeddings'"),
    (_longrope([1.0] * 4, [1.0] * 4, original=0), r"rope_scaling\['original_max_position_embeddings'\]"),
])
def test_longrope_bad_configs_name_the_key(scaling, match):
    with pytest.raises(ValueError, match=match):
        reference.rope_cos_sin_cache(16, 8, rope_scaling=scaling)


# ----------------------------------------------------------------- M-RoPE (Qwen2-VL / Qwen2.5-VL / Qwen3-VL)
#: (mrope_section, mrope_interleaved) at rotary_dim 128: Qwen2.5-VL-7B's sections; Qwen3-VL's interleaved ones.
MROPE_CASES = [((16, 24, 24), False), ((24, 20, 20), True)]
MROPE_IDS = ["sectioned", "interleaved"]


def _mrope_row_rule(i, section, interleaved):
    """The row (0 temporal, 1 height, 2 width) of frequency index i, written from the published rules:
    HF Qwen2-VL apply_multimodal_rotary_pos_emb (consecutive sections) and HF Qwen3-VL
    apply_interleaved_mrope / vLLM apply_interleaved_rope (slices 1:3h:3 and 2:3w:3)."""
    t, h, w = section
    if interleaved:
        return 1 if (i % 3 == 1 and i < 3 * h) else 2 if (i % 3 == 2 and i < 3 * w) else 0
    return 0 if i < t else 1 if i < t + h else 2


@pytest.mark.parametrize("section, interleaved", MROPE_CASES, ids=MROPE_IDS)
def test_mrope_reference_with_equal_rows_is_plain_rope(rng, section, interleaved):
    cache = reference.rope_cos_sin_cache(4096, 128, 1e6)
    q, k = _ref_inputs(rng, 6, 4, 160), _ref_inputs(rng, 6, 2, 160)
    pos = rng.integers(0, 4096, 6)
    plain = reference.apply_rope(q, k, pos, cache)
    mrope = reference.apply_rope(q, k, np.stack([pos, pos, pos]), cache, mrope_section=section,
                                 mrope_interleaved=interleaved)
    np.testing.assert_array_equal(mrope[0], plain[0])
    np.testing.assert_array_equal(mrope[1], plain[1])
    # 4-D tokens: positions (3, batch, seq_len)
    q4, pos4 = q.reshape(2, 3, 4, 160), pos.reshape(2, 3)
    got, _ = reference.apply_rope(q4, None, np.stack([pos4] * 3), cache, mrope_section=list(section),
                                  mrope_interleaved=interleaved)
    np.testing.assert_array_equal(got.reshape(q.shape), plain[0])


@pytest.mark.parametrize("section, interleaved", MROPE_CASES, ids=MROPE_IDS)
def test_mrope_reference_takes_each_index_from_its_own_row(rng, section, interleaved):
    """x1 = 1, x2 = 0 rotates to (cos, sin) of the index's angle: each index must show the
    cache row of the position its section names."""
    rotary_dim, half, tokens = 128, 64, 5
    cache = reference.rope_cos_sin_cache(1000, rotary_dim, 1e6)
    x = np.zeros((tokens, 1, 136))
    x[..., :half] = 1.0
    pos = np.stack([rng.integers(0, 1000, tokens) for _ in range(3)])
    out, _ = reference.apply_rope(x, None, pos, cache, mrope_section=section, mrope_interleaved=interleaved)
    rows_used = [_mrope_row_rule(i, section, interleaved) for i in range(half)]
    assert sorted(set(rows_used)) == [0, 1, 2] and [rows_used.count(r) for r in range(3)] == list(section)
    for t in range(tokens):
        for i in range(half):
            p = pos[rows_used[i], t]
            assert out[t, 0, i] == cache[p, i] and out[t, 0, half + i] == cache[p, half + i], (t, i)
    np.testing.assert_array_equal(out[..., rotary_dim:], 0.0)


def test_mrope_reference_leaves_tokens_with_any_bad_row_unchanged(rng):
    cache = reference.rope_cos_sin_cache(64, 32, 10000.0)
    x = _ref_inputs(rng, 4, 2, 32)
    pos = np.array([[1, 2, 3, 4], [1, -1, 3, 4], [1, 2, 64, 4]])
    with pytest.raises(ValueError, match="positions"):
        reference.apply_rope(x, None, pos, cache, mrope_section=(4, 6, 6))
    out, _ = reference.apply_rope(x, None, pos, cache, mrope_section=(4, 6, 6), check_positions=False)
    np.testing.assert_array_equal(out[[1, 2]], x[[1, 2]])
    assert not np.allclose(out[[0, 3]], x[[0, 3]])


@pytest.mark.parametrize("interleaved, layout", [(False, 1), (True, 2)])
def test_apply_rope_mrope_launch(interleaved, layout):
    section = (16, 24, 24)
    launch = _apply(mrope_section=section, mrope_interleaved=interleaved)
    assert launch.template_args[:6] == ("__nv_bfloat16", "float", "long long", True, 8, layout)
    # positions (3, 4) C-contiguous: token stride 1, row stride 4; the sections last.
    assert launch.scalars[6] == 1 and launch.scalars[20:] == (4, 16, 24, 24)
    assert [type(v) for v in launch.scalars[20:]] == [np.int32] * 4
    # (num_tokens, 3) storage seen transposed: token stride 3, row stride 1.
    strided = Sig((3, 4), (8, 24), np.dtype(np.int64), 0)
    launch = _apply(positions=strided, mrope_section=list(section), mrope_interleaved=interleaved)
    assert launch.scalars[6] == 3 and launch.scalars[20] == 1
    # 4-D tokens: positions (3, batch, seq_len).
    q4 = contiguous((2, 3, 8, 128), BF16)
    launch = _apply(q=q4, k=None, mrope_section=section)
    assert launch.scalars[0] == 6 and launch.scalars[6] == 1 and launch.scalars[20] == 6
    assert _apply(mrope_section=section, inplace=False).template_args[5] == 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(mrope_section=(16, 24, 23)), r"mrope_section: the sections must sum to rotary_dim / 2 = 64 .* \(sum 63\)"),
    (dict(mrope_section=(16, 48)), r"mrope_section: expected 3 ints >= 0"),
    (dict(mrope_section=(16.0, 24, 24)), r"mrope_section: expected 3 ints >= 0"),
    (dict(mrope_section=(-8, 36, 36)), r"mrope_section: expected 3 ints >= 0"),
    (dict(mrope_section=(True, 31, 32)), r"mrope_section: expected 3 ints >= 0"),
    (dict(mrope_section="16,24,24"), r"mrope_section: expected 3 ints >= 0"),
    (dict(mrope_interleaved=True), "mrope_interleaved: True needs mrope_section"),
    (dict(mrope_section=(16, 24, 24), is_neox=False), "is_neox: M-RoPE .* NeoX pairing only"),
    (dict(mrope_section=(16, 24, 24), positions=contiguous((4,), np.int64)),
     r"positions: with mrope_section, expected shape \(3, 4\)"),
    (dict(mrope_section=(16, 24, 24), positions=contiguous((4, 3), np.int64)), r"expected shape \(3, 4\)"),
    (dict(positions=contiguous((3, 4), np.int64)),
     r"positions: shape \(3, 4\) holds M-RoPE .* pass mrope_section"),
])
def test_apply_rope_mrope_intake_errors_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _apply(limits=None, **kwargs)
    with pytest.raises(TypeError, match="positions: expected dtype int32 or int64"):
        _apply(limits=None, mrope_section=(16, 24, 24), positions=contiguous((3, 4), F32))


@pytest.mark.parametrize("value", ["yes", 2, 0.5, (True,)])
def test_apply_rope_mrope_interleaved_is_a_flag_like_is_neox(value):
    """Helper 61: mrope_interleaved=1 was a ValueError where is_neox=1 is taken; both are
    flags now (_arrays.flag: True, False, 1, 0; TypeError otherwise)."""
    with pytest.raises(TypeError, match="mrope_interleaved: expected a bool, got "):
        _apply(mrope_section=(16, 24, 24), mrope_interleaved=value)
    assert _apply(mrope_section=(16, 24, 24), mrope_interleaved=1).template_args == \
        _apply(mrope_section=(16, 24, 24), mrope_interleaved=True).template_args


def test_interleaved_mrope_sections_fit_the_kernels_32_bit_bound():
    """rope.cu's mrope_row compares indices with 3 * h and 3 * w as ints (helper-32's case)."""
    half = 715_827_888  # rotary_dim 1431655776 < 2**31; 3 * 715827883 >= 2**31
    with pytest.raises(ValueError, match=r"mrope_section: interleaved sections must be below 2\*\*31 / 3"):
        rope_ops.mrope_layout((5, 715_827_883, 0), True, 2 * half, True)
    assert rope_ops.mrope_layout((5, 715_827_883, 0), False, 2 * half, True)[0] == rope_ops.MROPE_SECTIONED
    assert rope_ops.mrope_layout((6, 715_827_882, 0), True, 2 * half, True)[0] == rope_ops.MROPE_INTERLEAVED


def test_reference_refuses_what_the_kernel_refuses_for_mrope(fake_launcher):
    pos3 = np.stack([_POS] * 3)
    for kwargs in (dict(), dict(mrope_section=(8, 8, 8)), dict(mrope_section=(8, 12, 12), is_neox=False),
                   dict(mrope_section=[8, 12, 12], mrope_interleaved=1.5)):
        assert_same_error(cupykern.apply_rope, reference.apply_rope, _Q, _K, pos3, _CACHE, check_positions=False,
                          **kwargs)
    assert kernel_and_reference_errors(cupykern.apply_rope, reference.apply_rope, _Q, _K, pos3, _CACHE,
                                       check_positions=False, mrope_section=[8, 12, 12]) == (None, None)


def test_mrope_section_of_equal_non_ints_is_refused_after_a_call_with_ints(fake_launcher):
    """The recipe cache keys scalars with ==, and (8.0, 12, 12) == (8, 12, 12): after a call
    with ints, a section the intake refuses was taken from the cached recipe."""
    pos3 = np.stack([_POS] * 3)
    cache6, q6 = np.ones((16, 6), F32), np.ones((4, 2, 8), F32)
    cupykern.apply_rope(as_fake(_Q), as_fake(_K), as_fake(pos3), as_fake(_CACHE), check_positions=False,
                        mrope_section=(8, 12, 12))
    cupykern.apply_rope(as_fake(q6), None, as_fake(pos3), as_fake(cache6), check_positions=False,
                        mrope_section=[1, 1, 1])
    assert len(fake_launcher) == 2
    for q, cache, section in ((_Q, _CACHE, (8.0, 12, 12)), (_Q, _CACHE, [8, 12.0, 12]),
                              (_Q, _CACHE, (8, np.float64(12), 12)), (q6, cache6, (True, True, True))):
        with pytest.raises(ValueError, match="mrope_section: expected 3 ints >= 0"):
            cupykern.apply_rope(as_fake(q), None, as_fake(pos3), as_fake(cache), check_positions=False,
                                mrope_section=section)
        assert_same_error(cupykern.apply_rope, reference.apply_rope, q, None, pos3, cache, check_positions=False,
                          mrope_section=section)
    # NumPy ints are ints: the same recipe
    cupykern.apply_rope(as_fake(_Q), as_fake(_K), as_fake(pos3), as_fake(_CACHE), check_positions=False,
                        mrope_section=(np.int64(8), np.int32(12), 12))
    assert len(fake_launcher) == 3
    assert rope_ops.mrope_key([8, np.int64(12), 12]) == (8, 12, 12)


def test_mrope_rope_scaling_is_the_default_table():
    """HF Qwen2VLConfig rewrites rope_scaling type 'mrope' to 'default' and keeps mrope_section."""
    qwen25 = {"type": "mrope", "mrope_section": [16, 24, 24]}
    qwen3 = {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True}
    plain = reference.rope_cos_sin_cache(256, 128, 1e6)
    for scaling in (qwen25, qwen3):
        np.testing.assert_array_equal(reference.rope_cos_sin_cache(256, 128, 1e6, rope_scaling=scaling), plain)
    assert rope_scaling.mrope_parameters(qwen25, 128) == ((16, 24, 24), False)
    assert rope_scaling.mrope_parameters(qwen3, 128) == ((24, 20, 20), True)
    assert rope_scaling.mrope_parameters(None, 128) == (None, False)
    assert rope_scaling.mrope_parameters({"rope_type": "yarn"}, 128) == (None, False)


@pytest.mark.parametrize("scaling, match", [
    ({"type": "mrope", "mrope_section": [16, 24, 20]}, r"rope_scaling\['mrope_section'\]: .* rotary_dim / 2 = 64"),
    ({"type": "mrope", "mrope_section": "16 24 24"}, r"rope_scaling\['mrope_section'\]"),
    ({"type": "mrope", "mrope_section": [16, 24, 24], "mrope_interleaved": "true"},
     r"rope_scaling\['mrope_interleaved'\]: expected a bool"),
    ({"rope_type": "default", "mrope_interleaved": True}, r"rope_scaling\['mrope_interleaved'\]: true needs"),
])
def test_mrope_bad_rope_scaling_names_the_key(scaling, match):
    with pytest.raises(ValueError, match=match):
        reference.rope_cos_sin_cache(16, 128, rope_scaling=scaling)
    with pytest.raises(ValueError, match=match):
        rope_scaling.mrope_parameters(scaling, 128)


# ----------------------------------------------------------------- GPU: M-RoPE
def _mrope_positions(rng, num_tokens, pos_dtype, *, transposed=False):
    """(3, num_tokens) device positions, rows drawn independently; the last token at the table's end.
    ``transposed``: a (3, num_tokens) view of (num_tokens, 3) storage (token stride 3, row stride 1)."""
    pos = rng.integers(0, MAX_POSITION, (num_tokens, 3)).astype(pos_dtype)
    if num_tokens:
        pos[-1] = MAX_POSITION - 1
    if transposed:
        return cupy.asarray(pos).T
    return cupy.asarray(np.ascontiguousarray(pos.T))


def _mrope_cases():
    for num_tokens in (0, 1, 7, 300):
        for dtype in DTYPES:
            for rotary_dim, head_dim in ((128, 128), (128, 160)):
                yield num_tokens, dtype, rotary_dim, head_dim
    yield 4096, _dtypes.bfloat16, 128, 128


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(_mrope_cases()),
                         ids=lambda c: f"t{c[0]}-{_dtypes.short_name(c[1])}-rot{c[2]}-hd{c[3]}")
@pytest.mark.parametrize("section, interleaved", MROPE_CASES, ids=MROPE_IDS)
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "out_of_place"])
def test_apply_rope_mrope_matches_reference(rng, case, section, interleaved, inplace):
    num_tokens, dtype, rotary_dim, head_dim = case
    cache, host_cache = _tables(rotary_dim)
    q = random_device(rng, (num_tokens, 28, head_dim), dtype)
    k = random_device(rng, (num_tokens, 4, head_dim), dtype)
    pos = _mrope_positions(rng, num_tokens, POSITION_DTYPES[num_tokens % 2], transposed=bool(num_tokens % 2))
    before = cupy.asnumpy(q), cupy.asnumpy(k)
    want_q, want_k = reference.apply_rope(q, k, pos, host_cache, mrope_section=section, mrope_interleaved=interleaved)
    q_out, k_out = cupykern.apply_rope(q, k, pos, cache, mrope_section=list(section), mrope_interleaved=interleaved,
                                       inplace=inplace)
    if inplace:
        assert q_out is q and k_out is k
    else:
        assert (_bytes(q), _bytes(k)) == (before[0].tobytes(), before[1].tobytes()), "out of place wrote its inputs"
        assert q_out.flags.c_contiguous and k_out.flags.c_contiguous
    assert q_out.shape == q.shape and k_out.shape == k.shape
    assert_close(q_out, want_q, dtype, seed=rng.seed, what="q")
    assert_close(k_out, want_k, dtype, seed=rng.seed, what="k")
    # dims past rotary_dim: exactly the input's
    assert cupy.asnumpy(q_out)[..., rotary_dim:].tobytes() == before[0][..., rotary_dim:].tobytes()
    assert cupy.asnumpy(k_out)[..., rotary_dim:].tobytes() == before[1][..., rotary_dim:].tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("section, interleaved", MROPE_CASES, ids=MROPE_IDS)
def test_apply_rope_mrope_with_equal_rows_is_bitwise_plain_rope(rng, dtype, section, interleaved):
    """The same cos/sin values in the same fp32 math: the M-RoPE kernels give the plain kernel's bits."""
    cache, _ = _tables(128)
    q = random_device(rng, (65, 8, 128), dtype)
    k = random_device(rng, (65, 2, 128), dtype)
    pos = _positions(rng, 65, np.int64)
    plain = cupykern.apply_rope(q, k, pos, cache, inplace=False)
    mrope = cupykern.apply_rope(q, k, cupy.stack([pos] * 3), cache, mrope_section=section,
                                mrope_interleaved=interleaved, inplace=False)
    assert _bytes(mrope[0]) == _bytes(plain[0]) and _bytes(mrope[1]) == _bytes(plain[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("misalign", [0, 1], ids=["aligned", "misaligned_by_one"])
@pytest.mark.parametrize("section, interleaved", MROPE_CASES, ids=MROPE_IDS)
def test_apply_rope_mrope_on_fused_qkv_views(rng, dtype, misalign, section, interleaved):
    num_tokens, hq, hkv, head_dim = 129, 28, 4, 128
    buf, q, k, v = _fused_qkv(rng, num_tokens, hq, hkv, head_dim, dtype, misalign)
    cache, host_cache = _tables(head_dim, dtype)  # the cache in q's dtype (float32 for float32)
    pos = _mrope_positions(rng, num_tokens, np.int32, transposed=True)
    want_q, want_k = reference.apply_rope(q, k, pos, host_cache, mrope_section=section, mrope_interleaved=interleaved)
    v_before = _bytes(v)
    cupykern.apply_rope(q, k, pos, cache, mrope_section=section, mrope_interleaved=interleaved)
    assert_close(q, want_q, dtype, seed=rng.seed, what="q")
    assert_close(k, want_k, dtype, seed=rng.seed, what="k")
    assert _bytes(v) == v_before, "v was written"


@pytest.mark.gpu
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "out_of_place"])
def test_apply_rope_mrope_out_of_range_positions(rng, inplace):
    dtype = _dtypes.bfloat16
    cache, host_cache = _tables(128)
    q = random_device(rng, (30, 8, 128), dtype)
    k = random_device(rng, (30, 2, 128), dtype)
    host_pos = rng.integers(0, MAX_POSITION, (3, 30))
    bad = np.array([0, 7, 14, 29])
    host_pos[[0, 1, 2, 1], bad] = [-1, MAX_POSITION, -(1 << 31), 1 << 40]  # one bad row per bad token
    pos = cupy.asarray(host_pos)
    q_before, k_before = cupy.asnumpy(q), cupy.asnumpy(k)
    with pytest.raises(ValueError, match="positions"):
        cupykern.apply_rope(q, k, pos, cache, mrope_section=(16, 24, 24), inplace=inplace)
    assert _bytes(q) == q_before.tobytes(), "a rejected call wrote q"
    want_q, want_k = reference.apply_rope(q, k, pos, host_cache, mrope_section=(16, 24, 24), check_positions=False)
    q_out, k_out = cupykern.apply_rope(q, k, pos, cache, mrope_section=(16, 24, 24), inplace=inplace,
                                       check_positions=False)
    got_q, got_k = cupy.asnumpy(q_out), cupy.asnumpy(k_out)
    assert got_q[bad].tobytes() == q_before[bad].tobytes() and got_k[bad].tobytes() == k_before[bad].tobytes()
    assert_close(got_q, want_q, dtype, seed=rng.seed, what="q")
    assert_close(got_k, want_k, dtype, seed=rng.seed, what="k")


@pytest.mark.gpu
@pytest.mark.parametrize("section, interleaved", MROPE_CASES, ids=MROPE_IDS)
def test_apply_rope_mrope_under_cuda_graph_capture(rng, section, interleaved):
    dtype = _dtypes.bfloat16
    cache, host_cache = _tables(128)
    q = random_device(rng, (64, 28, 128), dtype)
    k = random_device(rng, (64, 4, 128), dtype)
    pos = _mrope_positions(rng, 64, np.int64)

    def call(a, b):
        return cupykern.apply_rope(a, b, pos, cache, mrope_section=section, mrope_interleaved=interleaved,
                                   check_positions=False)

    call(q.copy(), k.copy())  # compile and plan outside the capture
    want_q, want_k = reference.apply_rope(q, k, pos, host_cache, mrope_section=section, mrope_interleaved=interleaved)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        call(q, k)
        graph = stream.end_capture()
    graph.launch(stream=stream)
    stream.synchronize()
    assert_close(q, want_q, dtype, seed=rng.seed, what="q")
    assert_close(k, want_k, dtype, seed=rng.seed, what="k")


# ----------------------------------------------------------------- YaRN with DeepSeek's mscale (HF semantics)
def _yarn_hf_formula(d, base, factor, orig, *, beta_fast=32.0, beta_slow=1.0, mscale=None, mscale_all_dim=None,
                     attention_factor=None, truncate=True):
    """(inv_freq, attention_factor) written from HF transformers' _compute_yarn_parameters (YaRN,
    arXiv:2309.00071) and DeepSeek-V2/V3's yarn_get_mscale(scale, mscale) / yarn_get_mscale(scale,
    mscale_all_dim), without cupykern's code: plain floats, one index at a time."""
    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        attention_factor = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
                            if mscale and mscale_all_dim else get_mscale(factor))

    def correction_dim(rotations):
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    inv = []
    for i in range(d // 2):
        pos_freq = base ** (2 * i / d)
        extrapolation_factor = 1 - min(max((i - low) / (high - low), 0.0), 1.0)
        inv.append(1 / (factor * pos_freq) * (1 - extrapolation_factor) + 1 / pos_freq * extrapolation_factor)
    return inv, attention_factor


#: DeepSeek-V3's rope_scaling (qk_rope_head_dim 64, rope_theta 10000); DeepSeek-V2-Lite's mscales (0.707);
#: an mscale without mscale_all_dim (HF: the plain 0.1 ln(factor) + 1); gpt-oss's truncate false.
YARN_CONFIGS = [
    (64, 10000.0, {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                   "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
    (64, 10000.0, {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                   "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}),
    (64, 10000.0, {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "mscale": 1.0,
                   "mscale_all_dim": 0.5}),
    (64, 10000.0, {"type": "yarn", "factor": 16, "original_max_position_embeddings": 4096, "mscale": 0.707}),
    (64, 150000.0, {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                    "beta_slow": 1.0, "truncate": False}),
    (128, 1000000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                      "beta_fast": 16, "beta_slow": 2, "attention_factor": 0.9}),
]


@pytest.mark.parametrize("d, base, scaling", YARN_CONFIGS, ids=["deepseek-v3", "deepseek-v2-lite", "mscale-ratio",
                                                                 "mscale-alone", "gpt-oss-no-truncate", "given-af"])
def test_yarn_tables_follow_the_hf_formula(d, base, scaling):
    options = {key: scaling[key] for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor",
                                             "truncate") if key in scaling}
    inv, af = _yarn_hf_formula(d, base, float(scaling["factor"]), scaling["original_max_position_embeddings"],
                               **options)
    got_inv, got_af = rope_scaling.rope_parameters(d, base, scaling, max_position=1)
    np.testing.assert_allclose(got_inv, inv, rtol=1e-14, atol=0)
    assert got_af == pytest.approx(af, rel=1e-15)
    _check_table(scaling, inv, af, d=d, base=base, max_position=163840)
    if scaling.get("mscale") and scaling.get("mscale") == scaling.get("mscale_all_dim"):
        assert got_af == pytest.approx(1.0)  # DeepSeek: the mscales cancel in the table


def test_yarn_truncate_takes_numpy_bools_as_every_flag():
    """YaRN's ``truncate`` took Python's bool only (np.False_ was refused); the table is
    the same for NumPy's bool as for Python's."""
    from cupykern import rope_scaling

    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}

    def table(truncate):
        return rope_scaling.cos_sin_table(max_position=16, rotary_dim=8, rope_scaling={**scaling, "truncate": truncate})
    for numpy_flag, python_flag in ((np.False_, False), (np.True_, True)):
        np.testing.assert_array_equal(table(numpy_flag), table(python_flag))
    assert not np.array_equal(table(False), table(True))  # the flag is read: the two ramps differ here


def _empty_table_calls(q, k, cache, xp, new):
    """The four RoPE references (xp=reference, new=numpy) or ops (xp=cupykern, new=cupy)
    on a cos/sin table of no rows, positions unchecked: every token is out of range.
    Returns {name: outputs}."""
    num_tokens, kv_heads, head_dim = k.shape
    hidden = 16
    positions, weight = new.arange(num_tokens), new.ones((head_dim,), q.dtype)
    k_cache = new.zeros((8, kv_heads, head_dim), q.dtype)
    qkv = new.ones(((q.shape[1] + 2 * kv_heads) * head_dim, hidden), q.dtype)
    return {
        "apply_rope": xp.apply_rope(q.copy(), k.copy(), positions, cache, check_positions=False),
        "qk_rms_norm_rope": xp.qk_rms_norm_rope(q.copy(), k.copy(), weight, weight, positions, cache,
                                                check_positions=False),
        "rope_kv_append": xp.rope_kv_append(q.copy(), k.copy(), k.copy(), positions, cache, k_cache.copy(),
                                            k_cache.copy(), check_positions=False),
        "rms_norm_gemv_rope_kv_append": xp.rms_norm_gemv_rope_kv_append(
            new.ones((1, hidden), q.dtype), new.ones((hidden,), q.dtype), qkv, positions[:1], cache, k_cache.copy(),
            k_cache.copy(), check_positions=False),
    }


def test_references_take_a_table_of_no_rows_unchecked():
    """Helper 76: with cos_sin_cache[:0] and check_positions=False the op's checks pass and
    the kernels leave every token as it is; the references raised IndexError gathering row 0."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((3, 4, 8)).astype(np.float32)
    k = rng.standard_normal((3, 2, 8)).astype(np.float32)
    cache = reference.rope_cos_sin_cache(16, 8)[:0]
    out = _empty_table_calls(q, k, cache, reference, np)
    for name in ("apply_rope", "qk_rms_norm_rope"):
        np.testing.assert_array_equal(out[name][0], q)
        np.testing.assert_array_equal(out[name][1], k)
    q_rot, k_cache, v_cache = out["rope_kv_append"]
    np.testing.assert_array_equal(q_rot, q)
    assert not k_cache.any() and not v_cache.any()  # no row written
    _, k_cache, v_cache = out["rms_norm_gemv_rope_kv_append"]
    assert not k_cache.any() and not v_cache.any()


@pytest.mark.gpu
def test_ops_take_a_table_of_no_rows_unchecked_as_the_references():
    rng = np.random.default_rng(7)
    q = rng.standard_normal((3, 4, 8)).astype(np.float32)
    k = rng.standard_normal((3, 2, 8)).astype(np.float32)
    host_cache = reference.rope_cos_sin_cache(16, 8)[:0]
    want = _empty_table_calls(q, k, host_cache, reference, np)
    got = _empty_table_calls(cupy.asarray(q), cupy.asarray(k), cupy.asarray(host_cache, np.float32), cupykern, cupy)
    for name, outputs in want.items():  # rtol: rms_norm_gemv's q is an fp32 sum of 16 products
        for w, g in zip(outputs, got[name]):
            np.testing.assert_allclose(cupy.asnumpy(g).astype(np.float64), w, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_table_past_host_memory_says_which_sizes():
    """Helper 76: tables too large raised NumPy's bare MemoryError or "array is too big".
    Past 2**64 bytes NumPy refuses before allocating (a smaller table could be granted
    by an overcommitting kernel, then filled)."""
    with pytest.raises(MemoryError, match=r"max_position 2147483647 x rotary_dim 2147483646 \(float64, \d+ bytes\) "
                                          r"does not fit in host memory"):
        reference.rope_cos_sin_cache(2**31 - 1, 2**31 - 2)
