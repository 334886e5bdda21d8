"""The one cache-directory rule (cupykern/user_cache.py) as its two users see it (CPU).

``$CUPYKERN_CACHE_DIR`` moves both the tuned-config file (cupykern/tuning.py) and the
model files (cupykern/llm/fetch.py); without it both sit in platformdirs' user cache
directory for ``cupykern``; ``$CUPYKERN_TUNE_FILE`` moves the tuned file alone.
"""

from __future__ import annotations

import sys

import platformdirs
import pytest

from cupykern import tuning, user_cache
from cupykern.llm import fetch

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def clean_env(monkeypatch):
    """No cache overrides in the environment; the tuned file re-read after the test."""
    monkeypatch.delenv(user_cache.CACHE_ENV, raising=False)
    monkeypatch.delenv(tuning.ENV_FILE, raising=False)
    tuning.reload()
    yield monkeypatch
    monkeypatch.undo()  # restore the environment before the next reload sees it
    tuning.reload()


def test_cache_env_moves_the_tuned_file_and_the_models(clean_env, tmp_path):
    clean_env.setenv(user_cache.CACHE_ENV, str(tmp_path / "cache"))
    tuning.reload()
    assert user_cache.cache_dir() == tmp_path / "cache"
    assert tuning.path() == tmp_path / "cache" / "tuned.json"
    assert fetch.model_path("smollm2") == tmp_path / "cache" / "models" / MODEL_FILE


def test_cache_env_expands_the_home_directory(clean_env, tmp_path):
    clean_env.setenv("HOME", str(tmp_path))
    clean_env.setenv(user_cache.CACHE_ENV, "~/elsewhere")
    assert user_cache.cache_dir() == tmp_path / "elsewhere"


def test_without_overrides_both_sit_in_platformdirs_user_cache_dir(clean_env):
    base = platformdirs.user_cache_dir("cupykern", appauthor=False)
    assert str(user_cache.cache_dir()) == base
    assert str(tuning.path().parent) == base and tuning.path().name == "tuned.json"
    assert str(fetch.model_path("smollm2").parent.parent) == base


@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="XDG_CACHE_HOME is the Linux/Unix rule")
def test_without_overrides_linux_follows_xdg_cache_home(clean_env, tmp_path):
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache.cache_dir() == tmp_path / "xdg" / "cupykern"
    assert fetch.model_path("smollm2") == tmp_path / "xdg" / "cupykern" / "models" / MODEL_FILE


def test_tune_file_env_moves_the_tuned_file_alone(clean_env, tmp_path):
    clean_env.setenv(user_cache.CACHE_ENV, str(tmp_path / "cache"))
    clean_env.setenv(tuning.ENV_FILE, str(tmp_path / "mine" / "tuned.json"))
    tuning.reload()
    assert tuning.path() == tmp_path / "mine" / "tuned.json"
    assert fetch.model_path("smollm2") == tmp_path / "cache" / "models" / MODEL_FILE
