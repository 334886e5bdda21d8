"""Programmatic dependent launches (cupykern/dependent_launch.py, kernels_cu/cupykern/pdl.cuh).

CPU: every kernel template that allows a dependent launch waits for the kernels before
it before it touches memory (its source calls start_dependent_part() before any early
return), the driver structures have cuda.h's layout, and the kernel arguments are
marshalled as cupy.RawKernel passes them.
GPU (marked, sm_90+): chains of dependent kernels captured in a CUDA graph (each reading
what the one before wrote) give the same bits as the same launches made the plain way;
a kernel that did not wait would read stale rows.
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

from cupykern import dependent_launch, jit
from cupykern.ops import attention, gemv, tokens

DEPENDENT_TEMPLATES = [t for module in (gemv, attention, tokens) for t in vars(module).values()
                       if isinstance(t, jit.KernelTemplate)]


def _kernel_body(template: jit.KernelTemplate) -> str:
    """The text of ``template``'s kernel from its name to the closing brace at column 0."""
    text = (jit.kernels_dir() / template.source).read_text()
    match = re.search(rf"\b{template.name}\(", text)
    assert match, f"{template.name} not found in {template.source}"
    return text[match.start():text.index("\n}\n", match.start())]


def test_the_decode_kernels_allow_dependent_launches():
    """The graph-captured decode step launches these: all of them must allow it."""
    assert {t.name for t in DEPENDENT_TEMPLATES if t.dependent_launch} == {
        "gemv_kernel", "rms_norm_gemv_rope_kv_append_kernel", "rope_kv_append_kernel", "decode_attention_kernel",
        "attention_combine_kernel", "sample_tokens_kernel", "embedding_kernel", "append_tokens_kernel"}


@pytest.mark.parametrize("template", [t for t in DEPENDENT_TEMPLATES if t.dependent_launch], ids=lambda t: t.name)
def test_a_dependent_kernel_waits_before_any_return(template):
    body = _kernel_body(template)
    assert body.count("start_dependent_part();") == 1, template.name
    wait = body.index("start_dependent_part();")
    early_return = body.find("return;")
    assert early_return == -1 or wait < early_return, f"{template.name} may return before it waits"
    # Before the wait only the weights may be read: no positions, ids, x, q, logits or cache rows.
    before = body[body.index("{"):wait]
    for name in ("positions[", "token_ids[", "tokens[", "logits", "q +", "x +", "cache +", "partial_"):
        assert name not in before, f"{template.name} touches {name!r} before it waits"


def test_the_other_kernels_do_not_claim_it():
    from cupykern.ops import activation, norm, rope, row_reduce, softmax

    for module in (norm, softmax, row_reduce, activation, rope):
        for t in vars(module).values():
            if isinstance(t, jit.KernelTemplate):
                assert not t.dependent_launch, t.name
                assert "start_dependent_part" not in _kernel_body(t), t.name


def test_driver_structures_have_the_layout_of_cuda_h():
    assert ctypes.sizeof(dependent_launch._LaunchAttribute) == 72
    assert dependent_launch._LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(dependent_launch._LaunchConfig) == 56
    assert dependent_launch._LaunchConfig.stream.offset == 32
    assert dependent_launch._LaunchConfig.attrs.offset == 40
    assert dependent_launch._LaunchConfig.num_attrs.offset == 48


@pytest.mark.parametrize("value", [np.int32(-7), np.int64(1 << 40), np.float32(1.5), np.uint64(0xdeadbeef)])
def test_scalar_arguments_are_their_bytes(value):
    held = dependent_launch._parameter(value)
    assert ctypes.sizeof(held) == value.nbytes
    assert bytes(held) == value.tobytes()


@pytest.mark.parametrize("value", [3, 1.5, None, np.zeros(2)])
def test_other_arguments_are_refused(value):
    with pytest.raises(TypeError, match="cupy.ndarray or a NumPy scalar"):
        dependent_launch._parameter(value)


# ----------------------------------------------------------------- GPU
def _require_pdl():
    reason = dependent_launch.unavailable_reason()
    if reason:
        pytest.skip(reason)


def _graph(stream, launched, dependent: bool):
    """A graph of the recorded launches, as dependent launches or plain ones."""
    stream.begin_capture()
    try:
        for r in launched:
            if dependent:
                dependent_launch.launch(r.function, r.grid, r.block, r.args, r.shared_mem, stream)
            else:
                r.function(r.grid, r.block, r.args, r.shared_mem)
    finally:
        graph = stream.end_capture()
    return graph


