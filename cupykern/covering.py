"""The covering set: the few kernel instantiations a first run compiles instead of all.

``cupykern.families.instantiations()`` is the full cross product the ops can launch
(dtype x layout x variant: 6908 name expressions, most in norm.cu, quant.cu and rope.cu), which
takes minutes to compile with NVRTC. :func:`instantiations` picks a subset of it that
still compiles every line a user's first call can reach:

* every source file of the families;
* every value of every template parameter at least once, per kernel template (each
  dtype, each vector width, each threads-per-row, each flag);
* every instantiation the planner picks for the model presets of ``cupykern.models``
  in each dtype at the num_tokens of :data:`NUM_TOKENS` (:func:`planned`), on an
  H200 with the heuristics (a tuned file is ignored).

The picks come from each op's own intake spec and plan rule (``launcher.Op.prepare``)
run on call signatures (``_arrays.Sig``), so no GPU is needed. ``cupykern check``, the
no-GPU fallback of ``cupykern sweep`` and the compile tests take it from here;
``cupykern check --all`` and ``pytest --compile-all`` compile the full product.
:func:`heuristic_picks` (the presets' picks, and the row kernels, the gated activations
and RoPE at any size) is what the heuristics launch, whose register spills
tests/data/known_spills.json records.
"""

from __future__ import annotations

import itertools
import re

import numpy as np

from cupykern import _dtypes, families, launcher, models, plans, tuning
from cupykern._arrays import Sig

#: num_tokens the planner's picks are taken at: decode (1, 16), a small batch, 1024 (apply_rope's
#: token kernel in the prefill layout's heads, plans.ROPE_TOKEN_MAX_TOKENS_PER_SM), prefill,
#: and 6144 (rms_norm's prefill layout for llama-3.1-8b's rows, past
#: plans.DECODE_FILL_SHARE_FILLED's 4224).
NUM_TOKENS = (1, 16, 64, 1024, 4096, 6144)

#: Rows of the KV cache and cos/sin table below the presets' context length: decode
#: attention splits the cache past plans.ATTENTION_ONE_SPLIT_ROWS rows, so both paths are planned.
SHORT_CACHE_ROWS = 1024

#: Vocabulary of the logits and embedding table (Llama 3's).
VOCAB_SIZE = 128256

_EXPR = re.compile(r"^(\w+)(?:<(.*)>)?$")
_INT32, _INT64, _FLOAT32 = np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.float32)


def template_args(expr: str) -> tuple[str, tuple[str, ...]]:
    """``("rms_norm_kernel", ("float", "256", "4", "4", "32"))`` of a name expression
    as ``jit.KernelTemplate.expr`` spells it (no nested templates)."""
    name, args = _EXPR.match(expr).groups()
    return name, tuple(a.strip() for a in args.split(",")) if args else ()


def _c(shape, dtype, align: int = 0) -> Sig:
    return Sig.contiguous(tuple(shape), np.dtype(dtype), align)


