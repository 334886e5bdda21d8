"""What a result file records about where it ran: GPU, driver, CuPy, NVRTC, commit, date."""

from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path


def git_commit() -> str:
    """The checkout's short commit; CUPYKERN_COMMIT overrides it (a copy without .git)."""
    if os.environ.get("CUPYKERN_COMMIT"):
        return os.environ["CUPYKERN_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def gpu_problem() -> str | None:
    """None if CuPy sees a CUDA GPU, else why not (never raises: no driver, no libcuda
    and no device all mean "no GPU")."""
    try:
        import cupy

        if cupy.cuda.is_available():
            return None
        return "CuPy sees no CUDA GPU"
    except Exception as exc:  # noqa: BLE001
        return f"CuPy cannot use CUDA ({type(exc).__name__}: {exc})"


def check_gpu(what: str, without: str = "") -> None:
    """RuntimeError naming ``what`` unless CuPy sees a CUDA GPU (``without``: what to do
    instead, appended). Without a driver CuPy's own error is ``cudaErrorInsufficientDriver``,
    which sends a user after the wrong thing."""
    problem = gpu_problem()
    if problem:
        raise RuntimeError(f"{what}: no CUDA GPU is visible ({problem}){'; ' + without if without else ''}")


def gpu_available() -> bool:
    """Whether CuPy sees a CUDA GPU (False, not an exception, without a driver)."""
    return gpu_problem() is None


def describe(with_gpu: bool = True) -> dict:
    """A JSON-ready dict of the software and (if present) GPU."""
    import cupy
    import numpy

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "cupy": cupy.__version__,
        "numpy": numpy.__version__,
    }
    try:
        from cupy_backends.cuda.libs import nvrtc

        info["nvrtc"] = ".".join(map(str, nvrtc.getVersion()))
    except Exception as exc:  # noqa: BLE001 - report, don't fail
        info["nvrtc"] = f"unavailable ({exc.__class__.__name__})"
    info["gpu_available"] = bool(with_gpu and gpu_available())
    if info["gpu_available"]:
        device = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(device.id)
        attrs = device.attributes
        name = props["name"]
        info.update({
            "gpu": name.decode() if isinstance(name, bytes) else str(name),
            "compute_capability": device.compute_capability,
            "sm_count": attrs["MultiProcessorCount"],
            "memory_gib": round(device.mem_info[1] / 2**30, 1),
            "l2_mib": round(attrs["L2CacheSize"] / 2**20, 1),
            "theoretical_bandwidth_gbps": round(2 * attrs["MemoryClockRate"] * 1e3 * attrs["GlobalMemoryBusWidth"] / 8 / 1e9, 1),
            "driver": cupy.cuda.runtime.driverGetVersion(),
            "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        })
    return info
