"""Benchmark of the RoPE family (issue 3's table).

apply_rope and qk_rms_norm_rope at num_tokens 1, 64, 1024, 16384 with 32 q heads,
8 kv heads, head_dim 128, random positions, bf16; apply_rope beside a plain-CuPy
composition, qk_rms_norm_rope beside the split "rms_norm then apply_rope".

    python bench/bench_rope.py [--out DIR] [--seed S]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import main  # noqa: E402

CASES = [(op, n, 128, "bf16") for op in ("apply_rope", "qk_rms_norm_rope") for n in (1, 64, 1024, 16384)]

if __name__ == "__main__":
    main("rope", __doc__.splitlines()[0], CASES)
