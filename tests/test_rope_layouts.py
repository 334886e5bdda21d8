"""RoPE kernel layouts (plans.ROPE_LAYOUT): the wide kernels against the "steps" ones.

CPU: the planner's choice of layout and heads per thread, the fallback of
qk_rms_norm_rope to the steps kernel where a lane would hold more than one unit, the
wide kernels' register use. GPU (marked): every option of apply_rope and
qk_rms_norm_rope gives the same bytes under every layout (the golden digests of
tests/test_golden.py pin the default layout to the recorded outputs).
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from cupykern import _dtypes, jit, launcher, plans
from cupykern.ops import rope as rope_ops
from tests.helpers import DTYPES, DTYPE_IDS

BF16 = _dtypes.bfloat16
#: (plan constants, id): today's kernels, and the wide ones with each choice the bench compares.
LAYOUTS = [({"ROPE_LAYOUT": "steps"}, "steps"),
           ({"ROPE_LAYOUT": "wide"}, "wide"),
           ({"ROPE_LAYOUT": "wide", "ROPE_WIDE_HEADS_CHOICES": (2, 4), "ROPE_WIDE_HEADS_PER_THREAD": 4,
             "ROPE_WIDE_NORM_HEADS_PER_THREAD": 2, "ROPE_WIDE_DECODE_HEADS_PER_THREAD": 4, "ROPE_TOKEN_HEADS": (2, 4)},
            "wide-swapped-heads"),
           ({"ROPE_LAYOUT": "wide", "ROPE_WIDE_HEADS_CHOICES": (2,), "ROPE_TOKEN_HEADS": (2,)}, "wide-2-heads"),
           ({"ROPE_LAYOUT": "wide", "ROPE_WIDE_GRID_WAVES": 1, "ROPE_WIDE_NORM_GRID_WAVES": 0}, "wide-waves-swapped"),
           ({"ROPE_LAYOUT": "wide", "ROPE_WIDE_BLOCK_THREADS": 256, "ROPE_WIDE_NORM_BLOCK_THREADS": 1},
            "wide-block-threads-swapped"),
           ({"ROPE_LAYOUT": "wide", "ROPE_TOKEN_HEADS": (), "ROPE_NORM_TOKEN_HEADS": (), "ROPE_TOKEN_BAND_HEADS": 0},
            "wide-no-token-kernel")]


def _plan(num_tokens, head_dim=128, rotary_dim=128, dtype=BF16, fused_norm=False, max_vec=None):
    return plans.plan_rope(num_tokens, 40, head_dim, rotary_dim, dtype,
                           max_vec_width=max_vec or _dtypes.vec_width(dtype), fused_norm=fused_norm,
                           limits=plans.H200_LIMITS)


# ----------------------------------------------------------------- CPU: planner
@pytest.mark.parametrize("fused_norm", [False, True])
def test_wide_is_the_default_with_heads_by_batch_size(fused_norm):
    assert plans.ROPE_LAYOUT == "wide"
    # The fullest block of one round, from each op's constant up (40 heads: 5 a thread fill
    # a block of 256 threads, for both ops)
    prefill_heads = 5
    assert plans.ROPE_WIDE_NORM_HEADS_PER_THREAD == 3
    assert _plan(16384, fused_norm=fused_norm).heads_per_thread == prefill_heads
    assert _plan(4096, fused_norm=fused_norm).heads_per_thread == prefill_heads
    assert _plan(1, fused_norm=fused_norm).heads_per_thread == plans.ROPE_WIDE_DECODE_HEADS_PER_THREAD == 2
    assert _plan(64, fused_norm=fused_norm).heads_per_thread == 2


@pytest.mark.parametrize("fused_norm", [False, True])
def test_steps_layout_is_today_s_plan(monkeypatch, fused_norm):
    monkeypatch.setattr(plans, "ROPE_LAYOUT", "steps")
    for n in (1, 64, 4096, 16384):
        plan = _plan(n, fused_norm=fused_norm)
        assert plan.heads_per_thread == 0
        assert (plan.threads_per_head, plan.head_slots) == ((8, 32) if n < 4 * 132 else (8, 10))


@pytest.mark.parametrize("fused_norm", [False, True])
def test_wide_keeps_the_row_group_and_vector_width(monkeypatch, fused_norm):
    """qk_rms_norm_rope's bits depend on (vec_width, threads_per_head): the layouts agree on them."""
    for head_dim, rotary_dim in ((64, 64), (128, 64), (128, 128), (256, 256), (80, 32)):
        for dtype in DTYPES:
            for max_vec in sorted(set(plans.rope_vec_widths(dtype, fused_norm=fused_norm))):
                wide = _plan(4096, head_dim, rotary_dim, dtype, fused_norm, max_vec)
                monkeypatch.setattr(plans, "ROPE_LAYOUT", "steps")
                steps = _plan(4096, head_dim, rotary_dim, dtype, fused_norm, max_vec)
                monkeypatch.setattr(plans, "ROPE_LAYOUT", "wide")
                assert (wide.vec_width, wide.threads_per_head) == (steps.vec_width, steps.threads_per_head)


def test_qk_norm_falls_back_to_steps_when_a_lane_holds_two_units():
    # scalar path: 64 units of head_dim 128 over the 32 lanes of the row group
    assert _plan(4096, fused_norm=True, max_vec=1).heads_per_thread == 0
    assert _plan(4096, fused_norm=True, max_vec=8).heads_per_thread == 5
    # apply_rope's wide kernel holds a token's heads in one round: 40 heads of 64 lanes fit no block
    assert _plan(4096, max_vec=1).heads_per_thread == 0
    assert _plan(4096, max_vec=8).heads_per_thread == 5


