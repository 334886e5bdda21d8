"""The public ops, one module per kernel family (the file in kernels_cu/ of the same name).

Each module validates its arguments, plans the launch (cupykern.launch) and launches
on CuPy's current stream, and declares every template instantiation it can launch
in ``instantiations()``.
"""

from cupykern.ops import activation, norm, rope, row_reduce, softmax

#: The family modules, for jit.instantiations() and the CPU compile test.
FAMILIES = (norm, softmax, row_reduce, activation, rope)
