"""NOTES item 40: the fused add's library kernel beside item 38's stand-alone one ("fused",
streams.py's rowblock<256, true, 0, 0>: one row a block, 2 leaves a thread), in SASS for
sm_90 without a GPU (bench/sass.py). Item 38 measured the stand-alone about 1 % faster at
4096 x 4096 and no single difference tried (registers, the weights' place, the reduction)
explained it. Prints registers, instruction counts and the opcode histogram of both, and
writes both listings beside this script.

    python bench/results/2026-12-04_issue11-sass_cpu/fused_add_sass.py
"""
import re
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from cupy_backends.cuda.libs import nvrtc  # noqa: E402

from bench import sass  # noqa: E402
from cupykern import _dtypes, jit, plans  # noqa: E402
from cupykern.ops import norm  # noqa: E402

STREAMS = HERE.parent / "2026-12-04_issue11-fused-add-streams_NVIDIA-H200" / "streams.py"
BARE = "rowblock<256, true, 0, 0>"


def bare_kernel() -> dict:
    src = re.search(r'SRC = r"""(.*?)"""', STREAMS.read_text(), re.S).group(1)
    prog = nvrtc.createProgram(src, "streams.cu", (), ())
    try:
        nvrtc.addNameExpression(prog, BARE)
        nvrtc.compileProgram(prog, [*jit.nvrtc_options("90"), "--ptxas-options=-v"])
        name = nvrtc.getLoweredName(prog, BARE)
        log, cubin = nvrtc.getProgramLog(prog), jit._cubin(prog)
    finally:
        nvrtc.destroyProgram(prog)
    registers, spills = sass.ptxas_report(log)[name]
    return {"registers": registers, "spill_bytes": spills, "instructions": sass.disassemble(cubin)[name]}


def opcodes(code: list[str]) -> Counter:
    return Counter(line.split()[1] if line.startswith("@") else line.split()[0]
                   for line in code if not line.endswith(":"))


def main() -> None:
    plan = plans.plan_rows(4096, 4096, _dtypes.bfloat16, aligned=True, limits=plans.H200_LIMITS,
                           op="fused_add_rms_norm")
    expr = norm.FUSED_ADD_RMS_NORM.expr(*norm._template_args(_dtypes.bfloat16, plan))
    kernels = {"library " + expr: sass.sass_of("norm.cu", [expr], "90")[expr], "bare " + BARE: bare_kernel()}
    for label, found in kernels.items():
        code = found["instructions"]
        count = sum(not (line.startswith("NOP") or line.endswith(":")) for line in code)
        print(f"{label}: {found['registers']} registers, {found['spill_bytes']} spill bytes, {count} instructions")
        (HERE / (sass.file_name(label))).write_text("\n".join(code) + "\n")
    lib, bare = (opcodes(found["instructions"]) for found in kernels.values())
    for op in sorted(set(lib) | set(bare), key=lambda op: -(lib[op] + bare[op])):
        print(f"  {op:28s} library {lib[op]:4d}  bare {bare[op]:4d}")


if __name__ == "__main__":
    main()
