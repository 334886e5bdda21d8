"""CPU: the covering set (cupykern/covering.py) covers what it promises.

What `cupykern check`, the no-GPU `cupykern sweep` and the compile test compile by
default: every source, every value of every template parameter of every kernel
template, and every instantiation the planner picks for the model presets; a subset
of the full product that `cupykern check --all` compiles.
"""

from __future__ import annotations

import pytest

from cupykern import _dtypes, covering, families, jit, models, plans
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
    layout = plans.row_layout(4096, _dtypes.bfloat16, aligned=True, num_rows=4096)
    assert norm.RMS_NORM.expr(_dtypes.c_type(_dtypes.bfloat16), *layout.template_args(),
                              layout.fills(4096, _dtypes.bfloat16)) in picked["norm.cu"]
    assert covering.SHORT_CACHE_ROWS <= plans.ATTENTION_ONE_SPLIT_ROWS < llama.max_position_embeddings
    attention = {covering.template_args(e) for e in covering.planned([llama], num_tokens=[1])["attention.cu"]}
    assert {(name, args[3]) for name, args in attention if name == "decode_attention_kernel"} == \
        {("decode_attention_kernel", "false"), ("decode_attention_kernel", "true")}
    assert any(name == "attention_combine_kernel" for name, _ in attention)


def test_only_restricts_to_those_families(cover):
    assert covering.instantiations({"rope", "tokens"}) == {"rope.cu": cover["rope.cu"], "tokens.cu": cover["tokens.cu"]}
