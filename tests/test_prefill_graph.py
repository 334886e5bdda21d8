"""The prefill as captured CUDA graphs (cupykern/llm/prefill_graph.py) and the cuBLAS
products it captures (cupykern/llm/blas.py).

CPU: the buckets and chunks a prompt runs in; argument checks.
GPU (marked): ``matmul_nt`` against a float64 product, eager and inside a captured graph;
prefill graphs of a random-weight model of SmolLM2-135M's shapes (two layers) against
the eager forward: the last token's logits and the KV-cache rows, for prompts that fill
a bucket, pad one, and run in chunks; padding rows write no cache row; a graph reused
with another prompt reads its new inputs.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from bench.bench_decode_step import SMOLLM2
from cupykern import _dtypes
from cupykern.llm import blas, prefill_graph
from cupykern.llm.gguf_weights import LlamaConfig
from cupykern.llm.prefill_graph import BUCKETS, bucket_for, chunks

#: SmolLM2-135M's shapes (the decode bench's), two layers to keep it quick.
SMALL = dataclasses.replace(LlamaConfig(**SMOLLM2), num_layers=2, name="SmolLM2-135M shapes, 2 layers, random weights")
#: Logits of the graph against the eager forward: the same kernels and cuBLAS products, but
#: cuBLAS may choose another algorithm for a bucket's rows (other fp32 summation orders),
#: so the difference is that of one more dtype rounding here and there.
LOGIT_RTOL = {"fp16": 5e-3, "bf16": 3e-2}


# ----------------------------------------------------------------- CPU
def test_buckets_rise_by_at_most_half_from_32():
    assert list(BUCKETS) == sorted(set(BUCKETS)) and BUCKETS[:2] == (16, 32)
    assert all(b <= 1.5 * a for a, b in zip(BUCKETS[1:], BUCKETS[2:]))


@pytest.mark.parametrize("num_tokens, bucket", [(1, 16), (16, 16), (17, 32), (33, 48), (49, 64), (65, 96),
                                                (257, 384), (385, 512), (512, 512)])
def test_bucket_for_is_the_smallest_that_holds_the_chunk(num_tokens, bucket):
    assert bucket_for(num_tokens) == bucket


@pytest.mark.parametrize("num_tokens", [0, -1, BUCKETS[-1] + 1])
def test_bucket_for_refuses_what_no_graph_holds(num_tokens):
    with pytest.raises(ValueError, match=f"num_tokens: expected 1 .. {BUCKETS[-1]}"):
        bucket_for(num_tokens)


@pytest.mark.parametrize("num_tokens, want", [(1, [(0, 1)]), (512, [(0, 512)]), (513, [(0, 512), (512, 1)]),
                                              (1100, [(0, 512), (512, 512), (1024, 76)]), (0, [])])
def test_chunks_cover_the_prompt_in_order(num_tokens, want):
    assert chunks(num_tokens) == want


@pytest.mark.parametrize("num_tokens", [True, np.True_, 16.5, 2.0, "5", None])
def test_bucket_for_and_chunks_refuse_what_is_not_an_int(num_tokens):
    """A bool was a prompt of 1 token (bucket 16), 16.5 ran in bucket 32, chunks(2.5)
    raised range()'s TypeError."""
    for fn in (bucket_for, chunks):
        with pytest.raises(ValueError, match="num_tokens: expected an int"):
            fn(num_tokens)


def test_chunks_refuse_a_negative_prompt_and_take_numpy_ints():
    with pytest.raises(ValueError, match="num_tokens: expected an int >= 0, got -1"):
        chunks(-1)  # was [], so prepare(-1) captured nothing and said nothing
    assert chunks(np.int64(513)) == [(0, 512), (512, 1)] and bucket_for(np.int32(17)) == 32


@pytest.mark.parametrize("ids", [[1.7, 2.0], np.array([True, False]), np.array(["5", "6"]), [2**70]])
def test_prefill_graphs_run_refuses_ids_that_are_not_integers(ids):
    """np.asarray(ids, dtype=int64) truncated 1.7 to 1, took bools as 0 and 1 and parsed
    digit strings: a prompt of other tokens than given, silently."""
    graphs = object.__new__(prefill_graph.PrefillGraphs)
    graphs.cache, graphs._arrays = SimpleNamespace(length=0, max_tokens=8, k=[], v=[]), ()
    graphs.model = SimpleNamespace(config=SimpleNamespace(vocab_size=100))
    graphs._graph = lambda bucket: pytest.fail("the prompt was taken")
    with pytest.raises(TypeError, match="token_ids: expected integer ids"):
        graphs.run(ids)
    assert graphs.cache.length == 0


