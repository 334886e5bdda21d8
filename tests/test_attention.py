"""attention family: rope_kv_append, decode_attention, prefill_attention (kernels_cu/attention.cu).

CPU: instantiations, intake checks, the split rule, the prefill plan, reference
properties. GPU (marked): against the float64 reference over dtypes, head_dim 64/128,
GQA groups, one split and several; positions out of range; replays in a captured graph
with the position advanced on the device. prefill_attention: the same, over num_tokens
1/17/512 with consecutive, shuffled, repeated, negative and out-of-cache positions, its
batch invariance (a row's bytes whatever the other rows of the call) and a captured graph.
"""

from __future__ import annotations

import dataclasses
import math
import re

import cupy
import numpy as np
import pytest

import cupykern
from cupykern import _dtypes, jit, plans, reference
from cupykern._arrays import Sig
from cupykern.ops import attention
from tests.helpers import DTYPE_IDS, DTYPES, Guarded, assert_close, contiguous, prepare_args, random_device


def _table(rows, rotary_dim, base=10000.0):
    return cupykern.rope_cos_sin_cache(rows, rotary_dim, base) if cupykern.environment.gpu_available() else None


# ----------------------------------------------------------------- CPU
def test_split_rule_keeps_short_caches_whole_and_splits_long_ones():
    short = plans.plan_attention(1, 9, 265, _dtypes.float16, limits=plans.H200_LIMITS)
    assert short.num_splits == 1 and short.grid == (9, 1, 1)
    long = plans.plan_attention(1, 32, 8192, _dtypes.float16, limits=plans.H200_LIMITS)
    assert long.num_splits == 9 and long.split_size * long.num_splits >= 8192  # ~2 blocks per SM
    assert plans.plan_attention(64, 32, 8192, _dtypes.float16, limits=plans.H200_LIMITS).num_splits == 1


def _attention_args(**over):
    values = dict(q=contiguous((1, 8, 64), np.float16), k_cache=contiguous((100, 2, 64), np.float16),
                  v_cache=contiguous((100, 2, 64), np.float16), positions=contiguous((1,), np.int32), out=None,
                  workspace=None, scale=None)
    values.update(over)
    return prepare_args("decode_attention", **values)


@pytest.mark.parametrize("over, error, match", [
    (dict(q=contiguous((1, 8, 96), np.float16), k_cache=contiguous((100, 2, 96), np.float16),
          v_cache=contiguous((100, 2, 96), np.float16)), ValueError, "head_dim 96 is not supported"),
    (dict(k_cache=contiguous((100, 3, 64), np.float16), v_cache=contiguous((100, 3, 64), np.float16)), ValueError,
     r"num_kv_heads \(3\) must divide"),
    (dict(v_cache=contiguous((99, 2, 64), np.float16)), ValueError, "v_cache"),
    (dict(positions=contiguous((1,), np.float32)), TypeError, "positions: expected dtype int32 or int64"),
    (dict(positions=contiguous((2,), np.int32)), ValueError, "positions"),
    (dict(scale=0.0), ValueError, "scale"),
    (dict(q=contiguous((1, 8, 64), np.float16, align=2)), ValueError, "q: decode_attention reads 16-byte"),
])
def test_decode_attention_intake_names_the_bad_argument(over, error, match):
    with pytest.raises(error, match=match):
        attention._prepare_decode_attention(_attention_args(**over))


def test_decode_attention_split_needs_a_large_enough_workspace():
    big = dict(k_cache=contiguous((8192, 2, 64), np.float16), v_cache=contiguous((8192, 2, 64), np.float16))
    launch = attention._prepare_decode_attention(_attention_args(**big))
    assert launch.then is not None and launch.allocate[-1][0] == "workspace"
    with pytest.raises(ValueError, match="workspace: expected a unit-stride float32 vector"):
        attention._prepare_decode_attention(_attention_args(**big, workspace=contiguous((10,), np.float32)))


def test_decode_attention_refuses_a_misaligned_workspace():
    """The kernels store float32 partials through it: an address not a multiple of 4
    bytes would fault on the GPU (a misaligned store), so the intake refuses it."""
    big = dict(k_cache=contiguous((8192, 2, 64), np.float16), v_cache=contiguous((8192, 2, 64), np.float16))
    with pytest.raises(ValueError, match="workspace: the address must be a multiple of the item size 4"):
        attention._prepare_decode_attention(_attention_args(**big, workspace=contiguous((100000,), np.float32,
                                                                                        align=2)))


def test_decode_attention_checks_a_given_workspace_before_planning():
    """Whether the cache is split depends on the device, so a given workspace's dtype and
    layout are checked on every call (and by the reference, which stops before planning)."""
    rng = np.random.default_rng(0)
    q, cache = rng.standard_normal((1, 4, 64)), rng.standard_normal((5, 2, 64))
    with pytest.raises(TypeError, match="workspace: expected dtype float32"):
        reference.decode_attention(q, cache, cache, np.array([2]), workspace=np.zeros(3, np.int8))
    with pytest.raises(TypeError, match="workspace: expected dtype float32"):
        attention._prepare_decode_attention(_attention_args(workspace=contiguous((10,), np.int32)))
    with pytest.raises(ValueError, match="workspace: expected a unit-stride float32 vector"):
        attention._prepare_decode_attention(_attention_args(workspace=contiguous((2, 10), np.float32)))
    misaligned = np.zeros(64, np.uint8)[2:42].view(np.float32)
    with pytest.raises(ValueError, match="workspace: the address must be a multiple"):
        reference.decode_attention(q, cache, cache, np.array([2]), workspace=misaligned)