def test_wide_grid_waves_cap_the_grid(monkeypatch):
    # apply_rope: a block per group of tokens; qk_rms_norm_rope: ROPE_WIDE_NORM_GRID_WAVES waves
    # (planned without the kernel: ROPE_WIDE_BLOCKS_PER_SM 256-thread blocks an SM, scaled to the block);
    # 8b's qk takes the token kernel since item 38: the wide kernel's grid with it turned off
    monkeypatch.setattr(plans, "ROPE_NORM_TOKEN_HEADS", ())
    assert _plan(16384).grid[0] == -(-16384 // _plan(16384).tokens_per_block)

    def resident(plan):
        return plans.ROPE_WIDE_BLOCKS_PER_SM * 256 // plan.block_size * plans.H200_LIMITS.sm_count

    qk = _plan(16384, fused_norm=True)
    assert qk.block_size == 128 and qk.grid[0] == plans.ROPE_WIDE_NORM_GRID_WAVES * resident(qk) == 2 * 4 * 132
    monkeypatch.setattr(plans, "ROPE_WIDE_GRID_WAVES", 1)
    monkeypatch.setattr(plans, "ROPE_WIDE_NORM_GRID_WAVES", 0)
    apply = _plan(16384)
    assert apply.block_size == 64 and apply.grid[0] == resident(apply) == 8 * 132
    plan = _plan(16384, fused_norm=True)
    assert plan.grid[0] == -(-16384 // plan.tokens_per_block)


def test_resident_grid_takes_whole_waves_of_the_kernel_s_blocks(monkeypatch):
    monkeypatch.setattr(plans, "ROPE_NORM_TOKEN_HEADS", ())  # the wide kernel's plan (8b takes the token kernel)
    sms, h200 = plans.H200_LIMITS.sm_count, plans.H200_LIMITS
    plan = _plan(16384, fused_norm=True)
    assert plan.grid_waves == plans.ROPE_WIDE_NORM_GRID_WAVES >= 1
    for per_sm in (1, 2, 3, 5):
        got = plans.rope_resident_grid(plan, 16384, per_sm, h200)
        assert got.grid == (plans.ROPE_WIDE_NORM_GRID_WAVES * per_sm * sms, 1, 1)
        assert replace(got, grid=plan.grid) == plan  # nothing else changes
    # never more blocks than token groups; a block per group where the plan takes no waves
    assert plans.rope_resident_grid(plan, 100, 3, h200).grid == (-(-100 // plan.tokens_per_block), 1, 1)
    apply = _plan(16384)
    assert apply.grid_waves == 0 and plans.rope_resident_grid(apply, 16384, 1, h200) == apply
    for bad in (0, -1, True, 2.0, None, "3"):
        with pytest.raises(ValueError, match=r"blocks_per_sm: expected an int >= 1, got "):
            plans.rope_resident_grid(plan, 16384, bad, h200)
    # helper 55: a NumPy uint32 count wrapped in -(-n // t) (a grid of 2**31 - 1), a float one
    # planned a float grid, and the plan's fields went unchecked (the limits' are checked
    # where they are built: test_plans.py)
    grouped = replace(apply, tokens_per_block=4)  # 8b's apply_rope takes one token a block since item 34
    assert plans.rope_resident_grid(grouped, np.uint32(5), 1, h200).grid == (2, 1, 1)
    for bad in (-5, 10.0, None, "5", float("nan")):
        with pytest.raises(ValueError, match=r"num_tokens: expected an int >= 0, got "):
            plans.rope_resident_grid(plan, bad, 3, h200)
    for field, bad in (("grid_waves", -1), ("grid_waves", 2.0), ("grid_waves", True), ("tokens_per_block", 0)):
        with pytest.raises(ValueError, match=rf"plan.{field}: expected an int >= "):
            plans.rope_resident_grid(replace(plan, **{field: bad}), 16384, 3, h200)
    with pytest.raises(TypeError, match="plan: expected a plans.RopePlan, got NoneType"):
        plans.rope_resident_grid(None, 16384, 3, h200)
    with pytest.raises(TypeError, match="limits: expected a plans.DeviceLimits, got dict"):
        plans.rope_resident_grid(plan, 16384, 3, {})


@pytest.mark.parametrize("fused_norm", [False, True])
def test_wide_blocks_fill_their_block_threads_with_whole_tokens(monkeypatch, fused_norm):
    """apply_rope's wide blocks fill ROPE_WIDE_BLOCK_THREADS (64) threads with whole tokens,
    qk_rms_norm_rope's ROPE_WIDE_NORM_BLOCK_THREADS (128); at least one token a block. Item
    34: llama-3.1-8b's 256-thread blocks of 4 tokens took up to 3.9 % longer. In threads,
    not tokens: SmolLM2-135M's 12 heads of 64 take 16 threads a token, whose one-token
    blocks would leave half of each warp idle."""
    name = "ROPE_WIDE_NORM_BLOCK_THREADS" if fused_norm else "ROPE_WIDE_BLOCK_THREADS"
    assert (plans.ROPE_WIDE_BLOCK_THREADS, plans.ROPE_WIDE_NORM_BLOCK_THREADS) == (64, 128)
    monkeypatch.setattr(plans, "ROPE_NORM_TOKEN_HEADS", ())  # the wide kernel's blocks (item 38's token kernel off)
    # 8b (40 heads at 5 a thread): 64 threads a token; 4 tokens fill 256 threads
    default = 2 if fused_norm else 1
    for n in (600, 4096, 16384):  # prefill sizes (>= 4 tokens an SM), where ceil(n / 132) >= 4
        plan = _plan(n, fused_norm=fused_norm)
        assert (plan.heads_per_thread, plan.tokens_per_block, plan.block_size) == (5, default, 64 * default)
    # 70b's 72 heads: one token a block (apply_rope 5 heads, 120 threads; qk 3 heads, 192)
    big = plans.plan_rope(4096, 72, 128, 128, BF16, max_vec_width=8, fused_norm=fused_norm, limits=plans.H200_LIMITS)
    assert (big.tokens_per_block, big.block_size) == ((1, 192) if fused_norm else (1, 128))
    # SmolLM2-135M (9 + 3 heads of 64): 16 (apply_rope, 3 heads a thread of 4 lanes) or 32 (qk, 8
    # lanes) threads a token; 4 tokens a block, every lane of its warps busy
    small = plans.plan_rope(4096, 12, 64, 64, BF16, max_vec_width=8, fused_norm=fused_norm, limits=plans.H200_LIMITS)
    per_token = small.threads_per_head * small.head_slots
    assert per_token == (32 if fused_norm else 16)
    assert small.tokens_per_block * per_token == small.block_size == (128 if fused_norm else 64)
    for threads, want in ((1, 1), (63, 1), (64, 1), (128, 2), (255, 3), (256, 4), (2**20, 4)):
        monkeypatch.setattr(plans, name, threads)
        plan = _plan(16384, fused_norm=fused_norm)
        assert plan.tokens_per_block == want and plan.block_size == 64 * want
        if not fused_norm:  # a block per group of tokens
            assert plan.grid == (-(-16384 // want), 1, 1)
        else:  # 2 waves of the CPU estimate: ROPE_WIDE_BLOCKS_PER_SM 256-thread blocks, scaled to the block
            assert plan.grid == (2 * (2 * 256 // plan.block_size) * 132, 1, 1)
    # below 4 tokens an SM, never more tokens than ceil(num_tokens / SMs) (200 tokens: 2)
    monkeypatch.setattr(plans, name, 256)
    assert plans.plan_rope(200, 12, 64, 64, BF16, max_vec_width=8, fused_norm=fused_norm,
                           limits=plans.H200_LIMITS).tokens_per_block == 2
    # the steps kernel fills its blocks whatever the constant
    monkeypatch.setattr(plans, "ROPE_LAYOUT", "steps")
    monkeypatch.setattr(plans, name, 1)
    assert _plan(16384, fused_norm=fused_norm).tokens_per_block == 256 // (8 * 10)


@pytest.mark.parametrize("name, value", [("ROPE_LAYOUT", "fast"), ("ROPE_WIDE_HEADS_PER_THREAD", 6)])
def test_bad_layout_constants_are_refused(monkeypatch, name, value):
    monkeypatch.setattr(plans, name, value)
    with pytest.raises(ValueError, match=name):
        _plan(16384)


@pytest.mark.parametrize("fused_norm", [False, True])
@pytest.mark.parametrize("value", [(), (2, 2), (4, 2), (0,), (9,), (2.0, 4), "2", None, [2, 4], (True, 2)])
def test_bad_heads_choices_are_refused_by_name(monkeypatch, value, fused_norm):
    """ROPE_WIDE_HEADS_CHOICES / ROPE_WIDE_NORM_HEADS_CHOICES list the compiled kHeadsPerThread:
    (0,) divided by zero, (2.0, 4) planned float slots and (2, 2) listed every instantiation
    twice (helper-24)."""
    name = "ROPE_WIDE_NORM_HEADS_CHOICES" if fused_norm else "ROPE_WIDE_HEADS_CHOICES"
    monkeypatch.setattr(plans, name, value)
    for n in (1, 16384):
        with pytest.raises(ValueError, match=name):
            _plan(n, fused_norm=fused_norm)
    with pytest.raises(ValueError, match=name):
        rope_ops.instantiations()


def test_norm_heads_choices_stay_within_the_register_budget(monkeypatch):
    """qk_rms_norm_rope_wide_kernel's 16-bit 5 heads a thread take 119-128 of its 128
    registers (they spilled 88 bytes before item 32's 32-bit sizes): the choices are refused
    above 5, and a constant outside them names both."""
    monkeypatch.setattr(plans, "ROPE_WIDE_NORM_HEADS_CHOICES", (2, 6))
    with pytest.raises(ValueError, match=r"ROPE_WIDE_NORM_HEADS_CHOICES must be .* 1 \.\. 5"):
        _plan(16384, fused_norm=True)
    monkeypatch.setattr(plans, "ROPE_WIDE_NORM_HEADS_CHOICES", (2, 4))
    with pytest.raises(ValueError, match=r"ROPE_WIDE_NORM_HEADS_PER_THREAD must be one of "
                                         r"plans.ROPE_WIDE_NORM_HEADS_CHOICES \(2, 4\), got 3"):
        _plan(16384, fused_norm=True)


def test_steps_constant_is_read_at_every_shape(monkeypatch):
    """apply_rope reads ROPE_HEADS_PER_THREAD only where it falls back to the steps kernel
    (200 heads, scalar lanes); a bad value is refused for the shapes that take the wide one too."""
    monkeypatch.setattr(plans, "ROPE_HEADS_PER_THREAD", 0)
    for n, heads in ((1, 40), (16384, 40), (16384, 200)):
        with pytest.raises(ValueError, match="ROPE_HEADS_PER_THREAD"):
            plans.plan_rope(n, heads, 128, 128, BF16, max_vec_width=8, fused_norm=False, limits=plans.H200_LIMITS)


#: (constant, the ops that read it: False apply_rope, True qk_rms_norm_rope).
WIDE_CONSTANTS = [("ROPE_WIDE_HEADS_PER_THREAD", (False,)), ("ROPE_WIDE_NORM_HEADS_PER_THREAD", (True,)),
                  ("ROPE_WIDE_DECODE_HEADS_PER_THREAD", (False, True)), ("ROPE_WIDE_GRID_WAVES", (False,)),
                  ("ROPE_WIDE_NORM_GRID_WAVES", (True,)), ("ROPE_WIDE_BLOCKS_PER_SM", (False, True)),
                  ("ROPE_WIDE_NORM_FULL_BLOCK_HEADS", (True,)), ("ROPE_WIDE_BLOCK_THREADS", (False,)),
                  ("ROPE_WIDE_NORM_BLOCK_THREADS", (True,)),
                  # below it a batch is decode-sized; 0 once gave zero tokens the token kernel with a
                  # one-block grid (helper 59)
                  ("ROPE_MIN_TOKENS_PER_SM", (False, True)),
                  ("ROPE_TOKEN_MAX_TOKENS_PER_SM", (False, True)), ("ROPE_TOKEN_BAND_HEADS", (False,)),
                  ("ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM", (False,)),
                  ("ROPE_TOKEN_WINDOW_FROM_TOKENS_PER_SM", (False, True)),
                  ("ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM", (False, True)),
                  ("ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM", (False, True)),
                  ("ROPE_TOKEN_FAR_TO_TOKENS_PER_SM", (False, True))]


#: Bad values of every constant; 0 (a block per group of tokens) and more are legal waves, 2**40 blocks per SM
#: and full-block heads legal too (no cap, no limit), so those get -1 and -2**40 - 1 instead.
BAD_WIDE_VALUES = [-1, True, 2.0, 1.5, None, "2"]


@pytest.mark.parametrize("name, fused", [(n, f) for n, ops in WIDE_CONSTANTS for f in ops])
@pytest.mark.parametrize("value", BAD_WIDE_VALUES + [0, 2**40])
def test_bad_wide_constants_are_refused_by_name_at_every_batch_size(monkeypatch, name, fused, value):
    """-1 waves planned a grid of -264 blocks, ROPE_WIDE_BLOCKS_PER_SM 0 a grid of 0,
    heads per thread True or 2.0 a plan of bool or float heads (head_slots 20.0); a bad
    heads-per-thread constant passed at the batch sizes that do not read it."""
    legal = {"ROPE_WIDE_GRID_WAVES": (0, 2**40), "ROPE_WIDE_NORM_GRID_WAVES": (0, 2**40),
             "ROPE_WIDE_BLOCKS_PER_SM": (2**40,), "ROPE_WIDE_NORM_FULL_BLOCK_HEADS": (2**40,),
             "ROPE_WIDE_BLOCK_THREADS": (2**40,), "ROPE_WIDE_NORM_BLOCK_THREADS": (2**40,),
             "ROPE_MIN_TOKENS_PER_SM": (2**40,), "ROPE_TOKEN_MAX_TOKENS_PER_SM": (2**40,),
             "ROPE_TOKEN_BAND_HEADS": (0,), "ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM": (2**40,),
             "ROPE_TOKEN_WINDOW_FROM_TOKENS_PER_SM": (2**40,), "ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM": (2**40,),
             "ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM": (2**40,),
             "ROPE_TOKEN_FAR_TO_TOKENS_PER_SM": (0, 2**40)}.get(name, ())
    if type(value) is int and value in legal:
        value = -value - 1
    monkeypatch.setattr(plans, name, value)
    for num_tokens in (1, 64, 4096, 16384):
        with pytest.raises(ValueError, match=f"plans.{name} must be "):
            _plan(num_tokens, fused_norm=fused)


def test_steps_heads_per_thread_is_checked_by_name(monkeypatch):
    monkeypatch.setattr(plans, "ROPE_LAYOUT", "steps")
    monkeypatch.setattr(plans, "ROPE_HEADS_PER_THREAD", 0)  # was ZeroDivisionError
    for num_tokens in (1, 16384):
        with pytest.raises(ValueError, match="plans.ROPE_HEADS_PER_THREAD must be an int >= 1, got 0"):
            _plan(num_tokens)


def test_legal_wide_constants_still_plan(monkeypatch):
    # qk_rms_norm_rope's constant may be any of ROPE_WIDE_NORM_HEADS_CHOICES (40 heads: 5 fills
    # the block from any of them up)
    for fewest in plans.ROPE_WIDE_NORM_HEADS_CHOICES:
        monkeypatch.setattr(plans, "ROPE_WIDE_NORM_HEADS_PER_THREAD", fewest)
        assert _plan(16384, fused_norm=True).heads_per_thread == 5
    monkeypatch.setattr(plans, "ROPE_WIDE_GRID_WAVES", 2**40)  # more waves than blocks: a block per group
    assert _plan(16384).grid[0] == -(-16384 // _plan(16384).tokens_per_block)


def _qk_heads(num_heads, num_tokens=16384):
    return plans.plan_rope(num_tokens, num_heads, 128, 128, BF16, max_vec_width=8, fused_norm=True,
                           limits=plans.H200_LIMITS).heads_per_thread


def test_qk_takes_five_heads_only_where_they_fill_the_block(monkeypatch):
    """llama-3.1-8b's 40 heads at 5 a thread fill a 256-thread block (8 slots x 8 lanes x 4
    tokens; the blocks launched since item 34 hold 2) and were 1-10 % faster than 4;
    llama-3.1-70b's 72 at 5 fill 0.9 of one (2 tokens of 120 threads) and were 3-8 % slower
    than 3 (item 33). Where only 5 fit one round (150 heads), 5 rather than the steps kernel."""
    assert plans.ROPE_WIDE_NORM_FULL_BLOCK_HEADS == 5
    assert {n: _qk_heads(n) for n in (40, 72, 36, 48, 20)} == {40: 5, 72: 3, 36: 4, 48: 3, 20: 5}
    assert _qk_heads(150) == _qk_heads(150, num_tokens=1) == 5
    assert _qk_heads(40, num_tokens=1) == 2  # decode sizes: the fewest that fit
    monkeypatch.setattr(plans, "ROPE_WIDE_NORM_FULL_BLOCK_HEADS", 2**40)  # no choice limited: the fullest block
    assert _qk_heads(72) == 5
    monkeypatch.setattr(plans, "ROPE_WIDE_NORM_FULL_BLOCK_HEADS", 4)
    assert _qk_heads(72) == 3 and _qk_heads(36) == 3  # 36 at 4: 0.84 of a block, no longer taken


@pytest.mark.parametrize("full_block_heads", [5, 4, 2**40])
def test_qk_never_plans_fp32_above_its_most_heads(monkeypatch, full_block_heads):
    """fp32's 5-heads kernel with pass-through dims spills 20-80 bytes: whatever
    ROPE_WIDE_NORM_FULL_BLOCK_HEADS says (2**40 limits no choice in 16-bit), fp32 q/k plan
    at most ROPE_WIDE_NORM_FP32_MOST_HEADS heads a thread (helper 54's review)."""
    monkeypatch.setattr(plans, "ROPE_WIDE_NORM_FULL_BLOCK_HEADS", full_block_heads)
    assert plans.ROPE_WIDE_NORM_FP32_MOST_HEADS == 4
    for num_heads in (10, 20, 40, 72, 150):
        for head_dim, rotary_dim in ((64, 32), (128, 64), (128, 128)):
            for n in (1, 4096):
                plan = plans.plan_rope(n, num_heads, head_dim, rotary_dim, np.float32, max_vec_width=4,
                                       fused_norm=True, limits=plans.H200_LIMITS)
                assert plan.heads_per_thread <= 4


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("num_tokens, fused_norm", [(1, False), (16384, False), (16384, True)])
def test_wide_kernels_in_the_planned_shape_do_not_spill(dtype, num_tokens, fused_norm):
    plan = _plan(num_tokens, dtype=dtype, fused_norm=fused_norm)
    lead = (_dtypes.c_type(dtype), "float", "long long")
    if fused_norm:
        exprs = [rope_ops.QK_RMS_NORM_ROPE_WIDE.expr(*lead, neox, plan.vec_width, plan.threads_per_head,
                                                     plan.heads_per_thread, has_pass)
                 for neox in (True, False) for has_pass in (True, False)]
    else:
        exprs = [rope_ops.APPLY_ROPE_WIDE.expr(*lead, neox, plan.vec_width, layout, plan.heads_per_thread, in_place)
                 for neox, layout in ((True, 0), (False, 0), (True, 1), (True, 2)) for in_place in (True, False)]
    spills = jit.nvrtc_spills("rope.cu", exprs, "90")
    assert not any(spills.values()), {e: n for e, n in spills.items() if n}


def test_qk_token_kernel_where_every_thread_is_busy(monkeypatch):
    """bf16 qk_rms_norm_rope with ROPE_NORM_TOKEN_HEADS heads a thread takes the token
    kernel where its shape is full (every slot holds that many heads, every lane one unit,
    full rotary, whole warps of at least 64 threads a token): llama-3.1-8b (5 heads, 64
    threads; 2 heads, 160 threads, at decode sizes) and -70b (3, 192); a block per token, no
    waves. Not fp16 or fp32, not with pass-through dims, not where a slot would hold fewer
    heads, not SmolLM2-135M's 32-thread tokens, not with the constant empty (items 38, 39)."""
    assert plans.ROPE_NORM_TOKEN_HEADS == (2, 3, 5)

    def plan(num_tokens, heads=72, dtype=BF16, head_dim=128, rotary_dim=None):
        return plans.plan_rope(num_tokens, heads, head_dim, rotary_dim or head_dim, dtype,
                               max_vec_width=16 // np.dtype(dtype).itemsize, fused_norm=True, limits=plans.H200_LIMITS)

    for heads, counts, per_thread, block in ((72, (1, 64, 527, 528, 4096, 16384), 3, 192),
                                             (40, (528, 4096, 16384), 5, 64), (40, (1, 64, 527), 2, 160)):
        for n in counts:
            p = plan(n, heads)
            assert (p.token_kernel, p.heads_per_thread, p.tokens_per_block, p.grid_waves, p.grid, p.block_size) == \
                (True, per_thread, 1, 0, (n, 1, 1), block)
        assert not plan(0, heads).token_kernel  # no block to launch (helper 60)
        assert not plan(4096, heads, np.float16).token_kernel and not plan(4096, heads, np.float32).token_kernel
        assert not plan(4096, heads, rotary_dim=64).token_kernel  # pass-through dims, half the lanes a unit
    assert plan(4096, 20).heads_per_thread == 5 and not plan(4096, 20).token_kernel  # 4 slots: 32 threads
    assert plan(4096, 71).heads_per_thread == 3 and not plan(4096, 71).token_kernel  # a slot of 2 heads
    assert plan(4096, 42).head_slots == 14 and not plan(4096, 42).token_kernel  # 112 threads: not whole warps
    assert not plan(4096, 12, head_dim=64).token_kernel  # SmolLM2-135M
    # the scalar path (vector width 1: 32 lanes a head, one unit each at head_dim 64) keeps the wide kernel
    scalar = plans.plan_rope(4096, 40, 64, 64, BF16, max_vec_width=1, fused_norm=True, limits=plans.H200_LIMITS)
    assert scalar.vec_width == 1 and scalar.heads_per_thread and not scalar.token_kernel
    assert not plans.plan_rope(4096, 40, 128, 128, BF16, max_vec_width=8, fused_norm=False,
                               limits=plans.H200_LIMITS).token_kernel  # apply_rope's: in place only
    # the grid is a block per token: a device whose grid is shorter takes the wide kernel
    assert not plans.plan_rope(4096, 72, 128, 128, BF16, max_vec_width=8, fused_norm=True,
                               limits=replace(plans.H200_LIMITS, max_grid_x=4095)).token_kernel
    monkeypatch.setattr(plans, "ROPE_NORM_TOKEN_HEADS", (3,))
    assert plan(4096).token_kernel and not plan(4096, 40).token_kernel and not plan(1, 40).token_kernel
    monkeypatch.setattr(plans, "ROPE_NORM_TOKEN_HEADS", ())
    assert not plan(4096).token_kernel and plan(4096).grid_waves == plans.ROPE_WIDE_NORM_GRID_WAVES


def test_apply_rope_token_kernel_where_every_thread_is_busy(monkeypatch):
    """16-bit apply_rope in place with one position a token takes the token kernel at decode
    sizes where the wide layout's heads a thread (one of ROPE_TOKEN_HEADS) fill every slot
    and every lane holds one unit of 8 to 32 lanes, in whole warps of at least 64 threads:
    llama-3.1-8b (2 heads a thread, 160 threads), -70b (3, 192); a block per token. From 4
    to 12 tokens an SM (528-1583 on 132 SMs, item 44) in the prefill layout's heads where
    they fill every slot: 8b's 5 (64 threads), gemma-2-9b's 3 (16 lanes, 128 threads); where
    they do not (70b's 72 heads in 15 slots of 5), in ROPE_TOKEN_BAND_HEADS where those fill
    it (70b: 12 slots of 6, 96 threads; item 47), and those to 27 tokens an SM (3563 tokens,
    items 48 and 51); again from 17 to 23 tokens an SM (2244-3035, items 49-52), there in the
    decode layout's heads where they fill it too (8b's 2, gemma's 2 in 192 threads; item 52),
    and decode heads of 8 lanes to 31 (8b: 4091 tokens; items 52-53). Not from 12 to 17 or
    from 23 tokens an SM in the prefill heads, nor from 27 in the band's, nor from 31 in 8-lane
    decode heads; not out of place or M-RoPE, not fp32, not 4 lanes a head, not with the
    constants empty (item 39). Dims past rotary_dim do not stop it (in place they are not touched)."""
    assert plans.ROPE_TOKEN_HEADS == (2, 3, 5)
    assert (plans.ROPE_MIN_TOKENS_PER_SM, plans.ROPE_TOKEN_MAX_TOKENS_PER_SM, plans.ROPE_TOKEN_BAND_HEADS,
            plans.ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM, plans.ROPE_TOKEN_WINDOW_FROM_TOKENS_PER_SM,
            plans.ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM, plans.ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM) == \
        (4, 12, 6, 27, 17, 23, 31)
    assert plans.H200_LIMITS.sm_count == 132

    def plan(num_tokens, heads=40, dtype=BF16, head_dim=128, rotary_dim=None, **kw):
        kw = {"in_place": True, **kw}
        return plans.plan_rope(num_tokens, heads, head_dim, rotary_dim or head_dim, dtype,
                               max_vec_width=16 // np.dtype(dtype).itemsize, fused_norm=False,
                               limits=plans.H200_LIMITS, **kw)

    for heads, per_thread, block in ((40, 2, 160), (72, 3, 192)):
        for n in (1, 64, 527):
            for dtype in (BF16, np.float16):
                p = plan(n, heads, dtype)
                assert (p.token_kernel, p.heads_per_thread, p.tokens_per_block, p.grid_waves, p.grid, p.block_size) \
                    == (True, per_thread, 1, 0, (n, 1, 1), block)
        assert not plan(4092, heads).token_kernel and not plan(16384, heads).token_kernel  # prefill sizes
        assert not plan(0, heads).token_kernel  # no block to launch (helper 60)
    for n in (528, 1024, 1583):
        p = plan(n, 40)
        assert (p.token_kernel, p.heads_per_thread, p.tokens_per_block, p.grid, p.block_size) == \
            (True, 5, 1, (n, 1, 1), 64)
        p = plan(n, 72)  # 15 slots of 5 would hold 75 heads: 12 of 6
        assert (p.token_kernel, p.heads_per_thread, p.head_slots, p.tokens_per_block, p.grid, p.block_size) == \
            (True, 6, 12, 1, (n, 1, 1), 96)
        assert not plan(n, 72, np.float32).token_kernel and not plan(n, 72, in_place=False).token_kernel
        assert plan(n, 36).heads_per_thread == 5 and not plan(n, 36).token_kernel  # 6 slots of 6: 48 threads
        assert not plan(n, 40, in_place=False).token_kernel and not plan(n, 40, mrope=True).token_kernel
        p = plan(n, 24, head_dim=256)  # gemma-2-9b: 16 lanes a head, 3 heads a thread
        assert (p.token_kernel, p.heads_per_thread, p.threads_per_head, p.block_size) == (True, 3, 16, 128)
    for n in (1584, 2111, 2112, 3300, 3563):  # to the band heads' end (items 48, 51): 70b's 6; 8b's band over
        p = plan(n, 72)
        assert (p.token_kernel, p.heads_per_thread, p.head_slots, p.grid, p.block_size) == (True, 6, 12, (n, 1, 1), 96)
        assert not plan(n, 72, in_place=False).token_kernel and not plan(n, 72, mrope=True).token_kernel
        assert not plan(n, 72, np.float32).token_kernel
        assert plan(n, 40).token_kernel == (n >= 2244)  # 8b's band over, its window from 17 tokens an SM
        assert plan(n, 24, head_dim=256).token_kernel == (2244 <= n < 3036)
    for n in (2244, 2600, 2903, 2904, 3035):  # the window (items 49-52) in the decode heads: 8b's 2, gemma's 2
        p = plan(n, 40)
        assert (p.token_kernel, p.heads_per_thread, p.head_slots, p.tokens_per_block, p.grid, p.block_size) == \
            (True, 2, 20, 1, (n, 1, 1), 160)
        p = plan(n, 24, head_dim=256)
        assert (p.token_kernel, p.heads_per_thread, p.threads_per_head, p.grid, p.block_size) == \
            (True, 2, 16, (n, 1, 1), 192)
        assert plan(n, 40, np.float16).block_size == 160
        assert not plan(n, 40, in_place=False).token_kernel and not plan(n, 40, mrope=True).token_kernel
        assert not plan(n, 40, np.float32).token_kernel
        assert (plan(n, 72).token_kernel, plan(n, 72).heads_per_thread) == (True, 6)
    for n in (3036, 3299, 3564, 3900, 4091):  # 8-lane decode heads to their own end (items 52-53): 8b's 2
        p = plan(n, 40)
        assert (p.token_kernel, p.heads_per_thread, p.head_slots, p.tokens_per_block, p.grid, p.block_size) == \
            (True, 2, 20, 1, (n, 1, 1), 160)
        assert plan(n, 40, np.float16).token_kernel and plan(n, 40, head_dim=256, rotary_dim=128).token_kernel
        assert not plan(n, 40, in_place=False).token_kernel and not plan(n, 40, mrope=True).token_kernel
        assert not plan(n, 40, np.float32).token_kernel
        assert not plan(n, 24, head_dim=256).token_kernel  # gemma's 16 lanes: the window's own end
        assert not plan(n, 80).token_kernel  # 8 lanes, but decode heads that leave slots over: the prefill heads'
    for n in (2112, 2243):  # between the prefill heads' band and the window
        assert not plan(n, 40).token_kernel and not plan(n, 24, head_dim=256).token_kernel
    for n in (4092, 4096):  # past 8b's end
        assert not plan(n, 40).token_kernel and not plan(n, 24, head_dim=256).token_kernel
    for n in (3564, 4096):  # past the band heads' end
        assert not plan(n, 72).token_kernel and plan(n, 72).heads_per_thread == 5
    assert plan(4096, 40).heads_per_thread == 5 and plan(4096, 40).block_size == 64  # full, yet the wide kernel
    for n in (1, 527):
        assert not plan(n, in_place=False).token_kernel and not plan(n, mrope=True).token_kernel
        assert not plan(n, dtype=np.float32).token_kernel
        assert not plan(n, rotary_dim=64).token_kernel  # 4 lanes a head: no such token kernel
        assert plan(n, head_dim=256, rotary_dim=128).token_kernel  # 8 lanes, pass-through dims untouched
        assert plan(n, 20, head_dim=256).token_kernel and plan(n, 20, head_dim=256).threads_per_head == 16
        assert not plan(n, 12, head_dim=64).token_kernel  # SmolLM2-135M: 4 lanes a head
    assert not plans.plan_rope(64, 40, 128, 128, BF16, max_vec_width=4, fused_norm=False, in_place=True,
                               limits=plans.H200_LIMITS).token_kernel  # 8-byte vectors
    assert not plans.plan_rope(64, 40, 128, 128, BF16, max_vec_width=8, fused_norm=False, in_place=True,
                               limits=replace(plans.H200_LIMITS, max_grid_x=63)).token_kernel
    monkeypatch.setattr(plans, "ROPE_TOKEN_HEADS", (3,))
    assert plan(64, 72).token_kernel and not plan(64).token_kernel
    monkeypatch.setattr(plans, "ROPE_TOKEN_HEADS", ())
    assert not plan(64, 72).token_kernel and not plan(1).token_kernel
    assert plan(1024, 72).heads_per_thread == 6  # the band's heads are the band's own constant
    monkeypatch.setattr(plans, "ROPE_TOKEN_BAND_HEADS", 0)
    assert plan(1024, 72).heads_per_thread == 5 and not plan(1024, 72).token_kernel
    monkeypatch.setattr(plans, "ROPE_TOKEN_BAND_HEADS", 4)  # 18 slots of 8 lanes: 144 threads, not whole warps
    assert not plan(1024, 72).token_kernel
    monkeypatch.setattr(plans, "ROPE_TOKEN_BAND_HEADS", 9)  # 8 slots: 64 threads
    assert (plan(1024, 72).heads_per_thread, plan(1024, 72).block_size) == (9, 64)
    monkeypatch.setattr(plans, "ROPE_TOKEN_HEADS", (2, 3, 5))
    monkeypatch.setattr(plans, "ROPE_TOKEN_BAND_HEADS", 6)
    monkeypatch.setattr(plans, "ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM", 8)  # the band's end is its own: 1056 here
    assert plan(1055, 72).heads_per_thread == 6 and not plan(1056, 72).token_kernel and plan(1056, 40).token_kernel
    monkeypatch.setattr(plans, "ROPE_TOKEN_HEADS", (5, 3))  # no token kernel of the decode heads: the prefill heads
    assert (plan(2600, 40).heads_per_thread, plan(2600, 40).block_size) == (5, 64) and plan(1024, 40).token_kernel
    assert (plan(2600, 24, head_dim=256).heads_per_thread, plan(2600, 24, head_dim=256).block_size) == (3, 128)
    assert not plan(64, 40).token_kernel  # at decode sizes the decode heads (2) alone
    monkeypatch.setattr(plans, "ROPE_TOKEN_HEADS", (2, 3, 5))
    monkeypatch.setattr(plans, "ROPE_TOKEN_WINDOW_FROM_TOKENS_PER_SM", 8)  # a window over the first band's end:
    assert plan(1024, 40).heads_per_thread == 5 and plan(1583, 40).heads_per_thread == 5  # the first band's heads
    assert (plan(1584, 40).token_kernel, plan(1584, 40).heads_per_thread) == (True, 2)
    monkeypatch.setattr(plans, "ROPE_TOKEN_WINDOW_FROM_TOKENS_PER_SM", 17)
    monkeypatch.setattr(plans, "ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM", 17)  # an empty window but for 8 lanes
    assert not plan(2600, 24, head_dim=256).token_kernel and not plan(2244, 24, head_dim=256).token_kernel
    assert plan(2244, 40).token_kernel
    monkeypatch.setattr(plans, "ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM", 1)  # an end before the start: empty too
    assert not plan(2600, 24, head_dim=256).token_kernel and plan(1583, 40).token_kernel
    assert plan(2600, 40).token_kernel and plan(4091, 40).token_kernel  # 8 lanes: their own end
    monkeypatch.setattr(plans, "ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM", 1)
    assert not plan(2600, 40).token_kernel and not plan(3036, 40).token_kernel
    monkeypatch.setattr(plans, "ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM", 23)
    monkeypatch.setattr(plans, "ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM", 20)  # an 8-lane end before the window's
    assert not plan(2640, 40).token_kernel and plan(2639, 40).heads_per_thread == 2
    assert plan(2640, 24, head_dim=256).token_kernel and plan(3035, 24, head_dim=256).token_kernel


def test_apply_rope_token_kernel_at_6_lanes_only_at_its_table_s_heads(monkeypatch):
    """Rotary dims of 96 in 16-bit vectors are 6 lanes a head: apply_rope's token kernel
    takes them at ROPE_TOKEN_6_LANES_HEADS heads a thread alone (item 60): phi-3-mini's 64
    heads of 96 at decode sizes in 32 slots of 2 heads (192 threads), and past them in the
    same decode heads to the window's end (3035 tokens on 132 SMs; its 5 prefill heads and
    the band's 6 do not divide 64), the wide kernel from 3036. 96 heads of 96
    (3 heads a thread at decode sizes: they spill on sm_80) keep the wide kernel, as do fp32,
    out of place, qk_rms_norm_rope (8-lane row groups) and the table emptied; the compiled
    set holds the 6-lane kernel at the table's heads alone."""
    assert plans.ROPE_TOKEN_6_LANES_HEADS == (2,) and plans.H200_LIMITS.sm_count == 132

    def plan(num_tokens, heads=64, dtype=BF16, **kw):
        kw = {"in_place": True, "fused_norm": False, **kw}
        return plans.plan_rope(num_tokens, heads, 96, 96, dtype, max_vec_width=16 // np.dtype(dtype).itemsize,
                               limits=plans.H200_LIMITS, **kw)

    for n in (1, 16, 64, 527):
        for dtype in (BF16, np.float16):
            p = plan(n, dtype=dtype)
            assert (p.token_kernel, p.threads_per_head, p.heads_per_thread, p.head_slots, p.grid, p.block_size) == \
                (True, 6, 2, 32, (n, 1, 1), 192)
    for n in (528, 1024, 3035):  # past the decode sizes its decode heads fill the token kernel (items 54-56), at 6 lanes too
        p = plan(n)
        assert (p.token_kernel, p.threads_per_head, p.heads_per_thread, p.block_size) == (True, 6, 2, 192)
    for n in (3036, 4096):  # past the window's end (23 tokens an SM) the wide kernel at its 5 prefill heads
        assert not plan(n).token_kernel and plan(n).heads_per_thread == 5
    assert plan(1, 96).heads_per_thread == 3 and not plan(1, 96).token_kernel
    p = plan(1, 32)  # a q-only call of phi-3-mini: 16 slots, 96 threads (helper 109)
    assert (p.token_kernel, p.threads_per_head, p.heads_per_thread, p.head_slots, p.block_size) == (True, 6, 2, 16, 96)
    p = plans.plan_rope(1, 64, 192, 96, BF16, max_vec_width=8, fused_norm=False, in_place=True,
                        limits=plans.H200_LIMITS)  # rotary_dim 96 under a larger head_dim: in place, untouched past it
    assert (p.token_kernel, p.threads_per_head, p.heads_per_thread, p.block_size) == (True, 6, 2, 192)
    assert not plan(1, dtype=np.float32).token_kernel and not plan(1, in_place=False).token_kernel
    assert not plan(1, fused_norm=True).token_kernel
    six = [e for e in rope_ops.instantiations()[rope_ops.APPLY_ROPE_TOKEN] if e.endswith(", 6, 2>")]
    assert len(six) == 16  # bf16 and fp16, cache float or q's dtype, int and long long positions, both pairings
    assert not [e for e in rope_ops.instantiations()[rope_ops.APPLY_ROPE_TOKEN] if ", 6, " in e and e not in six]
    monkeypatch.setattr(plans, "ROPE_TOKEN_6_LANES_HEADS", ())
    assert not plan(1).token_kernel and plan(1).heads_per_thread == 2
    assert not [e for e in rope_ops.instantiations()[rope_ops.APPLY_ROPE_TOKEN] if ", 6, " in e]
    monkeypatch.setattr(plans, "ROPE_TOKEN_6_LANES_HEADS", (np.int64(2), 4))
    assert plans.rope_token_6_lanes_heads() == (2, 4) and all(type(h) is int for h in plans.rope_token_6_lanes_heads())
    assert plan(1).token_kernel


@pytest.mark.parametrize("value", [(3,), (2, 2), (2, np.int64(2)), [2], (2.0,), ("2",), (True,), (7,), 2, None])
def test_bad_6_lanes_heads_are_refused_by_name_at_every_shape(monkeypatch, value):
    """A bad ROPE_TOKEN_6_LANES_HEADS (3 heads spill on sm_80) is a PlanError naming it,
    from plan_rope at every shape (not only 6-lane ones) and from the compiled set."""
    monkeypatch.setattr(plans, "ROPE_TOKEN_6_LANES_HEADS", value)
    for n, heads, head_dim, fused_norm in ((1, 64, 96, False), (1, 40, 128, False), (4096, 40, 128, True)):
        with pytest.raises(plans.PlanError, match=r"plans\.ROPE_TOKEN_6_LANES_HEADS must be a tuple of distinct ints"):
            plans.plan_rope(n, heads, head_dim, head_dim, BF16, max_vec_width=8, fused_norm=fused_norm, in_place=True,
                            limits=plans.H200_LIMITS)
    with pytest.raises(plans.PlanError, match=r"plans\.ROPE_TOKEN_6_LANES_HEADS must be a tuple of distinct ints"):
        rope_ops.instantiations()


def test_apply_rope_token_kernel_in_the_decode_heads_where_neither_prefill_nor_band_heads_fill(monkeypatch):
    """Past the decode sizes, where neither the prefill layout's heads nor the band's fill the
    token kernel and the decode layout's do, apply_rope takes the token kernel in the decode
    heads to the window's end (31 tokens an SM at 8 lanes, 23 else; items 54-56): 16, 32
    (qwen2.5-7b), 56 and 64 heads of 128 (4 heads a thread in the wide kernel, 2 in 8-lane
    slots) from 528 to 4091 tokens on 132 SMs, bf16 and fp16; 16 heads of 256 (16 lanes) to
    3035. Not out of place, M-RoPE or fp32, not past the ends; band heads that fill come
    first (70b keeps its 6, and the wide kernel past their end); 8b and gemma as before."""
    assert (plans.ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM, plans.ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM) == (23, 31)

    def plan(num_tokens, heads, head_dim=128, dtype=BF16, **kw):
        kw = {"in_place": True, **kw}
        return plans.plan_rope(num_tokens, heads, head_dim, head_dim, dtype, max_vec_width=16 // np.dtype(dtype).itemsize,
                               fused_norm=False, limits=plans.H200_LIMITS, **kw)

    for heads, slots in ((16, 8), (32, 16), (56, 28), (64, 32)):
        assert plan(4096, heads).heads_per_thread == 4 and not plan(4096, heads).token_kernel
        for n in (528, 1024, 1584, 2300, 3036, 4091):
            for dtype in (BF16, np.float16):
                p = plan(n, heads, dtype=dtype)
                assert (p.token_kernel, p.heads_per_thread, p.head_slots, p.grid, p.block_size) == \
                    (True, 2, slots, (n, 1, 1), slots * 8), (heads, n)
            assert not plan(n, heads, in_place=False).token_kernel and not plan(n, heads, mrope=True).token_kernel
            assert not plan(n, heads, dtype=np.float32).token_kernel
        assert not plan(4092, heads).token_kernel and plan(4092, heads).heads_per_thread == 4
    p = plan(3035, 16, 256)
    assert (p.token_kernel, p.heads_per_thread, p.threads_per_head, p.block_size) == (True, 2, 16, 128)
    assert not plan(3036, 16, 256).token_kernel
    for n in (3564, 4091):  # 70b: its band heads fill, so past their end the wide kernel, not the decode heads
        assert plan(n, 72).heads_per_thread == 5 and not plan(n, 72).token_kernel
    assert plan(1024, 72).heads_per_thread == 6 and plan(1024, 40).heads_per_thread == 5
    # the ends under patched constants
    monkeypatch.setattr(plans, "ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM", 20)
    assert plan(2639, 32).token_kernel and not plan(2640, 32).token_kernel
    monkeypatch.setattr(plans, "ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM", 10)
    assert plan(1319, 16, 256).token_kernel and not plan(1320, 16, 256).token_kernel
    # without the decode heads among ROPE_TOKEN_HEADS, the wide kernel
    monkeypatch.setattr(plans, "ROPE_TOKEN_HEADS", (3, 5))
    assert not plan(1024, 32).token_kernel and plan(1024, 32).heads_per_thread == 4


def _under_layout_steps(monkeypatch, call):
    with monkeypatch.context() as m:
        m.setattr(plans, "ROPE_LAYOUT", "steps")
        return call()


def test_apply_rope_token_kernel_past_every_end_to_the_far_end(monkeypatch):
    """Past every end of the token kernel's rules (the window's, its 8-lane end's, the
    band's) and below ROPE_TOKEN_FAR_TO_TOKENS_PER_SM tokens an SM, apply_rope takes the
    token kernel again (items 64-65): in the prefill heads where they fill it (8b's 5 in 64
    threads, gemma-2-9b's 3 in 128), else in the decode heads (70b's 3 in 192, qwen2.5-7b's 2
    in 128, phi-3-mini's 2 of 6 lanes in 192). Not from 12 to 17 tokens an SM (8b stays the
    wide kernel's there, item 50), not at or past the far end, not out of place, M-RoPE,
    fp32 or qk_rms_norm_rope; 0 turns the rule off."""
    def plan(num_tokens, heads, head_dim=128, rotary_dim=None, dtype=BF16, fused_norm=False,
             limits=plans.H200_LIMITS, **kw):
        kw = {"in_place": True, **kw}
        return plans.plan_rope(num_tokens, heads, head_dim, rotary_dim or head_dim, dtype,
                               max_vec_width=16 // np.dtype(dtype).itemsize, fused_norm=fused_norm, limits=limits,
                               **kw)

    def shape(p):
        return p.token_kernel, p.heads_per_thread, p.block_size

    monkeypatch.setattr(plans, "ROPE_TOKEN_FAR_TO_TOKENS_PER_SM", 0)  # off: the wide kernel past every end
    off = {(n, heads, head_dim): plan(n, heads, head_dim) for n in (3036, 3564, 4092, 8184)
           for heads, head_dim in ((40, 128), (72, 128), (32, 128), (24, 256), (64, 96))}
    assert not any(p.token_kernel for (n, heads, _), p in off.items()
                   if n >= 4092 or heads in (24, 64) or (heads, n) == (72, 3564))
    # qk_rms_norm_rope at 5000 tokens: 40 heads its token kernel, 32 bf16 and 40 fp16 its wide kernel
    fused_off = [plan(5000, h, dtype=d, fused_norm=True) for h, d in ((40, BF16), (32, BF16), (40, np.float16))]
    assert [p.token_kernel for p in fused_off] == [True, False, False]
    steps_off = _under_layout_steps(monkeypatch, lambda: plan(5000, 40))
    capped_off = plan(5000, 40, limits=replace(plans.H200_LIMITS, max_grid_x=4500))
    monkeypatch.setattr(plans, "ROPE_TOKEN_FAR_TO_TOKENS_PER_SM", 62)  # 8184 tokens on 132 SMs
    for dtype in (BF16, np.float16):
        for n in (4092, 5000, 8183):  # past 8b's and qwen's 8-lane ends (31 tokens an SM)
            assert shape(plan(n, 40, dtype=dtype)) == (True, 5, 64)
            assert shape(plan(n, 32, dtype=dtype)) == (True, 2, 128)
        for n in (3564, 4096, 8183):  # past 70b's band end (27)
            assert shape(plan(n, 72, dtype=dtype)) == (True, 3, 192)
        for n in (3036, 5000, 8183):  # past the window's end (23): gemma's 16-lane heads, phi's 6-lane ones
            assert shape(plan(n, 24, 256, dtype=dtype)) == (True, 3, 128)
            assert shape(plan(n, 64, 96, dtype=dtype)) == (True, 2, 192)
    for heads, head_dim in ((40, 128), (72, 128), (32, 128), (24, 256), (64, 96)):
        assert not plan(8184, heads, head_dim).token_kernel  # the far end
        assert plan(8184, heads, head_dim) == off[(8184, heads, head_dim)]
        for kw in ({"in_place": False}, {"mrope": True}, {"dtype": np.float32}):
            assert not plan(5000, heads, head_dim, **kw).token_kernel
    assert [plan(5000, h, dtype=d, fused_norm=True) for h, d in ((40, BF16), (32, BF16), (40, np.float16))] == \
        fused_off  # qk_rms_norm_rope keeps its own rule
    assert _under_layout_steps(monkeypatch, lambda: plan(5000, 40)) == steps_off  # no wide layout: no heads to take
    p = plan(5000, 40, limits=replace(plans.H200_LIMITS, max_grid_x=4500))  # a block per token would not fit
    assert p == capped_off and not p.token_kernel
    for n in (1584, 2243):  # 12-17 tokens an SM: 8b's wide kernel (item 50), as before
        assert not plan(n, 40).token_kernel
    for n in (2244, 3035, 3563, 4091):  # the earlier rules keep their heads
        assert plan(n, 40).heads_per_thread == 2 and plan(n, 72).heads_per_thread == (6 if n < 3564 else 3)
    monkeypatch.setattr(plans, "ROPE_TOKEN_HEADS", (3, 5))  # the decode heads (2) not compiled: the wide kernel
    assert not plan(5000, 32).token_kernel and not plan(5000, 64, 96).token_kernel
    assert shape(plan(5000, 40)) == (True, 5, 64)


def test_resident_grid_refuses_token_plans_it_cannot_cover():
    """helper 71: the public rope_resident_grid gave a token-kernel plan (no token loop, no
    guard) grids of 100 blocks for 1024 tokens, 132 for 100000 with waves, 1 for none."""
    p = plans.plan_rope(1024, 40, 128, 128, BF16, max_vec_width=8, fused_norm=False, in_place=True,
                        limits=plans.H200_LIMITS)
    assert p.token_kernel and plans.rope_resident_grid(p, 1024, 2, plans.H200_LIMITS).grid == (1024, 1, 1)
    for plan, n, limits in ((p, 1024, replace(plans.H200_LIMITS, max_grid_x=100)),
                            (replace(p, grid_waves=1), 100000, plans.H200_LIMITS),
                            (replace(p, tokens_per_block=2), 1024, plans.H200_LIMITS), (p, 0, plans.H200_LIMITS)):
        with pytest.raises(plans.PlanError, match="a token-kernel plan launches one block per token"):
            plans.rope_resident_grid(plan, n, 2, limits)


@pytest.mark.parametrize("name, fused_norm, choices", [
    ("ROPE_NORM_TOKEN_HEADS", True, "ROPE_WIDE_NORM_HEADS_CHOICES"),
    ("ROPE_TOKEN_HEADS", False, "ROPE_WIDE_HEADS_CHOICES")])
@pytest.mark.parametrize("value", [(6,), [3], (True,), ("3",), 3, None])
def test_bad_token_heads_are_refused_by_name_at_every_shape(monkeypatch, name, fused_norm, choices, value):
    monkeypatch.setattr(plans, name, value)
    for n in (1, 4096):
        with pytest.raises(ValueError, match=rf"plans\.{name} must be a tuple of plans\.{choices}"):
            plans.plan_rope(n, 40, 128, 128, BF16, max_vec_width=8, fused_norm=fused_norm, in_place=True,
                            limits=plans.H200_LIMITS)


_TOKEN_DTYPES_MESSAGE = ("must map True to a tuple of cupykern.bfloat16 at most and False to a tuple of "
                         "cupykern.bfloat16 / numpy.float16")


@pytest.mark.parametrize("name, value, message", [
    ("ROPE_TOKEN_DTYPES", None, _TOKEN_DTYPES_MESSAGE),
    ("ROPE_TOKEN_DTYPES", {True: (np.float32,), False: ()}, _TOKEN_DTYPES_MESSAGE),
    ("ROPE_TOKEN_DTYPES", {True: ("garbage",), False: ()}, _TOKEN_DTYPES_MESSAGE),
    ("ROPE_TOKEN_DTYPES", {True: BF16, False: (BF16,)}, _TOKEN_DTYPES_MESSAGE),
    ("ROPE_TOKEN_DTYPES", {True: (BF16,)}, _TOKEN_DTYPES_MESSAGE),
    # helper 98: fp16 under True compiled and planned qk_rms_norm_rope's fp16 token kernel, which spills
    ("ROPE_TOKEN_DTYPES", {True: (BF16, np.float16), False: (BF16, np.float16)}, _TOKEN_DTYPES_MESSAGE),
    ("ROPE_TOKEN_DTYPES", {1: (BF16,), 0: (BF16,)}, _TOKEN_DTYPES_MESSAGE),
    ("ROPE_NORM_THREADS_PER_HEAD", (8, 16), r"must be \(8, 16, 32\)"),
    ("ROPE_NORM_THREADS_PER_HEAD", (8.0, 16, 32), r"must be \(8, 16, 32\)"),
    ("ROPE_NORM_THREADS_PER_HEAD", [8, 16, 32], r"must be \(8, 16, 32\)"),
    ("ROPE_NORM_THREADS_PER_HEAD", None, r"must be \(8, 16, 32\)")])
def test_bad_compiled_tables_are_refused_by_name(monkeypatch, name, value, message):
    """helper 96: the two tables of what the token kernels are compiled for, set to a bad
    value, raised a raw TypeError / IndexError (not naming them) from plan_rope wherever it
    reached a token kernel's shape test, and from the compiled set; now PlanError by name,
    from both, at every shape (helper 98: 49 heads of 256 never reached the shape test)."""
    monkeypatch.setattr(plans, name, value)
    shapes = [(n, 40, 128, fused_norm) for n, fused_norm in ((1, False), (1, True), (1024, False))]
    for n, num_heads, head_dim, fused_norm in shapes + [(1, 49, 256, False), (1, 49, 256, True)]:
        with pytest.raises(plans.PlanError, match=rf"plans\.{name} {message}"):
            plans.plan_rope(n, num_heads, head_dim, head_dim, BF16, max_vec_width=8, fused_norm=fused_norm,
                            in_place=True, limits=plans.H200_LIMITS)
    with pytest.raises(plans.PlanError, match=rf"plans\.{name} {message}"):
        rope_ops.instantiations()


def test_compiled_tables_read_as_committed(monkeypatch):
    assert plans.rope_token_dtypes(True) == (np.dtype(BF16),)
    assert plans.rope_token_dtypes(False) == (np.dtype(BF16), np.dtype(np.float16))
    assert plans.rope_norm_row_groups() == (8, 16, 32) == plans.ROPE_NORM_THREADS_PER_HEAD
    with pytest.raises(TypeError, match="fused_norm must be a bool"):
        plans.rope_token_dtypes("no")
    # numpy ints read as ints (helper 98: returned as given, they reached the kernel names)
    monkeypatch.setattr(plans, "ROPE_NORM_THREADS_PER_HEAD", tuple(np.int64(g) for g in (8, 16, 32)))
    assert all(type(g) is int for g in plans.rope_norm_row_groups())
    # an entry may leave dtypes out: fewer token kernels, the wide kernel in their place
    decode_8b = dict(max_vec_width=8, fused_norm=False, in_place=True, limits=plans.H200_LIMITS)
    assert plans.plan_rope(1, 40, 128, 128, BF16, **decode_8b).token_kernel
    monkeypatch.setattr(plans, "ROPE_TOKEN_DTYPES", {True: (), False: ()})
    assert not plans.plan_rope(1, 40, 128, 128, BF16, **decode_8b).token_kernel
    assert not rope_ops.instantiations()[rope_ops.APPLY_ROPE_TOKEN]


@pytest.mark.parametrize("num_heads, head_dim", [(40, 128), (72, 128), (20, 256), (10, 512)],
                         ids=["8b", "70b", "16-lanes", "32-lanes"])
def test_token_kernel_in_the_planned_shape_does_not_spill(num_heads, head_dim):
    """Every lane count the token kernel is planned with (8, 16, 32 lanes a head: head_dim
    128, 256, 512) at decode and prefill sizes (each heads a thread under its own register
    cap, rope.cu::qk_token_max_registers), on both architectures the tests compile for
    (helper 59: the spill ledger's heuristic picks have no head_dim 512)."""
    exprs = []
    for n in (1, 4096):
        plan = plans.plan_rope(n, num_heads, head_dim, head_dim, BF16, max_vec_width=8, fused_norm=True,
                               limits=plans.H200_LIMITS)
        assert plan.token_kernel and plan.threads_per_head == head_dim // 16
        exprs += [rope_ops.QK_RMS_NORM_ROPE_TOKEN.expr("__nv_bfloat16", cache, pos, neox, plan.vec_width,
                                                       plan.threads_per_head, plan.heads_per_thread)
                  for cache in ("float", "__nv_bfloat16") for pos in ("int", "long long") for neox in (True, False)]
    for arch in ("80", "90"):
        spills = jit.nvrtc_spills("rope.cu", exprs, arch)
        assert not any(spills.values()), {e: n for e, n in spills.items() if n}


@pytest.mark.parametrize("num_heads, head_dim", [(40, 128), (72, 128), (20, 256), (10, 512), (64, 96)],
                         ids=["8b", "70b", "16-lanes", "32-lanes", "phi-3-mini"])
def test_apply_rope_token_kernel_in_the_planned_shapes_does_not_spill(num_heads, head_dim):
    """apply_rope's token kernel at every lane count it is planned with and its heads a
    thread at decode sizes and at 1024 tokens (the prefill layout's heads, item 44), bf16 and
    fp16, sm_80 and sm_90."""
    exprs = []
    for n in (1, 1024):
        for dtype, c_type in ((BF16, "__nv_bfloat16"), (np.float16, "__half")):
            plan = plans.plan_rope(n, num_heads, head_dim, head_dim, dtype, max_vec_width=8, fused_norm=False,
                                   in_place=True, limits=plans.H200_LIMITS)
            if plan.heads_per_thread in plans.ROPE_TOKEN_HEADS and plans._rope_token_full(
                    dtype, 8, head_dim, head_dim, head_dim // 16, plan.threads_per_head, plan.head_slots,
                    plan.heads_per_thread, num_heads, False):
                exprs += [rope_ops.APPLY_ROPE_TOKEN.expr(c_type, cache, pos, neox, 8, plan.threads_per_head,
                                                         plan.heads_per_thread)
                          for cache in ("float", c_type) for pos in ("int", "long long") for neox in (True, False)]
    assert len(exprs) >= 16  # at least one size of each shape is full
    for arch in ("80", "90"):
        spills = jit.nvrtc_spills("rope.cu", exprs, arch)
        assert not any(spills.values()), {e: n for e, n in spills.items() if n}


def _loads_and_position_wait(sass_lines: list[str]) -> tuple[list[int], int]:
    """In a token kernel's SASS (bench/sass.py's lines): the indices of its q/k loads (LDG
    without .CONSTANT: q and k are not __restrict__) and of the first instruction after
    the position's load (its first .CONSTANT LDG; the cos/sin loads come after it) that
    names the position's register(s): there the warp waits for it."""
    loads = [(i, line) for i, line in enumerate(sass_lines) if re.search(r"(^|\s)LDG\.", line)]
    i_pos, pos_load = next((i, line) for i, line in loads if ".CONSTANT" in line)
    first = int(re.search(r"LDG\S*\s+R(\d+)", pos_load).group(1))
    registers = (first, first + 1) if re.search(r"LDG\S*\.64", pos_load) else (first,)  # int64 or int32
    named = re.compile("|".join(rf"\bR{r}\b" for r in registers))
    wait = next(i for i in range(i_pos + 1, len(sass_lines)) if named.search(sass_lines[i]))
    return [i for i, line in loads if ".CONSTANT" not in line], wait


@pytest.mark.parametrize("arch", ["80", "90"])
def test_apply_rope_token_kernel_issues_its_q_k_loads_before_waiting_on_the_position(arch):
    """apply_rope's token kernel requests a token's position, then its q/k, and waits on the
    position only after every q/k load is issued (item 59: with a plain return for an
    out-of-range position, ptxas sank the loads below the range check, a memory round trip
    later; 0.9-6.8 % of its time on the H200). Every instantiation the presets plan, from
    its SASS. (qk_rms_norm_rope's token kernel keeps the plain return: slower otherwise.)"""
    from bench import sass
    from cupykern import covering

    exprs = sorted(e for e in covering.planned()["rope.cu"] if e.startswith("apply_rope_token_kernel<"))
    assert len(exprs) >= 16
    cubin, lowered, _ = jit.nvrtc_cubin("rope.cu", exprs, arch)
    code = sass.disassemble(cubin)
    for expr in exprs:
        qk_loads, wait = _loads_and_position_wait(code[lowered[expr]])
        heads = int(expr.rstrip(">").split(",")[-1])
        assert len(qk_loads) == 2 * heads, (expr, qk_loads)  # a head's two 16-byte vectors
        assert max(qk_loads) < wait, (expr, qk_loads, wait)


def test_every_planned_wide_instantiation_is_enumerated(monkeypatch):
    exprs = set(rope_ops.instantiations()[rope_ops.APPLY_ROPE_WIDE])
    for heads in plans.ROPE_WIDE_HEADS_CHOICES:
        for in_place in (True, False):
            assert rope_ops.APPLY_ROPE_WIDE.expr("__nv_bfloat16", "float", "int", False, 1, 0, heads, in_place) in exprs
    assert len(rope_ops.instantiations()[rope_ops.QK_RMS_NORM_ROPE_WIDE]) == \
        len(rope_ops.instantiations()[rope_ops.QK_RMS_NORM_ROPE]) * len(plans.ROPE_WIDE_NORM_HEADS_CHOICES) * 2
    # the token kernel: the wide one's bf16 instantiations of 16-byte vectors without
    # pass-through dims, under its own name and without that flag
    wide = [e for e in rope_ops.instantiations()[rope_ops.QK_RMS_NORM_ROPE_WIDE]
            if e.startswith("qk_rms_norm_rope_wide_kernel<__nv_bfloat16,") and e.endswith(", false>")
            and ", 8, " in e]
    assert wide and sorted(rope_ops.instantiations()[rope_ops.QK_RMS_NORM_ROPE_TOKEN]) == \
        sorted(e.replace("qk_rms_norm_rope_wide_kernel", "qk_rms_norm_rope_token_kernel")[:-len(", false>")] + ">"
               for e in wide)
    # apply_rope's: the wide one's in-place 16-bit instantiations of 16-byte vectors without
    # M-RoPE, x the row groups, under its own name, the same at ROPE_TOKEN_BAND_HEADS, and
    # 6 lanes at ROPE_TOKEN_6_LANES_HEADS (2) alone
    wide = [e for e in rope_ops.instantiations()[rope_ops.APPLY_ROPE_WIDE]
            if e.startswith(("apply_rope_wide_kernel<__nv_bfloat16,", "apply_rope_wide_kernel<__half,"))
            and e.endswith(", true>") and ", 8, 0, " in e]
    token = [e.replace("apply_rope_wide_kernel", "apply_rope_token_kernel").replace(", 8, 0, ", f", 8, {lanes}, ")
             [:-len(", true>")] + ">" for e in wide for lanes in plans.ROPE_NORM_THREADS_PER_HEAD]
    band = [e.rsplit(", ", 1)[0] + f", {plans.ROPE_TOKEN_BAND_HEADS}>" for e in token if e.endswith(", 2>")]
    six = [e.replace(", 8, 8, 2>", ", 8, 6, 2>") for e in token if e.endswith(", 8, 8, 2>")]
    assert wide and band and len(six) == 16
    assert sorted(rope_ops.instantiations()[rope_ops.APPLY_ROPE_TOKEN]) == sorted(token + band + six)
    monkeypatch.setattr(plans, "ROPE_TOKEN_BAND_HEADS", 0)
    assert sorted(rope_ops.instantiations()[rope_ops.APPLY_ROPE_TOKEN]) == sorted(token + six)
    monkeypatch.setattr(plans, "ROPE_TOKEN_6_LANES_HEADS", ())
    assert sorted(rope_ops.instantiations()[rope_ops.APPLY_ROPE_TOKEN]) == sorted(token)
    for bad in (11, -1, True, "6", None):  # the compiled set reads it as the planner does
        monkeypatch.setattr(plans, "ROPE_TOKEN_BAND_HEADS", bad)
        with pytest.raises(ValueError, match=r"plans.ROPE_TOKEN_BAND_HEADS must be an int in \[0, 10\]"):
            rope_ops.instantiations()
    monkeypatch.setattr(plans, "ROPE_TOKEN_BAND_HEADS", 0)
    qk_exprs = set(rope_ops.instantiations()[rope_ops.QK_RMS_NORM_ROPE_WIDE])
    for heads in plans.ROPE_WIDE_NORM_HEADS_CHOICES:
        for has_pass in (True, False):
            assert rope_ops.QK_RMS_NORM_ROPE_WIDE.expr("__nv_bfloat16", "float", "int", False, 8, 8, heads,
                                                       has_pass) in qk_exprs


# ----------------------------------------------------------------- GPU: same bytes under every layout
def _under(constants: dict, call):
    """``call()`` with plan constants set (launch caches emptied before and after)."""
    saved = {name: getattr(plans, name) for name in constants}
    try:
        for name, value in constants.items():
            setattr(plans, name, value)
        launcher.clear_caches()
        return call()
    finally:
        for name, value in saved.items():
            setattr(plans, name, value)
        launcher.clear_caches()


def _bytes_under_layouts(make, run):
    """{layout id: bytes of run(make())} for every layout of LAYOUTS (fresh inputs each)."""
    import cupy

    got = {}
    for constants, name in LAYOUTS:
        inputs = make()
        outs = _under(constants, lambda: run(inputs))
        got[name] = b"".join(cupy.asnumpy(o).tobytes() for o in outs if o is not None)
    return got


def _inputs(seed, num_tokens, hq, hkv, head_dim, rotary_dim, dtype, cache_dtype, pos_dtype, *, fused=False,
            misalign=0, bad=False, mrope=False):
    import cupy

    from cupykern import rope_scaling

    rng = np.random.default_rng(seed)
    width = (hq + 2 * hkv) * head_dim
    flat = cupy.asarray(rng.standard_normal(num_tokens * width + misalign, dtype=np.float32).astype(dtype))
    if fused:  # views of one fused QKV buffer
        buf = flat[misalign:].reshape(num_tokens, width)
        q = buf[:, : hq * head_dim].reshape(num_tokens, hq, head_dim)
        k = buf[:, hq * head_dim:(hq + hkv) * head_dim].reshape(num_tokens, hkv, head_dim)
    else:
        q = flat[: num_tokens * hq * head_dim].reshape(num_tokens, hq, head_dim).copy()
        k = flat[num_tokens * hq * head_dim: num_tokens * (hq + hkv) * head_dim].reshape(num_tokens, hkv,
                                                                                          head_dim).copy()
    rows = 4096
    cache = cupy.asarray(rope_scaling.cos_sin_table(rows, rotary_dim, 500000.0, dtype=np.dtype(cache_dtype)))
    pos = rng.integers(0, rows, (3, num_tokens) if mrope else num_tokens).astype(pos_dtype)
    if bad and num_tokens:
        pos[..., 0] = -1
        pos[..., -1] = rows
    return dict(q=q, k=k, positions=cupy.asarray(pos), cos_sin_cache=cache,
                q_weight=cupy.asarray((rng.standard_normal(head_dim) * 0.1 + 1).astype(dtype)),
                k_weight=cupy.asarray((rng.standard_normal(head_dim) * 0.1 + 1).astype(dtype)))


def _apply(i, **kw):
    import cupykern

    return cupykern.apply_rope(i["q"], i["k"], i["positions"], i["cos_sin_cache"], check_positions=False, **kw)


def _qk(i, is_neox):
    import cupykern

    return cupykern.qk_rms_norm_rope(i["q"], i["k"], i["q_weight"], i["k_weight"], i["positions"],
                                     i["cos_sin_cache"], 1e-6, is_neox=is_neox, check_positions=False)


def _assert_token_kernel_bytes(make, run, template, num_tokens, token_off: dict, heads_per_thread=None):
    """``run(make())`` (an in-place RoPE op) launches ``template`` alone with a block per
    token (``heads_per_thread`` heads a thread, if given) and changes q or k; its q and k,
    bit for bit, are the steps kernel's and, under ``token_off`` (the op's token heads
    emptied), the wide kernel's on fresh inputs."""
    import cupy

    def qk_bytes(i):
        return b"".join(cupy.asnumpy(i[a]).tobytes() for a in ("q", "k"))

    inputs = make()
    before = qk_bytes(inputs)
    with launcher.recording() as launched:
        _under({}, lambda: run(inputs))
    assert [rec.template for rec in launched] == [template]
    assert launched[0].grid == (num_tokens, 1, 1)
    assert heads_per_thread in (None, launched[0].plan.heads_per_thread)
    got = {"token": qk_bytes(inputs)}
    assert got["token"] != before
    for constants, name in (({"ROPE_LAYOUT": "steps"}, "steps"), (token_off, "wide")):
        i = make()
        _under(constants, lambda: run(i))
        got[name] = qk_bytes(i)
    _assert_same(got)


def _assert_same(got):
    first = got["steps"]
    assert len(first) > 0 or all(len(v) == 0 for v in got.values())
    for name, value in got.items():
        assert value == first, f"layout {name} differs from steps"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
# 600: apply_rope's token kernel in place at (128, 128) (4-12 tokens an SM, item 44); 2000: the wide kernel's
@pytest.mark.parametrize("num_tokens", [1, 600, 2000])
@pytest.mark.parametrize("head_dim, rotary_dim", [(128, 128), (128, 64), (80, 32)])
@pytest.mark.parametrize("variant", ["plain", "out_of_place", "fused_misaligned", "cache_in_dtype_int32",
                                     "bad_positions"])
def test_apply_rope_layouts_give_the_same_bytes(dtype, is_neox, num_tokens, head_dim, rotary_dim, variant):
    cache_dtype = dtype if variant == "cache_in_dtype_int32" else np.float32
    pos_dtype = np.int32 if variant == "cache_in_dtype_int32" else np.int64
    seed = num_tokens * 1000 + head_dim + rotary_dim

    def make():
        return _inputs(seed, num_tokens, 32, 8, head_dim, rotary_dim, dtype, cache_dtype, pos_dtype,
                       fused=variant.startswith("fused"), misalign=int(variant == "fused_misaligned"),
                       bad=variant in ("bad_positions", "out_of_place"))

    inplace = variant != "out_of_place"
    _assert_same(_bytes_under_layouts(make, lambda i: (*_apply(i, is_neox=is_neox, inplace=inplace), i["q"], i["k"])))


@pytest.mark.gpu
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "out_of_place"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["sectioned", "interleaved"])
@pytest.mark.parametrize("num_tokens", [1, 600])
def test_mrope_layouts_give_the_same_bytes(interleaved, num_tokens, inplace):
    def make():
        return _inputs(5, num_tokens, 28, 4, 128, 128, BF16, np.float32, np.int64, mrope=True, bad=True)

    section = (24, 20, 20) if interleaved else (16, 24, 24)
    _assert_same(_bytes_under_layouts(make, lambda i: (*_apply(i, mrope_section=section, mrope_interleaved=interleaved,
                                                               inplace=inplace), i["q"], i["k"])))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("num_tokens", [1, 600])
@pytest.mark.parametrize("head_dim, rotary_dim", [(128, 128), (128, 64), (64, 32)])
@pytest.mark.parametrize("variant", ["plain", "fused_misaligned", "cache_in_dtype_int32", "bad_positions"])
def test_qk_rms_norm_rope_layouts_give_the_same_bytes(dtype, is_neox, num_tokens, head_dim, rotary_dim, variant):
    cache_dtype = dtype if variant == "cache_in_dtype_int32" else np.float32
    pos_dtype = np.int32 if variant == "cache_in_dtype_int32" else np.int64

    def make():
        return _inputs(num_tokens + head_dim, num_tokens, 16, 4, head_dim, rotary_dim, dtype, cache_dtype, pos_dtype,
                       fused=variant.startswith("fused"), misalign=int(variant == "fused_misaligned"),
                       bad=variant == "bad_positions")

    _assert_same(_bytes_under_layouts(make, lambda i: _qk(i, is_neox)))


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 600])
@pytest.mark.parametrize("num_q_heads, num_kv_heads, head_dim", [
    (20, 3, 128),   # 3 heads a thread at decode (23 heads, 8 lanes: 12 slots of 2 do not fit), a partly filled round
    (64, 8, 128),   # llama-3.1-70b: 3 heads a thread at decode, 4 at prefill (18 slots)
    (28, 3, 256),   # 16 lanes a head: 3 at decode, 4 at prefill
    (8, 2, 512),    # 32 lanes a head (16-byte vectors)
    (32, 8, 128),   # llama-3.1-8b: the token kernel at prefill (5 heads a thread, 64 threads)
])
def test_qk_rms_norm_rope_head_counts_give_the_same_bytes(num_q_heads, num_kv_heads, head_dim, num_tokens):
    """The wide kernel's heads-a-thread choices, q and k heads mixed in one thread's round and
    a last round only partly filled give the steps kernel's bytes (helper 51's review)."""
    def make():
        return _inputs(head_dim + num_q_heads, num_tokens, num_q_heads, num_kv_heads, head_dim, head_dim, BF16,
                       np.float32, np.int64, bad=True)

    _assert_same(_bytes_under_layouts(make, lambda i: _qk(i, True)))


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("num_q_heads, num_kv_heads, head_dim", [(32, 8, 128), (64, 8, 128), (16, 4, 256)],
                         ids=["8b", "70b", "16-lanes"])
@pytest.mark.parametrize("variant", ["plain", "fused", "cache_in_dtype_int32", "bad_positions"])
@pytest.mark.parametrize("num_tokens", [3, 600])
def test_qk_token_kernel_gives_the_steps_kernel_bytes(is_neox, num_q_heads, num_kv_heads, head_dim, variant,
                                                      num_tokens):
    """bf16 qk_rms_norm_rope takes the token kernel in these shapes at decode sizes (3
    tokens: 2 heads a thread, 3 for 70b; item 39) and prefill sizes (600: 5 and 3; item 38):
    its q and k, bit for bit, are the steps kernel's and the wide kernel's, with views of a
    fused QKV buffer, int32 positions with a bf16 cache, and positions out of range (left
    unchanged)."""
    cache_dtype = BF16 if variant == "cache_in_dtype_int32" else np.float32
    pos_dtype = np.int32 if variant == "cache_in_dtype_int32" else np.int64

    def make():
        return _inputs(num_q_heads + head_dim + num_tokens, num_tokens, num_q_heads, num_kv_heads, head_dim, head_dim,
                       BF16, cache_dtype, pos_dtype, fused=variant == "fused", bad=variant == "bad_positions")

    _assert_token_kernel_bytes(make, lambda i: _qk(i, is_neox), rope_ops.QK_RMS_NORM_ROPE_TOKEN, num_tokens,
                               {"ROPE_NORM_TOKEN_HEADS": ()})


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("num_tokens, num_q_heads, num_kv_heads, head_dim, rotary_dim", [
    (3, 32, 8, 128, 128),     # llama-3.1-8b: 2 heads a thread, 160 threads
    (300, 32, 8, 128, 128),   # the same in 300 blocks
    (600, 32, 8, 128, 128),   # 4-12 tokens an SM on 51-150 SMs: 8b's prefill layout, 5 heads a thread (item 44)
    (7, 64, 8, 128, 128),     # llama-3.1-70b: 3 heads a thread, 192 threads
    (600, 64, 8, 128, 128),   # the same band: 70b in ROPE_TOKEN_BAND_HEADS, 6 heads a thread (item 47)
    (1800, 64, 8, 128, 128),  # 12-27 tokens an SM on 67-150 SMs: the band heads past the prefill heads' (item 48)
    (3000, 64, 8, 128, 128),  # 16-27 tokens an SM on 112-187 SMs: the band heads' end of item 51
    (2600, 32, 8, 128, 128),  # 17-23 tokens an SM on 114-152 SMs: the window in the decode heads (items 49-52)
    (3000, 32, 8, 128, 128),  # 17-23 tokens an SM on 131-176 SMs: the window's end of item 52
    (3900, 32, 8, 128, 128),  # 17-31 tokens an SM on 126-229 SMs: 8b's 8-lane decode heads to their own end
    (2600, 16, 8, 256, 256),  # gemma-2-9b in the window: 2 heads of 16 lanes, 192 threads (item 52)
    (300, 16, 4, 256, 256),   # 16 lanes a head, 2 heads a thread
    (300, 32, 8, 256, 128),   # 8 lanes a head (2 heads a thread), dims past rotary_dim (left as they are)
    (3, 32, 32, 96, 96),      # phi-3-mini: 6 lanes a head, 2 heads a thread, 192 threads (item 60)
    (300, 32, 32, 96, 96),    # the same in 300 blocks
    (5, 16, 16, 96, 96),      # 6 lanes, 32 heads: 16 slots, 96 threads (helper 109)
    (5, 32, 32, 192, 96),     # 6 lanes with dims past rotary_dim (left as they are; helper 109)
    (1024, 28, 4, 128, 128),  # qwen2.5-7b past the decode sizes: its decode heads, 2 a thread (items 54-56)
    (3900, 28, 4, 128, 128),  # the same to the 8-lane end
], ids=["8b-3", "8b-300", "8b-600", "70b-7", "70b-600", "70b-1800", "70b-3000", "8b-2600", "8b-3000", "8b-3900",
        "gemma-2600", "16-lanes", "pass-through", "phi-3", "phi-300", "6-lanes-32-heads", "6-lanes-pass-through",
        "qwen-1024", "qwen-3900"])
@pytest.mark.parametrize("variant", ["plain", "fused", "cache_in_dtype_int32", "bad_positions"])
def test_apply_rope_token_kernel_gives_the_steps_kernel_bytes(dtype, is_neox, num_tokens, num_q_heads, num_kv_heads,
                                                              head_dim, rotary_dim, variant):
    """apply_rope in place at decode sizes takes its token kernel in these shapes (item 39),
    and past them 8b's 5 heads a thread (item 44), 70b's 6 (items 47-48) and, in the window,
    the decode heads again (8b's 2, gemma-2-9b's 2 of 16 lanes; items 49-52):
    q and k, bit for bit, are the steps kernel's and the wide kernel's, with views of a fused QKV buffer,
    int32 positions with a cache in q's dtype, and positions out of range (left unchanged)."""

    heads = None
    if num_tokens >= 600:  # from 4 tokens an SM: 8b's prefill heads to 12, 70b's band heads to 27, the window
        import cupy

        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        window = (plans.ROPE_TOKEN_WINDOW_FROM_TOKENS_PER_SM, plans.ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM
                  if head_dim == 256 else plans.ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM)
        in_window = num_q_heads != 64 and num_tokens in (2600, 3000, 3900)
        decode_heads_past = num_q_heads == 28  # qwen2.5-7b: neither prefill nor band heads fill, its decode heads do
        # 70b at 1800 and 3000: the band heads' part past the prefill heads' band (3000 past
        # item 48's end of 16); 8b and gemma at 2600 and 3000, 8b at 3900: the window (8b's
        # 8-lane decode heads to their own end); qwen from 4 tokens an SM to that end
        low, end = (plans.ROPE_MIN_TOKENS_PER_SM, plans.ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM) \
            if decode_heads_past else window if in_window else {
            1800: (plans.ROPE_TOKEN_MAX_TOKENS_PER_SM, plans.ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM),
            3000: (16, plans.ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM)}.get(
                num_tokens, (plans.ROPE_MIN_TOKENS_PER_SM, plans.ROPE_TOKEN_MAX_TOKENS_PER_SM
                             if num_q_heads == 32 else plans.ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM))
        if not low * sms <= num_tokens < end * sms:
            pytest.skip(f"{num_tokens} tokens are outside {low}-{end} tokens an SM on {sms} SMs")
        heads = 2 if in_window or decode_heads_past else 5 if num_q_heads == 32 else plans.ROPE_TOKEN_BAND_HEADS
    _assert_apply_rope_token_bytes(variant, dtype, is_neox, num_tokens, num_q_heads, num_kv_heads, head_dim, rotary_dim,
                                   heads)


def _assert_apply_rope_token_bytes(variant, dtype, is_neox, num_tokens, num_q_heads, num_kv_heads, head_dim,
                                   rotary_dim, heads):
    """:func:`_assert_token_kernel_bytes` for apply_rope on fresh inputs of ``variant``
    (plain, fused QKV views, a cache in q's dtype with int32 positions, positions out of
    range), the wide kernel with the token heads emptied."""
    cache_dtype = dtype if variant == "cache_in_dtype_int32" else np.float32
    pos_dtype = np.int32 if variant == "cache_in_dtype_int32" else np.int64

    def make():
        return _inputs(num_tokens + head_dim + rotary_dim, num_tokens, num_q_heads, num_kv_heads, head_dim, rotary_dim,
                       dtype, cache_dtype, pos_dtype, fused=variant == "fused", bad=variant == "bad_positions")

    _assert_token_kernel_bytes(make, lambda i: _apply(i, is_neox=is_neox), rope_ops.APPLY_ROPE_TOKEN, num_tokens,
                               {"ROPE_TOKEN_HEADS": (), "ROPE_TOKEN_BAND_HEADS": 0}, heads)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("num_tokens, num_q_heads, num_kv_heads, head_dim, rotary_dim, heads, end", [
    (5000, 32, 8, 128, 128, 5, "ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM"),  # llama-3.1-8b: the prefill heads
    (5000, 64, 8, 128, 128, 3, "ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM"),  # llama-3.1-70b: the decode heads
    (5000, 28, 4, 128, 128, 2, "ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM"),  # qwen2.5-7b: the decode heads
    (3600, 16, 8, 256, 256, 3, "ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM"),  # gemma-2-9b: prefill heads of 16 lanes
    (3600, 32, 32, 96, 96, 2, "ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM"),   # phi-3-mini: decode heads of 6 lanes
], ids=["8b", "70b", "qwen", "gemma", "phi"])
@pytest.mark.parametrize("variant", ["plain", "fused", "cache_in_dtype_int32", "bad_positions"])
def test_apply_rope_token_kernel_past_every_end_gives_the_steps_kernel_bytes(
        monkeypatch, dtype, is_neox, num_tokens, num_q_heads, num_kv_heads, head_dim, rotary_dim, heads, end,
        variant):
    """Past the shape's last other end (``end``), below ROPE_TOKEN_FAR_TO_TOKENS_PER_SM (set
    to 64 here), apply_rope's token kernel in the prefill or decode heads (items 64-65)
    gives q and k bit for bit the steps kernel's and the wide kernel's bytes."""
    import cupy

    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    if not getattr(plans, end) * sms <= num_tokens < 64 * sms:
        pytest.skip(f"{num_tokens} tokens are not past {end} and below 64 tokens an SM on {sms} SMs")
    monkeypatch.setattr(plans, "ROPE_TOKEN_FAR_TO_TOKENS_PER_SM", 64)
    _assert_apply_rope_token_bytes(variant, dtype, is_neox, num_tokens, num_q_heads, num_kv_heads, head_dim, rotary_dim,
                                   heads)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, num_q_heads, num_kv_heads", [
    (BF16, 64, 8),         # llama-3.1-70b: 3 heads a thread, 192-thread blocks
    (BF16, 32, 8),         # llama-3.1-8b: 5 heads a thread, 128-thread blocks of 2 tokens
    (np.float32, 32, 8),   # 16 lanes a head, 3 heads a thread (fp32's 72 heads take the steps kernel)
], ids=["bf16-70b", "bf16-8b", "fp32-8b"])
def test_qk_rms_norm_rope_grid_is_whole_waves_of_its_resident_blocks(dtype, num_q_heads, num_kv_heads):
    """At 3000 tokens the grid-stride grid is capped: 2 waves of the blocks an SM holds of the
    launched kernel (the occupancy API's count, asked here apart from the launcher), with the
    bytes of a block per token group and of the steps kernel."""
    import cupy

    def make():
        return _inputs(7, 3000, num_q_heads, num_kv_heads, 128, 128, dtype, np.float32, np.int64, bad=True)

    inputs = make()
    with launcher.recording() as launched:  # the wide kernel's waves: 70b's token kernel turned off
        _under({"ROPE_NORM_TOKEN_HEADS": ()}, lambda: _qk(inputs, True))
    (rec,) = launched
    per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(rec.function.ptr, rec.block[0], 0)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    groups = -(-3000 // rec.plan.tokens_per_block)
    assert rec.plan.heads_per_thread and rec.plan.grid_waves == plans.ROPE_WIDE_NORM_GRID_WAVES
    assert rec.grid == (min(groups, plans.ROPE_WIDE_NORM_GRID_WAVES * per_sm * sms), 1, 1) == rec.plan.grid
    got = {"wide": b"".join(cupy.asnumpy(o).tobytes() for o in (inputs["q"], inputs["k"]))}
    for constants, name in (({"ROPE_LAYOUT": "steps"}, "steps"), ({"ROPE_WIDE_NORM_GRID_WAVES": 0}, "blocks"),
                            ({}, "default")):
        i = make()
        outs = _under(constants, lambda: _qk(i, True))
        got[name] = b"".join(cupy.asnumpy(o).tobytes() for o in outs)
    _assert_same(got)
