"""Plans and launches one of the row kernels (norm.cu, softmax.cu, row_reduce.cu).

The family modules validate their arguments, then call :func:`plan` and :func:`run`
with the template, its leading type arguments and the kernel's argument tuple.
"""

from __future__ import annotations

from cupykern import jit, launch, tuning


#: Plans by everything they depend on; cleared when it grows past _MAX_PLANS (a
#: serving loop sees a handful of shapes; a sweep many).
_plans: dict = {}
_MAX_PLANS = 4096


def plan(num_rows: int, hidden_size: int, dtype, aligned: bool, *, op: str | None = None) -> launch.LaunchPlan:
    """The plan for the current device, with any active :class:`launch.overrides`; ``op``
    (the public op's name) lets a tuned configuration for it apply (cupykern/tuning.py).

    Memoised: planning and validating cost ~20 us of Python per call, a tenth of a
    decode step's budget per kernel (bench/bench_host_overhead.py).
    """
    import cupy

    overrides = launch.current_overrides()
    device_id = cupy.cuda.runtime.getDevice()
    key = (num_rows, hidden_size, dtype, aligned, op, device_id, tuple(sorted(overrides.items())), tuning.state())
    found = _plans.get(key)
    if found is None:
        limits = launch.DeviceLimits.of_device(device_id)
        found = launch.plan_rows(num_rows, hidden_size, dtype, aligned=aligned, limits=limits, op=op, **overrides)
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = found
    return found


def run(template: jit.KernelTemplate, lead_args: tuple, plan_: launch.LaunchPlan, args: tuple,
        *, cache_vectors: bool = True) -> None:
    """Launches ``template<*lead_args, layout...>`` on CuPy's current stream.

    ``cache_vectors=False`` is for one-pass kernels, whose template has no
    kVecsPerThread parameter.
    """
    layout = plan_.layout
    layout_args = layout.template_args() if cache_vectors else (layout.threads_per_row, layout.vec_width,
                                                                 layout.warp_size)
    kernel = jit.get_kernel(template, *lead_args, *layout_args)
    kernel(plan_.grid, plan_.block, args)
