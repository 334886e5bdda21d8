"""gemv family: gemv, gemv_add_residual, rms_norm_gemv, rms_norm_gemv_silu_and_mul (kernels_cu/gemv.cu).

CPU: the instantiation space, intake checks on hand-built signatures, the plan, and
the references' rounding points. GPU (marked): each op against the float64 reference
over dtypes, token counts (1-16), row lengths (vector and scalar paths), guarded
outputs; a token's bits the same in any batch; inside a captured CUDA graph.

Tolerance: the kernels round the normalised row where the references do; an fp32 mean
square can land an element of it on the other side of that rounding than the float64
one, which moves a product by that element's weight times one unit in its last place:
rtol = 2.5 ulp of the dtype instead of the usual 1.5 covers it.
"""

from __future__ import annotations

import math

import cupy
import numpy as np
import pytest

import cupykern
from cupykern import _dtypes, plans, reference
from cupykern.ops import gemv
from cupykern.reference._common import round_to
from tests.helpers import DTYPE_IDS, DTYPES, Guarded, as_fake, assert_close, contiguous, prepare_args, random_device

OPS = ["gemv", "gemv_add_residual", "rms_norm_gemv", "rms_norm_gemv_silu_and_mul"]
#: Row lengths: SmolLM2's hidden and intermediate sizes, Llama-3-8B's hidden size, and
#: lengths that are not a multiple of a 16-byte vector (the scalar path).
K_SIZES = [576, 1536, 4096, 577, 33]
TOKENS = [1, 3, 16]


def _rtol(dtype) -> float:
    bits = {_dtypes.float16: 10, _dtypes.bfloat16: 7}.get(np.dtype(dtype))
    return 2.5 * 2.0**-bits if bits else 3e-5


