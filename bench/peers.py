"""Peers: the sweep's ops and shapes through every other implementation importable here.

For each model preset (default llama-3.1-8b and llama-3.1-70b), each op (default the
eight of the README's table) at each num_tokens (default 1, 16, 64, 256, 1024, 4096,
16384), bf16, on the same seeded registry inputs:

* cupykern itself and the plain-CuPy composition (bench/common.py's COMPOSITIONS over
  cupykern/compositions.py; always);
* PyTorch eager and torch.compile, each in every formulation a PyTorch user could write
  (:func:`_torch_formulations`): ops that update their inputs (fused_add_rms_norm,
  apply_rope, qk_rms_norm_rope) "in place" (slice assignments and ``copy_``) and "out of
  place" (new tensors returned: ``r = x + r; y = rms_norm(r)``; RoPE as Hugging Face's
  ``apply_rotary_pos_emb``, ``q * cos + rotate_half(q) * sin``, with cos and sin
  gathered by ``positions`` from ``cos_sin_cache`` inside the timed function, as the
  cupykern kernel gathers them inside the kernel); ops with an ``out`` argument
  "into out" (written into a preallocated tensor with ``copy_``) and "out of place"
  (returned new). Every formulation keeps the references' contract: fp32 math, one
  rounding to the storage dtype (a bf16 formulation rounds several times and fails the
  check); the quant family's FP8 outputs as vLLM's PyTorch fallbacks write them (y in
  fp32 times 1 / scale, clamped to +-448, one cast to ``torch.float8_e4m3fn``, compared
  as its bits; per-token scales from the row's max, floored as vLLM floors them);
* torch.nn.functional.rms_norm, Liger-Kernel (its RoPE with cos/sin in bf16, as its API
  is usually fed, and in fp32; both gathered before the timed calls) and FlashInfer,
  each only if importable (none is a dependency; torch is imported here only, guarded).

Every implementation and formulation is checked against the same float64 reference
(cupykern.validation on the registry's inputs, shared through DLPack without copies)
before it is timed the same way: CUDA-graph replay for decode sizes (torch peers through
torch.cuda.graph), cold-L2 CUDA events otherwise, on one stream; when torch runs, every
implementation is timed after a torch graph has been replayed
(:func:`enter_torch_graph_state`). A point's ``impl``
names the peer and its formulation (``"torch.compile (out of place)"``); points keep the
sweep engine's schema (cupykern/sweep.py). The ratio is the fastest correct formulation
of a peer over cupykern (> 1: cupykern is faster); the markdown table printed at the end
(also written beside the JSON as .md) gives, per op and size, the fastest correct peer
of all and cupykern's % of the device-to-device copy measured at the start of the run
(1 GiB a direction), and at sizes past decode its % of a copy of the same bytes (a
cudaMemcpy moving the point's minimal byte count, half read and half written, each half
rounded down to a multiple of 4096 bytes, cold L2, timed when the point is): a copy of
tens of MiB does not reach the 1 GiB copy's GB/s (launch and the last wave's tail), so
this column says what a kernel moving those bytes can be expected to reach.

torch.compile is static (``dynamic=False``, default mode: the CUDA graph is ours): one
compile per (op, formulation, model, num_tokens). To keep that inside one device call,
``--compile-workers`` processes compile every shape of the run first, in parallel, into
Inductor's on-disk caches (their autotuning is not kept: the measuring process
autotunes on a quiet GPU); the measuring process then traces and loads from the cache.
The compile time spent (the workers' wall time and each first call) is printed and kept
in the JSON (``torch_compile``).

    python bench/peers.py [--models A,B] [--model NAME ...] [--num-tokens 1,16,64,...]
                          [--ops OP,...] [--peers NAME,...] [--compile-dynamic false|true|none]
                          [--compile-workers N] [--dtype bf16] [--repeat N] [--seed S] [--out DIR]
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
import traceback
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (COMPOSITIONS, DEFAULT_SEED, HELP_OPTIONS, RESULTS_DIR, dtype_option,  # noqa: E402
                          model_names, positive_int, positive_int_list, require_gpu, save)
from cupykern import _dtypes, environment, models, sweep, timing  # noqa: E402
from cupykern.registry import all_specs  # noqa: E402
from cupykern.validation import check_op  # noqa: E402

NUM_TOKENS = models.NUM_TOKENS_LADDER  # the default sweep's shapes
#: The models of the README's table.
DEFAULT_MODELS = ("llama-3.1-8b", "llama-3.1-70b")
#: The ops of the README's table (``--ops`` takes any op of the registry).
DEFAULT_OPS = ("rms_norm", "fused_add_rms_norm", "layer_norm", "softmax", "silu_and_mul", "gelu_and_mul",
               "apply_rope", "qk_rms_norm_rope")
#: Calls per captured graph for torch peers (as cupykern.timing.time_graph).
OPS_PER_GRAPH = 100
#: Peer names in table order; "cupy composition" always runs.
PEER_NAMES = ("cupy composition", "torch eager", "torch.compile", "F.rms_norm", "liger", "flashinfer")
#: --compile-dynamic -> torch.compile's ``dynamic``.
COMPILE_DYNAMIC = {"false": False, "true": True, "none": None}
#: Ops whose registry inputs are updated in place by cupykern (the others write ``out``).
IN_PLACE_OPS = ("fused_add_rms_norm", "apply_rope", "qk_rms_norm_rope")


class Skip(Exception):
    """This peer has no implementation of this op (or not of this variant)."""


def impl_name(peer: str, formulation: str) -> str:
    """A point's ``impl``: ``"torch.compile (out of place)"``, or the peer alone."""
    return f"{peer} ({formulation})" if formulation else peer


def split_impl(impl: str) -> tuple[str, str]:
    """``impl_name`` undone: (peer, formulation or "")."""
    for peer in PEER_NAMES:
        if impl == peer:
            return peer, ""
        if impl.startswith(peer + " (") and impl.endswith(")"):
            return peer, impl[len(peer) + 2:-1]
    return impl, ""


