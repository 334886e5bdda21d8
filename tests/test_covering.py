"""CPU: the covering set (cupykern/covering.py) covers what it promises.

What `cupykern check`, the no-GPU `cupykern sweep` and the compile test compile by
default: every source, every value of every template parameter of every kernel
template, and every instantiation the planner picks for the model presets; a subset
of the full product that `cupykern check --all` compiles.
"""

from __future__ import annotations

import numpy as np
import pytest

from cupykern import _dtypes, covering, families, jit, models, plans
from cupykern._arrays import Sig
from cupykern.ops import norm


@pytest.fixture(scope="module")
def full() -> dict:
    return families.instantiations()


@pytest.fixture(scope="module")
def cover() -> dict:
    return covering.instantiations()


def _values(exprs) -> set:
    """(kernel template, parameter position, value) of each name expression."""
    return {(name, i, v) for name, args in map(covering.template_args, exprs) for i, v in enumerate(args)}


def test_template_args_reads_what_kernel_template_spells():
    template = jit.KernelTemplate("norm.cu", "rms_norm_kernel")
    assert covering.template_args(template.expr("float", 256, 4, 4, True)) == \
        ("rms_norm_kernel", ("float", "256", "4", "4", "true"))
    assert covering.template_args(template.expr()) == ("rms_norm_kernel", ())
    assert covering.template_args("k<long long, 8>") == ("k", ("long long", "8"))


def test_every_source_is_in_the_covering_set(cover, full):
    assert sorted(cover) == sorted(full) == sorted(f"{family}.cu" for family in families.FAMILIES)
    assert all(cover[source] for source in cover)


def test_the_covering_set_is_a_small_subset_in_the_full_order(cover, full):
    for source, exprs in cover.items():
        assert len(exprs) == len(set(exprs))
        assert exprs == [e for e in full[source] if e in set(exprs)], source  # a subset, in the same order
    assert sum(map(len, cover.values())) < sum(map(len, full.values())) / 5


def test_every_template_parameter_value_is_covered(cover, full):
    for source in full:
        full_templates = {covering.template_args(e)[0] for e in full[source]}
        assert {covering.template_args(e)[0] for e in cover[source]} == full_templates, source
        missing = _values(full[source]) - _values(cover[source])
        assert not missing, f"{source}: template parameter values not compiled: {sorted(missing)}"


def test_the_planners_picks_for_the_presets_are_covered(cover, full):
    picked = covering.planned()
    assert sorted(picked) == sorted(full)  # every family's ops were planned for some preset
    for source, exprs in picked.items():
        assert set(exprs) <= set(full[source]), f"{source}: a pick outside families.instantiations()"
        assert set(exprs) <= set(cover[source]), source


def test_planned_picks_are_the_plan_rules(full):
    """Llama-3.1-8B's rms_norm at 4096 tokens in bf16: the row layout of plans.row_layout;
    a cache past the one-split limit plans split-KV attention and its combine."""
    llama = models.get("llama-3.1-8b")
    picked = covering.planned([llama], dtypes=[_dtypes.bfloat16], num_tokens=[4096])
    layout = plans.row_layout(4096, _dtypes.bfloat16, aligned=True, num_rows=4096, op="rms_norm")
    assert norm.RMS_NORM.expr(_dtypes.c_type(_dtypes.bfloat16), *layout.template_args(),
                              layout.fills(4096, _dtypes.bfloat16)) in picked["norm.cu"]
    assert covering.SHORT_CACHE_ROWS <= plans.ATTENTION_ONE_SPLIT_ROWS < llama.max_position_embeddings
    attention = {covering.template_args(e) for e in covering.planned([llama], num_tokens=[1])["attention.cu"]}
    assert {(name, args[3]) for name, args in attention if name == "decode_attention_kernel"} == \
        {("decode_attention_kernel", "false"), ("decode_attention_kernel", "true")}
    assert any(name == "attention_combine_kernel" for name, _ in attention)


