"""Benchmark of the norm family and softmax (issue 2's table).

rms_norm, fused_add_rms_norm, layer_norm and softmax at num_tokens 1, 16, 64, 1024,
16384 and hidden 2048, 4096, 8192, in bf16 and fp16, beside plain-CuPy compositions.

    python bench/bench_norm.py [--out DIR] [--seed S] [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import main  # noqa: E402

OPS = ("rms_norm", "fused_add_rms_norm", "layer_norm", "softmax")
NUM_TOKENS = (1, 16, 64, 1024, 16384)
HIDDEN_SIZES = (2048, 4096, 8192)
DTYPES = ("bf16", "fp16")


def cases(quick: bool = False):
    """(op, num_tokens, hidden_size, dtype) of the table; ``quick``: bf16 only."""
    for op in OPS:
        for dtype in DTYPES[:1] if quick else DTYPES:
            for hidden in HIDDEN_SIZES:
                for n in NUM_TOKENS:
                    yield op, n, hidden, dtype


if __name__ == "__main__":
    main("norm", __doc__.splitlines()[0], cases(), quick_cases=cases(quick=True))