# ----------------------------------------------------------------- availability
def _importable(name: str) -> str | None:
    """None if ``name`` imports, else why not."""
    try:
        if importlib.util.find_spec(name) is None:
            return "not installed"
        importlib.import_module(name)
        return None
    except Exception as exc:  # noqa: BLE001 - a broken install is reported, not raised
        return f"import failed: {exc.__class__.__name__}: {exc}"


def availability() -> dict[str, str | None]:
    """Peer name -> None if it can run here, else the reason it is skipped."""
    torch_missing = _importable("torch")
    status = {"cupy composition": None, "torch eager": torch_missing}
    if torch_missing:
        status.update({name: f"needs torch ({torch_missing})" for name in PEER_NAMES[2:]})
        return status
    import torch

    if not torch.cuda.is_available():
        return {**status, **{name: "torch sees no CUDA device" for name in PEER_NAMES[1:]}}
    status["torch.compile"] = _importable("triton") and f"needs triton ({_importable('triton')})"
    status["F.rms_norm"] = None if hasattr(torch.nn.functional, "rms_norm") else "torch too old (no F.rms_norm)"
    status["liger"] = _importable("liger_kernel")
    status["flashinfer"] = _importable("flashinfer")
    return status


def peer_versions() -> dict[str, str]:
    """Installed versions of the peers' packages (for the result file)."""
    from importlib import metadata

    versions = {}
    for package in ("torch", "triton", "liger-kernel", "flashinfer-python", "flashinfer"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions


# ----------------------------------------------------------------- torch implementations
def _torch_formulations(torch) -> dict[str, dict]:
    """op -> {formulation: f(t)}, f on a dict of torch tensors (and the registry's scalars)
    returning the op's outputs; fp32 math and one rounding to the storage dtype, like the
    references. A formulation with ``wants_out`` writes into ``t["out"]`` (allocated
    before the timed calls, as the sweep allocates cupykern's)."""
    F = torch.nn.functional

    def rms(xf, w, eps, offset):
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (w.float() + offset)

    def with_out(math):
        """{"out of place": returns math(t) rounded to its dtype, "into out": copies it into t["out"]}."""
        def returned(t):
            value, dtype = math(t)
            return (value.to(dtype),)

        def into_out(t):
            value, _ = math(t)
            return (t["out"].copy_(value),)

        into_out.wants_out = True
        return {"into out": into_out, "out of place": returned}

    def rms_norm(t):
        x = t["x"]
        return rms(x.float(), t["weight"], t["eps"], t.get("weight_offset", 0.0)), x.dtype

    def layer_norm(t):
        x = t["x"]
        return F.layer_norm(x.float(), (x.shape[-1],), t["weight"].float(), t["bias"].float(), t["eps"]), x.dtype

    def softmax(t):
        return torch.softmax(t["x"].float(), dim=-1), torch.float32

    def row_reduce(t):
        if t["op"] != "sum":
            raise Skip(f"row_reduce {t['op']}")
        return t["x"].float().sum(-1), torch.float32

    def gated(act):
        def math(t):
            x = t["x"]
            d = x.shape[-1] // 2
            return act(t, x[..., :d].float()) * x[..., d:].float(), x.dtype
        return math

    def fused_add_in_place(t):
        x, r = t["x"], t["residual"]
        r.copy_(x.float() + r.float())
        x.copy_(rms(r.float(), t["weight"], t["eps"], t.get("weight_offset", 0.0)))
        return x, r

    def fused_add_out_of_place(t):  # r = x + r; y = rms_norm(r): both new
        x = t["x"]
        r = (x.float() + t["residual"].float()).to(x.dtype)
        return rms(r.float(), t["weight"], t["eps"], t.get("weight_offset", 0.0)).to(x.dtype), r

    def rotate_in_place(t, heads):
        cache = t["cos_sin_cache"]
        half = cache.shape[1] // 2
        rows = cache[t["positions"]]
        cos, sin = rows[:, None, :half], rows[:, None, half:]
        for x, xf, normalised in heads:
            x1, x2 = xf[..., :half], xf[..., half:2 * half]
            o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
            x[..., :half] = o1.to(x.dtype)
            x[..., half:2 * half] = o2.to(x.dtype)
            if normalised and xf.shape[-1] > 2 * half:  # normalised pass-through dims
                x[..., 2 * half:] = xf[..., 2 * half:].to(x.dtype)
        return t["q"], t["k"]

    def rotate_half(x):  # Hugging Face's
        x1, x2 = x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def rotate_out_of_place(t, heads):
        """Hugging Face's apply_rotary_pos_emb (partial rotary as its Phi/NeoX models:
        rotate the first rotary_dim dims, concatenate the rest), in fp32; cos and sin
        (each halves' angles twice, as HF's ``cat((freqs, freqs))``) gathered here."""
        cache = t["cos_sin_cache"]
        half = cache.shape[1] // 2
        rows = cache[t["positions"]]
        cos = torch.cat((rows[:, :half], rows[:, :half]), dim=-1)[:, None, :]
        sin = torch.cat((rows[:, half:], rows[:, half:]), dim=-1)[:, None, :]
        outputs = []
        for xf, dtype in heads:
            rot = xf[..., :2 * half]
            y = rot * cos + rotate_half(rot) * sin
            if xf.shape[-1] > 2 * half:
                y = torch.cat((y, xf[..., 2 * half:]), dim=-1)
            outputs.append(y.to(dtype))
        return tuple(outputs)

    def apply_rope_in_place(t):
        return rotate_in_place(t, [(t["q"], t["q"].float(), False), (t["k"], t["k"].float(), False)])

    def apply_rope_out_of_place(t):
        q, k = t["q"], t["k"]
        return rotate_out_of_place(t, [(q.float(), q.dtype), (k.float(), k.dtype)])

    def qk_norm(t):
        return (rms(t["q"].float(), t["q_weight"], t["eps"], 0.0), rms(t["k"].float(), t["k_weight"], t["eps"], 0.0))

    def qk_rms_norm_rope_in_place(t):
        qn, kn = qk_norm(t)
        return rotate_in_place(t, [(t["q"], qn, True), (t["k"], kn, True)])

    def qk_rms_norm_rope_out_of_place(t):
        qn, kn = qk_norm(t)
        return rotate_out_of_place(t, [(qn, t["q"].dtype), (kn, t["k"].dtype)])

    # FP8 (E4M3FN) outputs as vLLM's PyTorch fallbacks write them: y in fp32 scaled, clamped
    # to +-448 (PyTorch's cast gives NaN past the range), cast once; uint8 bits, as cupykern's.
    fp8_max, min_scale = 448.0, 1.0 / (448.0 * 512.0)

    def to_fp8(y, scale):
        if not hasattr(torch, "float8_e4m3fn"):
            raise Skip("this PyTorch has no float8_e4m3fn")
        return (y * (1.0 / scale)).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn).view(torch.uint8)

    def per_token(y, t):
        amax = y.abs().amax(-1, keepdim=True)
        if t.get("scale_ub") is not None:
            amax = amax.clamp(max=t["scale_ub"])
        scales = (amax / fp8_max).clamp(min=min_scale)
        return to_fp8(y, scales), scales

    def norm_of(t, r):
        return rms(r.float(), t["weight"], t["eps"], t.get("weight_offset", 0.0))

    def added(t, in_place: bool):
        x, r = t["x"], t["residual"]
        if in_place:
            return r.copy_(x.float() + r.float())
        return (x.float() + r.float()).to(x.dtype)

    def fused_quant(dynamic: bool):
        def form(in_place):
            def f(t):
                r = added(t, in_place)
                y = norm_of(t, r)
                return (*per_token(y, t), r) if dynamic else (to_fp8(y, t["scale"]), r)
            return f
        return {"in place": form(True), "out of place": form(False)}

    def silu_and_mul_quant(t):
        x = t["x"]
        d = x.shape[-1] // 2
        return (to_fp8(F.silu(x[..., :d].float()) * x[..., d:].float(), t["scale"]),)

    quant = {
        "rms_norm_quant": {"out of place": lambda t: (to_fp8(norm_of(t, t["x"]), t["scale"]),)},
        "fused_add_rms_norm_quant": fused_quant(dynamic=False),
        "silu_and_mul_quant": {"out of place": silu_and_mul_quant},
        "rms_norm_dynamic_per_token_quant": {"out of place": lambda t: per_token(norm_of(t, t["x"]), t)},
        "fused_add_rms_norm_dynamic_per_token_quant": fused_quant(dynamic=True),
    }
    return {
        **quant,
        "rms_norm": with_out(rms_norm),
        "fused_add_rms_norm": {"in place": fused_add_in_place, "out of place": fused_add_out_of_place},
        "layer_norm": with_out(layer_norm),
        "softmax": with_out(softmax),
        "row_reduce": with_out(row_reduce),
        "silu_and_mul": with_out(gated(lambda t, g: F.silu(g))),
        "gelu_and_mul": with_out(gated(lambda t, g: F.gelu(g, approximate=t.get("approximate", "none")))),
        "apply_rope": {"in place": apply_rope_in_place, "out of place": apply_rope_out_of_place},
        "qk_rms_norm_rope": {"in place": qk_rms_norm_rope_in_place, "out of place": qk_rms_norm_rope_out_of_place},
    }


