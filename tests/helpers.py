"""Shared test helpers: seeded device inputs, poisoned and guarded outputs, comparison,
and call signatures of host arrays for the CPU tests of intake specs."""

from __future__ import annotations

from types import SimpleNamespace

import cupy
import numpy as np

from cupykern import _arrays, _dtypes, jit, launcher, plans, tuning, validation
from cupykern.reference._common import host

#: The storage dtypes every op takes, and their short names as pytest ids.
DTYPES = _dtypes.DTYPES
DTYPE_IDS = [_dtypes.short_name(d) for d in DTYPES]

#: Value written around and into outputs before a kernel runs: any element the kernel
#: fails to write stays NaN and fails the comparison.
POISON = np.nan


def random_device(rng: np.random.Generator, shape, dtype, scale: float = 1.0, loc: float = 0.0):
    """Normal(loc, scale) values from ``rng``, rounded to ``dtype``, on the device."""
    values = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale) + np.float32(loc)
    return cupy.asarray(values.astype(dtype))


def poisoned(shape, dtype):
    """A new device array of ``dtype`` filled with NaN."""
    return cupy.full(shape, POISON, dtype=np.float32).astype(dtype)


class Guarded:
    """A poisoned output view inside a larger buffer whose margins are checked later.

    ``view`` is ``shape``, rows ``row_pad`` elements wider than needed and ``margin``
    elements into the buffer, so a kernel writing past a row, past the last row or
    before the first is caught by :meth:`check_margins`.
    """

    def __init__(self, shape, dtype, *, row_pad: int = 8, margin: int = 64, misalign: int = 0):
        shape = tuple(shape)
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        width = shape[-1] + row_pad
        self.sentinel = np.float32(-4096.0)  # exact in every supported dtype
        self.buffer = cupy.full(margin + rows * width + margin, self.sentinel, dtype=np.float32).astype(dtype)
        body = self.buffer[margin + misalign: margin + misalign + rows * width].reshape(rows, width)
        self.view = body[:, : shape[-1]].reshape(shape)
        self.view[...] = cupy.asarray(POISON, dtype=np.float32).astype(dtype)
        self._mask = np.ones(self.buffer.shape, dtype=bool)
        flat_index = np.arange(rows * width).reshape(rows, width)[:, : shape[-1]].ravel() + margin + misalign
        self._mask[flat_index] = False

    def check_margins(self):
        outside = host(self.buffer).astype(np.float64)[self._mask]
        bad = np.flatnonzero(outside != np.float64(self.sentinel))
        assert bad.size == 0, f"kernel wrote outside its output: {bad.size} guard elements changed"


def assert_close(actual, expected, dtype, *, seed, what: str = "output", rtol=None, atol=None):
    """Asserts ``actual`` (device or host, any dtype) matches float64 ``expected``
    (cupykern.validation.compare_array: NaN exactly where the reference has NaN,
    infinities equal, finite elements within the dtype's tolerance unless given)."""
    result = validation.compare_array(actual, expected, dtype, rtol=rtol, atol=atol, what=what)
    assert result.ok, f"{result.message} (seed {seed})"


def sig(a, align: int | None = None) -> _arrays.Sig:
    """The call signature of an array as the launcher builds it: shape, byte strides,
    dtype and the address modulo 16 (``align``; for a host array 0 unless given)."""
    if align is None:
        align = a.data.ptr & 15 if isinstance(a, cupy.ndarray) else 0
    return _arrays.Sig(tuple(a.shape), tuple(a.strides), np.dtype(a.dtype), align)


def contiguous(shape, dtype, align: int = 0) -> _arrays.Sig:
    """The call signature of a C-contiguous array (``_arrays.Sig.contiguous``)."""
    return _arrays.Sig.contiguous(shape, dtype, align)


def prepare_args(op_name: str, /, *, overrides=None, limits=plans.H200_LIMITS, **values) -> launcher.Args:
    """What op ``op_name``'s ``prepare`` sees for a call (CPU tests): ``values`` maps each
    argument name to a Sig, None or a scalar; limits are an H200's (None: no GPU)."""
    return launcher.Args(op_name, values, limits=limits, overrides=overrides)


class FakeArray:
    """What the launcher reads of a cupy.ndarray: shape, strides (bytes), dtype, data.ptr,
    and CuPy's C-contiguity flag (CPU tests of the launch path)."""

    def __init__(self, shape, dtype, ptr=1 << 20, strides=None):
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        contiguous = _arrays.Sig.contiguous(self.shape, self.dtype).strides
        self.strides = contiguous if strides is None else tuple(strides)
        self.data = SimpleNamespace(ptr=ptr, device_id=0)
        self.size = int(np.prod(self.shape))
        self.itemsize = self.dtype.itemsize
        self._c_contiguous = all(n == 1 or s == c for n, s, c in zip(self.shape, self.strides, contiguous))


#: Blocks an SM holds of any kernel under fake_launch_device (jit.blocks_per_sm's stand-in).
FAKE_BLOCKS_PER_SM = 3


