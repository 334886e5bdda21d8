"""Benchmark of the gated activations (issue 4's table).

silu_and_mul and gelu_and_mul at num_tokens 1, 64, 1024, 16384 with d 11008 and 14336
in bf16, beside a plain-CuPy composition (silu_and_mul) and a copy in the same run.

    python bench/bench_activation.py [--out DIR] [--seed S]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import main  # noqa: E402

CASES = [(op, n, d, "bf16") for op in ("silu_and_mul", "gelu_and_mul") for d in (11008, 14336)
         for n in (1, 64, 1024, 16384)]

if __name__ == "__main__":
    main("activation", __doc__.splitlines()[0], CASES)
