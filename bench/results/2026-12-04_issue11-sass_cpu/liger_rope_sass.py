"""NOTES item 40: Liger-Kernel's RoPE kernel (`_triton_rope`, launched with Triton's default
4 warps: 128 threads a token) compiled by Triton for sm_90 without a GPU, beside the
library's apply_rope kernels for the same shapes (llama-3.1-8b: 32 + 8 heads of 128;
-70b: 64 + 8), in SASS: registers, instructions and memory operations.

    /tmp/trivenv/bin/python bench/results/2026-12-04_issue11-sass_cpu/liger_rope_sass.py   # cubins
    python bench/results/2026-12-04_issue11-sass_cpu/liger_rope_sass.py --compare           # the project's venv

Registers of the Triton cubins: `cuobjdump -res-usage` (nvdisasm on PATH), printed by
--compare when cuobjdump is found.
"""
import re
import shutil
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WORK = Path("/tmp/liger_rope_sass")
MODELS = {"8b": (32, 8), "70b": (64, 8)}


def compile_cubins() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    wheel = next((ROOT / ".whl").glob("liger_kernel-*.whl"))
    text = zipfile.ZipFile(wheel).read("liger_kernel/ops/rope.py").decode()
    body = re.search(r"@triton\.jit\ndef _triton_rope\(.*?\n(?=\n\ndef )", text, re.S).group(0)
    WORK.mkdir(exist_ok=True)
    (WORK / "liger_rope.py").write_text("import triton\nimport triton.language as tl\n\n\n" + body + "\n")
    sys.path.insert(0, str(WORK))
    from liger_rope import _triton_rope as kernel

    sig = {"q_ptr": "*bf16", "q_row_stride": "i32", "k_ptr": "*bf16", "k_row_stride": "i32", "cos": "*fp32",
           "cos_row_stride": "i32", "sin": "*fp32", "sin_row_stride": "i32", "sl": "i32"}
    sig.update(dict.fromkeys(("bs", "cos_bs", "n_qh", "n_kh", "hd", "pad_n_qh", "pad_n_kh", "pad_hd", "pad_rd", "rd",
                              "BLOCK_SIZE", "BACKWARD_PASS"), "constexpr"))
    names = list(sig)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names[:9]}
    for model, (n_qh, n_kh) in MODELS.items():
        constexprs = {"bs": 1, "cos_bs": 1, "n_qh": n_qh, "n_kh": n_kh, "hd": 128, "pad_n_qh": n_qh, "pad_n_kh": n_kh,
                      "pad_hd": 128, "pad_rd": 128, "rd": 128, "BLOCK_SIZE": max(n_qh, n_kh), "BACKWARD_PASS": False}
        compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        (WORK / f"liger_rope_{model}.cubin").write_bytes(compiled.asm["cubin"])
        print(f"liger_rope_{model}.cubin")


def summary(code: list[str]) -> str:
    ops = Counter(line.split()[1] if line.startswith("@") else line.split()[0] for line in code if not line.endswith(":"))
    memory = {op: n for op, n in sorted(ops.items()) if op.startswith(("LDG", "STG", "LD.", "ST."))}
    return f"{sum(n for op, n in ops.items() if not op.startswith('NOP'))} instructions, {memory}"


def compare() -> None:
    sys.path.insert(0, str(ROOT))
    from bench import sass
    from cupykern import covering

    cuobjdump = shutil.which("cuobjdump") or next(Path("/tmp").glob("cuobjdump_pkg/nvidia/*/bin/cuobjdump"), None)
    env_path = str(Path(sass.nvdisasm()).parent)
    for model in MODELS:
        cubin = WORK / f"liger_rope_{model}.cubin"
        (code,) = sass.disassemble(cubin.read_bytes()).values()
        registers = "?"
        if cuobjdump:
            out = subprocess.run([str(cuobjdump), "-res-usage", str(cubin)], capture_output=True, text=True,
                                 env={"PATH": env_path}).stdout
            registers = re.search(r"REG:(\d+)", out).group(1)
        print(f"liger _triton_rope {model} (128 threads a token): {registers} registers, {summary(code)}")
    picks = sorted(e for e in covering.planned()["rope.cu"]
                   if e.startswith("apply_rope") and "__nv_bfloat16, float, long long" in e)
    for expr, found in sass.sass_of("rope.cu", picks, "90").items():
        print(f"{expr}: {found['registers']} registers, {summary(found['instructions'])}")


if __name__ == "__main__":
    compare() if "--compare" in sys.argv else compile_cubins()
