"""Variants of one call side by side, for the experiments kept under bench/results/ (each
a script run on the device through bench/gpu_session.sh's BENCHES): cupykern.plans'
constants set per variant, outputs compared bit for bit, timing rounds interleaved so that
a drift over the call (a few hundredths of a microsecond: bench/results/NOTES.md, items
16-19) falls on every variant alike.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

from cupykern import launcher, plans, timing


def option(name: str, default: str) -> str:
    """The command-line value after ``name`` (``--tag``, ``--sizes``...), else ``default``:
    the few options of the experiment scripts under bench/results/."""
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def template_args(kernel) -> tuple:
    """The template arguments cupykern.jit compiled ``kernel`` (a RawKernel it returned)
    with, from its cache's key: to compile a variant of the same instantiation."""
    from cupykern import jit

    return next(key[2] for key, value in jit._kernels.items() if value is kernel)


@contextlib.contextmanager
def plan_constants(values: dict):
    """cupykern.plans' constants set to ``values`` inside the block, the launcher's recipe
    caches emptied on entry and on exit (so the calls inside plan again). AttributeError
    for a name plans does not have."""
    saved = {name: getattr(plans, name) for name in values}
    try:
        for name, value in values.items():
            setattr(plans, name, value)
        launcher.clear_caches()
        yield
    finally:
        for name, value in saved.items():
            setattr(plans, name, value)
        launcher.clear_caches()


def under(values: dict, fn: Callable) -> Callable:
    """``fn`` as a callable that runs under :func:`plan_constants` ``values``. Each call plans
    again (host time in the hundreds of microseconds): time it behind
    :func:`cupykern.timing.time_cold`'s hold or in a graph, not by host clocks."""
    def call():
        with plan_constants(values):
            return fn()
    return call


def same_bits(a: tuple, b: tuple) -> bool:
    """Whether two tuples of device arrays have the same shapes, dtypes and bytes."""
    import cupy

    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype
        and bool((cupy.ascontiguousarray(x).view(cupy.uint8) == cupy.ascontiguousarray(y).view(cupy.uint8)).all())
        for x, y in zip(a, b))


def outputs_from(fns: dict[str, Callable], arrays: tuple, start: tuple) -> dict[str, tuple]:
    """Each of ``fns`` run once from the same start: the device ``arrays`` the calls write in
    place are reset to ``start`` (copies of them, same shapes) before each call, and copied
    after it. Returns {name: tuple of those copies}, for :func:`same_bits`."""
    outs = {}
    for name, fn in fns.items():
        for array, initial in zip(arrays, start, strict=True):
            array[...] = initial
        fn()
        outs[name] = tuple(array.copy() for array in arrays)
    return outs


def time_rounds(fns: dict[str, Callable], timer: Callable | dict[str, Callable] = timing.time_cold,
                rounds: int = 3) -> dict[str, list[float]]:
    """Median microseconds of each of ``fns`` in each of ``rounds`` rounds, by ``timer(fn) ->
    timing.Timing`` (one timer for all, or one by name); the order turns by one each round,
    so no variant always runs first."""
    timers = timer if isinstance(timer, dict) else dict.fromkeys(fns, timer)
    names = list(fns)
    medians: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            medians[name].append(timers[name](fns[name]).median_us)
    return medians


def liger_rope_on_rows(q, k, rows, head_dim: int) -> Callable:
    """Liger-Kernel's RoPE (``LigerRopeFunction``) rotating ``q`` (num_tokens, q heads,
    head_dim) and ``k`` (num_tokens, kv heads, head_dim) in place, as a callable to time:
    ``rows`` are the fp32 cos_sin_cache rows of the tokens' positions (num_tokens,
    rotary_dim), gathered before the timed call as bench/peers.py's "cos/sin fp32" form
    (Liger takes cos and sin per token, each of rotary_dim, halves repeated). Imports
    torch and liger_kernel (the device image has torch; .whl/ carries Liger)."""
    import cupy
    import torch
    from liger_kernel.ops.rope import LigerRopeFunction

    num_tokens, half = q.shape[0], rows.shape[1] // 2
    cos = torch.from_dlpack(cupy.concatenate([rows[:, :half]] * 2, axis=1)[None])
    sin = torch.from_dlpack(cupy.concatenate([rows[:, half:]] * 2, axis=1)[None])
    qt, kt = torch.from_dlpack(q), torch.from_dlpack(k)

    def call():
        LigerRopeFunction.apply(qt.view(1, num_tokens, -1, head_dim).transpose(1, 2),
                                kt.view(1, num_tokens, -1, head_dim).transpose(1, 2), cos, sin)
    return call


def peer_call(op: str, peer: str, form: str, inputs: dict) -> Callable:
    """bench/peers.py's ``peer`` ("liger" or "torch.compile") in its formulation ``form``
    (e.g. "" for Liger's rms_norm, "out of place") of ``op``, on copies of ``inputs`` (the
    registry's): a callable as the peers run times it (a torch.compile form compiles on
    its first call)."""
    import torch

    from bench import peers

    table = {"liger": peers._liger, "torch.compile": peers._torch_compile}[peer](torch)
    return peers._prepare(torch, table[op][form], peers._copy_inputs(inputs))


def rope_points(rng, model_names, sizes, *, with_weights: bool = False):
    """For each preset of ``model_names`` and each size of ``sizes``: (model preset,
    num_tokens, inputs, start), where inputs are bf16 RoPE inputs as the registry's
    (cupykern.registry.rope: q, k, positions random into the preset's whole cos_sin_cache,
    and q_weight / k_weight with ``with_weights``) and start is copies of (q, k), for
    :func:`outputs_from`. Made one point at a time, as the loop asks for them (the
    previous point's arrays are freed once the caller drops them too)."""
    import cupykern
    from cupykern import models
    from cupykern.registry.rope import _rope_inputs

    for model_name in model_names:
        model = models.get(model_name)
        for n in sizes:
            inputs = _rope_inputs(rng, n, model.head_dim, cupykern.bfloat16, model=model, with_weights=with_weights)
            yield model, n, inputs, (inputs["q"].copy(), inputs["k"].copy())