def fake_launch_device(monkeypatch, *, get_kernel, empty) -> None:
    """Replaces what the launcher asks the GPU: the current device and how many there
    are, the device's limits (an H200's), the compiled kernel (``get_kernel(template,
    *args)``, whose ``.kernel`` is called to launch), its occupancy
    (:data:`FAKE_BLOCKS_PER_SM` blocks an SM) and output memory (``empty``)."""
    monkeypatch.setattr(launcher, "_current_device", lambda: 0)
    monkeypatch.setattr(launcher, "_devices_known", True)
    monkeypatch.setattr(launcher, "_multi_gpu", False)
    monkeypatch.setattr(launcher, "_empty", empty)
    monkeypatch.setattr(jit, "get_kernel", get_kernel)
    monkeypatch.setattr(jit, "blocks_per_sm", lambda kernel, block_size, shared_mem_bytes=0: FAKE_BLOCKS_PER_SM)
    monkeypatch.setattr(plans.DeviceLimits, "of_device", staticmethod(lambda device_id: plans.H200_LIMITS))


class FakeKernel:
    """jit.get_kernel's stand-in: ``.kernel`` is the per-device function, recording its launches."""

    def __init__(self, template, args, launches):
        self.template, self.args = template, args
        self.kernel = lambda grid, block, kargs, shared_mem=0: launches.append(
            SimpleNamespace(template=template, template_args=args, grid=grid, block=block, args=kargs))


def fake_launcher(monkeypatch, tune_path) -> list:
    """The whole launch path on the CPU: FakeArray stands for cupy.ndarray, kernels record
    their launches instead of running (the list returned), outputs are FakeArrays, the
    device is an H200, and the tuned file is ``tune_path`` (the heuristics, unless a test
    writes it). The caller calls ``tuning.reload()`` afterwards, which also forgets the
    stand-in recipes (the ``fake_launcher`` fixture of conftest.py does)."""
    launches = []
    allocations = iter(range(1 << 30, 1 << 40, 1 << 24))
    monkeypatch.setattr(launcher, "_ndarray", FakeArray)
    fake_launch_device(monkeypatch, get_kernel=lambda template, *args: FakeKernel(template, args, launches),
                       empty=lambda shape, dtype: FakeArray(shape, dtype, ptr=next(allocations)))
    monkeypatch.setenv(tuning.ENV_FILE, str(tune_path))
    tuning.reload()
    return launches


def as_fake(a):
    """What the launcher sees of host array ``a`` passed as a device array: a FakeArray of
    its shape, byte strides, dtype and address. Anything else (None, scalars) as is."""
    if isinstance(a, np.ndarray):
        return FakeArray(a.shape, a.dtype, ptr=a.ctypes.data, strides=a.strides)
    return a


def kernel_and_reference_errors(kernel, reference, *args, **kwargs) -> tuple:
    """Calls ``kernel`` (a public op, under the ``fake_launcher`` fixture) with the
    :func:`as_fake` twins of the host arrays in ``args``/``kwargs``, and ``reference`` (its
    float64 twin) with the arrays themselves; returns what each raised (TypeError or
    ValueError; None if it returned)."""
    errors = []
    for fn, convert in ((kernel, as_fake), (reference, lambda a: a)):
        try:
            fn(*map(convert, args), **{name: convert(value) for name, value in kwargs.items()})
            errors.append(None)
        except (TypeError, ValueError) as exc:
            errors.append(exc)
    return tuple(errors)


def assert_same_error(kernel, reference, *args, **kwargs) -> Exception:
    """Asserts that the kernel op and its reference refuse these arguments alike: the same
    exception type with the same message (:func:`kernel_and_reference_errors`); returns it."""
    kernel_error, reference_error = kernel_and_reference_errors(kernel, reference, *args, **kwargs)
    assert kernel_error is not None, "the kernel took these arguments"
    assert (type(reference_error), str(reference_error)) == (type(kernel_error), str(kernel_error))
    return kernel_error


def overlap_check(monkeypatch, op, launch, values: dict, pointers: dict):
    """Runs the launcher's per-call overlap checks of ``launch`` (what ``op``'s prepare
    returned for ``values``) on arrays at the byte addresses ``pointers`` ({name: ptr}),
    with no GPU: nothing is compiled or launched. Raises what a call would raise."""
    return overlap_checker(monkeypatch, op, launch, values)(pointers)


def overlap_checker(monkeypatch, op, launch, values: dict):
    """:func:`overlap_check` as a function of ``pointers``, every call through one recipe
    (as calls of one signature share theirs)."""
    class NoKernel:
        kernel = None  # the recipe's function: None launches nothing

    monkeypatch.setattr(jit, "get_kernel", lambda *args: NoKernel())
    recipe = op._recipe(launch, values)
    # Stand-ins are not CuPy arrays, so the call misses the cache and asks _resolve.
    monkeypatch.setattr(op, "_resolve", lambda arrays, scalars: (recipe, list(arrays)))

    def call(pointers: dict):
        arrays = [FakeArray((1,), np.uint8, ptr=pointers[name]) if name in pointers else None for name in op.arrays]
        return op(tuple(arrays), ())
    return call