def _calls(model: models.ModelPreset, dtype, n: int):
    """(op name, {argument: Sig or scalar}) of the calls a decoder layer of ``model`` makes
    with ``n`` tokens in ``dtype``, as the registry's inputs shape them (cupykern/registry)."""
    h, inter, d = model.hidden_size, model.intermediate_size, model.head_dim
    hq, hkv = model.num_attention_heads, model.num_key_value_heads
    eps = model.rms_norm_eps
    x, row = _c((n, h), dtype), _c((h,), dtype)
    yield from _row_calls(x, row, eps, model.norm_weight_offset)
    yield "silu_and_mul", dict(x=_c((n, 2 * inter), dtype))
    yield "gelu_and_mul", dict(x=_c((n, 2 * inter), dtype), approximate=model.gelu_approximate)
    yield "swiglu", dict(gate=_c((n, inter), dtype), up=_c((n, inter), dtype))
    scale = _c((1,), _FLOAT32)
    yield "silu_and_mul_quant", dict(x=_c((n, 2 * inter), dtype), scale=scale)
    q, k, v = _c((n, hq, d), dtype), _c((n, hkv, d), dtype), _c((n, hkv, d), dtype)
    for rows in (SHORT_CACHE_ROWS, model.max_position_embeddings):
        table = _c((rows, model.rotary_dim), _FLOAT32)
        kv_cache = _c((rows, hkv, d), dtype)
        for index in (_INT32, _INT64):
            positions = _c((n,), index)
            for inplace in (True, False):  # rope.cu's kInPlace: an instantiation each
                yield "apply_rope", dict(q=q, k=k, positions=positions, cos_sin_cache=table, is_neox=True,
                                         inplace=inplace)
                if model.mrope_section is not None:  # M-RoPE prefill: (3, n) positions
                    yield "apply_rope", dict(q=q, k=k, positions=_c((3, n), index), cos_sin_cache=table, is_neox=True,
                                             inplace=inplace, mrope_section=model.mrope_section,
                                             mrope_interleaved=model.mrope_interleaved)
            yield "qk_rms_norm_rope", dict(q=q, k=k, q_weight=_c((d,), dtype), k_weight=_c((d,), dtype),
                                           positions=positions, cos_sin_cache=table, eps=eps, is_neox=True)
            yield "rope_kv_append", dict(q=q, k=k, v=v, positions=positions, cos_sin_cache=table, k_cache=kv_cache,
                                         v_cache=kv_cache, is_neox=True)
            yield "decode_attention", dict(q=q, k_cache=kv_cache, v_cache=kv_cache, positions=positions)
            yield "prefill_attention", dict(q=q, k_cache=kv_cache, v_cache=kv_cache, positions=positions)
            if n <= max(plans.GEMV_MAX_TOKENS):  # the gemv family takes decode sizes only
                yield "rms_norm_gemv_rope_kv_append", dict(
                    x=x, norm_weight=row, qkv_weight=_c(((hq + 2 * hkv) * d, h), dtype), positions=positions,
                    cos_sin_cache=table, k_cache=kv_cache, v_cache=kv_cache, eps=eps, is_neox=True)
    logits = _c((n, VOCAB_SIZE), _FLOAT32)
    for temperature, positions in ((0.0, None), (0.7, _c((n,), _INT32))):  # greedy; seeded draw
        yield "sample_tokens", dict(logits=logits, positions=positions, temperature=temperature, seed=0)
    yield "embedding", dict(token_ids=_c((n,), _INT32), weight=_c((VOCAB_SIZE, h), dtype))
    yield "append_tokens", dict(tokens=_c((n,), _INT32), positions=_c((n,), _INT32), history=_c((n, 4096), _INT32))
    if n <= max(plans.GEMV_MAX_TOKENS):
        yield "gemv_add_residual", dict(x=_c((n, hq * d), dtype), weight=_c((h, hq * d), dtype), residual=x)
        yield "gemv_add_residual", dict(x=_c((n, inter), dtype), weight=_c((h, inter), dtype), residual=x)
        yield "rms_norm_gemv_silu_and_mul", dict(x=x, norm_weight=row, gate_up_weight=_c((2 * inter, h), dtype),
                                                 eps=eps)
        for out_dtype in (None, _FLOAT32):  # QKV in the model's dtype; the LM head's float32 logits
            yield "rms_norm_gemv", dict(x=x, norm_weight=row, weight=_c(((hq + 2 * hkv) * d, h), dtype), eps=eps,
                                        out_dtype=out_dtype)
            yield "gemv", dict(x=x, weight=_c((VOCAB_SIZE, h), dtype), out_dtype=out_dtype)


def _row_calls(x: Sig, row: Sig, eps: float, offset: float):
    """(op name, arguments) of every row kernel's op on rows ``x`` with weight/bias ``row``."""
    yield "rms_norm", dict(x=x, weight=row, eps=eps, weight_offset=offset)
    yield "fused_add_rms_norm", dict(x=x, residual=x, weight=row, eps=eps, weight_offset=offset)
    yield "layer_norm", dict(x=x, weight=row, bias=row, eps=1e-5)
    for out in (None, _c(x.shape, x.dtype, x.align)):  # float32 out by default, or x's dtype
        yield "softmax", dict(x=x, out=out, temperature=1.0)
    for op in ("sum", "max", "min", "sumsq"):
        yield "row_reduce", dict(x=x, op=op)
    scale = _c((1,), _FLOAT32)
    yield "rms_norm_quant", dict(x=x, weight=row, scale=scale, eps=eps, weight_offset=offset)
    yield "fused_add_rms_norm_quant", dict(x=x, residual=x, weight=row, scale=scale, eps=eps, weight_offset=offset)
    yield "rms_norm_dynamic_per_token_quant", dict(x=x, weight=row, eps=eps, weight_offset=offset)
    yield "fused_add_rms_norm_dynamic_per_token_quant", dict(x=x, residual=x, weight=row, eps=eps,
                                                            weight_offset=offset)