def test_host_token_ids_flattens_integer_ids_of_any_int_dtype():
    from cupykern.llm.reference import host_token_ids

    for dtype in (np.int8, np.uint16, np.int32, np.uint32, np.int64):
        got = host_token_ids(np.array([[3, 1, 4]], dtype))
        assert got.dtype == np.int64 and got.tolist() == [3, 1, 4]
    assert host_token_ids([]).shape == (0,)  # empty: check_tokens says "at least one token"
    assert host_token_ids(SimpleIds()).tolist() == [7]


@pytest.mark.parametrize("ids, message", [
    (np.array([5, 2**64 - 1], np.uint64), "token_ids: expected ids below 2\\*\\*63, got max 18446744073709551615"),
    ([2**63], "token_ids: expected ids below 2\\*\\*63, got max 9223372036854775808"),
    ([[1, 2], [3]], "token_ids: expected an array of integer ids, got list")])
def test_host_token_ids_refuses_ids_int64_cannot_hold_and_ragged_lists(ids, message):
    """uint64 2**64 - 1 became -1 (check_tokens then said "got min -1"), [2**63] became
    -2**63; a ragged list raised NumPy's "inhomogeneous shape" naming no argument."""
    from cupykern.llm.reference import host_token_ids

    with pytest.raises(ValueError, match=message):
        host_token_ids(ids)
    assert host_token_ids(np.array([2**63 - 1], np.uint64)).tolist() == [2**63 - 1]  # check_tokens' to judge


class SimpleIds:
    """A device array's stand-in: ``.get()`` gives the host copy."""

    def get(self):
        return np.array([7], np.int32)


def _fake_model_and_cache(layers=2, rows=16, context_length=32):
    from cupykern.llm.kv_cache import KVCache
    from cupykern.llm.ops import KERNELS

    config = SimpleNamespace(num_layers=2, context_length=context_length, vocab_size=100)
    model = SimpleNamespace(ops=KERNELS, config=config)

    def array(i):
        return SimpleNamespace(shape=(rows, 3, 64), strides=(384, 128, 2), data=SimpleNamespace(ptr=(i + 1) << 20))

    return model, KVCache([array(i) for i in range(layers)], [array(layers + i) for i in range(layers)])


def test_prefill_graphs_refuse_a_cache_the_model_cannot_fill():
    """A layer short: IndexError inside the warm-up; rows past the RoPE table: positions
    there neither rotated nor written (rope_kv_append skips them in a graph), silently."""
    model, short = _fake_model_and_cache(layers=1)
    with pytest.raises(ValueError, match="cache: expected 2 layers of keys and values"):
        prefill_graph.PrefillGraphs(model, short, stream=None)
    model, long = _fake_model_and_cache(rows=33)
    with pytest.raises(ValueError, match=r"cache: expected 1 \.\. 32 rows \(the model's context length\), got 33"):
        prefill_graph.PrefillGraphs(model, long, stream=None)


def test_prefill_graphs_refuse_another_cache_than_theirs():
    """The graphs write the arrays captured: with graphs.cache swapped (or a layer's
    array replaced) the prompt went to the old cache while the new one's length moved."""
    model, cache = _fake_model_and_cache()
    graphs = prefill_graph.PrefillGraphs(model, cache, stream=None)
    graphs._graph = lambda bucket: pytest.fail("a graph was replayed or captured")
    _, graphs.cache = _fake_model_and_cache()
    graphs.cache.k[0].data.ptr = 99 << 20
    for call in (lambda: graphs.run([1, 2, 3]), lambda: graphs.prepare(3)):
        with pytest.raises(ValueError, match="cache: not the arrays these prefill graphs were made for"):
            call()
    assert graphs.cache.length == 0
    graphs.cache = cache
    cache.v[1] = SimpleNamespace(shape=(16, 3, 64), strides=(384, 128, 2), data=SimpleNamespace(ptr=98 << 20))
    with pytest.raises(ValueError, match="cache: not the arrays"):
        graphs.run([1])


