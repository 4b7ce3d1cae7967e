"""The build cache: one folder per content hash, written atomically under a lock.

Two processes compiling the same model at once both succeed: the first
builds in a private folder and renames it into place under an exclusive
lock; the second waits on the lock and then finds the finished entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

DONE = "complete"


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "cuvil"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def lookup(root: Path, key: str) -> Path | None:
    entry = root / key[:2] / key
    return entry if (entry / DONE).is_file() else None


def get_or_build(root: Path, key: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """The entry folder for ``key``, building it with ``build(folder)`` when absent.

    Returns the folder and whether it was already there."""
    entry = root / key[:2] / key
    if (entry / DONE).is_file():
        return entry, True
    with _locked(root / "locks" / f"{key}.lock"):
        if (entry / DONE).is_file():
            return entry, True
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=entry.parent))
        try:
            build(tmp)
            (tmp / DONE).write_text("ok\n")
            if entry.exists():  # a partial entry left by a crash: replace it
                shutil.rmtree(entry, ignore_errors=True)
            os.replace(tmp, entry)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return entry, False
