"""Programmatic dependent launch (PDL): a kernel that may start before the one before it ends.

Launched with the driver's ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``, a
kernel's blocks may start once every block of the previous kernel in the stream has
called ``griddepcontrol.launch_dependents``; they request what depends on no earlier
kernel (weights), then wait (``griddepcontrol.wait``) for the earlier kernels to finish.
In a chain of dependent decode-size kernels this hides each launch's latency (about a
microsecond on an H200) behind the kernel before it. The device side, and the rules a
kernel follows to be launched this way, are in ``kernels_cu/cupykern/pdl.cuh``; kernel
templates that follow them say so (``jit.KernelTemplate.dependent_launch``).

CuPy 14 launches through ``cuLaunchKernel``, which takes no launch attributes, so this
module calls the driver's ``cuLaunchKernelEx`` through ctypes (``libcuda.so.1``: Linux).
It serves CUDA-graph capture (:mod:`cupykern.llm.decode_graph`), where a launch is
recorded once and its host cost does not recur; it is not a fast eager path.

Source: CUDA Driver API, ``cuLaunchKernelEx`` and ``CUlaunchConfig`` (CUDA 12.0+); CUDA
C++ Programming Guide, "Programmatic Dependent Launch and Synchronization" (sm_90+),
including its use inside captured graphs.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np

#: ``CUlaunchAttributeID`` of programmatic stream serialization (cuda.h).
_PROGRAMMATIC_STREAM_SERIALIZATION = 6
#: The first compute capability with griddepcontrol (sm_90).
MIN_COMPUTE_CAPABILITY = 90


class _LaunchAttributeValue(ctypes.Union):
    # cuda.h: a 64-byte union, 8-byte aligned; programmaticStreamSerializationAllowed is its first int.
    _fields_ = [("pad", ctypes.c_char * 64), ("align", ctypes.c_uint64),
                ("programmatic_stream_serialization_allowed", ctypes.c_int)]


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("value", _LaunchAttributeValue)]  # id, 4 bytes of padding, value


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_mem_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


# The layouts of cuda.h on 64-bit platforms (CUlaunchAttribute 72 bytes, CUlaunchConfig 56).
assert ctypes.sizeof(_LaunchAttribute) == 72 and _LaunchAttribute.value.offset == 8
assert ctypes.sizeof(_LaunchConfig) == 56


@lru_cache(maxsize=None)
def _driver():
    """libcuda's cuLaunchKernelEx and cuGetErrorString, or an OSError/AttributeError."""
    lib = ctypes.CDLL("libcuda.so.1")
    launch = lib.cuLaunchKernelEx
    launch.restype = ctypes.c_int
    launch.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                       ctypes.POINTER(ctypes.c_void_p)]
    error_string = lib.cuGetErrorString
    error_string.restype = ctypes.c_int
    error_string.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return launch, error_string


def unavailable_reason(device: int | None = None) -> str | None:
    """None if dependent launches work on ``device`` (default: the current one), else why
    not: no usable CUDA device (no driver or GPU, or no such device), a GPU before sm_90,
    or no ``cuLaunchKernelEx`` in the driver library."""
    import cupy

    try:
        dev = cupy.cuda.Device(device)
        capability = int(dev.compute_capability)
    except (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError) as e:
        which = "the current device" if device is None else f"device {device!r}"
        return f"CUDA cannot be used on {which} ({e})"
    if capability < MIN_COMPUTE_CAPABILITY:
        return f"GPU {dev.id} is sm_{capability}: programmatic dependent launch needs sm_90 or newer"
    try:
        _driver()
    except (OSError, AttributeError) as e:
        return f"the CUDA driver library offers no cuLaunchKernelEx ({e})"
    return None


def _parameter(value):
    """A ctypes object holding one kernel argument as the kernel reads it."""
    import cupy

    if isinstance(value, cupy.ndarray):  # a pointer, as cupy.RawKernel passes arrays
        return ctypes.c_uint64(value.data.ptr)
    if isinstance(value, np.generic):  # a sized NumPy scalar: its bytes
        return ctypes.create_string_buffer(value.tobytes(), value.nbytes)
    raise TypeError(f"a kernel argument must be a cupy.ndarray or a NumPy scalar, got {type(value).__name__}")


def launch(function, grid: tuple, block: tuple, args: tuple, shared_mem: int, stream) -> None:
    """Launches ``function`` (a ``cupy.cuda.Function``) on ``stream`` as a programmatic
    dependent launch: it may start while the previous kernel of ``stream`` still runs, so
    it must follow ``pdl.cuh``'s rules (callers check ``KernelTemplate.dependent_launch``).

    ``grid`` and ``block`` are 1-3 ints; ``args`` the kernel's arguments as
    :class:`cupykern.launcher.Launched` records them (CuPy arrays for pointers, NumPy
    scalars); ``shared_mem`` dynamic shared memory in bytes; ``stream`` a
    ``cupy.cuda.Stream`` (capturing or not). Mutates what the kernel writes.

    Raises:
        TypeError: an argument neither a CuPy array nor a NumPy scalar.
        RuntimeError: the driver refused the launch (its error name and message).
    """
    cu_launch, error_string = _driver()
    grid = (*grid, 1, 1)[:3]
    block = (*block, 1, 1)[:3]
    attribute = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
    attribute.value.programmatic_stream_serialization_allowed = 1
    config = _LaunchConfig(*grid, *block, shared_mem, stream.ptr, ctypes.pointer(attribute), 1)
    held = [_parameter(a) for a in args]  # alive until the call returns (the driver copies the values)
    params = (ctypes.c_void_p * max(len(held), 1))(*[ctypes.addressof(h) for h in held])
    result = cu_launch(ctypes.byref(config), function.ptr, params, None)
    if result != 0:
        message = ctypes.c_char_p()
        error_string(result, ctypes.byref(message))
        text = message.value.decode() if message.value else "unknown error"
        raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {result}: {text}")