@pytest.mark.parametrize("num_tokens, message", [
    (17, r"num_tokens: expected 0 \.\. 16 \(the cache's rows\), got 17"),
    (10**15, r"num_tokens: expected 0 \.\. 16 \(the cache's rows\), got 1000000000000000"),
    (-1, r"num_tokens: expected 0 \.\. 16"), (2.0, "num_tokens: expected an int, got 2.0")])
def test_prepare_refuses_prompts_the_cache_cannot_hold(num_tokens, message):
    """prepare(10**15) built a list of 2 * 10**12 chunks before capturing anything."""
    model, cache = _fake_model_and_cache(rows=16)
    graphs = prefill_graph.PrefillGraphs(model, cache, stream=None)
    graphs._graph = lambda bucket: pytest.fail("a graph was captured")
    with pytest.raises(ValueError, match=message):
        graphs.prepare(num_tokens)


def test_prefill_graphs_need_the_kernel_ops():
    from types import SimpleNamespace

    from cupykern.llm.ops import PLAIN

    with pytest.raises(ValueError, match="model: prefill graphs need the kernel ops"):
        prefill_graph.PrefillGraphs(SimpleNamespace(ops=PLAIN), cache=None, stream=None)


@pytest.mark.parametrize("x, w, error", [
    (np.zeros((2, 4), np.float16), np.zeros((3, 4), np.float16), "x: expected a cupy.ndarray, got ndarray"),
])
def test_matmul_nt_refuses_host_arrays(x, w, error):
    with pytest.raises(TypeError, match=error):
        blas.matmul_nt(x, w)


class _FakeCupyArray:
    """What matmul_nt reads of a cupy.ndarray (shape, strides, dtype, ndim, data.ptr)."""

    def __init__(self, shape, dtype=np.float16, ptr=1 << 20, strides=None):
        self.shape, self.dtype, self.ndim = tuple(shape), np.dtype(dtype), len(shape)
        item = self.dtype.itemsize
        self.strides = (shape[1] * item, item) if strides is None else tuple(strides)
        self.data = SimpleNamespace(ptr=ptr)


@pytest.fixture
def fake_cupy_arrays(monkeypatch):
    """matmul_nt's argument checks on the CPU: _FakeCupyArray stands for cupy.ndarray, and
    reaching cuBLAS (past every check) raises AssertionError."""
    import cupy

    def reached(stream):
        raise AssertionError("the call reached cuBLAS")

    monkeypatch.setattr(cupy, "ndarray", _FakeCupyArray)
    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda: type("S", (), {"ptr": 0})())
    monkeypatch.setattr(blas, "_handle", reached)
    return _FakeCupyArray


def test_matmul_nt_names_a_missing_x_or_w(fake_cupy_arrays):
    w = fake_cupy_arrays((3, 4))
    with pytest.raises(TypeError, match="x: expected a cupy.ndarray, got NoneType"):
        blas.matmul_nt(None, w)
    with pytest.raises(TypeError, match="w: expected a cupy.ndarray, got NoneType"):
        blas.matmul_nt(w, None)


def test_matmul_nt_refuses_out_overlapping_an_input(fake_cupy_arrays):
    """cuBLAS would read x or w while writing out over it: refused, except column slices
    of one buffer whose rows interleave."""
    fa = fake_cupy_arrays
    x, w = fa((4, 4), ptr=1 << 20), fa((4, 4), ptr=1 << 30)
    for out, name in ((fa((4, 4), ptr=1 << 20), "x"), (fa((4, 4), ptr=1 << 30), "w"),
                      (fa((4, 4), ptr=(1 << 20) + 30), "x"), (fa((4, 4), ptr=(1 << 30) - 2), "w")):
        with pytest.raises(ValueError, match=f"out overlaps {name} in memory"):
            blas.matmul_nt(x, w, out)
    wide_x = fa((4, 4), ptr=1 << 20, strides=(16, 2))  # columns 0..3 of a (4, 8) buffer
    with pytest.raises(ValueError, match="out overlaps x in memory"):  # columns 3..6: one shared
        blas.matmul_nt(wide_x, w, fa((4, 4), ptr=(1 << 20) + 6, strides=(16, 2)))
    with pytest.raises(AssertionError, match="reached cuBLAS"):  # columns 4..7: disjoint
        blas.matmul_nt(wide_x, w, fa((4, 4), ptr=(1 << 20) + 8, strides=(16, 2)))


