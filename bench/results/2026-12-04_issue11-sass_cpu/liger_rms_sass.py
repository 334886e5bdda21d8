"""NOTES item 40: Liger-Kernel's rms_norm forward kernel compiled by Triton for sm_90 on a
machine without a GPU (nor PyTorch), its SASS beside the library's (bench/sass.py), for
llama-3.1-70b's rows (8192 bf16: BLOCK_SIZE 8192, 16 warps, Liger's calculate_settings;
casting mode "gemma" as bench/peers.py calls it) and 8b's (4096: 8 warps).

    python3 -m venv /tmp/trivenv && /tmp/trivenv/bin/pip install "triton==3.6.*"
    /tmp/trivenv/bin/python bench/results/2026-12-04_issue11-sass_cpu/liger_rms_sass.py   # cubins, then:
    python bench/results/2026-12-04_issue11-sass_cpu/liger_rms_sass.py --compare          # the project's venv

The kernel's source is read from the Liger wheel in .whl/ (bench/gpu_session.sh's) and
written, with the imports it needs and nothing of PyTorch, to a module beside the cubins.
"""
import re
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WORK = Path("/tmp/liger_rms_sass")
SHAPES = {8192: 16, 4096: 8}  # row size: Liger's num_warps


def kernel_module() -> Path:
    wheel = next((ROOT / ".whl").glob("liger_kernel-*.whl"))
    text = zipfile.ZipFile(wheel).read("liger_kernel/ops/rms_norm.py").decode()
    body = re.search(r"@triton\.jit\ndef _rms_norm_forward_kernel\(.*?\n(?=\n\n)", text, re.S).group(0)
    WORK.mkdir(exist_ok=True)
    module = WORK / "liger_rms.py"
    module.write_text("import triton\nimport triton.language as tl\n"
                      "from triton.language.extra.libdevice import rsqrt\n\n"
                      "_CASTING_MODE_NONE: tl.constexpr = tl.constexpr(-1)\n"
                      "_CASTING_MODE_LLAMA: tl.constexpr = tl.constexpr(0)\n"
                      "_CASTING_MODE_GEMMA: tl.constexpr = tl.constexpr(1)\n\n\n" + body + "\n")
    return module


def compile_cubins() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sys.path.insert(0, str(kernel_module().parent))
    from liger_rms import _rms_norm_forward_kernel as kernel

    sig = {"Y_ptr": "*bf16", "Y_row_stride": "i32", "X_ptr": "*bf16", "X_row_stride": "i32", "W_ptr": "*bf16",
           "W_row_stride": "constexpr", "RSTD_ptr": "*fp32", "RSTD_row_stride": "constexpr", "n_cols": "i32",
           "eps": "fp32", "offset": "fp32", "casting_mode": "constexpr", "elementwise_affine": "constexpr",
           "BLOCK_SIZE": "constexpr"}
    names = list(sig)
    # What a launch from PyTorch specialises: 16-byte aligned pointers, strides and n_cols
    # divisible by 16, the unit strides as constants.
    aligned = ("Y_ptr", "Y_row_stride", "X_ptr", "X_row_stride", "W_ptr", "RSTD_ptr", "n_cols")
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    for n, warps in SHAPES.items():
        constexprs = {"W_row_stride": 1, "RSTD_row_stride": 1, "casting_mode": 1, "elementwise_affine": True,
                      "BLOCK_SIZE": n}
        compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        (WORK / f"liger_rms_{n}.cubin").write_bytes(compiled.asm["cubin"])
        print(f"liger_rms_{n}.cubin: {warps} warps")


def count(code: list[str], *prefixes: str) -> int:
    """Instructions of ``code`` whose opcode (past a predicate) starts with one of ``prefixes``."""
    opcodes = (line.split()[1] if line.startswith("@") else line.split()[0] for line in code if not line.endswith(":"))
    return sum(op.startswith(prefixes) for op in opcodes)


def compare() -> None:
    sys.path.insert(0, str(ROOT))
    from bench import sass
    from cupykern import _dtypes, plans
    from cupykern.ops import norm

    for n in SHAPES:
        plan = plans.plan_rows(256, n, _dtypes.bfloat16, aligned=True, limits=plans.H200_LIMITS, op="rms_norm")
        expr = norm.RMS_NORM.expr(*norm._template_args(_dtypes.bfloat16, plan))
        ours = sass.sass_of("norm.cu", [expr], "90")[expr]["instructions"]
        (liger,) = sass.disassemble((WORK / f"liger_rms_{n}.cubin").read_bytes()).values()
        for label, code in ((expr, ours), (f"liger _rms_norm_forward_kernel {n}", liger)):
            print(f"{label}: {count(code, 'LDS')} LDS, {count(code, 'STS')} STS, {count(code, 'BAR')} BAR, "
                  f"{count(code, 'SHFL')} SHFL, {count(code, 'LDG', 'LD.')} global loads, "
                  f"{sum(not (line.startswith('NOP') or line.endswith(':')) for line in code)} instructions")
            (HERE / sass.file_name(label)).write_text("\n".join(code) + "\n")


if __name__ == "__main__":
    compare() if "--compare" in sys.argv else compile_cubins()