def _any_row_calls(dtype):
    """The row ops' calls (:func:`_row_calls`) at every size class their planner tells
    apart: rows of each tree width (1 to plans.MAX_TREE_COLUMNS leaves, and past it),
    whole, one element short of their last leaf, and of whole leaves short of the width
    (3 x 2**(k-1) leaves: the walk with bounds on 16-byte vectors, as 5120-element bf16
    rows take), 16-byte aligned or 4 bytes off (the scalar path), at decode and prefill
    row counts (2**24 rows: past any fill of the GPU for the narrowest rows,
    plans.DECODE_FILL_SHARE), at each row limit of plans.EXACT_WALK and one past it, and at
    the fewest rows of plans.REREAD and one short of them."""
    width = plans.leaf_width(dtype)
    exact_limits = {most + extra for _, most in plans.EXACT_WALK.values() if most is not None for extra in (0, 1)}
    row_limits = {plans.reread_limits(op)[0] + extra for op in plans.REREAD for extra in (-1, 0)}
    row_counts = sorted({1, plans.DECODE_MAX_ROWS, plans.DECODE_MAX_ROWS + 1, 4096, 1 << 24, *exact_limits,
                         *row_limits})
    for k in range(plans.MAX_TREE_COLUMNS.bit_length() + 1):
        short_leaves = {(3 * width << k) // 2} if k else set()
        for hidden_size in {width << k, max(1, (width << k) - 1), *short_leaves}:
            for align in (0, 4):
                row = _c((hidden_size,), dtype, align)
                for n in row_counts:
                    yield from _row_calls(_c((n, hidden_size), dtype, align), row, 1e-6, 0.0)


#: Output widths d of the gated activations at which their planner's choices differ: odd
#: and short rows (scalar and narrow vectors, the scalar tail), each vector width's
#: multiples, the presets' intermediate sizes, and rows past a wave of 16-byte vectors.
ANY_GATED_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 100, 1000, 1024, 4100, 11008, 14336, 28672, 1 << 20)

#: (head_dim, rotary_dim) of RoPE at which its planner's vector width, threads a head and
#: wide/steps kernels differ: full and partial rotary (GPT-NeoX's quarter, Phi's half,
#: StableLM's 20 of 80), head sizes 32-296 (past 256: qk_rms_norm_rope's 32-lane groups
#: with more than one unit a lane), halves that are 4 mod 8 (16-bit 8-byte vectors), 2
#: mod 4 (fp32's) and odd (scalar access).
ANY_ROPE_HEADS = ((32, 32), (64, 64), (64, 32), (72, 72), (80, 80), (80, 40), (80, 20), (44, 44), (96, 96),
                  (128, 128), (128, 64), (128, 32), (240, 96), (256, 256), (256, 128), (288, 120), (296, 272), (6, 6))

#: (num_q_heads, num_kv_heads) of RoPE: q alone, MHA, GQA from 8 to 128 q heads, counts
#: that are no multiple of the wide kernel's head slots, a count past what one round of a
#: token's threads holds (the steps kernel), and for each of qk_rms_norm_rope's row groups
#: of 8, 16 and 32 lanes a count that each of its heads-a-thread choices is the fewest to
#: hold in one round (16 / 23 / 31 heads with 32 lanes, 32 / 40 / 56 with 16, 40 / 72 /
#: 120 with 8).
ANY_ROPE_HEAD_COUNTS = ((8, 0), (12, 4), (16, 16), (20, 3), (28, 3), (32, 8), (48, 8), (64, 8), (112, 8), (128, 8),
                        (192, 0), (192, 8))


def _any_gated_calls(dtype):
    """The gated activations' calls at every size class their planner tells apart
    (:data:`ANY_GATED_WIDTHS`, 16-byte aligned or 4 bytes off, decode to prefill row
    counts and past the device's 2-D grid of rows)."""
    scale = _c((1,), _FLOAT32)
    for d in ANY_GATED_WIDTHS:
        for align in (0, 4):
            for n in (1, 16, 64, 4096, 70_000):
                if n * d > 1 << 31:  # the int32 element counts of the intake
                    continue
                x = _c((n, 2 * d), dtype, align)
                yield "silu_and_mul", dict(x=x)
                for approximate in ("none", "tanh"):
                    yield "gelu_and_mul", dict(x=x, approximate=approximate)
                yield "swiglu", dict(gate=_c((n, d), dtype, align), up=_c((n, d), dtype, align))
                yield "silu_and_mul_quant", dict(x=x, scale=scale)


