"""JIT compilation of the CUDA sources in ``kernels_cu/`` through ``cupy.RawModule``.

* :func:`source` reads a kernel file and inlines the ``#include <cupykern/...>``
  headers, so the source string CuPy hashes for its disk cache covers every line of
  device code (CuPy does not hash headers found through ``-I``).
* :class:`KernelTemplate` names a ``__global__`` template; :meth:`KernelTemplate.expr`
  is the one place a template instantiation is spelled, for both
  ``name_expressions=`` and ``get_function``.
* :func:`get_kernel` compiles one instantiation per module, lazily, once per process
  and device (under a lock); CuPy's on-disk cache (``CUPY_CACHE_DIR``) keeps later
  processes fast. One module per instantiation rather than per family: a family has
  hundreds of instantiations (dtype x layout), and compiling them all on first use
  would take minutes, while one takes a fraction of a second.
* :func:`nvrtc_compile` compiles a batch with NVRTC directly (no GPU or driver
  needed), with the options CuPy uses at run time; the CPU compile test and
  ``cupykern check`` give it the covering set (``cupykern.covering``), and with
  ``--compile-all`` / ``--all`` every instantiation of ``cupykern.families.instantiations()``.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

#: Options given to RawModule; CuPy adds -arch, -ftz=true,
#: --device-as-default-execution-space and its include paths (see nvrtc_options).
COMPILE_OPTIONS = ("--std=c++17",)

_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](cupykern/[\w./]+)[>"]\s*$', re.MULTILINE)


def kernels_dir() -> Path:
    """The ``kernels_cu`` folder: inside the installed package, or beside it in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "kernels_cu", here.parent / "kernels_cu"):
        if (candidate / "cupykern").is_dir():
            return candidate
    raise FileNotFoundError(f"cupykern: kernels_cu not found next to {here}")


@lru_cache(maxsize=None)
def source(filename: str) -> str:
    """Text of ``kernels_cu/<filename>`` with cupykern headers inlined (each once)."""
    root = kernels_dir()
    seen: set[str] = set()

    def expand(text: str) -> str:
        def include(match: re.Match) -> str:
            header = match.group(1)
            if header in seen:
                return ""
            seen.add(header)
            return f"// ---- begin {header}\n{expand((root / header).read_text())}\n// ---- end {header}"

        return _INCLUDE.sub(include, text)

    return expand((root / filename).read_text())


@dataclass(frozen=True)
class KernelTemplate:
    """A ``__global__`` function template in one source file of ``kernels_cu``.

    ``dependent_launch``: the kernel follows ``kernels_cu/cupykern/pdl.cuh`` (it waits for
    the kernels before it before touching anything they touch), so it may be launched as
    a programmatic dependent launch (:mod:`cupykern.dependent_launch`).
    """

    source: str
    name: str
    dependent_launch: bool = False

    def expr(self, *args) -> str:
        """The instantiation's name expression, e.g. ``rms_norm_kernel<float, 256, 4, 4, 32>``.

        Arguments are C type names (str), ints or bools, in template order; none for a
        plain (non-template) kernel, whose expression is its name.
        """
        if not args:
            return self.name
        spelled = [str(a).lower() if isinstance(a, bool) else str(a) for a in args]
        return f"{self.name}<{', '.join(spelled)}>"


_lock = threading.Lock()
#: Compiled kernels by (device, template, arguments). Unbounded on purpose: its keys are
#: drawn from the finite instantiation space the op modules declare.
_kernels: dict = {}


