"""CPU: the kernel instantiations compile with NVRTC.

No GPU or driver is needed: NVRTC is called directly with the options CuPy 14.2 uses
at run time (jit.nvrtc_options), for sm_80 and sm_90. By default the covering set
(cupykern.covering.instantiations(): every source, every template parameter value,
the planner's picks for the model presets) is compiled, which keeps README's test
command within minutes on 2 cores; ``pytest --compile-all`` compiles every
instantiation the package can launch (cupykern.families.instantiations()), as CI does.
Each compile reports ptxas's register spills, held against tests/data/known_spills.json
for the kernels the heuristics launch. Chunks run on all CPU cores once per session;
each (source, arch) is one test. This is the only place the suite compiles a whole set:
the family test files check its size and names, and compile only the few
instantiations whose register use they inspect.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ProcessPoolExecutor

import pytest

from cupykern import _dtypes, covering, families, jit, plans
from tests import known_spills

ARCHS = ("80", "90")
CHUNK = 64


def _compile_chunk(job):
    filename, exprs, arch = job
    try:
        return filename, arch, jit.nvrtc_spills(filename, exprs, arch), None
    except RuntimeError as exc:
        return filename, arch, {}, str(exc)[:4000]


@pytest.fixture(scope="module")
def to_compile(request) -> dict:
    """{source: [name expressions]}: the covering set, or every instantiation with --compile-all."""
    return families.instantiations() if request.config.getoption("--compile-all") else covering.instantiations()


@pytest.fixture(scope="module")
def compiled(to_compile):
    jobs = [(f, exprs[i:i + CHUNK], arch) for f, exprs in to_compile.items() for arch in ARCHS
            for i in range(0, len(exprs), CHUNK)]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(_compile_chunk, jobs))
    summary: dict = {}
    for filename, arch, spills, error in results:
        entry = summary.setdefault((filename, arch), {"spills": {}, "errors": []})
        entry["spills"].update(spills)
        if error:
            entry["errors"].append(error)
    return summary


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("filename", sorted(families.instantiations()))
def test_instantiations_compile(compiled, to_compile, filename, arch):
    entry = compiled[(filename, arch)]
    assert not entry["errors"], "\n".join(entry["errors"])
    assert sorted(entry["spills"]) == sorted(to_compile[filename])


@pytest.fixture(scope="module")
def heuristic_picks() -> dict:
    return covering.heuristic_picks()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("filename", sorted(families.instantiations()))
def test_heuristic_picks_do_not_spill(compiled, heuristic_picks, filename, arch):
    """What the heuristics launch (the presets' picks, the row kernels at any size) spills
    exactly what tests/data/known_spills.json records (tests/known_spills.py), of what this
    run compiled: the covering set holds the presets' picks, --compile-all (CI) all. A new
    or larger spill fails; so does a smaller one, until the ledger is rewritten."""
    known = known_spills.load()[arch]
    spills = compiled[(filename, arch)]["spills"]
    assert spills, filename
    changed = {e: f"{n} bytes, recorded {known.get(e, 0)}" for e, n in spills.items()
               if e in heuristic_picks.get(filename, ()) and n != known.get(e, 0)}
    assert not changed, (f"{changed} (NVRTC {known_spills.nvrtc_version()}, the ledger's "
                         f"{known_spills.recorded_nvrtc()}: tests/known_spills.py rewrites it)")


@pytest.mark.parametrize("arch", ARCHS)
def test_rope_token_kernels_do_not_spill(compiled, arch):
    """Every instantiation of RoPE's token kernels this run compiled (all of them with
    --compile-all, in CI) spills nothing, whatever the plan constants make planned: under
    its register cap of 88 qk_rms_norm_rope's 4 heads a thread spilled 8 bytes (helper 60)."""
    spills = compiled[("rope.cu", arch)]["spills"]
    names = ("apply_rope_token_kernel<", "qk_rms_norm_rope_token_kernel<")
    token = {e: n for e, n in spills.items() if e.startswith(names)}
    assert token and not any(token.values()), {e: n for e, n in token.items() if n}


def test_every_family_is_compiled():
    assert sorted(families.instantiations()) == sorted(f"{family}.cu" for family in families.FAMILIES)


def test_instantiation_names_are_unique():
    for filename, exprs in families.instantiations().items():
        assert len(exprs) == len(set(exprs)), filename


def test_source_inlines_headers_once():
    text = jit.source("norm.cu")
    assert "#include <cupykern/" not in text
    assert text.count("// ---- begin cupykern/reduce.cuh") == 1


def test_the_spill_ledger_records_heuristic_picks_only(heuristic_picks):
    for source, exprs in heuristic_picks.items():  # each compiled by --compile-all
        assert exprs <= set(families.instantiations()[source]), source
    picks = set().union(*heuristic_picks.values())
    ledger = known_spills.load()
    assert set(ledger) == set(ARCHS)
    for arch, spills in ledger.items():
        stale = [e for e in spills if e not in picks]
        assert not stale, f"sm_{arch}: no longer launched by the heuristics, rewrite the ledger: {stale}"


@pytest.mark.parametrize("hidden_size", [4096, 8192, 16384, 65536])
@pytest.mark.parametrize("dtype", _dtypes.DTYPES, ids=_dtypes.short_name)
def test_heuristic_layouts_do_not_spill(hidden_size, dtype):
    """The layouts the planner picks for common sizes, at decode and prefill sizes, keep
    their register cache in registers."""
    from cupykern.ops import norm

    layouts = {plans.row_layout(hidden_size, dtype, aligned=True, num_rows=n) for n in (1, 4096)}
    # Both walks where both are built: kExact is what these sizes get where the layout fills the row.
    exprs = [t.expr(_dtypes.c_type(dtype), *layout.template_args(), exact) for layout in sorted(layouts, key=str)
             for t, op in ((norm.RMS_NORM, "rms_norm"), (norm.FUSED_ADD_RMS_NORM, "fused_add_rms_norm"),
                           (norm.LAYER_NORM, "layer_norm"))
             for exact in plans.exact_choices(op, layout)]
    spills = jit.nvrtc_spills("norm.cu", exprs, "90")
    assert not any(spills.values()), {e: n for e, n in spills.items() if n}