def _recorded(stream, chain):
    """The launches ``chain()`` makes, recorded inside a capture (so nothing runs)."""
    from cupykern import launcher

    with launcher.recording() as launched:
        stream.begin_capture()
        try:
            chain()
        finally:
            stream.end_capture()
    return list(launched)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["fp16", "bf16"])
def test_gpu_a_dependent_gemv_chain_gives_the_plain_bits(dtype_name):
    """40 residual updates, each GEMV reading the row the one before it wrote (and its
    norm the whole row): any kernel reading before its predecessor finished would
    change the bits."""
    import cupy

    import cupykern
    from cupykern import _dtypes

    _require_pdl()
    dtype = _dtypes.parse(dtype_name)
    rng = cupy.random.default_rng(11)
    k = 576
    weights = [(rng.standard_normal((k, k), dtype=np.float32) / np.sqrt(k)).astype(dtype) for _ in range(40)]
    norm_weight = (1 + 0.1 * rng.standard_normal(k, dtype=np.float32)).astype(dtype)
    start = [rng.standard_normal((1, k), dtype=np.float32).astype(dtype) for _ in range(2)]
    a, b = cupy.empty_like(start[0]), cupy.empty_like(start[1])
    h = cupy.empty_like(start[0])
    # The inputs were written on the default stream, which a non-blocking stream does not wait
    # for: without this the eager chain once read `start` before it was written (all NaN, 3434
    # other GPU tests passing, bench/results/NOTES.md item 34).
    cupy.cuda.Device().synchronize()

    def chain():
        for i, w in enumerate(weights):
            src, dst = (a, b) if i % 2 else (b, a)
            cupykern.rms_norm_gemv(src, norm_weight, w, 1e-5, out=h)
            cupykern.gemv_add_residual(h, w, dst)

    stream = cupy.cuda.Stream(non_blocking=True)
    results = {}
    with stream:
        a[...], b[...] = start
        chain()  # loads the kernels; its result is the plain launches' result
        results["eager"] = (a.copy(), b.copy())
        launched = _recorded(stream, chain)
        for dependent in (False, True):
            graph = _graph(stream, launched, dependent)
            a[...], b[...] = start
            graph.launch(stream)
            results[dependent] = (a.copy(), b.copy())
        stream.synchronize()
    for dependent in (False, True):
        for got, want in zip(results[dependent], results["eager"]):
            assert cupy.array_equal(got.view(np.uint16), want.view(np.uint16)), f"dependent={dependent}"


@pytest.mark.gpu
def test_gpu_a_dependent_append_chain_counts_every_step():
    """200 append_tokens in a row, each incrementing the position the one before wrote:
    a read before the previous write lands would lose a step."""
    import cupy

    import cupykern

    _require_pdl()
    positions = cupy.zeros((1,), np.int32)
    history = cupy.full((1, 256), -1, np.int32)
    token = cupy.full((1,), 7, np.int32)
    cupy.cuda.Device().synchronize()  # written on the default stream, which `stream` does not wait for
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        cupykern.append_tokens(token, positions, history)  # loads the kernel
        launched = _recorded(stream, lambda: [cupykern.append_tokens(token, positions, history) for _ in range(200)])
        graph = _graph(stream, launched, dependent=True)
        positions.fill(0)
        history.fill(-1)
        graph.launch(stream)
        graph.launch(stream)
        stream.synchronize()
    assert int(positions.get()[0]) == 400
    got = history.get()[0]
    assert got[0] == -1 and (got[1:] == 7).all()  # positions 1 .. 255 written, 256 .. 400 past the history


def test_unavailable_reason_says_why_when_cuda_cannot_be_used(monkeypatch):
    """Without a driver or GPU (or with no such device) it raised CuPy's CUDARuntimeError
    instead of returning the reason."""
    import cupy

    def no_device(device=None):
        raise cupy.cuda.runtime.CUDARuntimeError(35)  # cudaErrorInsufficientDriver

    monkeypatch.setattr(cupy.cuda, "Device", no_device)
    assert dependent_launch.unavailable_reason().startswith("CUDA cannot be used on the current device (")
    assert dependent_launch.unavailable_reason(3).startswith("CUDA cannot be used on device 3 (")
