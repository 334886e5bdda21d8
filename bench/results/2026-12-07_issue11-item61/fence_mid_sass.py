"""NOTES item 61: the order of apply_rope's token kernel's global loads (q = a q/k load, C
= a .CONSTANT load: the position, then cos/sin; S = a store) in the SASS of the tree's
kernel and of item61_sources.mid(m), bf16 with int64 positions, sm_90 and sm_80, with
ptxas's registers and spill bytes. No GPU: NVRTC and nvdisasm (bench/sass.py).

    python fence_mid_sass.py
"""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import item61_sources  # noqa: E402
from bench import sass  # noqa: E402
from cupykern import jit  # noqa: E402

tree_source = jit.source


def order(text: str, expr: str, arch: str):
    jit.source = lambda name: text if name == "rope.cu" else tree_source(name)
    try:
        cubin, lowered, log = jit.nvrtc_cubin("rope.cu", [expr], arch, ["--ptxas-options=-v"])
    finally:
        jit.source = tree_source
    code = sass.disassemble(cubin)[lowered[expr]]
    seq = "".join("C" if ".CONSTANT" in line else "q" if re.search(r"(^|\s)LDG\.", line) else "S"
                  for line in code if re.search(r"(^|\s)(LDG|STG)\.", line))
    return sass.ptxas_report(log)[lowered[expr]], seq


for heads in (6, 5, 3, 2):
    expr = f"apply_rope_token_kernel<__nv_bfloat16, float, long long, true, 8, 8, {heads}>"
    for arch in ("90", "80"):
        print(heads, arch, "tree", *order(tree_source("rope.cu"), expr, arch))
        for m in range(1, heads):
            print(heads, arch, f"mid{m}", *order(item61_sources.mid(m), expr, arch))