def _f_rms_norm(torch):
    def rms_norm(t):
        x = t["x"]
        w = t["weight"] if not t.get("weight_offset") else (t["weight"].float() + t["weight_offset"]).to(x.dtype)
        return (torch.nn.functional.rms_norm(x, (x.shape[-1],), weight=w, eps=t["eps"]),)
    return {"rms_norm": {"": rms_norm}}


def _liger(torch):
    from liger_kernel.ops.geglu import LigerGELUMulFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.rope import LigerRopeFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    def rms_norm(t):  # casting_mode "gemma": all in fp32, one rounding (as the reference)
        return (LigerRMSNormFunction.apply(t["x"], t["weight"], t["eps"], t.get("weight_offset", 0.0), "gemma"),)

    def halves(x):
        d = x.shape[-1] // 2
        return x[..., :d], x[..., d:]

    def silu_and_mul(t):
        return (LigerSiLUMulFunction.apply(*halves(t["x"])),)

    def gelu_and_mul(t):
        if t.get("approximate", "none") != "tanh":
            raise Skip("Liger's GEGLU is the tanh approximation only")
        return (LigerGELUMulFunction.apply(*halves(t["x"])),)

    def gather_cos_sin(dtype):
        """Per-token cos/sin at full head width (HF's layout, which Liger takes), gathered
        before (outside) the timed calls: ``dtype`` None keeps the cache's fp32, else q's."""
        def setup(t):
            q, cache = t["q"], t["cos_sin_cache"]
            half = cache.shape[1] // 2
            if 2 * half != q.shape[-1]:
                raise Skip("Liger rope rotates whole heads only")
            rows = cache[t["positions"]]
            to = q.dtype if dtype == "q" else torch.float32
            t["_cos"] = torch.cat([rows[:, :half]] * 2, -1).to(to)[None]
            t["_sin"] = torch.cat([rows[:, half:]] * 2, -1).to(to)[None]
        return setup

    def rope(dtype):
        def apply_rope(t):  # in place on q and k (Liger's kernel writes its contiguous inputs)
            q, k = t["q"], t["k"]
            tokens, head_dim = q.shape[0], q.shape[-1]
            q_out, k_out = LigerRopeFunction.apply(q.view(1, tokens, -1, head_dim).transpose(1, 2),
                                                   k.view(1, tokens, -1, head_dim).transpose(1, 2), t["_cos"], t["_sin"])
            return q_out.transpose(1, 2).reshape(q.shape), k_out.transpose(1, 2).reshape(k.shape)
        apply_rope.setup = gather_cos_sin(dtype)
        return apply_rope

    return {"rms_norm": {"": rms_norm}, "silu_and_mul": {"": silu_and_mul}, "gelu_and_mul": {"": gelu_and_mul},
            "apply_rope": {"cos/sin bf16": rope("q"), "cos/sin fp32": rope("fp32")}}


