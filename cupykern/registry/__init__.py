"""Op registry: one :class:`OpSpec` per public op, the single source of test inputs,
references, byte counts and default sizes for ``cupykern check``, ``cupykern sweep``
and the benchmarks (bench/).

Each family declares its specs in ``cupykern/registry/<family>.py`` as ``SPECS``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class OpSpec:
    """How to drive and check one op.

    Attributes:
        name: public function name (``"rms_norm"``).
        family: kernel family, the name of its files (``"norm"``).
        size_name: what the per-row size is called (``"hidden_size"``, ``"d"``, ``"head_dim"``).
        make_inputs: ``(rng, num_tokens, size, dtype) -> dict`` of device arrays and
            scalars, drawn from the seeded ``numpy.random.Generator``.
        run: ``(inputs) -> tuple of device arrays``, the op's outputs (for in-place
            ops, the mutated arrays). Must not allocate when ``inputs`` carries ``out``.
        reference: ``(inputs) -> tuple of float64 NumPy arrays`` matching ``run``;
            called on inputs captured before ``run`` mutates anything.
        min_bytes: ``(inputs) -> int``: each input read once, each output written once.
        output_dtypes: ``(inputs) -> tuple of dtypes`` of ``run``'s outputs (for tolerances).
        check_sizes: sizes ``cupykern check`` validates at.
        token_inputs: input names indexed by token along their first axis (validation
            samples rows of these; tables such as ``cos_sin_cache`` are passed whole).
    """

    name: str
    family: str
    size_name: str
    make_inputs: Callable
    run: Callable
    reference: Callable
    min_bytes: Callable
    output_dtypes: Callable
    check_sizes: tuple = (4096,)
    token_inputs: tuple = ("x", "residual", "gate", "up", "q", "k", "positions")

    def with_run(self, run) -> "OpSpec":
        """The same spec driving another implementation (benchmarks of peers)."""
        return dataclasses.replace(self, run=run)


def nbytes(*arrays) -> int:
    """Bytes of the logical elements of each array (views count only what they span)."""
    return sum(a.size * a.itemsize for a in arrays if a is not None)


def random_device(rng: np.random.Generator, shape, dtype, scale: float = 1.0, loc: float = 0.0):
    """Normal(loc, scale) values drawn on the host from ``rng``, stored in ``dtype`` on the device."""
    import cupy

    values = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale) + np.float32(loc)
    return cupy.asarray(values.astype(dtype))


def all_specs() -> dict[str, OpSpec]:
    """Every registered op by name, in family order."""
    from cupykern.registry import activation, norm, rope, row_reduce, softmax

    specs: dict[str, OpSpec] = {}
    for module in (norm, softmax, row_reduce, activation, rope):
        for spec in module.SPECS:
            specs[spec.name] = spec
    return specs
