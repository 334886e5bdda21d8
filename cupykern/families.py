"""The one list of kernel families, and what is derived from it.

A family is five files named after it (README, "Adding an op"): ``kernels_cu/<family>.cu``,
``cupykern/ops/<family>.py`` (the ops: intake spec, plan rule, kernel templates, public
functions in ``__all__``, ``instantiations()``), ``cupykern/reference/<family>.py`` (the
float64 twins, in ``__all__``), ``cupykern/registry/<family>.py`` (``SPECS``) and
``tests/test_<family>.py``. :data:`FAMILIES` is the only other place a family is named:
the package's exports, the reference's exports, the registry, ``cupykern check`` and the
compile tests all derive from it.
"""

from __future__ import annotations

import importlib

#: The kernel families, in the order tables list them.
FAMILIES = ("norm", "softmax", "row_reduce", "activation", "quant", "rope", "gemv", "attention", "tokens")


def modules(kind: str) -> list:
    """The ``cupykern.<kind>.<family>`` module of each family (kind: ops, reference, registry)."""
    return [importlib.import_module(f"cupykern.{kind}.{family}") for family in FAMILIES]


def public_names(kind: str) -> dict:
    """``{name: object}`` of every family module's ``__all__`` (kind: ops or reference)."""
    return {name: getattr(module, name) for module in modules(kind) for name in module.__all__}


def instantiations(only=None) -> dict[str, list[str]]:
    """Every kernel instantiation the package can launch, as {source file: [name expressions]};
    with ``only`` (a family name or an iterable of them), those families' alone.
    ``cupykern.covering`` picks the subset a first run compiles. ValueError naming ``only``
    for no name or one not in :data:`FAMILIES` (an empty answer would read as "nothing to
    compile"), TypeError for what is not a name or names."""
    spaces: dict[str, list[str]] = {}
    chosen = FAMILIES if only is None else _known(only)
    for module in (importlib.import_module(f"cupykern.ops.{family}") for family in chosen):
        for template, exprs in module.instantiations().items():
            spaces.setdefault(template.source, []).extend(exprs)
    return spaces


def _known(only) -> list[str]:
    """The families ``only`` names (one name, or an iterable of names), in FAMILIES' order;
    TypeError for anything else, ValueError for no name or an unknown one."""
    if isinstance(only, str):
        names = {only}
    elif isinstance(only, (bytes, bytearray)) or not hasattr(only, "__iter__"):
        raise TypeError(f"only: expected a family name or an iterable of them, got {only!r}")
    else:
        names = list(only)
        if not all(isinstance(name, str) for name in names):
            raise TypeError(f"only: expected family names (str), got {only!r}")
        names = set(names)
    if not names:
        raise ValueError(f"only: expected at least one family name from {FAMILIES}, got {only!r}")
    unknown = sorted(map(repr, names - set(FAMILIES)))
    if unknown:
        raise ValueError(f"only: expected kernel family names from {FAMILIES}, got unknown {', '.join(unknown)}")
    return [f for f in FAMILIES if f in names]