def _flashinfer(torch):
    import flashinfer

    def rms_norm(t):
        if t.get("weight_offset") == 1.0:
            return (flashinfer.norm.gemma_rmsnorm(t["x"], t["weight"], t["eps"]),)
        if t.get("weight_offset"):
            raise Skip("weight offset other than 0 or 1")
        return (flashinfer.norm.rmsnorm(t["x"], t["weight"], t["eps"]),)

    def fused_add_rms_norm(t):
        if t.get("weight_offset") == 1.0:
            flashinfer.norm.gemma_fused_add_rmsnorm(t["x"], t["residual"], t["weight"], t["eps"])
        elif t.get("weight_offset"):
            raise Skip("weight offset other than 0 or 1")
        else:
            flashinfer.norm.fused_add_rmsnorm(t["x"], t["residual"], t["weight"], t["eps"])
        return t["x"], t["residual"]

    def gelu_and_mul(t):
        approx = t.get("approximate", "none")
        f = flashinfer.activation.gelu_tanh_and_mul if approx == "tanh" else flashinfer.activation.gelu_and_mul
        return (f(t["x"]),)

    def apply_rope(t):
        q, k = t["q"], t["k"]
        head_dim = q.shape[-1]
        flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(
            t["positions"], q.view(q.shape[0], -1), k.view(k.shape[0], -1), head_dim, t["cos_sin_cache"], is_neox=True)
        return q, k

    return {"rms_norm": {"": rms_norm}, "fused_add_rms_norm": {"": fused_add_rms_norm},
            "silu_and_mul": {"": lambda t: (flashinfer.activation.silu_and_mul(t["x"]),)},
            "gelu_and_mul": {"": gelu_and_mul}, "apply_rope": {"": apply_rope}}


def _raise_recompile_limits(torch) -> None:
    """Static compiles of one function at every shape of the run (models x num_tokens)
    exceed Dynamo's default of 8 entries per function, past which it would silently run
    eager: raise the limits, and fail rather than fall back where the version can."""
    import torch._dynamo

    config = torch._dynamo.config
    for name, value in (("recompile_limit", 256), ("cache_size_limit", 256), ("accumulated_recompile_limit", 65536),
                        ("accumulated_cache_size_limit", 65536), ("fail_on_recompile_limit_hit", True),
                        ("fail_on_cache_limit_hit", True)):
        if hasattr(config, name):
            setattr(config, name, value)


def _torch_compile(torch, dynamic=False):
    """The torch formulations through ``torch.compile(dynamic=dynamic)`` (default mode)."""
    _raise_recompile_limits(torch)
    compiled = {}
    for op, forms in _torch_formulations(torch).items():
        compiled[op] = {}
        for name, f in forms.items():
            c = torch.compile(f, dynamic=dynamic)
            if getattr(f, "wants_out", False):
                c.wants_out = True
            compiled[op][name] = c
    return compiled


BUILDERS = {"torch eager": _torch_formulations, "torch.compile": _torch_compile, "F.rms_norm": _f_rms_norm,
            "liger": _liger, "flashinfer": _flashinfer}


def _torch_views(torch, inputs: dict) -> dict:
    """Torch views (DLPack, no copies) of the device arrays of ``inputs``; None values dropped."""
    import cupy

    return {k: torch.from_dlpack(v) if isinstance(v, cupy.ndarray) else v for k, v in inputs.items() if v is not None}


def _prepare(torch, impl, inputs: dict):
    """A zero-argument callable running ``impl`` on torch views of ``inputs`` (no copies)."""
    t = _torch_views(torch, inputs)
    setup = getattr(impl, "setup", None)
    if setup is not None:  # untimed preparation (Liger's rope: gather cos/sin)
        setup(t)
    return lambda: impl(t)


# ----------------------------------------------------------------- inputs, drawn once per point
def _copy_inputs(inputs: dict) -> dict:
    """Fresh device copies of ``inputs``' arrays (scalars and None as they are)."""
    import cupy

    return {k: v.copy() if isinstance(v, cupy.ndarray) else v for k, v in inputs.items()}


def _cached_spec(spec, pristine: dict):
    """``spec`` drawing copies of ``pristine`` (the registry's seeded inputs, drawn once per
    point) instead of drawing again: every implementation gets the same values, and the
    host draws 1.9 GB of gate_up once rather than once per implementation."""
    import dataclasses

    return dataclasses.replace(spec, make_inputs=lambda rng, n, size, dtype, model=None: _copy_inputs(pristine))


# ----------------------------------------------------------------- timing torch peers
def _torch_graph_time(torch, fn, replays: int) -> timing.Timing:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(OPS_PER_GRAPH):
            fn()
    for _ in range(3):
        graph.replay()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / OPS_PER_GRAPH)
    return timing.Timing.of(samples, "graph replay")