def _any_rope_calls(dtype):
    """apply_rope's and qk_rms_norm_rope's calls at every size class their planner tells
    apart (:data:`ANY_ROPE_HEADS` x :data:`ANY_ROPE_HEAD_COUNTS`, NeoX and GPT-J pairs,
    int32 and int64 positions, a float32 or ``dtype`` cos/sin table, decode and prefill
    token counts, and 1024 tokens for apply_rope in place without M-RoPE (its token kernel
    in the prefill layout's heads, plans.ROPE_TOKEN_MAX_TOKENS_PER_SM); q, k and the table
    16-byte aligned or 8, 4 or 2 bytes off: narrower vectors), and M-RoPE's two layouts on
    each of them.
    Position dtype, pairing and in place or not change the instantiation only; alignment,
    head sizes and counts and num_tokens the plan."""
    aligns = (0, 8, 4, 2) if np.dtype(dtype).itemsize == 2 else (0, 8, 4)
    for (head_dim, rotary_dim), (hq, hkv), align in itertools.product(ANY_ROPE_HEADS, ANY_ROPE_HEAD_COUNTS, aligns):
        for n in (1, 1024, 4096):  # decode, apply_rope's token band, prefill (plans.ROPE_*TOKENS_PER_SM)
            band_only = n == 1024  # a size class of in-place apply_rope without M-RoPE alone
            q = _c((n, hq, head_dim), dtype, align)
            k = _c((n, hkv, head_dim), dtype, align) if hkv else None
            for table_dtype, index in itertools.product({_FLOAT32, np.dtype(dtype)}, (_INT32, _INT64)):
                table = _c((SHORT_CACHE_ROWS, rotary_dim), table_dtype, 0 if align % table_dtype.itemsize else align)
                positions = _c((n,), index)
                for is_neox in (True, False):
                    # In place and out of place launch an instantiation each (rope.cu's
                    # kInPlace); out of place plans as in place (its outputs are new, aligned).
                    for inplace in (True,) if band_only else (True, False):
                        yield "apply_rope", dict(q=q, k=k, positions=positions, cos_sin_cache=table,
                                                 is_neox=is_neox, inplace=inplace)
                    if k is not None and not band_only:
                        weight = _c((head_dim,), dtype, align)
                        yield "qk_rms_norm_rope", dict(q=q, k=k, q_weight=weight, k_weight=weight,
                                                       positions=positions, cos_sin_cache=table, eps=1e-6,
                                                       is_neox=is_neox)
                half = rotary_dim // 2
                if half >= 3 and not band_only:  # M-RoPE (NeoX pairs only): sectioned and interleaved
                    section = (half - 2 * (half // 3), half // 3, half // 3)
                    for interleaved, inplace in itertools.product((False, True), (True, False)):
                        yield "apply_rope", dict(q=q, k=k, positions=_c((3, n), index), cos_sin_cache=table,
                                                 is_neox=True, inplace=inplace, mrope_section=section,
                                                 mrope_interleaved=interleaved)


def _launched(launch: launcher.Launch | None):
    """(source, name expression) of each kernel a Launch starts (a split attention starts two)."""
    while launch is not None and launch.template is not None:
        yield launch.template.source, launch.template.expr(*launch.template_args)
        launch = launch.then


def _picks(calls, limits: plans.DeviceLimits) -> dict[str, list]:
    """{source: [name expressions]} the ops' intake and plan rule pick for ``calls``
    ((op name, arguments) pairs) on a GPU of ``limits``, with the heuristics (a tuned file
    is not read). A call an op refuses (Gemma's head_dim 256 in decode_attention, say)
    has no pick; a plan that fails the planner's own checks (plans.PlanError: a block
    past ``limits``, say) is raised, not taken for a refusal."""
    families.modules("ops")  # the family modules declare their ops on import
    ops = launcher.ops()
    picked: dict[str, list] = {}
    with tuning.suspended():
        for name, values in calls:
            op = ops[name]
            args = {a: values.get(a) for a in (*op.arrays, *op.scalars)}
            try:
                launch = op.prepare(launcher.Args(name, args, device=0, limits=limits))
            except plans.PlanError:
                raise
            except ValueError:  # shapes the op does not take
                continue
            for source, expr in _launched(launch):
                if expr not in picked.setdefault(source, []):
                    picked[source].append(expr)
    return picked


def planned(presets=None, dtypes=_dtypes.DTYPES, num_tokens=NUM_TOKENS, limits=plans.H200_LIMITS) -> dict[str, list]:
    """{source: [name expressions]} the planner picks for ``presets`` (default: every
    preset of cupykern.models) in ``dtypes`` at ``num_tokens``, on a GPU of ``limits``.

    Runs each op's intake and plan rule on call signatures, no GPU (:func:`_picks`).
    """
    return _picks((call for model in presets or models.PRESETS.values() for dtype in dtypes for n in num_tokens
                   for call in _calls(model, dtype, n)), limits)


#: The any-size enumerations and the sources whose kernels their calls launch (a test
#: holds each to its sources): RoPE's takes most of heuristic_picks' time (about 14 of
#: 18 s on one core: apply_rope is planned in place and out of place, an instantiation
#: each), so a caller that needs the picks of other sources skips it.
ANY_SIZE_CALLS = ((_any_row_calls, ("norm.cu", "softmax.cu", "row_reduce.cu", "quant.cu")),
                  (_any_gated_calls, ("activation.cu", "quant.cu")),
                  (_any_rope_calls, ("rope.cu",)))


def planned_any_size(dtypes=_dtypes.DTYPES, limits=plans.H200_LIMITS, sources=None) -> dict[str, list]:
    """{source: [name expressions]} the planner picks for the row ops (norms, softmax,
    row_reduce, the FP8 norms), the gated activations and RoPE at any size: every size
    class their planners tell apart (:data:`ANY_SIZE_CALLS`), so every kernel of theirs
    the heuristics can launch; only the enumerations that reach ``sources`` (source
    file names; None: all)."""
    sources = _source_names(sources)
    chosen = [calls for calls, reach in ANY_SIZE_CALLS if sources is None or set(reach) & sources]
    return _picks((call for dtype in dtypes for calls in chosen for call in calls(dtype)), limits)


def _source_names(sources) -> frozenset | None:
    """``sources`` (None, or an iterable of source file names such as "norm.cu") as a
    frozenset; TypeError for a bare string or a name that is not a str, ValueError for a
    name that is no family's source (kernels_cu/<family>.cu, cupykern.families)."""
    if sources is None:
        return None
    try:
        names = None if isinstance(sources, (str, bytes)) else frozenset(sources)
    except TypeError:  # not iterable, or unhashable names
        names = None
    if names is None or not all(isinstance(name, str) for name in names):
        raise TypeError(f"sources: expected None or a collection of source file names such as {{'norm.cu'}}, "
                        f"got {sources!r}")
    known = {f"{family}.cu" for family in families.FAMILIES}
    if names - known:
        raise ValueError(f"sources: {sorted(names - known)} are not kernel sources (expected names of {sorted(known)})")
    return names


def heuristic_picks(limits=plans.H200_LIMITS, sources=None) -> dict[str, set]:
    """{source: {name expressions}} the heuristics launch for the presets' calls
    (:func:`planned`: their sizes, 16-byte aligned, NeoX RoPE) and for the row ops, the
    gated activations and RoPE at any size (:func:`planned_any_size`), for every source,
    or for the source file names in ``sources`` alone (faster: enumerations that reach
    none of them are skipped). Their register spills to local memory are those
    tests/data/known_spills.json records (tests/test_jit_compile.py; ``cupykern check``
    counts them); a layout reached only through an override or a tuned file is not held
    to it."""
    if not isinstance(limits, plans.DeviceLimits):
        raise TypeError(f"limits: expected a plans.DeviceLimits, got {type(limits).__name__}")
    sources = _source_names(sources)
    picks: dict[str, set] = {}
    for part in (planned(limits=limits), planned_any_size(limits=limits, sources=sources)):
        for source, exprs in part.items():
            if sources is None or source in sources:
                picks.setdefault(source, set()).update(exprs)
    return picks


def _coverage(expr: str) -> set:
    """What compiling ``expr`` covers: its kernel template (position -1) and each
    (template, parameter position, value)."""
    name, args = template_args(expr)
    return {(name, -1, ""), *((name, i, v) for i, v in enumerate(args))}


def instantiations(only=None) -> dict[str, list[str]]:
    """The covering set, as {source file: [name expressions]} in the order of
    ``families.instantiations(only)`` (``only``: a family name or names; ValueError for
    a name that is not a family).

    The planner's picks (:func:`planned`) first, then, greedily, the instantiation that
    adds the most template-parameter values not yet covered, until every value of the
    full product is covered (per kernel template and parameter position).
    """
    full = families.instantiations(only)
    picks = planned()
    chosen: dict[str, list[str]] = {}
    for source, exprs in full.items():
        coverage = {e: _coverage(e) for e in exprs}
        keep = set(picks.get(source, ())) & set(exprs)
        covered = set().union(*(coverage[e] for e in keep))
        while True:
            best = max(exprs, key=lambda e: len(coverage[e] - covered))
            if not coverage[best] - covered:
                break
            keep.add(best)
            covered |= coverage[best]
        chosen[source] = [e for e in exprs if e in keep]
    return chosen
