"""The order of pass 2's global loads and stores in a rereading kernel's SASS (NOTES item 29).

Usage: python3 sass_order.py TREE...   (each TREE holds kernels_cu/, as bench/ab.sh trees
writes them): compiles rms_norm_kernel<__nv_bfloat16, 512, 8, 2, 32, true, true> for sm_90
with NVRTC (the options cupykern uses), disassembles it with cuobjdump and prints its
LDG / STG / BAR lines in order.
"""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from cupy_backends.cuda.libs import nvrtc

EXPR = "rms_norm_kernel<__nv_bfloat16, 512, 8, 2, 32, true, true>"
for tree in sys.argv[1:]:
    sys.path.insert(0, tree)
    for name in [m for m in sys.modules if m == "cupykern" or m.startswith("cupykern.")]:
        del sys.modules[name]
    from cupykern import jit
    prog = nvrtc.createProgram(jit.source("norm.cu"), "norm.cu", (), ())
    nvrtc.addNameExpression(prog, EXPR)
    nvrtc.compileProgram(prog, jit.nvrtc_options("90"))
    cubin = nvrtc.getCUBIN(prog)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        Path(f.name).write_bytes(cubin)
        sass = subprocess.run(["/usr/local/cuda/bin/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
    print(f"== {tree} ({jit.kernels_dir()}): {EXPR}")
    for line in sass.splitlines():
        if re.search(r"\b(LDG|STG|BAR|CCTL)\b", line):
            print("  ", line.strip()[:110])
    sys.path.remove(tree)