def enter_torch_graph_state(torch) -> None:
    """Replays a torch graph of 100 silu-and-mul pairs before anything is timed. The first
    such graph of a process adds about 0.17 us to every later graph kernel, CuPy's and
    torch's alike, for the rest of the process (bench/results/NOTES.md, item 18: a graph
    of 100 in-place multiplies of 16 floats did not); without this the run's first
    cupykern point is timed before that state and its peers in it."""
    x = torch.randn(1, 2 * 14336, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(1, 14336, device="cuda", dtype=torch.bfloat16)
    _torch_graph_time(torch, lambda: torch.mul(torch.nn.functional.silu(x[:, :14336]), x[:, 14336:], out=out),
                      replays=10)
    torch.cuda.synchronize()


def measure_torch(torch, name: str, impl, spec, num_tokens: int, size: int, dtype, *, seed: int,
                  copy_gbps: float, repeat: int | None, model=None) -> tuple[sweep.Point, float]:
    """Checks ``impl`` against the float64 reference on the registry's inputs, then times it
    (on CuPy's current stream, which must also be torch's). Returns the point (no plan
    fields; its alloc_bytes count torch's allocator) and the seconds of the first call,
    made on copies of the inputs before the check (torch.compile's compile time)."""
    import cupy

    bound = spec.for_model(model)
    inputs = bound.make_inputs(np.random.default_rng(seed), num_tokens, size, dtype)
    if "out" in inputs:  # allocated once by the op itself, as the sweep does for cupykern
        inputs["out"] = bound.run(inputs)[0] if getattr(impl, "wants_out", False) else None
    elif getattr(impl, "wants_out", False):
        raise Skip("the op takes no out")
    scratch = _prepare(torch, impl, _copy_inputs(inputs))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    scratch()
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - t0
    del scratch
    fn = _prepare(torch, impl, inputs)
    checked = check_op(bound.with_run(lambda i: tuple(cupy.from_dlpack(o.detach()) for o in fn())),
                       num_tokens, size, dtype, seed, inputs=inputs)
    allocated = sweep.alloc_bytes(fn, bytes_in_use=torch.cuda.memory_allocated)
    if num_tokens <= sweep.DECODE_MAX_TOKENS:
        t = _torch_graph_time(torch, fn, repeat or 20)
    else:
        t = timing.time_cold(fn) if repeat is None else timing.time_cold(fn, repeat=repeat)
    point = sweep.make_point(bound, impl=name, model=getattr(model, "name", None), num_tokens=num_tokens, size=size,
                             dtype=dtype, timed=t, checked=checked, min_bytes=bound.min_bytes(inputs),
                             copy_gbps=copy_gbps, alloc_bytes=allocated)
    return point, first_call_s


# ----------------------------------------------------------------- torch.compile ahead of the run
def input_signature(spec, model, size: int, dtype, formulation) -> list:
    """What torch.compile specialises on in one (op, model, formulation), for any
    num_tokens: ``[(key, ("tensor", shape after the token axis, dtype name, token-indexed,
    index bound) or ("scalar", value))]`` in the inputs' order, from the registry's
    inputs at one token (cheap). The ``out`` of a formulation that ``wants_out`` is shaped
    as its out-of-place twin's output."""
    import cupy

    bound = spec.for_model(model)
    inputs = bound.make_inputs(np.random.default_rng(0), 1, size, dtype)
    if "out" in inputs:
        inputs["out"] = bound.run(inputs)[0] if getattr(formulation, "wants_out", False) else None
    token_inputs = set(spec.token_inputs) | {"out"}
    rows = inputs["cos_sin_cache"].shape[0] if "cos_sin_cache" in inputs else None
    signature = []
    for key, value in inputs.items():
        if value is None:
            continue
        if isinstance(value, cupy.ndarray):
            token = key in token_inputs
            signature.append((key, ("tensor", tuple(value.shape[1:] if token else value.shape), str(value.dtype),
                                    token, rows if key == "positions" else None)))
        else:
            signature.append((key, ("scalar", value)))
    return signature


def tensors_of(torch, signature: list, num_tokens: int, device: str = "cuda") -> dict:
    """Device tensors matching ``signature`` at ``num_tokens`` (random values; indices below their bound)."""
    t = {}
    for key, (kind, *rest) in signature:
        if kind == "scalar":
            t[key] = rest[0]
            continue
        shape, dtype_name, token, bound = rest
        shape = (num_tokens, *shape) if token else shape
        dtype = getattr(torch, {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32",
                                "int64": "int64", "int32": "int32"}[dtype_name])
        if bound is not None:
            t[key] = torch.randint(0, bound, shape, dtype=dtype, device=device)
        else:
            t[key] = torch.randn(shape, dtype=torch.float32, device=device).to(dtype)
    return t


def _prewarm_worker(tasks: list, dynamic) -> list:
    """In a child process: compiles and runs once each task (op, formulation, signature,
    num_tokens) so that Inductor's on-disk caches hold the compiled graphs; its autotuning
    (many workers share the GPU) is not written to the cache. Returns (task index,
    seconds, error or None) per task."""
    import torch
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1  # the workers are the parallelism
    inductor_config.autotune_local_cache = False  # not part of the cache key
    compiled = _torch_compile(torch, dynamic)
    done = []
    for index, op, formulation, signature, num_tokens in tasks:
        t0 = time.perf_counter()
        try:
            compiled[op][formulation](tensors_of(torch, signature, num_tokens))
            torch.cuda.synchronize()
            done.append((index, time.perf_counter() - t0, None))
        except Exception as exc:  # noqa: BLE001 - the measuring process compiles it itself
            done.append((index, time.perf_counter() - t0, f"{exc.__class__.__name__}: {exc}"))
    return done


def prewarm_compile(torch, tasks: list, workers: int, dynamic, console: Console) -> dict:
    """Runs ``tasks`` (op, formulation, signature, num_tokens) through ``workers`` spawned
    processes (:func:`_prewarm_worker`), the costliest first; returns a summary for the
    result file."""
    import concurrent.futures
    import multiprocessing

    if not tasks or workers < 1:
        return {"workers": 0, "tasks": len(tasks), "wall_s": 0.0}
    module = importlib.import_module("bench.peers")
    indexed = [(i, *task) for i, task in enumerate(tasks)]
    indexed.sort(key=lambda task: -task[4])  # larger shapes compile longer (autotuning)
    shares = [indexed[w::workers] for w in range(workers)]
    t0 = time.perf_counter()
    results, failed = [], []
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(module._prewarm_worker, share, dynamic) for share in shares if share]
        for future in concurrent.futures.as_completed(futures):
            try:
                results += future.result()
            except Exception as exc:  # noqa: BLE001 - a dead worker costs cache hits, not the run
                failed.append(f"{exc.__class__.__name__}: {exc}")
    wall = time.perf_counter() - t0
    errors = [f"{tasks[i][0]} {tasks[i][1]} x{tasks[i][3]}: {e}" for i, _, e in results if e]
    summary = {"workers": workers, "tasks": len(tasks), "wall_s": round(wall, 1),
               "worker_s": round(sum(s for _, s, _ in results), 1), "errors": errors + failed}
    failures = f", {len(summary['errors'])} failed" if summary["errors"] else ""
    console.print(f"torch.compile ahead of the run: {len(tasks)} compiles in {workers} processes, {wall:.0f} s wall "
                  f"({summary['worker_s']:.0f} s summed){failures}")
    return summary


def _cache_counters(torch) -> dict:
    try:
        from torch._dynamo.utils import counters

        return {k: int(v) for k, v in counters["inductor"].items() if k.startswith(("fxgraph_cache", "autograd_cache"))}
    except Exception:  # noqa: BLE001 - informative only
        return {}


