"""A NumPy emulation of the row reduction tree (kernels_cu/cupykern/reduce.cuh) and of
each layout's schedule of it (rows.cuh::for_each_leaf, reduce.cuh::row_tree_reduce).

``tree_root`` is the definition: leaves, J columns folded in order, recursive halving.
``layout_root`` does what the kernels do with P threads per row and A columns per
thread: the walk of each lane's leaves (whole leaves round by round, then a partial
last leaf), the in-register halving, for P > 32 the halving over warps through shared
memory (depth first, as halving_subtree), then the lane butterfly, and returns lane 0's
value (the root every thread uses). ``op`` is any binary function; :func:`symbolic`
builds the expression itself, so equal results mean the same operations on the same
operands, not just equal numbers.
"""

from __future__ import annotations

import numpy as np

from cupykern import plans

WARP = 32
IDENTITY = object()  # the identity of ``symbolic``: padding and empty columns


def symbolic(a, b):
    """The expression ``(a, b)``; combining with IDENTITY is exact, as -0.0 + x and
    max(-inf, x) are for the kernels' ops."""
    if a is IDENTITY:
        return b
    if b is IDENTITY:
        return a
    return (a, b)


def tree_root(leaves, hidden_size: int, dtype, op, identity):
    """The tree's root over the leaf values ``leaves`` (one per 16-byte element group)."""
    columns = plans.tree_columns(hidden_size, dtype)
    x = [identity] * columns
    for v, leaf in enumerate(leaves):  # column v % J, leaves in increasing v
        x[v % columns] = op(x[v % columns], leaf)
    half = columns // 2
    while half:
        x[:half] = [op(x[j], x[j + half]) for j in range(half)]
        half //= 2
    return x[0]


def _halving_subtree(s, count: int, half: int, j: int, op):
    if half == count:
        return s[j]
    return op(_halving_subtree(s, count, 2 * half, j, op), _halving_subtree(s, count, 2 * half, j + half, op))


def _butterfly(values, op):
    """__shfl_xor_sync over groups of len(values) lanes, offsets width/2 .. 1."""
    offset = len(values) // 2
    while offset:
        values = [op(values[lane], values[lane ^ offset]) for lane in range(len(values))]
        offset //= 2
    return values


def layout_lanes(leaves, hidden_size: int, dtype, threads_per_row: int, columns_per_thread: int, op, identity):
    """Each lane's value after row_tree_reduce with this layout (lane 0's is the root)."""
    p, a = threads_per_row, columns_per_thread
    leaf = plans.leaf_width(dtype)
    num_whole = hidden_size // leaf
    partial = hidden_size % leaf != 0
    lanes = []
    for lane in range(p):
        column = [identity] * a
        v, m = lane, 0
        while v < num_whole:  # for_each_leaf: rounds of a leaves, column m % a
            column[m % a] = op(column[m % a], leaves[v])
            v, m = v + p, m + 1
        if partial and lane == num_whole % p:
            c = (num_whole // p) % a
            column[c] = op(column[c], leaves[num_whole])
        half = a // 2
        while half:
            column[:half] = [op(column[i], column[i + half]) for i in range(half)]
            half //= 2
        lanes.append(column[0])
    if p <= WARP:
        return _butterfly(lanes, op)
    warps = p // WARP
    crossed = [_halving_subtree(lanes[lane::WARP], warps, 1, 0, op) for lane in range(WARP)]
    return _butterfly(crossed, op)


def layout_root(leaves, hidden_size: int, dtype, threads_per_row: int, columns_per_thread: int, op, identity):
    """Lane 0's value: the root the layout computes."""
    return layout_lanes(leaves, hidden_size, dtype, threads_per_row, columns_per_thread, op, identity)[0]


# ----------------------------------------------------------------- float32, as the kernels
def f32_add(a, b):
    return np.float32(np.float32(a) + np.float32(b))


def f32_max(a, b):
    """MaxOp::apply: (a > b || a != a) ? a : b (NaN-propagating, first operand on ties)."""
    return a if (a > b or a != a) else b


def leaf_sums(row: np.ndarray) -> list:
    """row_reduce's "sum" leaves: -0.0 + x0 + x1 + ... in float32, per 16-byte element group."""
    leaf = plans.leaf_width(row.dtype)
    values = row.astype(np.float32)
    out = []
    for start in range(0, len(values), leaf):
        s = np.float32(-0.0)
        for x in values[start:start + leaf]:
            s = f32_add(s, x)
        out.append(s)
    return out


def leaf_maxes(row: np.ndarray) -> list:
    leaf = plans.leaf_width(row.dtype)
    values = row.astype(np.float32)
    out = []
    for start in range(0, len(values), leaf):
        s = np.float32(-np.inf)
        for x in values[start:start + leaf]:
            s = f32_max(s, x)
        out.append(s)
    return out
