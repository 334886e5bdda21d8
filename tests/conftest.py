"""Test configuration: the `gpu` marker, the seeded `rng` fixture, an empty tuned file
(`tune_file`) and the launch path on stand-ins (`fake_launcher`).

GPU tests are marked ``@pytest.mark.gpu`` and skipped when CuPy sees no GPU. Every
test draws its inputs from ``rng``, seeded from the base seed (``--seed``, default
20261129) and the test's id, so each test gets its own reproducible inputs; the seed
is in every failure message (``rng.seed``).
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `import tests.helpers`


from cupykern import environment  # noqa: E402 - after the path insert

HAS_GPU = environment.gpu_available()


def pytest_addoption(parser):
    parser.addoption("--seed", type=int, default=20261129, help="base seed of every test's rng")
    parser.addoption("--compile-all", action="store_true",
                     help="tests/test_jit_compile.py: compile every instantiation (cupykern.families, minutes), "
                          "not the covering set (cupykern.covering)")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU: run on a GPU machine (see README)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class SeededRng(np.random.Generator):
    """A numpy Generator that remembers its seed (for failure messages)."""

    def __init__(self, seed: int):
        super().__init__(np.random.PCG64(seed))
        self.seed = seed


@pytest.fixture
def rng(request) -> SeededRng:
    base = request.config.getoption("--seed")
    return SeededRng(base ^ zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def tune_file(tmp_path):
    """An empty tuned-config file for this test (cupykern/tuning.py); afterwards the
    process sees the user's file again."""
    from cupykern import tuning

    path = tmp_path / "tuned.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tuning.ENV_FILE, str(path))
        tuning.reload()
        yield path
    tuning.reload()  # the variable is restored: read the user's file at the next lookup


@pytest.fixture
def fake_launcher(monkeypatch, tmp_path):
    """The launch path on stand-ins, without a GPU (tests/helpers.py ``fake_launcher``):
    returns the list of launches made; afterwards the stand-in recipes are forgotten."""
    from cupykern import tuning
    from tests.helpers import fake_launcher as install

    launches = install(monkeypatch, tmp_path / "tuned.json")
    yield launches
    tuning.reload()  # the variable is restored: forget the stand-in recipes (the launcher subscribes)