def test_decode_attention_refuses_more_tokens_than_a_grid_holds():
    """Tokens are the grid's y dimension (at most 65535 blocks): more would fail to launch."""
    n = attention.MAX_TOKENS + 1
    with pytest.raises(ValueError, match="q: decode_attention takes at most 65535 tokens"):
        attention._prepare_decode_attention(_attention_args(q=contiguous((n, 8, 64), np.float16),
                                                            positions=contiguous((n,), np.int32)))
    plan = attention._prepare_decode_attention(_attention_args(q=contiguous((n - 1, 8, 64), np.float16),
                                                               positions=contiguous((n - 1,), np.int32))).plan
    assert plan.grid[1] == attention.MAX_TOKENS


@pytest.mark.parametrize("sizes", [(-5, 32, 128, 8192), (1, 32, 128, 8192.0), (1, "32", 128, 8192), (1, 32, True, 8192)])
def test_workspace_size_refuses_sizes_that_are_not_counts(sizes):
    """A negative count gave a negative size, a float one a float (cupy.empty refuses both later)."""
    with pytest.raises(ValueError, match="expected an int >= 0"):
        attention.workspace_size(*sizes, limits=plans.H200_LIMITS)


def test_workspace_size_without_a_gpu_asks_for_limits(monkeypatch):
    """Helper 65: without a GPU and without limits, CuPy's "CUDA driver version is
    insufficient" named the driver, not what to pass."""
    monkeypatch.setattr(cupykern.environment, "gpu_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"workspace_size: no CUDA GPU .*pass limits="):
        attention.workspace_size(1, 32, 128, 4096)
    assert attention.workspace_size(1, 32, 128, 4096, limits=plans.H200_LIMITS) >= 0


def test_workspace_size_of_numpy_counts_is_a_python_int():
    """Helper 63: numpy.uint8 counts wrapped in the product (0 floats for 16 tokens of 16 heads)."""
    size = attention.workspace_size(np.uint8(16), np.uint8(16), np.uint16(128), np.int32(8192), limits=plans.H200_LIMITS)
    assert type(size) is int and size == attention.workspace_size(16, 16, 128, 8192, limits=plans.H200_LIMITS) > 0


def test_rope_kv_append_intake_checks_caches_and_flags():
    values = dict(q=contiguous((2, 4, 64), np.float16), k=contiguous((2, 2, 64), np.float16),
                  v=contiguous((2, 2, 64), np.float16), positions=contiguous((2,), np.int64),
                  cos_sin_cache=contiguous((10, 64), np.float32), k_cache=contiguous((10, 2, 64), np.float16),
                  v_cache=contiguous((10, 2, 64), np.float16), is_neox=True)
    assert attention._prepare_rope_kv_append(prepare_args("rope_kv_append", **values)).plan.grid == (2, 1, 1)
    for name, bad, error in (("k_cache", contiguous((10, 3, 64), np.float16), ValueError),
                             ("v_cache", contiguous((10, 2, 64), np.float32), TypeError),
                             ("is_neox", 1.5, TypeError)):
        with pytest.raises(error, match=name):
            attention._prepare_rope_kv_append(prepare_args("rope_kv_append", **dict(values, **{name: bad})))
    # helper 71: a v_cache of fewer rows than k_cache was written past its end (the kernel
    # bounds a position by k_cache's rows)
    short = r"v_cache: expected shape \(10, 2, 64\) \(as k_cache\), got \(4, 2, 64\)"
    with pytest.raises(ValueError, match=short):
        attention._prepare_rope_kv_append(prepare_args("rope_kv_append", **dict(values, v_cache=contiguous(
            (4, 2, 64), np.float16))))
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 4, 64)), rng.standard_normal((2, 2, 64))
    with pytest.raises(ValueError, match=short):  # the float64 twin: IndexError before
        reference.rope_kv_append(q, k, k, np.array([1, 8]), reference.rope_cos_sin_cache(10, 64),
                                 np.zeros((10, 2, 64)), np.zeros((4, 2, 64)))


_Q_SHAPE = r"q: expected shape \(num_tokens, num_heads, head_dim\), got "


@pytest.mark.parametrize("q", [
    contiguous((5, 8 * 64), np.float16),  # the heads not split out of a (T, H * D) row
    contiguous((1, 5, 8, 64), np.float16),  # (batch, seq_len, ...), which _arrays.heads takes
    Sig((1, 5, 8, 64), (5 * 8 * 128, 8 * 128, 128, 4), np.dtype(np.float16), 0),  # and head_dim not unit-stride
    contiguous((1, 5, 8, 64), np.float32),  # a float32 q against float16 caches
])
@pytest.mark.parametrize("op", ["decode_attention", "prefill_attention", "rope_kv_append"])
def test_attention_ops_refuse_a_q_that_is_not_3d_naming_its_shape(op, q):
    """q's dimension count is checked before its head geometry: a 2-d or 4-d q gets the
    one shape these ops take, not a stride, dtype or (batch, seq_len, ...) message."""
    k = contiguous((5, 2, 64), np.float16)
    values = dict(q=q, k_cache=contiguous((100, 2, 64), np.float16), v_cache=contiguous((100, 2, 64), np.float16),
                  positions=contiguous((5,), np.int32))
    if op == "rope_kv_append":
        values.update(k=k, v=k, cos_sin_cache=contiguous((100, 64), np.float32), is_neox=True)
    else:
        values.update(out=None, scale=None, **({"workspace": None} if op == "decode_attention" else {}))
    prepare = {"decode_attention": attention._prepare_decode_attention,
               "prefill_attention": attention._prepare_prefill_attention,
               "rope_kv_append": attention._prepare_rope_kv_append}[op]
    with pytest.raises(ValueError, match=_Q_SHAPE + re.escape(str(tuple(q.shape)))):
        prepare(prepare_args(op, **values))