# ----------------------------------------------------------------- the ratio table
def ratio_rows(points: list[dict], peers) -> list[dict]:
    """One row per (model, op, num_tokens): cupykern's time and % of copy and, per peer,
    ``(fastest correct formulation's time / cupykern time, ok, formulation)`` (the fastest
    failing one with ok False where none passed; None where the peer did not run), and
    ``fastest``: the same for the fastest correct peer of all, with its name."""
    by_key: dict = {}
    for p in points:
        by_key.setdefault((p.get("model"), p["op"], p["num_tokens"], p["size"]), {}).setdefault(
            split_impl(p["impl"])[0], []).append(p)
    rows = []
    for (model, op, n, size), impls in by_key.items():
        own = (impls.get("cupykern") or [None])[0]
        row = {"model": model, "op": op, "num_tokens": n, "size": size,
               "cupykern_us": own["median_us"] if own else None, "cupykern_ok": bool(own and own["check_ok"]),
               "cupykern_pct_of_copy": own.get("pct_of_copy") if own else None,
               "cupykern_pct_of_same_bytes_copy": own.get("pct_of_same_bytes_copy") if own else None,
               "fastest": None}
        for peer in peers:
            candidates = impls.get(peer)
            if not candidates or not own:
                row[peer] = None
                continue
            ok = [p for p in candidates if p["check_ok"]]
            best = min(ok or candidates, key=lambda p: p["median_us"])
            row[peer] = (best["median_us"] / own["median_us"], bool(ok), split_impl(best["impl"])[1])
            if ok and (row["fastest"] is None or row[peer][0] < row["fastest"][0]):
                row["fastest"] = (row[peer][0], best["impl"])
        rows.append(row)
    return rows


def print_ratios(console: Console, rows: list[dict], peers, title: str) -> None:
    """:func:`ratio_rows` as a rich table: green where cupykern is faster, red where not;
    each peer's cell names its fastest correct formulation."""
    table = Table(title=title)
    for column in ("model", "op", "tokens", "size", "cupykern us", "% copy", "% same-bytes copy", *peers,
                   "fastest peer"):
        table.add_column(column, justify="left" if column in ("model", "op", "fastest peer") else "right")
    for row in rows:
        decode = row["num_tokens"] <= sweep.DECODE_MAX_TOKENS
        pct, own_pct = row["cupykern_pct_of_copy"], row["cupykern_pct_of_same_bytes_copy"]
        cells = [str(row["model"]), row["op"], str(row["num_tokens"]), str(row["size"]),
                 "-" if row["cupykern_us"] is None else f"{row['cupykern_us']:.2f}" + ("" if row["cupykern_ok"]
                                                                                       else " [red]x[/]"),
                 "-" if pct is None or decode else f"{pct:.1f}",
                 "-" if own_pct is None or decode else f"{own_pct:.1f}"]
        for peer in peers:
            value = row[peer]
            if value is None:
                cells.append("-")
            else:
                ratio, ok, formulation = value
                color = "green" if ratio >= 1 else "red"
                cells.append(f"[{color}]{ratio:.2f}[/]" + (f" {_short(formulation)}" if formulation else "")
                             + ("" if ok else " [red](wrong)[/]"))
        cells.append("-" if row["fastest"] is None else f"{row['fastest'][0]:.2f} {row['fastest'][1]}")
        table.add_row(*cells)
    console.print(table)


_SHORT = {"out of place": "oop", "in place": "ip", "into out": "out=", "cos/sin bf16": "bf16 cs",
          "cos/sin fp32": "fp32 cs"}


def _short(formulation: str) -> str:
    return _SHORT.get(formulation, formulation)


def markdown_table(rows: list[dict], num_tokens, *, header: str) -> str:
    """The README's table: per (model, op), the fastest correct peer's time over
    cupykern's at each num_tokens (a letter names the peer and formulation, listed below
    the table), and cupykern's % of the same run's copy at the two largest sizes above
    the decode range, then its % of a copy of each point's own bytes there."""
    letters: dict = {}
    throughput = [n for n in num_tokens if n > sweep.DECODE_MAX_TOKENS][-2:]
    lines = [header, "",
             "| model | op | size | " + " | ".join(map(str, num_tokens)) + " | cupykern % copy"
             + (f" at {' / '.join(map(str, throughput))}" if throughput else "")
             + " | % of a copy of the same bytes |",
             "|---|---|---|" + "---|" * len(num_tokens) + "---|---|"]
    grouped: dict = {}
    for row in rows:
        grouped.setdefault((row["model"], row["op"], row["size"]), {})[row["num_tokens"]] = row
    for (model, op, size), by_n in grouped.items():
        cells = []
        for n in num_tokens:
            row = by_n.get(n)
            if row is None or row["fastest"] is None:
                cells.append("-" if row is None else "no correct peer")
                continue
            ratio, impl = row["fastest"]
            letter = letters.setdefault(impl, "abcdefghijklmnopqrstuvwxyz"[len(letters) % 26])
            cells.append(f"{ratio:.2f} {letter}" + ("" if row["cupykern_ok"] else " (cupykern wrong)"))
        def percents(key):
            return " / ".join(f"{by_n[n][key]:.1f}" for n in throughput
                              if n in by_n and by_n[n].get(key) is not None) or "-"
        lines.append(f"| {model} | {op} | {size} | " + " | ".join(cells) + " | "
                     + percents("cupykern_pct_of_copy") + " | " + percents("cupykern_pct_of_same_bytes_copy") + " |")
    lines += ["", "Fastest correct peer time / cupykern time (> 1: cupykern faster); "
                  + "; ".join(f"{letter}: {impl}" for impl, letter in letters.items()) + "."]
    return "\n".join(lines)


#: Byte counts a same-bytes copy is rounded down to (see :func:`same_bytes_copy_gbps`).
COPY_GRANULE = 4096