# Row kernels of the decode layouts that run one row a block (rows.cuh::one_row_per_block):
# a row group of 256 or 512 threads (the whole block), at most 2 leaves a thread
# (softmax's exact walk: 4 too), the vector path (16-byte leaves: 4 floats, 8 16-bit
# elements); the fused add in its exact walk only (rms_norm_rows.cuh). One row a block
# made ptxas choose fewer registers and spill in wider blocks and on the scalar path, on
# sm_80 too (bench/results/NOTES.md, item 23).
_DECODE_ROW_LAYOUT = re.compile(r"\b(?P<T>float|__half|__nv_bfloat16), (?:\w+, )?(?:256|512), "
                                r"(?P<W>4|8), (?P<V>\d), 32\b(?:, (?P<exact>true|false))?")


def _decode_row_layout(expr: str) -> bool:
    m = _DECODE_ROW_LAYOUT.search(expr)
    if m is None or int(m["W"]) != 16 // (4 if m["T"] == "float" else 2):
        return False
    if expr.startswith("fused_add_") and m["exact"] != "true":
        return False
    return int(m["V"]) <= 2 or (expr.startswith("softmax_kernel<") and m["V"] == "4" and m["exact"] == "true")


_DECODE_ROW_SOURCES = ("norm.cu", "softmax.cu", "row_reduce.cu", "quant.cu")


def _decode_row_spills(job):
    filename, arch = job
    return jit.nvrtc_spills(filename, [e for e in families.instantiations()[filename] if _decode_row_layout(e)], arch)


@pytest.fixture(scope="module")
def decode_row_spills() -> dict:
    """{(source, arch): {expression: bytes spilled}}, compiled on all CPU cores at once."""
    jobs = [(f, arch) for f in _DECODE_ROW_SOURCES for arch in ARCHS]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(zip(jobs, pool.map(_decode_row_spills, jobs)))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("filename", _DECODE_ROW_SOURCES)
def test_decode_row_layouts_do_not_spill(decode_row_spills, filename, arch):
    spills = decode_row_spills[(filename, arch)]
    assert spills, filename
    assert not any(spills.values()), {e: n for e, n in spills.items() if n}


def test_nvrtc_cubin_is_whole_and_its_sass_readable():
    """jit.nvrtc_cubin reads the cubin through NVRTC itself (CuPy 14.2's getCUBIN drops its
    last byte: the ELF's headers then ran past its end and nvdisasm refused it), and
    bench/sass.py reads each kernel's SASS, registers and spills from it, the same on
    every compile."""
    import struct

    from bench import sass

    exprs = ["append_tokens_kernel", "sample_tokens_kernel<int, true>"]
    cubin, lowered, _ = jit.nvrtc_cubin("tokens.cu", exprs, "90")
    phoff, shoff = struct.unpack_from("<QQ", cubin, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", cubin, 54)
    assert cubin[:4] == b"\x7fELF" and max(phoff + phentsize * phnum, shoff + shentsize * shnum) <= len(cubin)
    first, again = sass.sass_of("tokens.cu", exprs, "90"), sass.sass_of("tokens.cu", exprs, "90")
    assert first == again and list(first) == exprs
    for found in first.values():
        assert found["registers"] > 0 and found["spill_bytes"] == 0
        assert any(line.startswith("EXIT") for line in found["instructions"])
        assert not any("/*" in line for line in found["instructions"])  # addresses and encodings stripped


def test_sass_tool_refuses_bad_sources_and_expressions():
    """Helper 63: an unknown source ended in KeyError or FileNotFoundError, a bad
    expression or architecture in NVRTC's traceback; now usage errors."""
    from click.testing import CliRunner

    from bench import sass

    runner = CliRunner()
    for args in (["--planned", "nope.cu"], ["nope.cu", "k<1>"]):
        result = runner.invoke(sass.main, args)
        assert result.exit_code == 2 and "'nope.cu' is not a source of kernels_cu/" in result.output
    # helper 67: a bad architecture is refused before NVRTC runs; a bad expression fails in it
    result = runner.invoke(sass.main, ["tokens.cu", "append_tokens_kernel", "--arch", "12"])
    assert result.exit_code == 2 and "expected a compute capability of 80 or newer" in result.output
    result = runner.invoke(sass.main, ["tokens.cu", "no_such_kernel<1>"])
    assert result.exit_code == 1 and "tokens.cu (sm_90) failed to compile" in result.output


def test_sass_tool_adds_named_expressions_to_the_planned_picks(monkeypatch):
    """`sass.py SOURCE --planned EXPR...` reads the picks and EXPR (it ignored EXPR)."""
    from click.testing import CliRunner

    from bench import sass
    from cupykern import covering

    monkeypatch.setattr(covering, "planned", lambda: {"tokens.cu": {"append_tokens_kernel"}})
    result = CliRunner().invoke(sass.main, ["tokens.cu", "--planned", "sample_tokens_kernel<int, true>"])
    assert result.exit_code == 0, result.output
    assert "append_tokens_kernel" in result.output and "sample_tokens_kernel<int, true>" in result.output