@pytest.mark.parametrize("op", ["decode_attention", "prefill_attention"])
@pytest.mark.parametrize("shape", [(5, 8 * 64), (1, 5, 8, 64)])
def test_reference_attention_refuses_a_q_that_is_not_3d_as_the_kernels(op, shape):
    """The float64 references run the kernels' intake: the same message for a 2-d or 4-d q."""
    cache = np.zeros((100, 2, 64))
    with pytest.raises(ValueError, match=_Q_SHAPE + re.escape(str(shape))):
        getattr(reference, op)(np.zeros(shape), cache, cache, np.arange(5))


def test_rope_kv_append_refuses_k_and_v_that_are_not_3d():
    values = dict(q=contiguous((2, 4, 64), np.float16), k=contiguous((2, 2, 64), np.float16),
                  v=contiguous((2, 2, 64), np.float16), positions=contiguous((2,), np.int64),
                  cos_sin_cache=contiguous((10, 64), np.float32), k_cache=contiguous((10, 2, 64), np.float16),
                  v_cache=contiguous((10, 2, 64), np.float16), is_neox=True)
    for name, shape in (("k", (2, 128)), ("v", (1, 2, 2, 64)), ("k_cache", (1, 10, 2, 64)), ("v_cache", (10, 128))):
        expected = ({"k": "(2, num_kv_heads, 64)", "v": "(2, num_kv_heads, 64)"}.get(name)
                    or "(max_tokens, num_kv_heads, head_dim)")
        with pytest.raises(ValueError, match=re.escape(f"{name}: expected shape {expected}, got {shape}")):
            attention._prepare_rope_kv_append(prepare_args("rope_kv_append",
                                                           **dict(values, **{name: contiguous(shape, np.float16)})))


def test_reference_attention_of_one_position_is_its_value():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 64))
    keys, values = rng.standard_normal((5, 2, 64)), rng.standard_normal((5, 2, 64))
    out = reference.decode_attention(q, keys, values, np.array([0]))
    np.testing.assert_allclose(out[0], np.repeat(values[0], 2, axis=0))
    # Negative positions attend to nothing; the result is exact softmax weights otherwise.
    assert not reference.decode_attention(q, keys, values, np.array([-1])).any()
    s = q[0, 3] @ keys[:3, 1].T / math.sqrt(64)
    w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    np.testing.assert_allclose(reference.decode_attention(q, keys, values, np.array([2]))[0, 3], w @ values[:3, 1])


def test_reference_rope_kv_append_writes_rotated_k_and_v_at_positions():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 2, 8)), rng.standard_normal((2, 1, 8)), rng.standard_normal((2, 1, 8))
    table = reference.rope_cos_sin_cache(16, 8)
    kc, vc = np.zeros((16, 1, 8)), np.zeros((16, 1, 8))
    q_out, k_after, v_after = reference.rope_kv_append(q, k, v, np.array([3, 7]), table, kc, vc)
    q_ref, k_ref = reference.apply_rope(q, k, np.array([3, 7]), table)
    np.testing.assert_array_equal(q_out, q_ref)
    np.testing.assert_array_equal(k_after[[3, 7]], k_ref)
    np.testing.assert_array_equal(v_after[[3, 7]], v)
    assert not k_after[[0, 1, 2, 4, 5, 6, 8]].any()


def test_references_take_scalars_and_flags_as_the_kernels():
    """A complex scale with no imaginary part and a NumPy bool flag pass the kernels'
    checks (_arrays.real, _arrays.flag): the references take them too."""
    rng = np.random.default_rng(0)
    q, cache = rng.standard_normal((1, 4, 64)), rng.standard_normal((5, 2, 64))
    np.testing.assert_array_equal(reference.decode_attention(q, cache, cache, np.array([2]), scale=0.5 + 0j),
                                  reference.decode_attention(q, cache, cache, np.array([2]), scale=0.5))
    q, k, v = rng.standard_normal((2, 2, 8)), rng.standard_normal((2, 1, 8)), rng.standard_normal((2, 1, 8))
    table, kc = reference.rope_cos_sin_cache(16, 8), np.zeros((16, 1, 8))
    reference.rope_kv_append(q, k, v, np.array([3, 7]), table, kc, kc.copy(), check_positions=np.True_)


def test_cache_positions_must_be_distinct():
    """Two tokens at one position would write one cache row from two blocks at once (a
    row mixing their elements): the check (kernels and references) refuses them."""
    attention.check_cache_positions(np.array([0, 5, 9]), 10)
    attention.check_cache_positions(np.array([], np.int32), 0)
    with pytest.raises(ValueError, match="positions: expected distinct values .*got 5 2 times"):
        attention.check_cache_positions(np.array([5, 1, 5]), 10)
    with pytest.raises(ValueError, match=r"positions: expected values in \[0, 10\)"):
        attention.check_cache_positions(np.array([5, 10]), 10)
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 2, 8)), rng.standard_normal((2, 1, 8)), rng.standard_normal((2, 1, 8))
    table, kc = reference.rope_cos_sin_cache(16, 8), np.zeros((16, 1, 8))
    with pytest.raises(ValueError, match="positions: expected distinct values"):
        reference.rope_kv_append(q, k, v, np.array([3, 3]), table, kc, kc.copy())
    _, k_after, _ = reference.rope_kv_append(q, k, v, np.array([3, 3]), table, kc, kc.copy(), check_positions=False)
    assert k_after[3].any()