def same_bytes_copy_gbps(nbytes_moved: int, known: dict) -> float:
    """GB/s of a device-to-device cudaMemcpy moving about ``nbytes_moved`` bytes in all
    (half read, half written; cold L2, :func:`cupykern.timing.copy_bandwidth`), measured
    once per byte count of the run (``known`` keeps them). Each direction's count is
    rounded down to a multiple of 4096 bytes (at least 4096): on the H200 a copy of
    43,008,000 bytes ran at 3815-3835 GB/s and one of 256, 512 or 16 bytes more at
    3314-3556, 10,752,000 bytes at 2435-2475 against 1824-2123 (bench/results/NOTES.md,
    item 37, call D); what a kernel moving those bytes can reach is the fast copy's rate."""
    if nbytes_moved not in known:
        known[nbytes_moved] = timing.copy_bandwidth(max(COPY_GRANULE, nbytes_moved // 2 // COPY_GRANULE * COPY_GRANULE))
    return known[nbytes_moved]


# ----------------------------------------------------------------- the run
def plan_compiles(specs, model_list, ops, num_tokens, dtype, formulations) -> list:
    """torch.compile's static compiles of the run: (op, formulation, signature, num_tokens)."""
    tasks = []
    for model in model_list:
        for op in ops:
            if op not in formulations:
                continue
            spec = specs[op]
            size = spec.size_for_model(model)
            for name, f in formulations[op].items():
                signature = input_signature(spec, model, size, dtype, f)
                tasks += [(op, name, signature, n) for n in num_tokens if spec.takes_tokens(n)]
    return tasks


def run(model_names, num_tokens, ops, peers, *, seed: int, repeat: int | None, dtype="bf16",
        out_dir: Path | None = None, compile_dynamic: str = "false", compile_workers: int = 8) -> dict:
    """Measures ``ops`` of each model at each of ``num_tokens`` through cupykern and each
    of ``peers`` that can run here (the others are listed as skipped) in each of their
    formulations; prints the ratio tables, saves the result file after every op and
    returns its content."""
    import cupy

    started = time.perf_counter()
    console = Console(width=200)
    model_list = [models.get(m) for m in ([model_names] if isinstance(model_names, str) else model_names)]
    specs = all_specs()
    dtype = _dtypes.parse(dtype)
    status = availability()
    chosen_peers = [p for p in PEER_NAMES if p in peers]
    skipped = {p: status[p] for p in chosen_peers if status[p]}
    running = [p for p in chosen_peers if not status[p]]
    torch = None
    impls: dict = {}
    dynamic = COMPILE_DYNAMIC[compile_dynamic]
    if any(p in BUILDERS for p in running):
        import torch as torch_module

        torch = torch_module
        for p in [p for p in running if p in BUILDERS]:
            try:
                impls[p] = BUILDERS[p](torch, dynamic) if p == "torch.compile" else BUILDERS[p](torch)
            except Exception as exc:  # noqa: BLE001 - e.g. an API this version lacks
                skipped[p] = f"setup failed: {exc.__class__.__name__}: {exc}"
                running.remove(p)
    env = environment.describe()
    versions = peer_versions()
    copy_gbps = timing.copy_bandwidth()
    console.print(f"[bold]peers[/] on {env.get('gpu')}, models {', '.join(m.name for m in model_list)}, "
                  f"{_dtypes.short_name(dtype)}: copy {copy_gbps:.0f} GB/s (same run); "
                  + ", ".join(f"{k} {v}" for k, v in versions.items()))
    for p, why in skipped.items():
        console.print(f"[yellow]skipped {p}: {why}[/]")
    compile_info = {"dynamic": compile_dynamic, "mode": "default", "first_calls": []}
    if "torch.compile" in running:
        tasks = plan_compiles(specs, model_list, ops, num_tokens, dtype, impls["torch.compile"])
        console.print(f"torch.compile (dynamic={dynamic}): {len(tasks)} compiles in this run")
        if dynamic is False:
            compile_info["prewarm"] = prewarm_compile(torch, tasks, compile_workers, dynamic, console)
    points, errors = [], []
    same_bytes_copies: dict = {}  # bytes moved -> GB/s of a copy moving them

    def document():
        return sweep.result_document("peers", environment=env, seed=seed, copy_gbps=copy_gbps,
                                     model=",".join(m.name for m in model_list), points=points,
                                     models=[m.name for m in model_list], peers_run=running, skipped=skipped,
                                     peer_versions=versions, torch_compile=compile_info, errors=errors,
                                     cold_flushed_warmup=timing.default_flushed_warmup())

    if torch is not None:
        enter_torch_graph_state(torch)
    stream = cupy.cuda.Stream(non_blocking=True)
    for model in model_list:
        for op in ops:
            spec = specs[op]
            size = spec.size_for_model(model)
            op_started = time.perf_counter()
            for n in num_tokens:
                if not spec.takes_tokens(n):
                    continue
                pristine = spec.for_model(model).make_inputs(np.random.default_rng(seed), n, size, dtype)
                cached = _cached_spec(spec, pristine)
                measured = [("cupykern", "", None)]
                if op in COMPOSITIONS and "cupy composition" in running:
                    measured.append(("cupy composition", "", COMPOSITIONS[op]))
                measured += [(p, f, impls[p][op][f]) for p in running if p in impls and op in impls[p]
                             for f in impls[p][op]]
                for peer, formulation, impl in measured:
                    name = impl_name(peer, formulation)
                    try:
                        with stream:
                            if peer == "cupykern":
                                point = sweep.measure(cached, n, size, dtype, seed=seed, copy_gbps=copy_gbps,
                                                      model=model, repeat=repeat)
                            elif peer == "cupy composition":
                                point = sweep.measure(cached, n, size, dtype, seed=seed, copy_gbps=copy_gbps,
                                                      model=model, impl=name, run=impl, repeat=repeat)
                            else:
                                with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
                                    point, first_s = measure_torch(torch, name, impl, cached, n, size, dtype,
                                                                   seed=seed, copy_gbps=copy_gbps, repeat=repeat,
                                                                   model=model)
                                if peer == "torch.compile":
                                    compile_info["first_calls"].append({"model": model.name, "op": op, "num_tokens": n,
                                                                        "formulation": formulation,
                                                                        "seconds": round(first_s, 3)})
                        stream.synchronize()
                    except Skip as why:
                        errors.append({"model": model.name, "op": op, "num_tokens": n, "impl": name,
                                       "skipped": str(why)})
                        continue
                    except Exception as exc:  # noqa: BLE001 - one failing peer must not end the run
                        stream.synchronize()
                        errors.append({"model": model.name, "op": op, "num_tokens": n, "impl": name,
                                       "error": f"{exc.__class__.__name__}: {exc}",
                                       "traceback": traceback.format_exc(limit=3)})
                        console.print(f"[red]{name} {op} {n}: {exc.__class__.__name__}: {exc}[/]")
                        continue
                    measured_point = point.as_dict()
                    if peer == "cupykern" and n > sweep.DECODE_MAX_TOKENS and measured_point.get("min_bytes"):
                        with stream:
                            own_copy = same_bytes_copy_gbps(measured_point["min_bytes"], same_bytes_copies)
                        measured_point["same_bytes_copy_gbps"] = own_copy
                        measured_point["pct_of_same_bytes_copy"] = 100.0 * measured_point["gbps"] / own_copy
                    points.append(measured_point)
                    if not point.check_ok:
                        console.print(f"[red]CHECK FAILED[/] {model.name} {op} {name} {n}x{size}: {point.check}")
                del pristine, cached
            cupy.get_default_memory_pool().free_all_blocks()
            if torch is not None:
                torch.cuda.empty_cache()
            console.print(f"{model.name} {op}: {time.perf_counter() - op_started:.0f} s "
                          f"({time.perf_counter() - started:.0f} s so far)")
            save(document(), out_dir)  # after every op, so a run cut short keeps what it measured
    first = compile_info["first_calls"]
    compile_info["first_call_s_total"] = round(sum(c["seconds"] for c in first), 1)
    if torch is not None:
        compile_info["cache_counters"] = _cache_counters(torch)
    if first:
        console.print(f"torch.compile first calls (trace, compile or cache load, autotune): "
                      f"{compile_info['first_call_s_total']:.0f} s over {len(first)} shapes; "
                      f"caches {compile_info.get('cache_counters')}")
    rows = ratio_rows(points, running)
    print_ratios(console, rows, running,
                 f"fastest correct formulation's time / cupykern time (> 1: cupykern faster), "
                 f"{_dtypes.short_name(dtype)}; oop: out of place, ip: in place, out=: into a given out")
    result = document()
    result["ratios"] = [{**r, **{p: list(r[p]) if r[p] else None for p in running},
                         "fastest": list(r["fastest"]) if r["fastest"] else None} for r in rows]
    result["wall_s"] = round(time.perf_counter() - started, 1)
    header = (f"peers at {env.get('commit')} on {env.get('gpu')}, {_dtypes.short_name(dtype)}, seed {seed}, "
              f"copy {copy_gbps:.0f} GB/s in the same run; " + ", ".join(f"{k} {v}" for k, v in versions.items())
              + f"; torch.compile dynamic={dynamic}")
    table = markdown_table(rows, list(num_tokens), header=header)
    console.print(table, markup=False, highlight=False, soft_wrap=True)
    path = save(result, out_dir)
    for folder in {RESULTS_DIR, *([out_dir] if out_dir else [])}:
        (Path(folder) / path.with_suffix(".md").name).write_text(table + "\n")
    console.print(f"saved {path} and .md beside it; {result['wall_s']:.0f} s in all")
    return result


def _name_list(known, what: str, default=None):
    """click callback: comma-separated names, each one of ``known`` (None: ``default``, or all of them)."""
    def callback(ctx, param, value):
        if value is None:
            return list(default or known)
        names = [v.strip() for v in value.split(",") if v.strip()]
        bad = [v for v in names if v not in known]
        if bad or not names:
            raise click.BadParameter(f"unknown {what} {bad or value!r}; known: {', '.join(known)}")
        return names
    return callback


def _default_workers() -> int:
    return max(1, min(8, (os.cpu_count() or 2) // 2))


@click.command(help=__doc__.splitlines()[0], context_settings=HELP_OPTIONS)
@click.option("--models", "models_csv", default=",".join(DEFAULT_MODELS), show_default=True, callback=model_names,
              help=f"comma-separated model presets giving the row sizes and constants ({', '.join(models.names())})")
@click.option("--model", "model_list", multiple=True, callback=model_names,
              help="one model preset (repeatable); replaces --models")
@click.option("--num-tokens", callback=positive_int_list, default=",".join(map(str, NUM_TOKENS)), show_default=True,
              help="comma-separated integers >= 1")
@click.option("--ops", callback=_name_list(tuple(all_specs()), "op", DEFAULT_OPS), default=None,
              help=f"comma-separated ops [default: {','.join(DEFAULT_OPS)}]")
@click.option("--peers", callback=_name_list(PEER_NAMES, "peer"), default=None,
              help=f"comma-separated of: {', '.join(PEER_NAMES)} [default: all]")
@click.option("--compile-dynamic", type=click.Choice(tuple(COMPILE_DYNAMIC)), default="false", show_default=True,
              help="torch.compile's dynamic: false compiles each shape (static, as the issue measured); "
                   "none: torch's default (a second shape recompiles dynamic)")
@click.option("--compile-workers", type=click.IntRange(min=0), default=_default_workers(),
              show_default="half the CPUs, at most 8",
              help="processes compiling the static torch.compile shapes ahead of the run (0: none, each "
                   "shape compiles when first measured)")
@click.option("--dtype", callback=dtype_option, default="bf16", show_default=True)
@click.option("--repeat", type=int, callback=positive_int, default=None, help="timed samples per point (>= 1)")
@click.option("--seed", type=click.IntRange(min=0), default=DEFAULT_SEED, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None, help="also write the JSON here")
def main(models_csv, model_list, num_tokens, ops, peers, compile_dynamic, compile_workers, dtype, repeat, seed,
         out) -> None:
    """Runs the comparison; exits 0 if every cupykern point validated, 1 if not, 2
    without a GPU or on bad arguments."""
    require_gpu("peers.py")
    result = run(model_list or models_csv, num_tokens, ops, peers, seed=seed, repeat=repeat, dtype=dtype, out_dir=out,
                 compile_dynamic=compile_dynamic, compile_workers=compile_workers)
    own = [p for p in result["points"] if p["impl"] == "cupykern"]
    sys.exit(0 if own and all(p["check_ok"] for p in own) else 1)


if __name__ == "__main__":
    main()
