"""The build cache: one folder per content hash, written atomically under a lock.

Two processes compiling the same model at once both succeed: the first
builds in a private folder and renames it into place under an exclusive
lock; the second waits on the lock and then finds the finished entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
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


def runtime_digest(runtime_dir: Path) -> str:
    """A digest of the runtime headers every generated file includes (part of each build's key)."""
    h = hashlib.sha256()
    for path in sorted(runtime_dir.iterdir()):
        if path.is_file():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def build_model_folder(
    root: Path,
    source: str,
    weights: bytes,
    key_parts: Sequence[str],
    compile_source: Callable[[Path, Path], str],
) -> tuple[Path, bool]:
    """The cache folder holding ``model.c``, ``weights.bin``, the compiled output and ``build.log``.

    The key hashes the source, the weights and ``key_parts`` (Cuvil version, target,
    compiler and flags, runtime digest). ``compile_source(model_c, folder)`` compiles and
    returns the compiler's messages. Returns the folder and whether it was cached."""
    h = hashlib.sha256()
    for part in (source, *key_parts):
        h.update(part.encode())
        h.update(b"\0")
    h.update(hashlib.sha256(weights).digest())

    def make(folder: Path) -> None:
        src = folder / "model.c"
        src.write_text(source, encoding="utf-8")
        (folder / "weights.bin").write_bytes(weights)
        (folder / "build.log").write_text(compile_source(src, folder), encoding="utf-8")

    return get_or_build(root, h.hexdigest(), make)


@dataclass
class BuildFolder:
    """A built model: its cache folder (source, compiled output, weights) and how long the build took."""

    folder: Path
    cached: bool
    seconds: float

    @property
    def weights(self) -> Path:
        return self.folder / "weights.bin"

    @property
    def source(self) -> Path:
        return self.folder / "model.c"

    @property
    def warnings(self) -> str:
        """What the compiler printed (empty when the code compiled cleanly)."""
        log = self.folder / "build.log"
        return log.read_text(encoding="utf-8") if log.is_file() else ""