def _inputs(rng, op, num_tokens, k, dtype, n=None):
    n = n or max(8, k // 2)
    rows = 2 * n if op == "rms_norm_gemv_silu_and_mul" else n
    return {"x": random_device(rng, (num_tokens, k), dtype),
            "weight": random_device(rng, (rows, k), dtype, scale=1 / math.sqrt(k)),
            "norm_weight": random_device(rng, (k,), dtype, scale=0.1, loc=1.0),
            "residual": random_device(rng, (num_tokens, n), dtype), "n": n}


def _call(op, i, out=None, out_dtype=None):
    if op == "gemv":
        return cupykern.gemv(i["x"], i["weight"], out=out, out_dtype=out_dtype)
    if op == "gemv_add_residual":
        return cupykern.gemv_add_residual(i["x"], i["weight"], i["residual"])
    if op == "rms_norm_gemv":
        return cupykern.rms_norm_gemv(i["x"], i["norm_weight"], i["weight"], 1e-6, out=out, out_dtype=out_dtype)
    return cupykern.rms_norm_gemv_silu_and_mul(i["x"], i["norm_weight"], i["weight"], 1e-6, out=out)


def _expected(op, i):
    if op == "gemv":
        return reference.gemv(i["x"], i["weight"])
    if op == "gemv_add_residual":
        return reference.gemv_add_residual(i["x"], i["weight"], i["residual"])
    if op == "rms_norm_gemv":
        return reference.rms_norm_gemv(i["x"], i["norm_weight"], i["weight"], 1e-6)
    return reference.rms_norm_gemv_silu_and_mul(i["x"], i["norm_weight"], i["weight"], 1e-6)


# ----------------------------------------------------------------- CPU
def test_instantiations_cover_every_variant_dtype_vector_and_token_bound():
    exprs = gemv.instantiations()[gemv.GEMV]
    assert len(exprs) == len(set(exprs))
    # 4 variants x 3 dtypes, plus float32 outputs of the two store variants for the 16-bit
    # dtypes; all but the SiLU gate also with several features a warp; x 2 vector widths
    # x 3 token bounds.
    assert len(exprs) == ((3 * 3 + 2 * 2) * 2 + 3) * 2 * 3
    assert f"gemv_kernel<__half, float, true, 0, 8, 1, {plans.GEMV_AHEAD}, 1>" in exprs
    many = f"gemv_kernel<__half, float, true, 0, 8, 1, {plans.GEMV_MANY_ROWS_AHEAD}, {plans.GEMV_MANY_ROWS_PER_WARP}>"
    assert many in exprs
    assert not any(e.startswith("gemv_kernel<__half, __half, true, 2,") and e.endswith(", 4>") for e in exprs)


@pytest.mark.parametrize("num_tokens, expected", [(1, 1), (2, 4), (4, 4), (5, 16), (16, 16)])
def test_plan_takes_the_smallest_token_bound(num_tokens, expected):
    plan = plans.plan_gemv(num_tokens, 960, _dtypes.float16, aligned=True, limits=plans.H200_LIMITS)
    assert plan.max_tokens == expected and plan.block_size == plans.GEMV_WARPS * 32
    assert plan.grid == (240, 1, 1) and plan.vec_width == 8


def _args(op, **values):
    return prepare_args(op, **values)


def test_intake_rejects_more_than_16_rows():
    a = _args("gemv", x=contiguous((17, 64), np.float16), weight=contiguous((8, 64), np.float16), out=None,
              out_dtype=None)
    with pytest.raises(ValueError, match="x: gemv takes at most 16 rows"):
        gemv._prepare("gemv")(a)


def test_intake_rejects_a_weight_of_another_k_and_dtype():
    with pytest.raises(ValueError, match=r"weight: expected shape \(8, 64\)"):
        gemv._prepare("gemv")(_args("gemv", x=contiguous((1, 64), np.float16), weight=contiguous((8, 65), np.float16),
                                    out=None, out_dtype=None))
    with pytest.raises(TypeError, match="weight"):
        gemv._prepare("gemv")(_args("gemv", x=contiguous((1, 64), np.float16), weight=contiguous((8, 64), np.float32),
                                    out=None, out_dtype=None))


def test_intake_rejects_an_odd_gate_up_weight_and_a_bad_out_dtype():
    x, nw = contiguous((1, 64), np.float16), contiguous((64,), np.float16)
    with pytest.raises(ValueError, match="gate_up_weight: expected an even number of rows"):
        gemv._prepare("rms_norm_gemv_silu_and_mul")(_args("rms_norm_gemv_silu_and_mul", x=x, norm_weight=nw,
                                                          gate_up_weight=contiguous((7, 64), np.float16), eps=1e-6,
                                                          out=None))
    with pytest.raises(TypeError, match="out_dtype"):
        gemv._prepare("rms_norm_gemv")(_args("rms_norm_gemv", x=x, norm_weight=nw, weight=contiguous((8, 64), np.float16),
                                             eps=1e-6, out=None, out_dtype=np.float64))
    with pytest.raises(ValueError, match="eps"):
        gemv._prepare("rms_norm_gemv")(_args("rms_norm_gemv", x=x, norm_weight=nw, weight=contiguous((8, 64), np.float16),
                                             eps=-1.0, out=None, out_dtype=None))


def test_intake_picks_the_scalar_path_when_k_is_not_a_vector_multiple():
    a = _args("gemv", x=contiguous((2, 60), np.float16), weight=contiguous((8, 60), np.float16), out=None,
              out_dtype=None)
    assert gemv._prepare("gemv")(a).plan.vec_width == 1
    a = _args("gemv", x=contiguous((2, 64), np.float16), weight=contiguous((8, 64), np.float16), out=None,
              out_dtype=None)
    assert gemv._prepare("gemv")(a).plan.vec_width == 8


def test_references_round_where_the_unfused_ops_store():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 16)).astype(np.float16)
    w = (rng.standard_normal((4, 16)) / 4).astype(np.float16)
    g = (1 + 0.1 * rng.standard_normal(16)).astype(np.float16)
    residual = rng.standard_normal((2, 4)).astype(np.float16)
    product = x.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_array_equal(reference.gemv_add_residual(x, w, residual), residual.astype(np.float64) + product)
    xn = round_to(reference.rms_norm(x, g, 1e-6), np.float16)
    np.testing.assert_array_equal(reference.rms_norm_gemv(x, g, w, 1e-6), xn @ w.astype(np.float64).T)
    np.testing.assert_array_equal(reference.rms_norm_gemv_silu_and_mul(x, g, w, 1e-6),
                                  reference.silu_and_mul(xn @ w.astype(np.float64).T))


