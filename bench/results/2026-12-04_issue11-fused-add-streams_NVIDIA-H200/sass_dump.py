"""SASS of the pairs item 38 could not tell apart by timing patches (NOTES item 38, call I):
call C's bare qk kernel against rope.cu's token kernel under __maxnreg__(96) (8b's 5
heads), and call A's bare fused add against norm.cu's fused_add_rms_norm_kernel (bf16,
256 threads). NVRTC's PTX assembled by ptxas for sm_90, disassembled with cuobjdump; writes <name>.sass
and prints each kernel's instruction count and its counts by opcode."""
import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from cupy_backends.cuda.libs import nvrtc

from cupykern import jit

HERE = Path(__file__).resolve().parent
OUT = Path(sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", "."))
tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
print("cuobjdump:", tool, os.path.exists(tool), flush=True)
rope = jit.source("rope.cu")
bounds = "__global__ void __launch_bounds__(kRopeMaxBlockSize) qk_rms_norm_rope_token_kernel("
builds = {
    "qk_bare": ((HERE / "qk_streams.py").read_text().split('SRC = r"""')[1].split('"""')[0], "qk_token<40, 5, true>"),
    "qk_token96": (rope.replace(bounds, "__global__ void __maxnreg__(96) qk_rms_norm_rope_token_kernel("),
                   "qk_rms_norm_rope_token_kernel<__nv_bfloat16, float, long long, true, 8, 8, 5, false>"),
    "add_bare": ((HERE / "streams.py").read_text().split('SRC = r"""')[1].split('"""')[0], "rowblock<256, true, 0, 0>"),
    "add_lib": (jit.source("norm.cu"), "fused_add_rms_norm_kernel<__nv_bfloat16, 256, 8, 2, 32, true>"),
}
for name, (code, expr) in builds.items():
    prog = nvrtc.createProgram(code, name + ".cu", (), ())
    nvrtc.addNameExpression(prog, expr)
    nvrtc.compileProgram(prog, [*jit.nvrtc_options("90")])
    ptx = OUT / f"{name}.ptx"
    ptx.write_bytes(nvrtc.getPTX(prog).rstrip(b"\0"))
    nvrtc.destroyProgram(prog)
    # NVRTC's own cubin read as "no device code" / "an invalid ELF file" to the device's
    # cuobjdump and nvdisasm (call I's first tries): assemble its PTX with ptxas instead.
    cubin = OUT / f"{name}.cubin"
    subprocess.run([str(Path(tool).parent / "ptxas"), "-arch=sm_90", "-o", str(cubin), str(ptx)], check=True)
    run = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True)
    if run.returncode or not run.stdout:
        print(name, "cuobjdump rc", run.returncode, run.stderr[:500], flush=True)
    (OUT / f"{name}.sass").write_text(run.stdout)
    cubin.unlink()
    ptx.unlink()
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", run.stdout)
    counts = collections.Counter(op.split(".")[0] for op in ops)
    print(f"{name}: {len(ops)} instructions; " + ", ".join(f"{k} {v}" for k, v in counts.most_common(18)), flush=True)
