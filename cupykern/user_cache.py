"""The one cache-directory rule: where the tuned-config file and the model files live.

``$CUPYKERN_CACHE_DIR`` if set, else the platform's user cache directory for
``cupykern`` as platformdirs gives it (``$XDG_CACHE_HOME/cupykern`` or
``~/.cache/cupykern`` on Linux, ``~/Library/Caches/cupykern`` on macOS,
``%LOCALAPPDATA%\\cupykern\\Cache`` on Windows). Inside it: ``tuned.json`` (the tuned
launch configurations; ``$CUPYKERN_TUNE_FILE`` moves that file alone) and ``models/``
(downloaded model files). CuPy's compiled-kernel cache is CuPy's own
(``$CUPY_CACHE_DIR``, default ``~/.cupy/kernel_cache``).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable that moves the whole cache directory.
CACHE_ENV = "CUPYKERN_CACHE_DIR"


def expand_user(value: str) -> Path:
    """``value`` as a path with ``~`` / ``~user`` expanded as a shell does: an unknown user
    is left as written (``Path.expanduser`` raises RuntimeError there)."""
    return Path(os.path.expanduser(value))


def unknown_home(path: Path) -> str | None:
    """Why a writer should not use ``path``: it still starts with ``~`` (a user
    :func:`expand_user` did not know), which would create a ``~name`` folder in the current
    directory; None for any other path."""
    if str(path).startswith("~"):
        return (f"{str(path).split('/')[0]} is no known user's home; set {CACHE_ENV} (or "
                f"CUPYKERN_TUNE_FILE) to a path that exists")
    return None


def cache_dir() -> Path:
    """The cupykern user cache directory (not created here)."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return expand_user(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("cupykern", appauthor=False))