def get_kernel(template: KernelTemplate, *args):
    """The compiled ``cupy.RawKernel`` for one instantiation on the current device.
    RuntimeError (:func:`device_arch_problem`'s reason) on a GPU older than :data:`MIN_ARCH`,
    before any compile: there NVRTC would fail on the bfloat16 code or build kernels no test
    has run."""
    import cupy

    key = (cupy.cuda.runtime.getDevice(), template, args)
    kernel = _kernels.get(key)
    if kernel is None:
        problem = device_arch_problem()  # only on a miss: a compiled kernel proves the device
        if problem:
            raise RuntimeError(f"{template.name}: {problem}")
        expr = template.expr(*args)
        with _lock:
            kernel = _kernels.get(key)
            if kernel is None:
                module = cupy.RawModule(code=source(template.source), options=COMPILE_OPTIONS,
                                        name_expressions=[expr])
                kernel = module.get_function(expr)
                _kernels[key] = kernel
    return kernel


def blocks_per_sm(kernel, block_size: int, shared_mem_bytes: int = 0) -> int:
    """Blocks of ``block_size`` threads one SM holds at once of a compiled ``kernel`` (a
    ``cupy.RawKernel`` from :func:`get_kernel`), by the CUDA occupancy API: its
    registers, shared memory and launch bounds decide. At least 1."""
    import cupy

    count = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, block_size,
                                                                       shared_mem_bytes)
    return max(1, int(count))


def device_arch_problem() -> str | None:
    """None if the current CUDA device's compute capability is at least :data:`MIN_ARCH`,
    else why not, as one sentence (the ops raise it from :func:`get_kernel`, ``cupykern
    check`` as a usage error). Needs a visible GPU."""
    import cupy

    arch = cupy.cuda.Device().compute_capability
    if int(arch) >= MIN_ARCH:
        return None
    return f"this GPU's compute capability is {arch}; cupykern needs {MIN_ARCH} or newer"


# ----------------------------------------------------------------- without a GPU
def cuda_include_dir() -> str:
    """CUDA headers (cuda_fp16.h, cuda_bf16.h) as CuPy finds them: the nvidia-cuda-runtime wheel first."""
    import cuda.pathfinder

    found = cuda.pathfinder.find_nvidia_header_directory("cudart")
    if found is None:
        raise RuntimeError("CUDA headers not found; pip install 'nvidia-cuda-runtime==13.*'")
    return str(found)


#: The oldest compute capability cupykern supports: bfloat16 arithmetic and the spill
#: ledger (tests/known_spills.py) start at sm_80, and the kernels are tested on sm_90.
MIN_ARCH = 80


def check_arch(arch: str) -> None:
    """ValueError unless ``arch`` (a compute capability such as ``"90"``) is one this NVRTC
    compiles for and at least :data:`MIN_ARCH`; the message names the ones accepted.
    TypeError unless ``arch`` is a str (as click and ``cupy.cuda.Device().compute_capability``
    give it)."""
    if not isinstance(arch, str):
        raise TypeError(f"arch: expected a str such as '90', got {type(arch).__name__} {arch!r}")
    from cupy_backends.cuda.libs import nvrtc

    supported = [str(a) for a in nvrtc.getSupportedArchs() if int(a) >= MIN_ARCH]
    if arch not in supported:
        raise ValueError(f"expected a compute capability of {MIN_ARCH} or newer that NVRTC supports "
                         f"({', '.join(supported)}), e.g. 90, got {arch!r}")


def nvrtc_options(arch: str) -> list[str]:
    """The NVRTC options CuPy 14.2 uses for our modules on a GPU of compute capability ``arch``."""
    import cupy

    cupy_include = str(Path(cupy.__file__).resolve().parent / "_core" / "include")
    return [*COMPILE_OPTIONS, f"-I{cupy_include}", f"-I{cuda_include_dir()}", "-ftz=true",
            "--device-as-default-execution-space", f"-arch=sm_{arch}"]


def nvrtc_compile(filename: str, exprs: list[str], arch: str, extra_options=()) -> tuple[dict[str, str], str]:
    """Compiles ``exprs`` from one source file with NVRTC, no GPU needed.

    Returns ({name expression: lowered name}, compile log). Raises RuntimeError with
    the NVRTC log on a compile error.
    """
    lowered, log, _ = _nvrtc(filename, exprs, arch, extra_options, cubin=False)
    return lowered, log