def test_matmul_nt_refuses_sizes_past_cublas_int(fake_cupy_arrays):
    """cublasGemmEx takes int sizes and leading dimensions: ctypes would wrap 2**32 + 64
    to 64 (another row's data read, silently)."""
    fa = fake_cupy_arrays
    w, out = fa((4, 64), ptr=1 << 40), fa((2, 4), ptr=1 << 41)
    with pytest.raises(ValueError, match="cuBLAS takes sizes and row strides up to 2147483647 elements, got x's "
                                         "row stride 4294967360"):
        blas.matmul_nt(fa((2, 64), strides=(2 * (2**32 + 64), 2)), w, out)
    with pytest.raises(ValueError, match=r"got x.shape\[1\] 2147483648"):
        blas.matmul_nt(fa((1, 2**31)), fa((1, 2**31), ptr=1 << 40), fa((1, 1), ptr=1 << 45))


def test_matmul_nt_takes_one_row_of_any_row_stride(fake_cupy_arrays):
    """``v[None]`` has row stride 0: one row needs none (cuBLAS gets in_features)."""
    fa = fake_cupy_arrays
    with pytest.raises(AssertionError, match="reached cuBLAS"):
        blas.matmul_nt(fa((1, 64), strides=(0, 2)), fa((4, 64), ptr=1 << 40), fa((1, 4), ptr=1 << 41))


@pytest.mark.parametrize("error", [ImportError, OSError])
def test_a_missing_cublas_says_what_to_install(monkeypatch, error):
    """Loading cuBLAS (CuPy's binding, then the soname) can fail with ImportError (not
    found) or OSError (found, not loadable): the same type comes back, naming the llm
    extra and the nvidia-cublas wheel (pyproject.toml), with the loader's words."""
    import cupy

    def fail(major):
        raise error(f"No such file: libcublas.so.{major}")

    monkeypatch.setattr(cupy.cuda.runtime, "runtimeGetVersion", lambda: 13020)
    monkeypatch.setattr(blas, "_open", fail)
    with pytest.raises(error) as info:
        blas._library.__wrapped__()  # past the cache of an earlier successful load
    message = str(info.value)
    assert message.startswith("cuBLAS (libcublas.so.13) could not be loaded: install the llm extra, "
                              "pip install -e '.[llm]' in the cupykern checkout")
    assert "nvidia-cublas==13.*" in message and "No such file: libcublas.so.13" in message
    assert "nvidia-cublas-cu12" in blas._install_hint(12)  # CUDA 12's wheel had the suffix


def test_the_llm_extra_brings_cublas():
    """cuBLAS is loaded through ctypes, so no import pulls it in: the llm extra must."""
    tomllib = pytest.importorskip("tomllib")
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert "nvidia-cublas==13.*" in project["optional-dependencies"]["llm"]
    assert any(d.startswith("cupy-cuda13x") for d in project["dependencies"])  # CUDA 13: the wheel's major


# ----------------------------------------------------------------- GPU: cuBLAS through ctypes
DTYPES = [_dtypes.float16, _dtypes.bfloat16]
#: Largest relative rounding of one fp16 / bf16 output (half a unit in the last place, doubled).
OUT_ROUNDING = {np.dtype(np.float16): 2.0 ** -10, _dtypes.bfloat16: 2.0 ** -7}


def _random(shape, dtype, seed):
    import cupy

    return cupy.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).astype(dtype)


def _check_product(got, x, w):
    """|got - x w^T| within one output rounding plus fp32 accumulation (K * 2^-24 of sum |x w|)."""
    x64, w64 = (a.astype(np.float32).get().astype(np.float64) for a in (x, w))
    want = x64 @ w64.T
    bound = OUT_ROUNDING[got.dtype] * np.abs(want) + x64.shape[1] * 2.0 ** -23 * (np.abs(x64) @ np.abs(w64).T)
    err = np.abs(got.astype(np.float32).get().astype(np.float64) - want)
    assert (err <= bound).all(), f"worst error / bound {np.max(err / bound):.2f}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m, n, k", [(1, 960, 576), (17, 576, 1536), (512, 3072, 576)])
