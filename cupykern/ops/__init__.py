"""The public ops, one module per kernel family (the file in kernels_cu/ of the same name).

Each module declares its ops as ``cupykern.launcher.Op`` objects (intake spec, plan
rule, kernel template), its public functions in ``__all__``, and every template
instantiation it can launch in ``instantiations()``. The list of families is
``cupykern.families.FAMILIES``; nothing is imported here.
"""