def nvrtc_cubin(filename: str, exprs: list[str], arch: str, extra_options=()) -> tuple[bytes, dict[str, str], str]:
    """As :func:`nvrtc_compile`, and the machine code: (cubin for sm_``arch``, {name
    expression: lowered name}, compile log). bench/sass.py reads its SASS, no GPU needed."""
    lowered, log, cubin = _nvrtc(filename, exprs, arch, extra_options, cubin=True)
    return cubin, lowered, log


def _nvrtc(filename: str, exprs: list[str], arch: str, extra_options, *, cubin: bool):
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source(filename), filename, (), ())
    try:
        for expr in exprs:
            nvrtc.addNameExpression(prog, expr)
        try:
            nvrtc.compileProgram(prog, [*nvrtc_options(arch), *extra_options])
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(f"{filename} (sm_{arch}) failed to compile:\n{nvrtc.getProgramLog(prog)}") from exc
        lowered = {expr: nvrtc.getLoweredName(prog, expr) for expr in exprs}
        return lowered, nvrtc.getProgramLog(prog), _cubin(prog) if cubin else None
    finally:
        nvrtc.destroyProgram(prog)


def _cubin(prog: int) -> bytes:
    """The cubin of NVRTC program ``prog`` (CuPy's handle), read through NVRTC's own calls:
    CuPy 14.2's ``nvrtc.getCUBIN`` drops the last byte (it strips a trailing NUL, as for
    PTX and the log), which leaves an ELF whose program headers run past its end."""
    import ctypes

    import cuda.pathfinder

    lib = ctypes.CDLL(cuda.pathfinder.load_nvidia_dynamic_lib("nvrtc").abs_path)
    size = ctypes.c_size_t()
    if lib.nvrtcGetCUBINSize(ctypes.c_void_p(prog), ctypes.byref(size)):
        raise RuntimeError("nvrtcGetCUBINSize failed")
    buf = ctypes.create_string_buffer(size.value)
    if lib.nvrtcGetCUBIN(ctypes.c_void_p(prog), buf):
        raise RuntimeError("nvrtcGetCUBIN failed")
    return buf.raw


#: ptxas's report of one kernel (``--ptxas-options=-v``): its name, then its spill stores.
_PTXAS_SPILLS = re.compile(r"Function properties for (\S+)\n[^\n]*?(\d+) bytes spill stores")


def nvrtc_spills(filename: str, exprs: list[str], arch: str) -> dict[str, int]:
    """{name expression: bytes of registers spilled to local memory} of ``exprs`` compiled
    with NVRTC for ``arch`` (ptxas's verbose report), no GPU needed. Spilled registers
    cost local-memory traffic on every access; the kernels the heuristics launch spill
    what tests/data/known_spills.json records (tests/test_jit_compile.py). Raises
    RuntimeError as :func:`nvrtc_compile`, or if ptxas reported on fewer kernels than
    asked for."""
    lowered, log = nvrtc_compile(filename, exprs, arch, ["--ptxas-options=-v"])
    reported = {name: int(n) for name, n in _PTXAS_SPILLS.findall(log)}
    missing = [expr for expr, name in lowered.items() if name not in reported]
    if missing:
        raise RuntimeError(f"{filename} (sm_{arch}): ptxas reported no spills line for {missing[:3]}:\n{log[:2000]}")
    # A function a kernel calls without inlining it gets a line of its own: its spills
    # would be no kernel's, so they are refused rather than dropped (none has one today).
    kernels = set(lowered.values())
    callees = {name: n for name, n in reported.items() if n and name not in kernels}
    if callees:
        raise RuntimeError(f"{filename} (sm_{arch}): functions called by the kernels spill: {callees}")
    return {expr: reported[name] for expr, name in lowered.items()}
