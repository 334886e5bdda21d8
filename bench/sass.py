"""The SASS of kernel instantiations as CuPy would build them (NVRTC, CuPy's options), no GPU needed.

    python bench/sass.py rope.cu 'qk_rms_norm_rope_token_kernel<__nv_bfloat16, float, long long, true, 8, 8, 5>'
    python bench/sass.py rope.cu --planned             # the heuristics' picks for the model presets
    python bench/sass.py rope.cu --planned 'EXPR' ...  # those picks and the named instantiations
    python bench/sass.py --planned --out DIR           # every source's picks, each kernel's SASS in DIR

Prints, per instantiation, the registers and spill bytes ptxas reports and the count of
SASS instructions (NOPs and labels left out). ``--out`` writes each kernel's SASS one instruction a
line, addresses and encodings stripped, so that two kernel trees compare with ``diff -r``:
a refactor that leaves every planned kernel's machine code as it was needs no GPU timing.
For the tree of another commit: ``git worktree add /tmp/base <ref>``, then
``python /tmp/base/bench/sass.py --planned --out /tmp/base-sass`` (it imports its own tree).

Needs nvdisasm: the test extra installs NVIDIA's ``nvidia-cuda-nvdisasm`` wheel; a CUDA
toolkit's on PATH also serves.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: An instruction line of ``nvdisasm -c``: ``/*0040*/  @!P0 BRA `(.L_x_1) ;  /* 0x... */``.
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;")
#: The line that opens a kernel's code in ``nvdisasm -c`` output.
_FUNCTION = re.compile(r"^\.text\.(\S+):$")
#: A branch target: numbered across the whole cubin, so renumbered per kernel.
_LABEL = re.compile(r"\.L_x_\d+")
#: ptxas's ``-v`` report: the kernel it compiles, then its registers (its spills are read
#: with jit's own pattern, as `cupykern check` reads them).
_ENTRY = re.compile(r"Compiling entry function '(\S+)'")
_REGISTERS = re.compile(r"Used (\d+) registers")


def nvdisasm() -> str:
    """Path of nvdisasm: on PATH, else NVIDIA's wheel (cuda.pathfinder); RuntimeError if neither."""
    import cuda.pathfinder

    found = shutil.which("nvdisasm") or cuda.pathfinder.find_nvidia_binary_utility("nvdisasm")
    if not found:
        raise RuntimeError("nvdisasm not found: pip install 'nvidia-cuda-nvdisasm==13.*' (in the test extra), "
                           "or put a CUDA toolkit's bin/ on PATH")
    return found


def disassemble(cubin: bytes) -> dict[str, list[str]]:
    """{mangled kernel name: its SASS, in order}: one instruction a line without address
    or encoding, and its branch targets' labels as lines of their own (``.L0:``), numbered
    from 0 in each kernel (nvdisasm numbers them across the cubin, so one kernel's change
    would renumber the others')."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([nvdisasm(), "-c", f.name], check=True, capture_output=True, text=True).stdout
    kernels: dict[str, list[str]] = {}
    current, labels = None, {}

    def label(match: re.Match) -> str:
        return f".L{labels.setdefault(match.group(0), len(labels))}"

    for line in text.splitlines():
        stripped = line.strip()
        opened = _FUNCTION.match(stripped)
        if opened:
            current, labels = kernels.setdefault(opened.group(1), []), {}
            continue
        if current is None:
            continue
        instruction = _INSTRUCTION.match(line)
        if instruction:
            current.append(_LABEL.sub(label, " ".join(instruction.group(1).split())))
        elif stripped.endswith(":") and _LABEL.fullmatch(stripped[:-1]):
            current.append(_LABEL.sub(label, stripped))
    return kernels


def ptxas_report(log: str) -> dict[str, tuple[int, int]]:
    """{mangled kernel name: (registers, spill store bytes)} from ptxas's ``-v`` log."""
    from cupykern import jit

    spills = {name: int(n) for name, n in jit._PTXAS_SPILLS.findall(log)}
    report, name = {}, None
    for line in log.splitlines():
        entry, registers = _ENTRY.search(line), _REGISTERS.search(line)
        if entry:
            name = entry.group(1)
        elif name and registers:
            report[name] = (int(registers.group(1)), spills.get(name, 0))
    return report


def sass_of(source: str, exprs: list[str], arch: str) -> dict[str, dict]:
    """{name expression: {"registers", "spill_bytes", "instructions"}} of ``exprs`` from
    kernels_cu/``source``, compiled in one NVRTC program for sm_``arch``."""
    from cupykern import jit

    cubin, lowered, log = jit.nvrtc_cubin(source, exprs, arch, ["--ptxas-options=-v"])
    code, report = disassemble(cubin), ptxas_report(log)
    return {expr: {"registers": report[name][0], "spill_bytes": report[name][1], "instructions": code[name]}
            for expr, name in lowered.items()}


def file_name(expr: str) -> str:
    """A file name for ``expr``'s SASS: its characters past [A-Za-z0-9] as one underscore."""
    return re.sub(r"[^A-Za-z0-9]+", "_", expr).strip("_") + ".sass"


@click.command(help=__doc__.splitlines()[0], context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("source", required=False)
@click.argument("exprs", nargs=-1)
@click.option("--planned", is_flag=True, help="the instantiations the heuristics pick for the presets "
              "(cupykern.covering.planned), of SOURCE or of every source")
@click.option("--arch", default="90", show_default=True,
              help="compute capability, 80 or newer, as NVRTC's -arch=sm_ARCH")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="write each kernel's SASS here, one file per instantiation")
def main(source, exprs, planned, arch, out) -> None:
    from rich.console import Console
    from rich.table import Table

    from cupykern import covering, jit

    try:  # before NVRTC's own log of a bad -arch
        jit.check_arch(arch)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--arch") from None
    sources = sorted(path.name for path in jit.kernels_dir().glob("*.cu"))
    if source is not None and source not in sources:
        raise click.BadParameter(f"{source!r} is not a source of kernels_cu/: one of {sources}", param_hint="SOURCE")
    if planned:
        picks = covering.planned()
        jobs = {source: sorted(set(picks.get(source, ())) | set(exprs))} if source else \
            {s: sorted(e) for s, e in picks.items()}  # with SOURCE, its name expressions join the picks
    elif source and exprs:
        jobs = {source: list(exprs)}
    else:
        raise click.UsageError("give SOURCE and name expressions, or --planned")
    table = Table("source", "instantiation", "registers", "spill bytes", "SASS (no NOPs)")
    if out:
        out.mkdir(parents=True, exist_ok=True)
    for src, src_exprs in jobs.items():
        try:
            compiled = sass_of(src, src_exprs, arch)
        except RuntimeError as exc:  # NVRTC's log: a bad expression or architecture
            raise click.ClickException(str(exc)) from None
        for expr, found in compiled.items():
            code = found["instructions"]
            count = sum(not (line.startswith("NOP") or line.endswith(":")) for line in code)
            table.add_row(src, expr, str(found["registers"]), str(found["spill_bytes"]), str(count))
            if out:
                (out / file_name(expr)).write_text("\n".join(code) + "\n")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
