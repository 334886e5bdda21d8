"""The one launch path of every op: call signature -> cached recipe -> kernel launch.

An op is declared once, in its family module (``cupykern/ops/<family>.py``), as an
:class:`Op`: the names of its array and scalar arguments, its plan kind, and a
``prepare(args) -> Launch`` function that is the op's intake spec and plan rule. It
sees each array only as an :class:`~cupykern._arrays.Sig` (shape, strides, dtype,
address modulo 16), raises TypeError/ValueError naming a bad argument, and returns a
declarative :class:`Launch`: the kernel template and its arguments, the plan, which
array goes in which pointer slot, the scalar arguments, what to allocate, what to
return and which arrays must not overlap.

A call builds its key (every array's signature, the scalars, the launch overrides in
force and, with several GPUs, the devices), finds the recipe in a bounded cache
(:data:`CACHE_SIZE` recipes per op, the oldest dropped first) and launches the cached
``cupy.cuda.Function`` with the call's arrays. On a miss, ``prepare`` runs once for that
key: the checks that depend on the signature alone, the plan, the kernel lookup
(compiling it on first use). Per call there remain the overlap checks, which depend on
the addresses (integer compares), and the allocation of outputs the caller did not
give. Foreign arrays (DLPack, CUDA array interface) are converted when the intake
reaches them, then take the same path; host arrays are refused.

The tuned-config file is read at planning time: the caches are emptied when it changes
through cupykern.tuning (``save``, ``clear``, ``reload``, ``suspended``).

:func:`recording` collects what was launched (op, plan, grid, block, arguments), for
sweeps that report the plan a point ran with and for the host-overhead benchmark.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from operator import itemgetter
from typing import Callable, NamedTuple

import cupy
import numpy as np

from cupykern import _arrays, jit, plans, tuning

#: Recipes kept per op; past it the oldest goes (first in, first out: a dict hit took
#: 60-70 % of a functools.lru_cache hit, bench/host_costs.py). A serving loop sees a
#: handful of call signatures, a sweep a few hundred; a recipe holds a few hundred bytes.
CACHE_SIZE = 1024

_ndarray = cupy.ndarray
_empty = cupy.empty
_FOREIGN = object()  # key entry of an array argument that is not a cupy.ndarray


class _NeedsConversion(Exception):
    """The intake reached an argument that must be converted to a CuPy array first."""


class _ChecksPassed(Exception):
    """A check-only intake (:meth:`Op.check`) reached planning: every argument check passed."""


# ----------------------------------------------------------------- what prepare returns
class Disjoint(NamedTuple):
    """Arrays ``a`` and ``b`` must not share memory (a kernel would race), except ``b``
    being exactly ``a`` when ``allow_same`` (in place). With both row geometries, two
    interleaved row views of one buffer (column slices, fused QKV) are told apart exactly;
    with one side's, so is a vector (or one row) stored between two of its rows. Without
    them the byte extents decide (conservative for strided arrays)."""

    a: str
    b: str
    allow_same: bool = False
    a_rows: _arrays.Rows | None = None
    b_rows: _arrays.Rows | None = None


@dataclass(frozen=True)
class Launch:
    """What an op's intake spec and plan rule decide for one call signature.

    Arrays are named as in :attr:`Op.arrays`. ``template`` None means nothing to
    launch (zero rows): outputs are still allocated and returned.
    """

    template: jit.KernelTemplate | None
    template_args: tuple = ()
    plan: object = None  # a cupykern.plans plan: grid, block, shared_mem_bytes, fields()
    pointers: tuple = ()  # kernel pointer arguments in order: a name, or (name, byte offset)
    scalars: tuple = ()  # the scalar kernel arguments after the pointers (NumPy scalars)
    allocate: tuple = ()  # (name, shape, dtype) of outputs to allocate on each call
    returns: str | tuple = ()  # the name, or names, of the arrays returned
    disjoint: tuple = ()  # Disjoint rules
    # A second kernel launched right after the first on the same arrays (split-KV
    # attention's combine): its template, template_args, plan, pointers and scalars count.
    then: "Launch | None" = None
    # A grid-stride plan's grid in whole waves of the compiled kernel's resident blocks:
    # called with the blocks an SM holds (jit.blocks_per_sm), returns the plan launched.
    regrid: Callable[[int], object] | None = None


def output(sig: _arrays.Sig | None, name: str, shape, dtype) -> tuple[_arrays.Sig, tuple]:
    """An output argument checked against ``shape`` and ``dtype`` (cupykern/_arrays.py), and
    the :attr:`Launch.allocate` entry that makes each call allocate it when it was not given."""
    return _arrays.output(sig, name, shape, dtype), (((name, tuple(shape), dtype),) if sig is None else ())


class Args:
    """What ``prepare`` sees: each array's Sig (or None), each scalar, and the context.

    ``device`` is the current GPU (None without one); :attr:`limits` its limits (a
    RuntimeError without a GPU, raised only once the argument checks have passed);
    ``overrides`` the launch overrides in force. CPU tests build one by hand.

    Reading :attr:`limits` is where the argument checks end and planning begins, so
    ``check_only`` Args stop there (:meth:`Op.check`).
    """

    def __init__(self, op_name: str, values: dict, *, device: int | None = None, limits=None,
                 overrides: dict | None = None, check_only: bool = False):
        self.op_name = op_name
        self._values = values
        self.device = device
        self._limits = limits
        self.overrides = overrides or {}
        self._check_only = check_only

    def __getattr__(self, name):
        try:
            value = self._values[name]
        except KeyError:
            raise AttributeError(f"{self.op_name} has no argument {name!r}") from None
        if value is _FOREIGN:
            raise _NeedsConversion(name)
        return value

    @property
    def limits(self) -> plans.DeviceLimits:
        if self._check_only:
            raise _ChecksPassed()
        if self._limits is None:
            if self.device is None:
                raise RuntimeError(f"{self.op_name}: no CUDA GPU is visible to launch on")
            self._limits = plans.DeviceLimits.of_device(self.device)
        return self._limits


class Launched(NamedTuple):
    """One launch seen by :func:`recording`: the same launch can be repeated bare as
    ``kernel(grid, block, args, shared_mem=shared_mem)`` (``cupy.RawKernel``) or
    ``function(grid, block, args, shared_mem)``, or as a programmatic dependent launch
    (:mod:`cupykern.dependent_launch`) where ``template.dependent_launch``."""

    op: str
    plan: object
    kernel: object  # cupy.RawKernel
    function: object  # cupy.cuda.Function
    grid: tuple
    block: tuple
    args: tuple
    shared_mem: int = 0
    template: jit.KernelTemplate | None = None


class _Recipe(NamedTuple):
    kernel: object  # cupy.RawKernel, or None: nothing to launch
    function: object  # its cupy.cuda.Function on the key's device
    grid: tuple
    block: tuple
    shared_mem: int
    pick: object  # the pointer arguments, from the call's arrays
    offsets: tuple  # (position, byte offset) of pointers into the middle of an array
    scalars: tuple
    allocate: tuple  # (index, shape, dtype)
    ptrs: object  # picks the arrays the overlap rules compare (None: no rules)
    overlaps: tuple  # (i, j, lo, hi, allow_same, (period, a_width, b_width, message)), i and j into ptrs
    passed: list  # [the addresses (list) of the last call whose rules passed]: a loop over the
    #               same buffers checks each address once, not each rule
    result: object  # picks what the op returns from the call's arrays
    plan: object
    then: object  # None, or (kernel, function, grid, block, shared_mem, pick, offsets, scalars, plan, template),
    #               launched next
    template: object  # the jit.KernelTemplate (recorded by recording())


# ----------------------------------------------------------------- per-process state
_OPS: dict[str, "Op"] = {}
_recording: list | None = None
_multi_gpu = False  # set at the first build: only then do keys carry devices
_devices_known = False
_keyed_context = False  # overrides in force or several GPUs: keys carry :func:`_context_key`

_local = threading.local()
_overrides_lock = threading.Lock()
_overrides_in_use = 0  # override contexts open in any thread: only then do calls read their thread's


def ops() -> dict[str, "Op"]:
    """Every declared op by name (the family modules declare them on import)."""
    return dict(_OPS)


def clear_caches() -> None:
    """Forgets every cached recipe (the tuned file changed, or a test wants cold calls)."""
    for op in _OPS.values():
        op._recipes.clear()


tuning.subscribe(clear_caches)


class overrides:
    """Context manager that forces launch choices in this thread.

    ``with launcher.overrides(threads_per_row=256, rows_per_block=1): rms_norm(x, w)`` is
    how sweeps try configurations. Keys: the union of the plan rules' (cupykern/plans.py):
    the row kernels take threads_per_row, vec_width, vecs_per_thread, rows_per_block and
    block_size (counts); the gated activations block_size, vec_width and grid_stride (True:
    one wave of blocks walks the (row, chunk) work items; False: a block per item, within
    the grid's limits). A rule given a key it does not take raises ValueError at
    the call, and so does an illegal value or combination; an unknown key raises TypeError
    here. None of them changes what is computed: the row layouts give the row's reduction
    tree (the same bits), the activations the same elementwise code.
    """

    KEYS = frozenset(plans.ROW_OVERRIDE_KEYS) | frozenset(plans.ACTIVATION_OVERRIDE_KEYS)

    def __init__(self, **choices):
        unknown = set(choices) - self.KEYS
        if unknown:
            raise TypeError(f"unknown launch overrides: {sorted(unknown)}; known: {sorted(self.KEYS)}")
        self.choices = {k: v for k, v in choices.items() if v is not None}

    def __enter__(self):
        global _overrides_in_use, _keyed_context
        self._saved = getattr(_local, "choices", {})
        _local.choices = {**self._saved, **self.choices}
        with _overrides_lock:
            _overrides_in_use += 1
            _keyed_context = True
        return self

    def __exit__(self, *exc):
        global _overrides_in_use, _keyed_context
        _local.choices = self._saved
        with _overrides_lock:
            _overrides_in_use -= 1
            _keyed_context = bool(_overrides_in_use) or _multi_gpu


def current_overrides() -> dict:
    """The launch overrides in force in this thread."""
    return dict(getattr(_local, "choices", {}))


def _context_key(arrays) -> tuple:
    """What a key holds beyond the arguments, when it matters: this thread's overrides,
    and with several GPUs the current device and each array's."""
    # Each value's type is part of the key: True == 1 == 1.0, and a call with a value the
    # plan rule refuses must not find the recipe of an equal value it accepted.
    choices = getattr(_local, "choices", {})
    return (tuple(sorted((k, type(v).__qualname__, v) for k, v in choices.items())),
            _devices(arrays) if _multi_gpu else None)


@contextmanager
def recording():
    """Collects every launch made inside (any thread) as :class:`Launched` records."""
    global _recording
    saved, _recording = _recording, []
    try:
        yield _recording
    finally:
        _recording = saved


def _current_device() -> int | None:
    try:
        return cupy.cuda.runtime.getDevice()
    except cupy.cuda.runtime.CUDARuntimeError:
        return None


def _devices(arrays) -> tuple:
    """The current device and each array's, for keys on a machine with several GPUs."""
    return (_current_device(), *[a.data.device_id if isinstance(a, _ndarray) else None for a in arrays])


def _tuple_getter(indices):
    """Picks ``indices`` of a sequence as a tuple (itemgetter returns a bare item for one)."""
    if len(indices) == 1:
        (i,) = indices
        return lambda seq: (seq[i],)
    return itemgetter(*indices)


def _row_geometry(rows, itemsize: int, lo: int, hi: int) -> tuple[int, int] | None:
    """(period, width) in bytes of an array for the overlap rules: rows of ``width`` bytes
    every ``period`` from its address, or one row (period 0) of its whole extent when that
    starts at its address (exact for one row or a contiguous vector, conservative for
    anything else); None where neither holds (a negative stride)."""
    if rows is not None and rows.num_rows > 1 and rows.row_stride > 0:
        return rows.row_stride * itemsize, rows.hidden_size * itemsize
    return (0, hi) if lo == 0 else None


def _sig_of(a):
    """An array argument's key entry (any cupy.ndarray, subclasses included), as Op.__call__ builds it."""
    if a is None:
        return None
    if a._c_contiguous:
        return (a.shape, a.dtype, a.data.ptr & 15)
    return (a.shape, a.strides, a.dtype, a.data.ptr & 15)


def _sig(entry) -> _arrays.Sig:
    """The Sig of a key entry: (shape, dtype, align) of a C-contiguous array, else (shape, strides, dtype, align)."""
    if len(entry) == 3:
        shape, dtype, align = entry
        return _arrays.Sig.contiguous(shape, dtype, align)
    return _arrays.Sig(*entry)


# ----------------------------------------------------------------- the op
class Op:
    """One public op's launch path (see the module docstring).

    ``arrays`` and ``scalars`` name the arguments in the order the public function
    passes them to :meth:`__call__` (two tuples); ``plan_kind`` is ``"rows"``, ``"activation"``,
    ``"rope"``, ``"gemv"``, ``"attention"`` or ``"tokens"`` (the rule in cupykern/plans.py;
    only ``"rows"`` ops are tuned), ``launch_options`` the override keys it takes (none by
    default: a sweep option given for such an op is not applied to it).
    """

    def __init__(self, name: str, *, arrays: tuple, scalars: tuple = (), prepare, plan_kind: str,
                 launch_options: tuple = ()):
        self.name = name
        self.arrays = tuple(arrays)
        self.scalars = tuple(scalars)
        self.plan_kind = plan_kind
        self.launch_options = tuple(launch_options)
        self.prepare = prepare
        self._num_arrays = len(self.arrays)
        self._index = {a: i for i, a in enumerate(self.arrays)}
        self._recipes: dict = {}  # key -> _Recipe, at most CACHE_SIZE, oldest first
        _OPS[name] = self

    def __call__(self, arrays: tuple, scalars: tuple = ()):
        """Checks, plans (once per signature) and launches; returns what the op returns."""
        # A C-contiguous array's strides follow from its shape and dtype: skip reading them.
        key = [((a.shape, a.dtype, a.data.ptr & 15) if a._c_contiguous else (a.shape, a.strides, a.dtype,
                                                                              a.data.ptr & 15))
               if type(a) is _ndarray else (None if a is None else _FOREIGN) for a in arrays]
        key.append(scalars)
        if _keyed_context:
            key.append(_context_key(arrays))
        key = tuple(key)
        try:
            recipe = self._recipes[key]
        except (KeyError, TypeError):  # a new signature, an unhashable scalar, a foreign array
            recipe, arrays = self._resolve(arrays, scalars)
        # The launch, inline: a method call per launch cost more than this comment.
        kernel, function, grid, block, shared_mem, pick, offsets, kernel_scalars, allocate, ptrs, overlaps, passed, \
            result, plan, then, template = recipe
        if allocate:
            arrays = list(arrays)
            for i, shape, dtype in allocate:
                arrays[i] = _empty(shape, dtype)
        if overlaps:
            # Each array's address read once; a rule is then one subtraction and one chained
            # comparison (b's extent meets a's iff b - a lies strictly between lo and hi).
            p = [a.data.ptr for a in ptrs(arrays)]
            if p != passed[0]:
                for i, j, lo, hi, allow_same, rule in overlaps:
                    d = p[j] - p[i]
                    if lo < d < hi and not (allow_same and d == 0):
                        _arrays.check_interleaved(d, *rule)
                passed[0] = p
        if function is not None:
            kargs = pick(arrays)
            if offsets:
                kargs = list(kargs)
                for position, offset in offsets:
                    kargs[position] = np.uint64(kargs[position].data.ptr + offset)
                kargs = tuple(kargs)
            kargs += kernel_scalars
            function(grid, block, kargs, shared_mem)
            if _recording is not None:
                _recording.append(Launched(self.name, plan, kernel, function, grid, block, kargs, shared_mem, template))
            if then is not None:
                self._launch_then(then, arrays)
        return result(arrays)

    def _launch_then(self, then: tuple, arrays) -> None:
        """The recipe's second launch (off the path of one-kernel ops)."""
        kernel, function, grid, block, shared_mem, pick, offsets, kernel_scalars, plan, template = then
        kargs = list(pick(arrays))
        for position, offset in offsets:
            kargs[position] = np.uint64(kargs[position].data.ptr + offset)
        kargs = (*kargs, *kernel_scalars)
        function(grid, block, kargs, shared_mem)
        if _recording is not None:
            _recording.append(Launched(self.name, plan, kernel, function, grid, block, kargs, shared_mem, template))

    def intake(self, arrays: tuple, scalars: tuple = ()) -> list:
        """Checks the arguments as a call would (cached the same way), launches nothing;
        returns the arrays as CuPy arrays (foreign ones converted)."""
        return self._resolve(arrays, scalars)[1]

    def check(self, values: dict) -> None:
        """Runs the op's argument checks on call signatures and stops where planning
        would begin: plans, compiles and launches nothing, needs no GPU, caches nothing.

        ``values`` maps argument names to a :class:`~cupykern._arrays.Sig` or None (arrays)
        or the value (scalars); a name left out is None. Raises the TypeError/ValueError
        a call with arrays of those signatures would raise; the per-call overlap checks
        of written arrays (which depend on addresses) are not run. The float64
        references (cupykern/reference) check their arguments through this.
        """
        names = (*self.arrays, *self.scalars)
        unknown = set(values) - set(names)
        if unknown:
            raise TypeError(f"{self.name} has no argument(s) {sorted(unknown)}")
        try:
            self.prepare(Args(self.name, {name: values.get(name) for name in names}, check_only=True))
        except _ChecksPassed:
            pass

    def plan_for(self, arrays: tuple, scalars: tuple = ()):
        """The plan a call with these arguments launches (None for zero rows)."""
        return self._resolve(arrays, scalars)[0].plan

    # ------------------------------------------------------------- internals
    def _resolve(self, arrays, scalars) -> tuple[_Recipe, list]:
        """The recipe of a call and its arrays, the slow way: built on a miss and cached,
        foreign arrays converted when the intake reaches them (so its order of checks
        decides which error comes first), an unhashable key built without the cache."""
        arrays = list(arrays)
        while True:
            key = (*[_sig_of(a) if isinstance(a, _ndarray) else (None if a is None else _FOREIGN) for a in arrays],
                   tuple(scalars), *((_context_key(arrays),) if _keyed_context else ()))
            try:
                try:
                    return self._recipes[key], arrays
                except KeyError:
                    recipe = self._build(key)
                    if len(self._recipes) >= CACHE_SIZE:
                        del self._recipes[next(iter(self._recipes))]
                    self._recipes[key] = recipe
                    return recipe, arrays
                except TypeError:  # unhashable: build uncached (the intake's own TypeError is raised again)
                    return self._build(key), arrays
            except _NeedsConversion:
                arrays = [a if a is None or isinstance(a, _ndarray) else _arrays.as_device_array(a, name)
                          for a, name in zip(arrays, self.arrays)]

    def _build(self, key: tuple) -> _Recipe:
        """The recipe for one key: the intake, the plan and the kernel (a cache miss)."""
        global _multi_gpu, _devices_known, _keyed_context
        n = self._num_arrays
        device = _current_device()
        if not _devices_known and device is not None:
            _multi_gpu = cupy.cuda.runtime.getDeviceCount() > 1
            _keyed_context = _keyed_context or _multi_gpu
            _devices_known = True
        values = {name: _sig(s) if type(s) is tuple else s for name, s in zip(self.arrays, key[:n])}
        values.update(zip(self.scalars, key[n]))
        keyed_overrides, devices = key[n + 1] if len(key) > n + 1 else ((), None)
        overrides = {k: v for k, _, v in keyed_overrides}
        if devices:
            for name, array_device in zip(self.arrays, devices[1:]):
                if array_device is not None:
                    _arrays.check_device(array_device, device, name)
        if overrides:  # checked here too: a call with zero rows never reaches its plan rule
            plans.check_override_keys(overrides, self.launch_options, self.name)
        launch = self.prepare(Args(self.name, values, device=device, overrides=overrides))
        if any(v is _FOREIGN for v in values.values()):  # an array the intake never looked at
            raise _NeedsConversion()
        return self._recipe(launch, values)

    def _recipe(self, launch: Launch, values: dict) -> _Recipe:
        index = self._index
        allocate = tuple((index[name], tuple(shape), dtype) for name, shape, dtype in launch.allocate)
        allocated = {name for name, _, _ in launch.allocate}
        result = itemgetter(index[launch.returns]) if isinstance(launch.returns, str) else \
            _tuple_getter([index[name] for name in launch.returns])
        if launch.template is None:
            return _Recipe(None, None, (), (), 0, None, (), (), allocate, None, (), [None], result, None, None, None)
        overlaps, slots = [], {}  # slots: array index -> its place among the addresses a call reads
        for rule in launch.disjoint:
            a, b = values[rule.a], values[rule.b]
            if a is None or b is None or rule.a in allocated or rule.b in allocated or not a.size or not b.size:
                continue
            (a_lo, a_hi), (b_lo, b_hi) = _arrays.byte_extent(a), _arrays.byte_extent(b)
            period = a_width = b_width = 0
            a_geometry = _row_geometry(rule.a_rows, a.itemsize, a_lo, a_hi)
            b_geometry = _row_geometry(rule.b_rows, b.itemsize, b_lo, b_hi)
            periods = {a_geometry[0], b_geometry[0]} - {0} if a_geometry and b_geometry else set()
            if len(periods) == 1:
                # Rows repeating with one period, on both sides or on one with a single row
                # on the other: disjoint iff b's rows sit in the gaps between a's (two
                # column slices of one wide buffer, a weight between two rows of a strided
                # out; _arrays.check_interleaved). One row on both sides: the extents say it.
                (period,), a_width, b_width = periods, a_geometry[1], b_geometry[1]
            hint = f" (in place is allowed only as {rule.b}={rule.a} exactly)" if rule.allow_same else ""
            i, j = (slots.setdefault(index[name], len(slots)) for name in (rule.a, rule.b))
            # [pa + a_lo, pa + a_hi) meets [pb + b_lo, pb + b_hi) iff a_lo - b_hi < pb - pa < a_hi - b_lo.
            overlaps.append((i, j, a_lo - b_hi, a_hi - b_lo, rule.allow_same and a == b,
                             (period, a_width, b_width, f"{rule.b} overlaps {rule.a} in memory{hint}")))
        first = self._kernel_launch(launch)
        then = self._kernel_launch(launch.then) if launch.then is not None else None
        kernel, function, grid, block, shared_mem, pick, offsets, scalars, plan, template = first
        return _Recipe(kernel, function, grid, block, shared_mem, pick, offsets, scalars, allocate,
                       _tuple_getter(list(slots)) if slots else None, tuple(overlaps), [None], result, plan, then,
                       template)

    def _kernel_launch(self, launch: Launch) -> tuple:
        """(kernel, function, grid, block, shared_mem, pick, offsets, scalars, plan, template) of one launch."""
        index = self._index
        names = [p if isinstance(p, str) else p[0] for p in launch.pointers]
        offsets = tuple((position, p[1]) for position, p in enumerate(launch.pointers) if not isinstance(p, str))
        kernel = jit.get_kernel(launch.template, *launch.template_args)
        plan = launch.plan
        if launch.regrid is not None:
            plan = launch.regrid(jit.blocks_per_sm(kernel, plan.block_size, int(plan.shared_mem_bytes)))
        return (kernel, kernel.kernel, tuple(plan.grid), tuple(plan.block), int(plan.shared_mem_bytes),
                _tuple_getter([index[name] for name in names]), offsets, tuple(launch.scalars), plan, launch.template)