# ----------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("head_dim, rotary_dim", [(64, 64), (128, 128), (128, 64)])
def test_rope_kv_append_against_float64(rng, dtype, is_neox, index_dtype, head_dim, rotary_dim):
    num_tokens, rows = 5, 300
    qkv = random_device(rng, (num_tokens, 9 + 2 * 3, head_dim), dtype)  # a fused QKV buffer, as a model has
    q, k, v = qkv[:, :9], qkv[:, 9:12], qkv[:, 12:]
    positions = cupy.asarray(rng.choice(rows, num_tokens, replace=False).astype(index_dtype))
    table = _table(rows, rotary_dim)
    k_cache, v_cache = random_device(rng, (rows, 3, head_dim), dtype), random_device(rng, (rows, 3, head_dim), dtype)
    want_q, want_k, want_v = reference.rope_kv_append(q, k, v, positions, table, k_cache, v_cache, is_neox=is_neox)
    k_before = k.copy()
    cupykern.rope_kv_append(q, k, v, positions, table, k_cache, v_cache, is_neox=is_neox)
    assert_close(q, want_q, dtype, seed=rng.seed, what="q")
    assert_close(k_cache, want_k, dtype, seed=rng.seed, what="k_cache")
    np.testing.assert_array_equal(v_cache.get(), want_v.astype(dtype))  # a copy: exact
    np.testing.assert_array_equal(k.get(), k_before.get())  # read only


@pytest.mark.gpu
def test_rope_kv_append_refuses_positions_out_of_range_before_writing(rng):
    dtype = _dtypes.float16
    q, k, v = (random_device(rng, (2, h, 64), dtype) for h in (4, 2, 2))
    k_cache, v_cache = cupy.zeros((8, 2, 64), dtype), cupy.zeros((8, 2, 64), dtype)
    table = _table(16, 64)
    q_before = q.copy()
    with pytest.raises(ValueError, match=r"positions: expected values in \[0, 8\)"):
        cupykern.rope_kv_append(q, k, v, cupy.asarray([1, 8], np.int32), table, k_cache, v_cache)
    assert not k_cache.any() and (q == q_before).all()
    # Unchecked, the bad token is left alone and the good one written.
    cupykern.rope_kv_append(q, k, v, cupy.asarray([1, 8], np.int32), table, k_cache, v_cache, check_positions=False)
    assert k_cache[1].any() and not k_cache[0].any() and not k_cache[2:].any()
    assert (q[1] == q_before[1]).all()


@pytest.mark.gpu
def test_cache_writers_refuse_repeated_positions_before_writing(rng):
    dtype = _dtypes.float16
    q, k, v = (random_device(rng, (2, h, 64), dtype) for h in (4, 2, 2))
    k_cache, v_cache = cupy.zeros((8, 2, 64), dtype), cupy.zeros((8, 2, 64), dtype)
    table = _table(8, 64)
    q_before = q.copy()
    positions = cupy.asarray([3, 3], np.int32)
    with pytest.raises(ValueError, match="positions: expected distinct values"):
        cupykern.rope_kv_append(q, k, v, positions, table, k_cache, v_cache)
    x, norm_weight = random_device(rng, (2, 64), dtype), cupy.ones(64, dtype)
    weight = random_device(rng, (8 * 64, 64), dtype, scale=0.125)
    with pytest.raises(ValueError, match="positions: expected distinct values"):
        cupykern.rms_norm_gemv_rope_kv_append(x, norm_weight, weight, positions, table, k_cache, v_cache)
    assert not k_cache.any() and not v_cache.any() and (q == q_before).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("head_dim", attention.HEAD_DIMS)
@pytest.mark.parametrize("num_heads, num_kv_heads", [(9, 3), (32, 8), (4, 4)])
@pytest.mark.parametrize("rows", [265, 3000])
def test_decode_attention_against_float64(rng, dtype, head_dim, num_heads, num_kv_heads, rows):
    num_tokens = 3
    q = random_device(rng, (num_tokens, num_heads, head_dim), dtype)
    k_cache = random_device(rng, (rows, num_kv_heads, head_dim), dtype)
    v_cache = random_device(rng, (rows, num_kv_heads, head_dim), dtype)
    positions = cupy.asarray([0, rows // 2, rows - 1], np.int32)
    out = cupy.full(q.shape, np.nan, dtype)
    cupykern.decode_attention(q, k_cache, v_cache, positions, out=out)
    assert_close(out, reference.decode_attention(q, k_cache, v_cache, positions), dtype, seed=rng.seed)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [265, 3000])
def test_decode_attention_clamps_the_largest_int64_position(rng, rows):
    """positions[t] + 1 overflowed at INT64_MAX (attending to nothing, output 0); it is a
    position past the cache, clamped to the whole cache as the reference does."""
    dtype = _dtypes.float16
    q = cupy.concatenate([random_device(rng, (1, 8, 64), dtype)] * 2)  # one query, twice
    k_cache, v_cache = (random_device(rng, (rows, 2, 64), dtype) for _ in range(2))
    positions = cupy.asarray([2**63 - 1, rows - 1], np.int64)
    out = cupykern.decode_attention(q, k_cache, v_cache, positions)
    assert_close(out, reference.decode_attention(q, k_cache, v_cache, positions), dtype, seed=rng.seed)
    np.testing.assert_array_equal(out[0].get(), out[1].get())


@pytest.mark.gpu
def test_decode_attention_with_a_given_workspace_and_clamped_positions(rng):
    dtype = _dtypes.bfloat16
    q = random_device(rng, (2, 8, 128), dtype)
    k_cache, v_cache = (random_device(rng, (4096, 2, 128), dtype) for _ in range(2))
    positions = cupy.asarray([-1, 10**6], np.int64)  # nothing; clamped to the whole cache
    workspace = cupy.empty(attention.workspace_size(2, 8, 128, 4096), np.float32)
    assert workspace.size > 0
    out = cupykern.decode_attention(q, k_cache, v_cache, positions, workspace=workspace)
    assert not out[0].any()
    assert_close(out, reference.decode_attention(q, k_cache, v_cache, positions), dtype, seed=rng.seed)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [265, 3000])
