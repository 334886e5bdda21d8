"""GPU: every op's outputs are bit for bit those of the commit that wrote the digests.

``tests/data/golden_outputs.json`` holds SHA-256 digests of fixed-seed outputs through
the public API (tests/golden_outputs.py), written on the GPU it names by an earlier
commit (re-recorded, with the command in tests/golden_outputs.py, by a commit that
changes bits on purpose, e.g. the row reduction tree of issue 11). On that GPU kind the default plans must give
the same bytes (other GPUs may differ in the 16-bit fast-math intrinsics, so the test
is skipped there).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import golden_outputs

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_outputs.json"


@pytest.mark.gpu
def test_outputs_are_bit_identical_to_the_recorded_commit():
    recorded = json.loads(GOLDEN.read_text())
    if golden_outputs.gpu_name() != recorded["gpu"]:
        pytest.skip(f"digests were recorded on {recorded['gpu']}, this is {golden_outputs.gpu_name()}")
    got = golden_outputs.digests()
    assert set(got) == set(recorded["digests"])
    changed = sorted(case for case, digest in got.items() if digest != recorded["digests"][case])
    assert not changed, f"{len(changed)} of {len(got)} cases changed bits: {changed[:10]}"
