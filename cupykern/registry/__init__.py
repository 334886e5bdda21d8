"""Op registry: one :class:`OpSpec` per public op: how ``cupykern check``, the sweep
engine (cupykern/sweep.py) and the benchmarks (bench/) draw its inputs, run it, check
it against its float64 reference and count its bytes. Tests draw their own inputs,
shaped to the property each test checks.

Each family declares its specs in ``cupykern/registry/<family>.py`` as ``SPECS``;
:func:`all_specs` gathers them over ``cupykern.families.FAMILIES``.

Model presets (cupykern/models.py): :meth:`OpSpec.size_for_model` gives an op's row
size for a model (hidden_size for norms, softmax and row_reduce, intermediate_size for
the gated activations, head_dim for RoPE) and :meth:`OpSpec.for_model` binds the
model's constants (eps, Gemma's weight offset, GeGLU's tanh, head counts, rope_theta,
rope_scaling) into ``make_inputs``. Without a model, specs behave as before.
"""

from __future__ import annotations

import dataclasses
import functools
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
            scalars, drawn from the seeded ``numpy.random.Generator``; if
            ``model_aware``, it also takes ``model=`` (a ``cupykern.models.ModelPreset``
            or None, the default, for the standard inputs).
        run: ``(inputs) -> tuple of device arrays``, the op's outputs (for in-place
            ops, the mutated arrays). Must not allocate when ``inputs`` carries ``out``.
        reference: ``(inputs) -> tuple of float64 NumPy arrays`` matching ``run``;
            called on inputs captured before ``run`` mutates anything.
        min_bytes: ``(inputs) -> int``: each input read once, each output written once.
        output_dtypes: ``(inputs) -> tuple of dtypes`` of ``run``'s outputs (for tolerances).
        check_sizes: sizes ``cupykern check`` validates at.
        token_inputs: input names indexed by token along their first axis (validation
            samples rows of these; tables such as ``cos_sin_cache`` are passed whole).
        model_aware: ``make_inputs`` accepts ``model=``.
        min_size, size_multiple: the row sizes the op accepts (RoPE: even head_dim).
        max_tokens: the most tokens the op takes (decode-size kernels), None for any.
        sizes: the only row sizes the op takes (decode_attention: head_dim 64, 128), or None.
        check_models: presets (cupykern.models names) whose inputs ``cupykern check`` also
            validates with, for a variant only a model's inputs reach (apply_rope's M-RoPE).
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
    model_aware: bool = False
    min_size: int = 1
    size_multiple: int = 1
    max_tokens: int | None = None
    sizes: tuple | None = None
    check_models: tuple = ()

    def takes_tokens(self, num_tokens: int) -> bool:
        """Whether the op accepts ``num_tokens`` tokens (decode-size ops take at most ``max_tokens``)."""
        return self.max_tokens is None or num_tokens <= self.max_tokens

    @property
    def check_token_counts(self) -> tuple:
        """The num_tokens ``cupykern check`` validates at: 1, and 257 or the most the op takes."""
        return (1, 257 if self.max_tokens is None else min(257, self.max_tokens))

    def with_run(self, run) -> "OpSpec":
        """The same spec driving another implementation (benchmarks of peers)."""
        return dataclasses.replace(self, run=run)

    def for_model(self, model) -> "OpSpec":
        """The same spec with ``model``'s constants bound into ``make_inputs`` (itself
        if ``model`` is None or the op has none to take)."""
        if model is None or not self.model_aware:
            return self
        return dataclasses.replace(self, make_inputs=functools.partial(self.make_inputs, model=model))

    def size_for_model(self, model) -> int:
        """This op's row size in ``model`` (:data:`MODEL_SIZES`); sizes a preset does not
        give (vocabulary, history length) stay at the first check size."""
        field = MODEL_SIZES.get(self.size_name)
        return getattr(model, field) if field else self.check_sizes[0]

    def size_error(self, size: int) -> str | None:
        """Why the op cannot take rows of ``size``, or None."""
        if self.sizes is not None and size not in self.sizes:
            return f"{self.name}: {self.size_name} must be one of {self.sizes}, got {size}"
        if size < self.min_size or size % self.size_multiple:
            rule = f">= {self.min_size}" + (f" and a multiple of {self.size_multiple}" if self.size_multiple > 1 else "")
            return f"{self.name}: {self.size_name} must be {rule}, got {size}"
        return None


#: size_name of an op -> the model preset's field that gives it.
MODEL_SIZES = {"hidden_size": "hidden_size", "d": "intermediate_size", "head_dim": "head_dim"}


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
    from cupykern import families

    return {spec.name: spec for module in families.modules("registry") for spec in module.SPECS}