def test_append_and_attend_replay_in_a_graph_as_the_position_advances(rng, rows):
    """A captured step (rope_kv_append, decode_attention, append_tokens moving the
    position on) replayed 8 times equals 8 eager steps."""
    dtype = _dtypes.float16
    table = _table(rows, 64)
    steps = [random_device(rng, (1, 4 + 2 * 2, 64), dtype) for _ in range(8)]

    def run(capture: bool):
        qkv = cupy.empty((1, 8, 64), dtype)
        k_cache, v_cache = cupy.zeros((rows, 2, 64), dtype), cupy.zeros((rows, 2, 64), dtype)
        positions = cupy.asarray([rows - 9], np.int32)
        history = cupy.zeros((1, rows), np.int32)
        token = cupy.zeros((1,), np.int32)
        out = cupy.empty((1, 4, 64), dtype)
        workspace = cupy.empty(max(1, attention.workspace_size(1, 4, 64, rows)), np.float32)
        outs = []

        def step():
            q, k, v = qkv[:, :4], qkv[:, 4:6], qkv[:, 6:]
            cupykern.rope_kv_append(q, k, v, positions, table, k_cache, v_cache, is_neox=False,
                                    check_positions=False)
            cupykern.decode_attention(q, k_cache, v_cache, positions, out=out,
                                      workspace=workspace if workspace.size > 1 else None)
            cupykern.append_tokens(token, positions, history)

        cupy.cuda.Device().synchronize()  # the default stream's writes, which a non-blocking stream does not wait for
        stream = cupy.cuda.Stream(non_blocking=True)
        graph = None
        with stream:
            if capture:
                qkv[...] = steps[0]
                step()  # loads every kernel before the capture
                positions[...] = rows - 9
                k_cache[...] = 0
                v_cache[...] = 0
                stream.begin_capture()
                step()
                graph = stream.end_capture()
            for s in steps:
                qkv[...] = s
                graph.launch(stream=stream) if capture else step()
                outs.append(out.copy())
            stream.synchronize()
        return [o.get() for o in outs], k_cache.get(), positions.get()

    eager, graphed = run(False), run(True)
    for a, b in zip(eager[0], graphed[0]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(eager[1], graphed[1])
    assert eager[2][0] == graphed[2][0] == rows - 1


def test_rope_kv_append_accepts_q_k_v_views_of_one_fused_buffer(monkeypatch):
    """q, k and v interleave token by token in a fused QKV buffer: no overlap; a k that
    really overlaps q is refused."""
    from tests.helpers import overlap_check

    values = dict(q=None, k=None, v=None, positions=contiguous((5,), np.int32),
                  cos_sin_cache=contiguous((300, 64), np.float32), k_cache=contiguous((300, 3, 64), np.float16),
                  v_cache=contiguous((300, 3, 64), np.float16), is_neox=False)
    row = 15 * 64  # 9 q heads, 3 k heads, 3 v heads of 64
    strides = (row * 2, 128, 2)
    from cupykern._arrays import Sig

    values.update(q=Sig((5, 9, 64), strides, np.dtype(np.float16), 0), k=Sig((5, 3, 64), strides, np.dtype(np.float16), 0),
                  v=Sig((5, 3, 64), strides, np.dtype(np.float16), 0))
    launch = attention._prepare_rope_kv_append(prepare_args("rope_kv_append", **values))
    base = 1 << 20
    pointers = dict(q=base, k=base + 9 * 128, v=base + 12 * 128, positions=1 << 30, cos_sin_cache=1 << 31,
                    k_cache=1 << 32, v_cache=1 << 33)
    overlap_check(monkeypatch, attention._ROPE_KV_APPEND, launch, values, pointers)
    with pytest.raises(ValueError, match="q overlaps k"):
        overlap_check(monkeypatch, attention._ROPE_KV_APPEND, launch, values, dict(pointers, k=base + 128))


def test_decode_attention_refuses_a_scale_whose_base2_product_overflows():
    with pytest.raises(ValueError, match="scale: expected a value > 0 whose product with log2"):
        attention._prepare_decode_attention(_attention_args(scale=3e38))
    assert attention._prepare_decode_attention(_attention_args(scale=2e38)).template is not None


def test_registry_sizes_of_decode_attention_are_its_head_dims():
    from cupykern.registry import all_specs

    spec = all_specs()["decode_attention"]
    assert spec.size_error(64) is None and spec.size_error(128) is None
    assert "must be one of (64, 128)" in spec.size_error(192)


# ----------------------------------------------------------------- prefill_attention: CPU
def _prefill_args(**over):
    values = dict(q=contiguous((5, 9, 64), np.float16), k_cache=contiguous((100, 3, 64), np.float16),
                  v_cache=contiguous((100, 3, 64), np.float16), positions=contiguous((5,), np.int32), out=None,
                  scale=None)
    values.update(over)
    return prepare_args("prefill_attention", **values)


@pytest.mark.parametrize("over, error, match", [
    (dict(q=contiguous((5, 9, 96), np.float16), k_cache=contiguous((100, 3, 96), np.float16),
          v_cache=contiguous((100, 3, 96), np.float16)), ValueError, "q: head_dim 96 is not supported"),
    (dict(q=contiguous((5, 9 * 64), np.float16)), ValueError, "q: expected shape"),
    (dict(k_cache=contiguous((100, 2, 64), np.float16), v_cache=contiguous((100, 2, 64), np.float16)), ValueError,
     r"num_kv_heads \(2\) must divide"),
    (dict(k_cache=None), TypeError, "k_cache"),
    (dict(v_cache=contiguous((99, 3, 64), np.float16)), ValueError, "v_cache"),
    (dict(v_cache=contiguous((100, 3, 64), np.float32)), TypeError, "v_cache"),
    (dict(positions=contiguous((5,), np.float32)), TypeError, "positions: expected dtype int32 or int64"),
    (dict(positions=contiguous((4,), np.int32)), ValueError, "positions"),
    (dict(scale=0.0), ValueError, "scale"),
    (dict(scale=3e38), ValueError, "scale: expected a value > 0 whose product with log2"),
    (dict(out=contiguous((5, 9, 64), np.float32)), TypeError, "out"),
    (dict(out=contiguous((5, 9, 32), np.float16)), ValueError, "out"),
    (dict(q=contiguous((5, 9, 64), np.float16, align=2)), ValueError, "q: prefill_attention reads 16-byte"),
    (dict(k_cache=contiguous((100, 3, 64), np.float16, align=8)), ValueError, "k_cache: prefill_attention reads"),
])
def test_prefill_attention_intake_names_the_bad_argument(over, error, match):
    with pytest.raises(error, match=match):
        attention._prepare_prefill_attention(_prefill_args(**over))


def test_prefill_attention_checks_as_decode_attention_does():
    """One intake (ops/attention.py::_attention_intake): each bad argument gives the same
    error as decode_attention's, the op's name aside; the reference raises it too."""
    rng = np.random.default_rng(0)
    q, cache = rng.standard_normal((3, 6, 64)), rng.standard_normal((10, 4, 64))
    for args in ((q, cache, cache, np.array([0, 1, 2])), (q[:, :, :32], cache, cache, np.array([0, 1, 2])),
                 (q, cache, cache, np.array([0.0, 1.0, 2.0])), (q, cache, cache[:5], np.array([0, 1, 2]))):
        errors = []
        for fn in (reference.decode_attention, reference.prefill_attention):
            with pytest.raises((TypeError, ValueError)) as info:
                fn(*args)
            errors.append((type(info.value), str(info.value)))
        assert errors[0] == errors[1]


def test_prefill_attention_plan_tiles_rows_of_one_kv_head():
    """16 query rows ((token, head-in-group) pairs) a block, tiles x kv heads in one
    grid dimension, 4 warps; the same shape for any positions (a captured graph)."""
    launch = attention._prepare_prefill_attention(_prefill_args(q=contiguous((512, 9, 64), _dtypes.bfloat16),
                                                                k_cache=contiguous((512, 3, 64), _dtypes.bfloat16),
                                                                v_cache=contiguous((512, 3, 64), _dtypes.bfloat16),
                                                                positions=contiguous((512,), np.int64)))
    assert launch.template is attention.PREFILL_ATTENTION
    assert launch.template_args == ("__nv_bfloat16", "long long", 64, plans.PREFILL_ATTENTION_LANES_PER_ROW,
                                    plans.PREFILL_ATTENTION_WARPS)
    rows_per_tile = 32 // plans.PREFILL_ATTENTION_LANES_PER_ROW
    assert launch.plan.grid == (-(-512 * 3 // rows_per_tile) * 3, 1, 1)
    assert launch.plan.block == (plans.PREFILL_ATTENTION_WARPS * 32, 1, 1) and launch.plan.shared_mem_bytes == 0
    assert launch.then is None and launch.allocate == (("out", (512, 9, 64), _dtypes.bfloat16),)
    assert launch.scalars[:3] == (np.int32(3), np.int32(3), np.int64(512 * 3))
    llama = plans.plan_prefill_attention(17, 32, 8, _dtypes.float16, limits=plans.H200_LIMITS)
    assert llama.grid == (-(-17 * 4 // rows_per_tile) * 8, 1, 1)
    assert plans.plan_prefill_attention(1, 4, 4, _dtypes.float32, limits=plans.H200_LIMITS).grid == (4, 1, 1)


def test_prefill_attention_launches_nothing_for_zero_tokens():
    launch = attention._prepare_prefill_attention(_prefill_args(q=contiguous((0, 9, 64), np.float16),
                                                                positions=contiguous((0,), np.int32)))
    assert launch.template is None and launch.returns == "out"


def test_prefill_attention_takes_no_overrides_and_refuses_a_grid_too_large():
    with pytest.raises(ValueError, match="do not apply to prefill_attention"):
        attention._prepare_prefill_attention(_prefill_args(overrides={"block_size": 256}))
    small = dataclasses.replace(plans.H200_LIMITS, max_grid_x=30)
    # 30 blocks: 10 tiles of 16 rows a kv head, 53 tokens of 3 rows.
    with pytest.raises(ValueError, match="q: prefill_attention takes at most 53 tokens per call here"):
        plans.plan_prefill_attention(54, 9, 3, _dtypes.float16, limits=small)
    assert plans.plan_prefill_attention(53, 9, 3, _dtypes.float16, limits=small).grid == (30, 1, 1)


def test_prefill_attention_accepts_q_as_a_view_of_a_fused_qkv_buffer():
    width = (9 + 2 * 3) * 64
    q = Sig((512, 9, 64), (width * 2, 128, 2), np.dtype(np.float16), 0)
    launch = attention._prepare_prefill_attention(_prefill_args(q=q, positions=contiguous((512,), np.int32)))
    assert launch.scalars[3:5] == (np.int64(width), np.int64(64))  # q's token and head strides, in elements


def test_prefill_attention_instantiations_compile_without_spills():
    """Every instantiation on sm_90 (the GPU it is tuned for) keeps its registers:
    q and the accumulator of a row's share, the tile's scores and the next tile's loads."""
    exprs = attention.instantiations()[attention.PREFILL_ATTENTION]
    assert len(exprs) == len(_dtypes.DTYPES) * len(_dtypes.INDEX_C_TYPES) * len(attention.HEAD_DIMS)
    spills = jit.nvrtc_spills("attention.cu", exprs, "90")
    assert not any(spills.values()), {e: n for e, n in spills.items() if n}


def test_covering_set_plans_prefill_attention():
    from cupykern import covering

    picked = covering.planned([cupykern.models.get("smollm2-135m")], num_tokens=[64])["attention.cu"]
    assert any(e.startswith("prefill_attention_kernel<") and ", 64, " in e for e in picked)


def test_reference_prefill_attention_is_decode_attention():
    rng = np.random.default_rng(0)
    q, keys, values = rng.standard_normal((6, 6, 64)), rng.standard_normal((9, 2, 64)), rng.standard_normal((9, 2, 64))
    positions = np.array([3, -1, 0, 8, 100, 3])
    got = reference.prefill_attention(q, keys, values, positions, scale=0.3)
    np.testing.assert_array_equal(got, reference.decode_attention(q, keys, values, positions, scale=0.3))
    assert not got[1].any()
    np.testing.assert_array_equal(got[4], reference.decode_attention(q[4:5], keys, values, np.array([8]),
                                                                     scale=0.3)[0])


def test_registry_has_prefill_attention_at_consecutive_positions():
    from cupykern.registry import all_specs

    spec = all_specs()["prefill_attention"]
    assert spec.family == "attention" and spec.sizes == attention.HEAD_DIMS
    assert "must be one of (64, 128)" in spec.size_error(96)


# ----------------------------------------------------------------- prefill_attention: GPU
def _prefill_case(rng, dtype, num_tokens, head_dim, num_heads, num_kv_heads, rows, positions):
    q = random_device(rng, (num_tokens, num_heads, head_dim), dtype)
    k_cache = random_device(rng, (rows, num_kv_heads, head_dim), dtype)
    v_cache = random_device(rng, (rows, num_kv_heads, head_dim), dtype)
    return q, k_cache, v_cache, cupy.asarray(positions)


def _positions(rng, kind, num_tokens, rows, index_dtype=np.int32):
    """consecutive: a prompt at the end of the cache; shuffled: any order, repeats allowed,
    with padding (-1) and positions past the cache."""
    if kind == "consecutive":
        return np.arange(rows - num_tokens, rows, dtype=index_dtype)
    p = rng.integers(0, rows, num_tokens).astype(index_dtype)
    if num_tokens > 2:
        p[rng.choice(num_tokens, 2, replace=False)] = (-1, rows + 7)
    return p


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("head_dim", attention.HEAD_DIMS)
@pytest.mark.parametrize("num_heads, num_kv_heads", [(9, 3), (32, 8), (4, 4)])
@pytest.mark.parametrize("num_tokens", [1, 17, 512])
@pytest.mark.parametrize("kind", ["consecutive", "shuffled"])
def test_prefill_attention_against_float64(rng, dtype, head_dim, num_heads, num_kv_heads, num_tokens, kind):
    rows = num_tokens + 40
    positions = _positions(rng, kind, num_tokens, rows, np.int64 if kind == "shuffled" else np.int32)
    q, k_cache, v_cache, positions = _prefill_case(rng, dtype, num_tokens, head_dim, num_heads, num_kv_heads, rows,
                                                   positions)
    out = Guarded(q.shape, dtype)  # poisoned, strided, margins checked
    result = cupykern.prefill_attention(q, k_cache, v_cache, positions, out=out.view)
    assert result is out.view
    want = reference.prefill_attention(q, k_cache, v_cache, positions)
    assert_close(out.view, want, dtype, seed=rng.seed)
    out.check_margins()
    empty = positions.get() < 0
    assert not out.view[cupy.asarray(empty)].get().astype(np.float32).any()  # exact zeros


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_prefill_attention_of_padding_rows_is_exactly_zero(rng, dtype):
    """The caller pads with -1: those rows attend to nothing, whatever their neighbours."""
    q, k_cache, v_cache, _ = _prefill_case(rng, dtype, 40, 64, 9, 3, 64, np.zeros(1))
    positions = cupy.asarray(np.where(np.arange(40) % 3 == 1, -1, np.arange(40)).astype(np.int32))
    out = cupykern.prefill_attention(q, k_cache, v_cache, positions)
    got = out.get().view(np.uint16 if np.dtype(dtype).itemsize == 2 else np.uint32)
    assert not got[1::3].any()  # +0.0 bits
    assert_close(out, reference.prefill_attention(q, k_cache, v_cache, positions), dtype, seed=rng.seed)


@pytest.mark.gpu
def test_prefill_attention_clamps_positions_past_the_cache(rng):
    dtype = _dtypes.float16
    q = cupy.concatenate([random_device(rng, (1, 8, 128), dtype)] * 3)  # one query, thrice
    k_cache, v_cache = (random_device(rng, (300, 2, 128), dtype) for _ in range(2))
    positions = cupy.asarray([2**63 - 1, 299, 10**6], np.int64)
    out = cupykern.prefill_attention(q, k_cache, v_cache, positions)
    assert_close(out, reference.prefill_attention(q, k_cache, v_cache, positions), dtype, seed=rng.seed)
    np.testing.assert_array_equal(out[0].get(), out[1].get())
    np.testing.assert_array_equal(out[2].get(), out[1].get())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("head_dim, num_heads, num_kv_heads", [(64, 9, 3), (128, 32, 8)])
def test_prefill_attention_batch_invariant(rng, dtype, head_dim, num_heads, num_kv_heads):
    """A row's bytes depend on its position, its q row and the cache alone: the prompt's
    512 rows in one call, one by one, in calls of 17 with other neighbours (reversed,
    mixed with padding and random positions) all give the same bytes."""
    rows = 600
    q, k_cache, v_cache, positions = _prefill_case(rng, dtype, 512, head_dim, num_heads, num_kv_heads, rows,
                                                   np.arange(512, dtype=np.int32) + 50)
    whole = cupykern.prefill_attention(q, k_cache, v_cache, positions).get()
    picks = [np.arange(0, 512, 37), np.arange(511, 494, -1), rng.choice(512, 17, replace=False)]
    for take in picks:
        got = cupykern.prefill_attention(q[take], k_cache, v_cache, positions[take]).get()
        np.testing.assert_array_equal(got.view(np.uint8), whole[take].view(np.uint8))
    for t in (0, 1, 255, 511):
        got = cupykern.prefill_attention(q[t:t + 1], k_cache, v_cache, positions[t:t + 1]).get()
        np.testing.assert_array_equal(got.view(np.uint8), whole[t:t + 1].view(np.uint8))
    # Neighbours with other positions (longer and shorter key ranges, padding) in the tile.
    take = np.arange(100, 117)
    mixed_q = cupy.concatenate([q[take], random_device(rng, (20, num_heads, head_dim), dtype)])
    mixed_positions = cupy.concatenate([positions[take], cupy.asarray(
        np.r_[rng.integers(0, rows, 18), -1, 10**6].astype(np.int32))])
    order = rng.permutation(37)
    got = cupykern.prefill_attention(mixed_q[order], k_cache, v_cache, mixed_positions[order]).get()
    np.testing.assert_array_equal(got[np.argsort(order)[:17]].view(np.uint8), whole[take].view(np.uint8))


@pytest.mark.gpu
def test_prefill_attention_reads_q_from_a_fused_qkv_buffer(rng):
    dtype = _dtypes.bfloat16
    qkv = random_device(rng, (33, 9 + 2 * 3, 64), dtype)
    q = qkv[:, :9]
    k_cache, v_cache = (random_device(rng, (40, 3, 64), dtype) for _ in range(2))
    positions = cupy.arange(33, dtype=np.int32)
    out = cupykern.prefill_attention(q, k_cache, v_cache, positions)
    assert_close(out, reference.prefill_attention(q, k_cache, v_cache, positions), dtype, seed=rng.seed)
    np.testing.assert_array_equal(out.get(), cupykern.prefill_attention(q.copy(), k_cache, v_cache, positions).get())


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", attention.HEAD_DIMS)
def test_prefill_attention_replays_in_a_captured_graph(rng, head_dim):
    """Captured once, replayed with new q, cache and positions written in place (the
    positions read on the device): each replay equals an eager call."""
    dtype = _dtypes.float16
    num_tokens, rows = 70, 128
    q = cupy.empty((num_tokens, 9, head_dim), dtype)
    k_cache, v_cache = cupy.empty((rows, 3, head_dim), dtype), cupy.empty((rows, 3, head_dim), dtype)
    positions = cupy.zeros(num_tokens, np.int32)
    out = cupy.empty_like(q)
    steps = []
    for start in (0, 30, -5):
        p = np.arange(start, start + num_tokens).astype(np.int32)  # the last has padding rows (-5 .. -1)
        steps.append((random_device(rng, q.shape, dtype), random_device(rng, k_cache.shape, dtype),
                      random_device(rng, v_cache.shape, dtype), cupy.asarray(p)))
    cupy.cuda.Device().synchronize()  # the default stream's writes, which a non-blocking stream does not wait for
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        cupykern.prefill_attention(q, k_cache, v_cache, positions, out=out)  # compiles before the capture
        stream.begin_capture()
        cupykern.prefill_attention(q, k_cache, v_cache, positions, out=out)
        graph = stream.end_capture()
        for sq, sk, sv, sp in steps:
            q[...], k_cache[...], v_cache[...], positions[...] = sq, sk, sv, sp
            out[...] = np.nan
            graph.launch(stream=stream)
            replayed = out.get()
            eager = cupykern.prefill_attention(sq, sk, sv, sp).get()
            np.testing.assert_array_equal(replayed, eager)
            assert_close(replayed, reference.prefill_attention(sq, sk, sv, sp), dtype, seed=rng.seed)
        stream.synchronize()
