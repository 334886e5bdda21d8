"""float64 NumPy twins of every cupykern kernel: same names, same argument order.

They take NumPy or CuPy arrays and return float64 NumPy arrays; in-place ops return
the tuple of what they would have written. Each checks its arguments with its kernel's
own intake checks (``reference/_common.py``: the same TypeError/ValueError with the same
message, for arrays of the same shape, strides and dtype; float64 arrays are also taken,
checked as float32). Tests, ``cupykern check``, the sweep and
the benchmarks validate the kernels against these. The names are every
``cupykern/reference/<family>.py``'s ``__all__`` (families: ``cupykern.families``).
"""

from cupykern import families as _families

_TWINS = _families.public_names("reference")
globals().update(_TWINS)

__all__ = sorted(_TWINS)