def test_matmul_nt_against_float64(dtype, m, n, k):
    import cupy

    x, w = _random((m, k), dtype, 1), _random((n, k), dtype, 2)
    out = cupy.full((m, n), np.nan, dtype)  # poisoned: every element must be written
    assert blas.matmul_nt(x, w, out) is out
    _check_product(out, x, w)
    _check_product(blas.matmul_nt(x, w), x, w)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matmul_nt_takes_row_views(dtype):
    """x as the k columns of a wider buffer (a row stride past k), out as columns of another."""
    import cupy

    wide = _random((33, 1024), dtype, 3)
    x, w = wide[:, 128:128 + 576], _random((192, 576), dtype, 4)
    canvas = cupy.full((33, 400), np.nan, dtype)
    out = canvas[:, 8:200]
    blas.matmul_nt(x, w, out)
    _check_product(out, x, w)
    assert cupy.isnan(canvas[:, :8]).all() and cupy.isnan(canvas[:, 200:]).all()  # nothing outside written


@pytest.mark.gpu
@pytest.mark.parametrize("x_shape, w_shape, out_shape, error, message", [
    ((4, 8), (3, 6), None, ValueError, "x, w: expected"),
    ((4, 8), (3, 8), (3, 4), ValueError, "out: expected shape"),
    ((0, 8), (3, 8), None, ValueError, "non-empty"),
])
def test_matmul_nt_refuses_bad_shapes(x_shape, w_shape, out_shape, error, message):
    import cupy

    x, w = cupy.zeros(x_shape, np.float16), cupy.zeros(w_shape, np.float16)
    out = None if out_shape is None else cupy.zeros(out_shape, np.float16)
    with pytest.raises(error, match=message):
        blas.matmul_nt(x, w, out)


@pytest.mark.gpu
def test_matmul_nt_refuses_bad_dtypes_and_layouts():
    import cupy

    with pytest.raises(TypeError, match="x: expected float16 or bfloat16, got float32"):
        blas.matmul_nt(cupy.zeros((2, 4), np.float32), cupy.zeros((3, 4), np.float32))
    with pytest.raises(TypeError, match="w, out: expected x's dtype"):
        blas.matmul_nt(cupy.zeros((2, 4), np.float16), cupy.zeros((3, 4), _dtypes.bfloat16))
    with pytest.raises(ValueError, match="x: expected a 2-d array with contiguous rows"):
        blas.matmul_nt(cupy.zeros((4, 2), np.float16).T, cupy.zeros((3, 4), np.float16))


@pytest.mark.gpu
def test_matmul_nt_refuses_out_over_an_input_and_takes_a_broadcast_row():
    import cupy

    x, w = _random((8, 8), np.float16, 8), _random((8, 8), np.float16, 9)
    before = x.copy()
    with pytest.raises(ValueError, match="out overlaps x in memory"):
        blas.matmul_nt(x, w, out=x)
    with pytest.raises(ValueError, match="out overlaps w in memory"):
        blas.matmul_nt(x, w, out=w)
    cupy.testing.assert_array_equal(x, before)
    row = _random((8,), np.float16, 10)
    _check_product(blas.matmul_nt(row[None], w), row[None].copy(), w)  # row stride 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matmul_nt_inside_a_captured_graph(dtype):
    """cupy.matmul raises during capture; this one is captured and each replay reads x anew."""
    import cupy

    x, w = _random((64, 576), dtype, 5), _random((960, 576), dtype, 6)
    out = cupy.empty((64, 960), dtype)
    cupy.cuda.Device().synchronize()  # x and w were written on the default stream, which `stream` does not wait for
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        blas.matmul_nt(x, w, out)  # the stream's handle made before the capture
        stream.begin_capture()
        try:
            blas.matmul_nt(x, w, out)
        finally:
            graph = stream.end_capture()
        out.fill(np.nan)
        x[...] = _random((64, 576), dtype, 7)
        graph.launch(stream)
        stream.synchronize()
    _check_product(out, x, w)


# ----------------------------------------------------------------- GPU: prefill graphs
@pytest.fixture(scope="module")
def small_models():
    from cupykern.llm.model import LlamaModel, random_device_weights

    built = {}

    def get(dtype_name):
        if dtype_name not in built:
            built[dtype_name] = LlamaModel(random_device_weights(SMALL, _dtypes.parse(dtype_name), seed=11))
        return built[dtype_name]

    return get


