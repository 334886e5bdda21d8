"""The ledger of register spills among the kernels the heuristics launch.

``covering.heuristic_picks()`` is every instantiation the planner launches without an
override or a tuned file (the model presets' picks, and the row kernels, the gated
activations and RoPE at any size).
ptxas spills a few of them to local memory, trading a few bytes of spill for occupancy
(rms_norm's bf16 scalar path on sm_90: 4 bytes at 64 registers, none at 72).
``tests/data/known_spills.json`` records those, {arch: {name expression: bytes}}, and
``tests/test_jit_compile.py::test_heuristic_picks_do_not_spill`` fails on any pick whose
spill differs from its entry (a new spill, a larger one, or a smaller one the ledger
has not caught up with); the covering set is checked by README's test command, every
pick by CI (``--compile-all``). The ledger holds NVRTC's version: another ptxas may
spill otherwise. Rewrite it after a change that moves spills, and say in the commit why
one was added:

    python tests/known_spills.py --write tests/data/known_spills.json

(NVRTC for sm_80 and sm_90, every core; a few minutes.)
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cupykern import covering, jit  # noqa: E402

ARCHS = ("80", "90")
LEDGER = Path(__file__).resolve().parent / "data" / "known_spills.json"


def load() -> dict[str, dict[str, int]]:
    """{arch: {name expression: bytes spilled}} as recorded."""
    return json.loads(LEDGER.read_text())["spills"]


def nvrtc_version() -> str:
    """The running NVRTC's version, as the ledger records it."""
    from cupy_backends.cuda.libs import nvrtc

    return ".".join(map(str, nvrtc.getVersion()))


def recorded_nvrtc() -> str:
    return json.loads(LEDGER.read_text())["nvrtc"]


def _spills(job):
    source, exprs, arch = job
    return arch, jit.nvrtc_spills(source, exprs, arch)


def measure() -> dict[str, dict[str, int]]:
    """{arch: {name expression: bytes}} of the heuristics' picks that spill, compiled now."""
    jobs = [(source, sorted(exprs)[i:i + 64], arch) for source, exprs in covering.heuristic_picks().items()
            for arch in ARCHS for i in range(0, len(exprs), 64)]
    found: dict[str, dict[str, int]] = {arch: {} for arch in ARCHS}
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for arch, spills in pool.map(_spills, jobs):
            found[arch].update({expr: n for expr, n in spills.items() if n})
    return {arch: dict(sorted(found[arch].items())) for arch in ARCHS}


def main(argv) -> int:
    if len(argv) != 2 or argv[0] != "--write":
        print(__doc__, file=sys.stderr)
        return 2
    spills = measure()
    document = {"nvrtc": nvrtc_version(), "spills": spills}
    Path(argv[1]).write_text(json.dumps(document, indent=1) + "\n")
    print(f"{sum(map(len, spills.values()))} spilling picks ({', '.join(f'sm_{a}: {len(s)}' for a, s in spills.items())}) "
          f"-> {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
