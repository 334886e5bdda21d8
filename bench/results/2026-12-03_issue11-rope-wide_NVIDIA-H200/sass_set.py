"""SASS of 96 apply_rope_wide_kernel instantiations (sm_90 and sm_80) from the tree's rope.cu,
on the CPU, to /tmp/rw/<tag>/sm<arch>.sass (addresses and encodings dropped). Run it on two
trees and compare with labels removed (`sed 's/\\.L_x_[0-9]*//g'`): how NOTES item 30 showed
ce234a4's kernel edits leave 1ae9076's machine code as it was. NVRTC's cubin from CuPy's
getCUBIN lacks its last byte (a zero is appended); nvdisasm comes from the
nvidia-cuda-nvdisasm 13.5 wheel (`pip download --no-deps nvidia-cuda-nvdisasm`, unzipped
to /tmp/nvd/x)."""
import os, re, subprocess, sys
from cupy_backends.cuda.libs import nvrtc
from cupykern import jit
tag = sys.argv[1]
os.makedirs(f"/tmp/rw/{tag}", exist_ok=True)
src = jit.source("rope.cu")
exprs = [f"apply_rope_wide_kernel<{t}, {c}, {p}, {n}, {w}, {m}, {h}, {ip}>"
         for t, c, w in (("__nv_bfloat16", "float", 8), ("float", "float", 4), ("__half", "__half", 4))
         for p in ("long long", "int") for n, m in (("true", 0), ("false", 0), ("true", 1), ("true", 2))
         for h in (2, 5) for ip in ("true", "false")]
for arch in ("90", "80"):
    prog = nvrtc.createProgram(src, "rope.cu", (), ())
    for e in exprs:
        nvrtc.addNameExpression(prog, e)
    nvrtc.compileProgram(prog, [*jit.nvrtc_options(arch)])
    path = f"/tmp/rw/{tag}/sm{arch}.cubin"
    open(path, "wb").write(nvrtc.getCUBIN(prog) + b"\0")
    out = subprocess.run(["/tmp/nvd/x/nvidia/cu13/bin/nvdisasm", "-c", path], capture_output=True, text=True).stdout
    # drop addresses/encodings so the text compares instruction by instruction
    lines = [re.sub(r"/\*[0-9a-f]{4,}\*/|/\* 0x[0-9a-f]+ \*/", "", l).strip() for l in out.splitlines()]
    open(f"/tmp/rw/{tag}/sm{arch}.sass", "w").write("\n".join(l for l in lines if l))
    print(arch, len(exprs), "kernels", sum(1 for l in lines if l.endswith(";")), "instructions")