# ----------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("k", K_SIZES)
@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("op", OPS)
def test_against_float64_with_guarded_output(rng, op, num_tokens, k, dtype):
    i = _inputs(rng, op, num_tokens, k, dtype)
    expected = _expected(op, i)
    if op == "gemv_add_residual":
        got = _call(op, i)
        assert got is i["residual"]
    else:
        guard = Guarded((num_tokens, i["n"]), dtype)
        got = _call(op, i, out=guard.view)
        guard.check_margins()
    assert_close(got, expected, dtype, seed=rng.seed, rtol=_rtol(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [_dtypes.float16, _dtypes.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("op", ["gemv", "rms_norm_gemv"])
def test_float32_output_is_the_unrounded_sum(rng, op, dtype):
    i = _inputs(rng, op, 4, 576, dtype, n=1000)
    got = _call(op, i, out_dtype=np.float32)
    assert got.dtype == np.float32
    assert_close(got, _expected(op, i), np.float32, seed=rng.seed, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", OPS)
def test_a_token_gives_the_same_bits_in_any_batch(rng, op, dtype):
    i = _inputs(rng, op, 16, 1536, dtype, n=200)
    batch = _call(op, dict(i, residual=i["residual"].copy())).get()
    for t in (0, 7, 15):
        alone = dict(i, x=i["x"][t:t + 1], residual=i["residual"][t:t + 1].copy())
        np.testing.assert_array_equal(_call(op, alone).get().view(np.uint8), batch[t:t + 1].view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_replays_inside_a_captured_graph(rng, op):
    dtype = _dtypes.float16
    i = _inputs(rng, op, 1, 576, dtype, n=960)
    out = cupy.empty((1, i["n"]), dtype)
    eager_residual = i["residual"].copy()
    eager = _call(op, dict(i, residual=eager_residual), out=out).copy()  # also loads the kernel
    cupy.cuda.Device().synchronize()  # the default stream's writes, which a non-blocking stream does not wait for
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        _call(op, i, out=out)
        graph = stream.end_capture()
    out[...] = np.nan
    cupy.cuda.Device().synchronize()  # the default stream's writes, which a non-blocking stream does not wait for
    graph.launch(stream=stream)
    stream.synchronize()
    if op == "gemv_add_residual":
        np.testing.assert_array_equal(i["residual"].get(), eager_residual.get())
    else:
        np.testing.assert_array_equal(out.get(), eager.get())


# ----------------------------------------------------------------- rms_norm_gemv_rope_kv_append
def _qkv_rope_values(**over):
    values = dict(x=contiguous((2, 64), np.float16), norm_weight=contiguous((64,), np.float16),
                  qkv_weight=contiguous(((4 + 2 * 2) * 32, 64), np.float16), positions=contiguous((2,), np.int32),
                  cos_sin_cache=contiguous((100, 32), np.float32), k_cache=contiguous((50, 2, 32), np.float16),
                  v_cache=contiguous((50, 2, 32), np.float16), q_out=None, eps=1e-6, is_neox=True)
    values.update(over)
    return prepare_args("rms_norm_gemv_rope_kv_append", **values)


def test_qkv_rope_plans_one_warp_per_pair_of_rows():
    launch = gemv._prepare_qkv_rope(_qkv_rope_values())
    assert launch.plan.grid == ((4 + 4) * 32 // 2 // plans.GEMV_WARPS, 1, 1)
    assert launch.allocate == (("q_out", (2, 4, 32), np.dtype(np.float16)),)


@pytest.mark.parametrize("over, error, match", [
    (dict(qkv_weight=contiguous((8 * 32 + 1, 64), np.float16)), ValueError, "qkv_weight: expected"),
    (dict(k_cache=contiguous((50, 2, 31), np.float16)), ValueError, "k_cache: expected shape .* even head_dim"),
    (dict(cos_sin_cache=contiguous((100, 32), np.float16)), ValueError, "cos_sin_cache: expected C-contiguous float32"),
    (dict(cos_sin_cache=contiguous((100, 34), np.float32)), ValueError, "rotary_dim"),
    (dict(positions=contiguous((3,), np.int32)), ValueError, "positions"),
    (dict(v_cache=contiguous((49, 2, 32), np.float16)), ValueError, "v_cache"),
    (dict(x=contiguous((17, 64), np.float16), positions=contiguous((17,), np.int32)), ValueError, "at most 16 rows"),
    (dict(is_neox=None), TypeError, "is_neox"),
    # This op has no q: the caches' dtype is x's.
    (dict(v_cache=contiguous((50, 2, 32), np.float32)), TypeError, r"v_cache: expected dtype float16 \(the dtype of x\)"),
])
def test_qkv_rope_intake_names_the_bad_argument(over, error, match):
    with pytest.raises(error, match=match):
        gemv._prepare_qkv_rope(_qkv_rope_values(**over))


def _qkv_rope_host(num_tokens, positions):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((num_tokens, 64)).astype(np.float16)
    weight = (rng.standard_normal((8 * 32, 64)) / 8).astype(np.float16)
    table = reference.rope_cos_sin_cache(10, 32).astype(np.float32)
    return (x, np.ones(64, np.float16), weight, np.asarray(positions, np.int32), table,
            np.zeros((10, 2, 32), np.float16), np.zeros((10, 2, 32), np.float16))


def test_qkv_rope_reference_takes_zero_tokens_as_the_kernel(fake_launcher):
    args = _qkv_rope_host(0, [])
    q_out, _, _ = cupykern.rms_norm_gemv_rope_kv_append(*map(as_fake, args), check_positions=False)
    assert q_out.shape == (0, 4, 32) and not fake_launcher
    q_ref, k_ref, _ = reference.rms_norm_gemv_rope_kv_append(*args)
    assert q_ref.shape == (0, 4, 32) and not k_ref.any()


def test_qkv_rope_reference_checks_positions_as_the_kernel():
    """With check_positions (the default) a position past the table or cache is the
    kernel's ValueError; without, the token writes nothing; the flag is checked as a bool."""
    args = _qkv_rope_host(2, [3, 10])
    with pytest.raises(ValueError, match=r"positions: expected values in \[0, 10\)"):
        reference.rms_norm_gemv_rope_kv_append(*args)
    _, k_after, _ = reference.rms_norm_gemv_rope_kv_append(*args, check_positions=False)
    assert k_after[3].any() and not np.delete(k_after, 3, axis=0).any()
    with pytest.raises(TypeError, match="check_positions: expected a bool"):
        reference.rms_norm_gemv_rope_kv_append(*args, check_positions=5)


def test_silu_reference_takes_an_empty_gate_up_weight_as_the_kernel(fake_launcher):
    x, g, w = np.ones((2, 64), np.float16), np.ones(64, np.float16), np.zeros((0, 64), np.float16)
    assert cupykern.rms_norm_gemv_silu_and_mul(as_fake(x), as_fake(g), as_fake(w)).shape == (2, 0)
    assert reference.rms_norm_gemv_silu_and_mul(x, g, w).shape == (2, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("num_tokens", [1, 5, 16])
@pytest.mark.parametrize("head_dim, rotary_dim, heads, kv_heads", [(64, 64, 9, 3), (128, 128, 32, 8), (128, 64, 4, 2)])
def test_qkv_rope_against_float64(rng, dtype, is_neox, num_tokens, head_dim, rotary_dim, heads, kv_heads):
    k, rows = 576, 300
    x = random_device(rng, (num_tokens, k), dtype)
    norm_weight = random_device(rng, (k,), dtype, scale=0.1, loc=1.0)
    weight = random_device(rng, ((heads + 2 * kv_heads) * head_dim, k), dtype, scale=1 / math.sqrt(k))
    positions = cupy.asarray(rng.choice(rows, num_tokens, replace=False).astype(np.int32))
    table = cupykern.rope_cos_sin_cache(rows, rotary_dim, 10000.0)
    k_cache = random_device(rng, (rows, kv_heads, head_dim), dtype)
    v_cache = random_device(rng, (rows, kv_heads, head_dim), dtype)
    want_q, want_k, want_v = reference.rms_norm_gemv_rope_kv_append(x, norm_weight, weight, positions, table, k_cache,
                                                                    v_cache, 1e-6, is_neox=is_neox)
    q_out = cupy.full((num_tokens, heads, head_dim), np.nan, dtype)
    cupykern.rms_norm_gemv_rope_kv_append(x, norm_weight, weight, positions, table, k_cache, v_cache, 1e-6,
                                          is_neox=is_neox, q_out=q_out)
    assert_close(q_out, want_q, dtype, seed=rng.seed, rtol=_rtol(dtype), what="q")
    assert_close(k_cache, want_k, dtype, seed=rng.seed, rtol=_rtol(dtype), what="k_cache")
    assert_close(v_cache, want_v, dtype, seed=rng.seed, rtol=_rtol(dtype), what="v_cache")


@pytest.mark.gpu
def test_qkv_rope_equals_the_unfused_pair_up_to_one_rounding(rng):
    """Fused against rms_norm_gemv followed by rope_kv_append (which round the product
    first): within two units in the last place of the O(1) products."""
    dtype = _dtypes.float16
    x = random_device(rng, (3, 576), dtype)
    norm_weight = random_device(rng, (576,), dtype, scale=0.1, loc=1.0)
    weight = random_device(rng, (15 * 64, 576), dtype, scale=1 / math.sqrt(576))
    positions = cupy.asarray([3, 7, 8], np.int32)
    table = cupykern.rope_cos_sin_cache(32, 64, 100000.0)
    caches = [cupy.zeros((32, 3, 64), dtype) for _ in range(4)]
    q_fused, _, _ = cupykern.rms_norm_gemv_rope_kv_append(x, norm_weight, weight, positions, table, caches[0],
                                                          caches[1], 1e-5, is_neox=False)
    qkv = cupykern.rms_norm_gemv(x, norm_weight, weight, 1e-5).reshape(3, 15, 64)
    cupykern.rope_kv_append(qkv[:, :9], qkv[:, 9:12], qkv[:, 12:], positions, table, caches[2], caches[3],
                            is_neox=False)
    for fused, unfused in ((q_fused, qkv[:, :9]), (caches[0], caches[2]), (caches[1], caches[3])):
        np.testing.assert_allclose(fused.get().astype(np.float64), unfused.get().astype(np.float64),
                                   rtol=2.0**-10, atol=2 * 2.0**-10)


@pytest.mark.gpu
@pytest.mark.parametrize("narrow", ["one block", "rows per warp", "both"])
@pytest.mark.parametrize("op", OPS + ["rms_norm_gemv_rope_kv_append"])
def test_other_warp_shapes_give_the_same_bits(rng, monkeypatch, op, narrow):
    """A feature's sum does not depend on how warps take the features: one block of
    GEMV_WARPS warps (a device of one SM that holds one block) walking every feature in
    turn, or GEMV_MANY_ROWS_PER_WARP features a warp (the LM head's shape, here from the
    first feature on, over a count that leaves the last unit short), give the bits of a
    warp per feature."""
    from cupykern import launcher

    dtype = _dtypes.float16
    if op == "rms_norm_gemv_rope_kv_append":
        x = random_device(rng, (2, 576), dtype)
        norm_weight = random_device(rng, (576,), dtype, scale=0.1, loc=1.0)
        weight = random_device(rng, (15 * 64, 576), dtype, scale=1 / math.sqrt(576))
        positions = cupy.asarray([3, 7], np.int32)
        table = cupykern.rope_cos_sin_cache(16, 64, 100000.0)

        def run():
            caches = [cupy.zeros((16, 3, 64), dtype) for _ in range(2)]
            q, k_cache, v_cache = cupykern.rms_norm_gemv_rope_kv_append(x, norm_weight, weight, positions, table,
                                                                        *caches, 1e-5, is_neox=False)
            return [a.get() for a in (q, k_cache, v_cache)]
    else:
        i = _inputs(rng, op, 3, 1536, dtype, n=301)

        def run():
            return [_call(op, dict(i, residual=i["residual"].copy())).get()]

    wide = run()
    if narrow != "rows per warp":
        one_block = plans.DeviceLimits(name="one small SM", sm_count=1, max_threads_per_sm=plans.GEMV_WARPS * 32,
                                       max_grid_x=1)
        monkeypatch.setattr(plans.DeviceLimits, "of_device", staticmethod(lambda device_id: one_block))
    if narrow != "one block":
        monkeypatch.setattr(plans, "GEMV_MANY_ROWS", 1)
    launcher.clear_caches()
    try:
        with launcher.recording() as launched:
            narrowed = run()
    finally:
        monkeypatch.undo()
        launcher.clear_caches()
    if narrow != "rows per warp":
        assert launched[-1].grid == (1, 1, 1)
    if narrow != "one block" and op in ("gemv", "gemv_add_residual", "rms_norm_gemv"):
        assert launched[-1].plan.rows_per_warp == plans.GEMV_MANY_ROWS_PER_WARP
    for a, b in zip(narrowed, wide):
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


@pytest.mark.parametrize("op, n_out, rows", [("gemv", 49152, 4), ("rms_norm_gemv", 16384, 4), ("gemv", 16383, 1),
                                             ("rms_norm_gemv_silu_and_mul", 49152, 1)])
def test_plan_gives_a_warp_several_features_from_gemv_many_rows(op, n_out, rows):
    plan = plans.plan_gemv(1, n_out, _dtypes.float16, aligned=True, limits=plans.H200_LIMITS, op=op,
                           many_rows=op != "rms_norm_gemv_silu_and_mul")
    assert plan.rows_per_warp == rows
    assert plan.ahead == (plans.GEMV_MANY_ROWS_AHEAD if rows > 1 else plans.GEMV_AHEAD)
    assert plan.grid[0] == -(-n_out // (rows * plans.GEMV_WARPS))