def _prefill_both_ways(model, ids, max_tokens):
    """(graph logits, graph cache, eager logits, eager cache) of prefilling ``ids``."""
    import cupy

    cache = model.new_cache(max_tokens)
    stream = cupy.cuda.Stream(non_blocking=True)
    graphs = prefill_graph.PrefillGraphs(model, cache, stream)
    logits = graphs.run(ids)
    stream.synchronize()
    eager_cache = model.new_cache(max_tokens)
    eager = model.forward(ids, eager_cache)
    return logits, cache, eager, eager_cache, graphs


def _relative(a, b):
    a, b = (x.get().astype(np.float64) for x in (a, b))
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["fp16", "bf16"])
@pytest.mark.parametrize("num_tokens", [1, 9, 16, 17, 600])  # padded, full, padded, chunked 512 + 88
def test_prefill_graph_matches_the_eager_forward(small_models, dtype_name, num_tokens):
    model = small_models(dtype_name)
    ids = np.random.default_rng(num_tokens).integers(0, SMALL.vocab_size, num_tokens)
    max_tokens = num_tokens + 40  # rows past the prompt: the padding must leave them alone
    logits, cache, eager, eager_cache, _ = _prefill_both_ways(model, ids, max_tokens)
    assert logits.shape == (1, SMALL.vocab_size) and logits.dtype == np.float32
    assert np.isfinite(logits.get()).all()
    assert _relative(logits, eager) <= LOGIT_RTOL[dtype_name]
    assert cache.length == eager_cache.length == num_tokens
    atol = {"fp16": 0.02, "bf16": 0.1}[dtype_name]
    for layer in range(SMALL.num_layers):
        for got, want in ((cache.k[layer], eager_cache.k[layer]), (cache.v[layer], eager_cache.v[layer])):
            np.testing.assert_allclose(got[:num_tokens].get().astype(np.float64),
                                       want[:num_tokens].get().astype(np.float64), rtol=0.02, atol=atol)
            assert not got[num_tokens:].any(), "a padding row reached the cache"


@pytest.mark.gpu
def test_prefill_graph_reused_reads_its_new_inputs(small_models):
    """The second prompt of the same bucket, after the first: the second's logits, and a
    prompt continued from a non-zero cache length (positions start there)."""
    import cupy

    model = small_models("fp16")
    first, second = (np.random.default_rng(s).integers(0, SMALL.vocab_size, 12) for s in (1, 2))
    cache = model.new_cache(64)
    stream = cupy.cuda.Stream(non_blocking=True)
    graphs = prefill_graph.PrefillGraphs(model, cache, stream)
    graphs.run(first)
    cache.length = 0
    again = graphs.run(second)
    more = graphs.run(first[:5])  # positions 12 .. 16 after the second prompt
    stream.synchronize()
    eager_cache = model.new_cache(64)
    want_second = model.forward(second, eager_cache)
    want_more = model.forward(first[:5], eager_cache)
    assert _relative(again, want_second) <= LOGIT_RTOL["fp16"]
    assert _relative(more, want_more) <= LOGIT_RTOL["fp16"]
    assert cache.length == 17 and len(graphs._graphs) == 1  # one bucket (16) served all three


@pytest.mark.gpu
def test_prefill_graph_checks_the_prompt(small_models):
    import cupy

    model = small_models("fp16")
    graphs = prefill_graph.PrefillGraphs(model, model.new_cache(8), cupy.cuda.Stream(non_blocking=True))
    with pytest.raises(ValueError):
        graphs.run([])
    with pytest.raises(ValueError):
        graphs.run([SMALL.vocab_size])
    with pytest.raises(ValueError):
        graphs.run(list(range(9)))  # more than the cache's 8 rows
    assert graphs.cache.length == 0


@pytest.mark.gpu
def test_prefill_graph_capture_leaves_the_default_pool_alone(small_models):
    """Capture's arrays come from the graphs' own pool: the default pool's used bytes
    (which the decode graph checks across its own capture) do not move."""
    import cupy

    model = small_models("fp16")
    cache = model.new_cache(32)
    graphs = prefill_graph.PrefillGraphs(model, cache, cupy.cuda.Stream(non_blocking=True))
    pool = cupy.get_default_memory_pool()
    used = pool.used_bytes()
    graphs.prepare(20)
    assert pool.used_bytes() == used