def test_only_restricts_to_those_families(cover):
    assert covering.instantiations({"rope", "tokens"}) == {"rope.cu": cover["rope.cu"], "tokens.cu": cover["tokens.cu"]}


def _random_calls(rng: np.random.Generator, count: int):
    """``count`` random calls of the row ops, the gated activations and RoPE (shapes,
    dtypes, alignments, pairings, M-RoPE, position and table dtypes) beyond the sizes
    covering enumerates: what a user may pass."""
    def c(shape, dtype, align=0):
        return Sig.contiguous(tuple(int(s) for s in shape), np.dtype(dtype), int(align))

    for _ in range(count):
        dtype = _dtypes.DTYPES[rng.integers(len(_dtypes.DTYPES))]
        n = int(rng.choice([1, 3, 16, 64, 65, 256, 257, 300, 529, 4096, 16384]))
        align = int(rng.choice([0, 0, 2, 4, 8])) if np.dtype(dtype).itemsize == 2 else int(rng.choice([0, 0, 4, 8]))
        kind = rng.random()
        if kind < 0.35:
            hidden = int(rng.integers(1, 20000))
            yield from covering._row_calls(c((n, hidden), dtype, align), c((hidden,), dtype, align), 1e-6, 0.0)
        elif kind < 0.5:
            d = int(rng.integers(1, 40000))
            yield "silu_and_mul", dict(x=c((n, 2 * d), dtype, align))
            yield "gelu_and_mul", dict(x=c((n, 2 * d), dtype, align), approximate="tanh")
        else:
            head_dim = int(rng.integers(1, 150)) * 2
            rotary_dim = int(rng.integers(1, head_dim // 2 + 1)) * 2
            hq, hkv = int(rng.integers(1, 200)), int(rng.choice([0, 1, 2, 4, 8, 32]))
            q = c((n, hq, head_dim), dtype, align)
            k = c((n, hkv, head_dim), dtype, align) if hkv else None
            table = c((1024, rotary_dim), rng.choice([np.float32, dtype]), 0)
            positions = c((n,), rng.choice([np.int32, np.int64]))
            is_neox = bool(rng.random() < 0.6)
            yield "apply_rope", dict(q=q, k=k, positions=positions, cos_sin_cache=table, is_neox=is_neox,
                                     inplace=bool(rng.random() < 0.5))
            half = rotary_dim // 2
            if is_neox and half >= 3:
                t = int(rng.integers(0, half + 1))
                h = int(rng.integers(0, half - t + 1))
                yield "apply_rope", dict(q=q, k=k, positions=c((3, n), positions.dtype), cos_sin_cache=table,
                                         is_neox=True, inplace=bool(rng.random() < 0.5),
                                         mrope_section=(t, h, half - t - h),
                                         mrope_interleaved=bool(rng.random() < 0.5))
            if k is not None:
                weight = c((head_dim,), dtype, align)
                yield "qk_rms_norm_rope", dict(q=q, k=k, q_weight=weight, k_weight=weight, positions=positions,
                                               cos_sin_cache=table, eps=1e-6, is_neox=is_neox)


def test_heuristic_picks_hold_what_random_calls_launch():
    """covering.heuristic_picks() (the spill ledger's set, tests/data/known_spills.json) holds
    every kernel the H200 heuristics launch for random calls of the row ops, the gated
    activations and RoPE: its size classes are the planners' (helper 44's fuzz found
    RoPE's narrow vectors, M-RoPE and rows of non-power-of-two leaves outside it)."""
    picks = covering.heuristic_picks()
    launched = covering._picks(_random_calls(np.random.default_rng(20261202), 600), plans.H200_LIMITS)
    missing = {source: sorted(set(exprs) - picks.get(source, set())) for source, exprs in launched.items()}
    assert not any(missing.values()), missing
    assert {"norm.cu", "activation.cu", "rope.cu"} <= set(launched)


def test_picks_raise_a_plan_that_fails_its_own_checks_and_skip_refused_shapes():
    """covering._picks skips a call the op refuses (a plain ValueError of its intake) but
    raises plans.PlanError: on a made-up GPU of 64-thread blocks the row heuristic's
    256-thread block fails the planner's own check, and hiding that would leave its
    kernels out of the spill ledger's reach."""
    x = Sig.contiguous((1, 4096), np.dtype(np.float32), 0)
    row = Sig.contiguous((4096,), np.dtype(np.float32), 0)
    calls = [("rms_norm", dict(x=x, weight=row, eps=1e-6, weight_offset=0.0))]
    small = plans.DeviceLimits(name="made up", sm_count=132, max_threads_per_block=64)
    with pytest.raises(plans.PlanError, match="block size .* at most 64"):
        covering._picks(calls, small)
    refused = [("rms_norm", dict(x=x, weight=Sig.contiguous((100,), np.dtype(np.float32), 0), eps=1e-6,
                                 weight_offset=0.0))]
    assert covering._picks(refused, plans.H200_LIMITS) == {}
    assert list(covering._picks(calls, plans.H200_LIMITS)) == ["norm.cu"]
    # Bad device counts never reach it: DeviceLimits refuses them where built (test_plans.py).


def test_any_size_enumerations_launch_only_the_sources_they_declare():
    """covering.ANY_SIZE_CALLS names the sources each any-size enumeration reaches, and
    heuristic_picks(sources=...) skips the enumerations that reach none of them: each
    enumeration's picks lie in its declared sources, and a restricted call gives the
    full set's entries for those sources."""
    for calls, reach in covering.ANY_SIZE_CALLS:
        picks = covering._picks((call for dtype in _dtypes.DTYPES for call in calls(dtype)), plans.H200_LIMITS)
        assert set(picks) <= set(reach), (calls.__name__, sorted(picks))
    full = covering.heuristic_picks()
    for sources in ({"norm.cu"}, {"gemv.cu", "activation.cu"}):
        assert covering.heuristic_picks(sources=sources) == {s: full[s] for s in sources}
    for bad in ("norm.cu", ["norm.cu", 3]):  # a bare string would be read as its letters
        with pytest.raises(TypeError, match="sources: expected None or a collection of source file names"):
            covering.heuristic_picks(sources=bad)
    for bad in ({"softmax"}, {"kernels_cu/softmax.cu", "softmax.cu"}):  # a family, a path: no source's name
        with pytest.raises(ValueError, match="sources: .* are not kernel sources"):
            covering.heuristic_picks(sources=bad)
    with pytest.raises(TypeError, match="limits: expected a plans.DeviceLimits, got str"):
        covering.heuristic_picks(limits="H200")


def test_instantiations_take_one_family_by_name_and_refuse_unknown_ones():
    """Helper 71: ``instantiations("rope")`` iterated the string's letters and answered {}."""
    assert families.instantiations("rope") == families.instantiations(["rope"])
    assert list(families.instantiations("rope")) == ["rope.cu"]
    with pytest.raises(ValueError, match=r"only: expected kernel family names from .*, got unknown 'ropes'$"):
        families.instantiations(["rope", "ropes"])
    with pytest.raises(ValueError, match=r"got unknown 'e', 'o', 'p', 'r'$"):
        covering.instantiations(list("rope"))


@pytest.mark.parametrize("only, error, match", [
    ([], ValueError, r"only: expected at least one family name"), (set(), ValueError, r"at least one family name"),
    (5, TypeError, r"only: expected a family name or an iterable of them, got 5"),
    (b"gemv", TypeError, r"only: expected a family name or an iterable of them"),
    ([["gemv"]], TypeError, r"only: expected family names \(str\)"),
])
def test_instantiations_refuse_what_is_not_a_family_name(only, error, match):
    """Helper 74: [] answered {} (nothing to compile), 5 and b"gemv" gave messages that did
    not name ``only``."""
    with pytest.raises(error, match=match):
        families.instantiations(only)
