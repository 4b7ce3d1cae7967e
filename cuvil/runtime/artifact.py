"""Saved models: writing a compiled model to a folder, and ``cuvil.load`` reading it back.

An artifact is a folder that runs without the original model and without
the Python that compiled it::

    meta.json        what this file describes (below)
    model.c          the generated C (rebuilds standalone: the headers are beside it)
    cuvil_api.h      the documented C API (cuvil_load, cuvil_run, cuvil_free ...)
    cuvil_rt.h ...   the runtime headers model.c includes
    model.so         the library (model.wasm for a WebAssembly target)
    model.*.so       x86_avx512: the same code for CPUs with VNNI, AVX512_BF16 (loaded there)
    weights.bin      the constants, loaded or mapped at start-up

Which files a backend writes is the backend's business: its executor names
them (``artifact_files()``) and describes them (``artifact_meta()``: the
backend, each file's role, the compiler and flags, a rebuild command).
This module adds what any artifact has: the format and its version, the
Cuvil version, the target, the model's signature (inputs and outputs with
their dtypes and shapes, the symbols and their constraints), where the
model came from (its sha256) and what compiling it took, and the size and
sha256 of every file, which ``load`` checks before anything is mapped.

A folder is written whole or not at all: it is built beside the
destination and renamed into place, so a reader never sees half an
artifact, and a library already loaded from the old folder stays valid.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from cuvil._version import __version__
from cuvil.errors import CuvilError, ModelError
from cuvil.runtime.compiled import CompiledModel, CompileInfo, Executor, Signature

FORMAT = "cuvil-artifact"
FORMAT_VERSION = 1
META = "meta.json"

# The backend named in meta.json, and the module whose ``load_executor(folder, meta)`` opens it.
BACKENDS = {"c": "cuvil.backends.c", "wasm": "cuvil.backends.wasm", "cuda": "cuvil.backends.cuda"}
# Every artifact has these; a backend may add roles of its own (all listed in meta.json "files").
REQUIRED_ROLES = ("library", "weights")


# Dims and symbol bounds are int64 in the runtimes.
_DIM_END = 1 << 63


class ArtifactError(ModelError):
    """A folder is not a loadable Cuvil artifact: a file is missing or changed, or meta.json is malformed."""


@runtime_checkable
class SavableExecutor(Protocol):
    """An executor whose compiled form can be saved: what a backend gives ``save``."""

    def artifact_files(self) -> dict[str, Path]:
        """Each file of the artifact, by its name there, and where it is now."""
        ...

    def artifact_meta(self) -> dict[str, Any]:
        """The backend's part of meta.json: at least ``backend`` and ``files`` (role -> file name)."""
        ...


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save(model: CompiledModel, path: str | os.PathLike[str]) -> Path:
    """Write ``model`` as an artifact folder at ``path`` and return it.

    An existing artifact at ``path`` is replaced; any other non-empty folder is left alone (an error)."""
    executor = model._executor
    if not isinstance(executor, SavableExecutor):
        why = ("the reference interpreter has no compiled form; compile for a C target, e.g. target='native'"
               if model.target == "ref" else
               f"its executor ({type(executor).__name__}) does not name its files (artifact_files, artifact_meta)")
        raise CuvilError(f"a model compiled for target {model.target!r} cannot be saved: {why}")
    dest = Path(path)
    if dest.exists() and not dest.is_dir():
        raise CuvilError(f"{dest}: exists and is not a folder")
    if dest.is_dir() and any(dest.iterdir()) and not (dest / META).is_file():
        raise CuvilError(f"{dest}: folder is not empty and holds no Cuvil artifact; choose another")
    files = executor.artifact_files()
    backend_meta = executor.artifact_meta()
    roles = backend_meta.get("files", {})
    for role, name in roles.items():
        if name not in files:
            raise CuvilError(f"backend {backend_meta.get('backend')!r} names {role} file {name!r} but gives no such file")
    if META in files:
        raise CuvilError(f"backend {backend_meta.get('backend')!r} gives a file named {META}, which is reserved")
    clash = sorted(set(backend_meta) & {"format", "format_version", "cuvil_version", "target", "inputs", "outputs",
                                        "symbols", "compile", "digests"})
    if clash:
        raise CuvilError(f"backend {backend_meta.get('backend')!r} sets meta.json keys that save owns: {clash}")

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the artifact is an ordinary folder
        digests: dict[str, dict[str, Any]] = {}
        for name in sorted(files):
            shutil.copyfile(files[name], tmp / name)
            digests[name] = {"size": (tmp / name).stat().st_size, "sha256": _sha256(tmp / name)}
        meta: dict[str, Any] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "cuvil_version": __version__,
            "target": model.target,
            **model.signature.to_json(),
            **backend_meta,
            "compile": model.info.to_json(),
            "digests": digests,
        }
        (tmp / META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        _replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _replace(new: Path, dest: Path) -> None:
    """Move the finished folder ``new`` to ``dest``, replacing an artifact there."""
    if not dest.exists():
        os.replace(new, dest)
        return
    if not any(dest.iterdir()):
        dest.rmdir()
        os.replace(new, dest)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dest.name}-old-", dir=dest.parent))
    os.replace(dest, old / "artifact")
    os.replace(new, dest)
    shutil.rmtree(old, ignore_errors=True)


# ---- loading --------------------------------------------------------------------------------------------------


def read_meta(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """An artifact's meta.json, checked to be well formed (its files are not checked here)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactError(f"{folder}: no such folder" if not folder.exists() else f"{folder}: not a folder")
    path = folder / META
    if not path.is_file():
        raise ArtifactError(f"{folder}: holds no {META}; is it a folder written by `cuvil compile -o` or save()?")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise ArtifactError(f"{path}: nested too deeply to be a Cuvil meta.json") from None
    if not isinstance(meta, dict):
        raise ArtifactError(f"{path}: must hold a JSON object")
    if meta.get("format") != FORMAT:
        raise ArtifactError(f"{path}: \"format\" must be {FORMAT!r}, got {meta.get('format')!r}")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{path}: format_version {version!r}; this Cuvil ({__version__}) reads version "
                            f"{FORMAT_VERSION}")

    def need(key: str, kind: type | tuple[type, ...], what: str) -> Any:
        if key not in meta:
            raise ArtifactError(f"{path}: missing {key!r}")
        if not isinstance(meta[key], kind) or (isinstance(meta[key], bool) and kind is not bool):
            raise ArtifactError(f"{path}: {key!r} must be {what}, got {meta[key]!r}")
        return meta[key]

    need("cuvil_version", str, "a string")
    need("target", str, "a string")
    backend = need("backend", str, "a string")
    if backend not in BACKENDS:
        raise ArtifactError(f"{path}: unknown backend {backend!r}; this Cuvil loads {', '.join(sorted(BACKENDS))}")
    for key in ("inputs", "outputs", "symbols"):
        need(key, list, "a list")
    roles = need("files", dict, "an object (role -> file name)")
    digests = need("digests", dict, "an object (file name -> size and sha256)")
    need("compile", dict, "an object")
    for role in REQUIRED_ROLES:
        if role not in roles:
            raise ArtifactError(f"{path}: \"files\" names no {role} file")
    for role, name in roles.items():
        if not isinstance(name, str) or name not in digests:
            raise ArtifactError(f"{path}: the {role} file {name!r} is not among the \"digests\"")
    for name, d in digests.items():
        if (not isinstance(name, str) or not name or name != Path(name).name or name in (".", "..", META)
                or not isinstance(d, dict) or not isinstance(d.get("size"), int) or not isinstance(d.get("sha256"), str)):
            raise ArtifactError(f"{path}: bad \"digests\" entry {name!r}: {d!r} (a plain file name -> size, sha256)")
    for s in meta["symbols"]:
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) or any(
                s.get(k) is not None and (isinstance(s[k], bool) or not isinstance(s[k], int) or not lo <= s[k] < _DIM_END)
                for k, lo in (("min", 0), ("max", 0), ("multiple_of", 1))):
            raise ArtifactError(f"{path}: bad \"symbols\" entry {s!r} (a name, and min, max, multiple_of: "
                                "non-negative integers or null)")
    for key in ("inputs", "outputs"):
        for k, spec in enumerate(meta[key]):
            shape = spec.get("shape") if isinstance(spec, dict) else None
            if not isinstance(shape, list):
                raise ArtifactError(f"{path}: {key} {k} has no \"shape\" list: {spec!r:.200}")
            for d in shape:
                if not isinstance(d, str) and (isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < _DIM_END):
                    raise ArtifactError(f"{path}: {key} {k} ({spec.get('name')!r:.80}): dim {d!r:.40} is not a size "
                                        f"(0 to 2**63 - 1) or a symbol expression")
    try:
        Signature.from_json(meta)
        CompileInfo.from_json(meta["compile"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ArtifactError(f"{path}: malformed inputs, outputs, symbols or compile facts ({type(exc).__name__}: "
                            f"{exc})") from None
    return meta


def check_files(folder: Path, meta: Mapping[str, Any]) -> None:
    """Every file meta.json lists is present, with its recorded size and sha256."""
    for name, d in sorted(meta["digests"].items()):
        p = folder / name
        if not p.is_file():
            raise ArtifactError(f"{folder}: {name} is missing (meta.json lists it)")
        size = p.stat().st_size
        if size != d["size"]:
            raise ArtifactError(f"{folder}: {name} holds {size} bytes, meta.json says {d['size']}; the artifact "
                                "was changed after it was saved")
        if _sha256(p) != d["sha256"]:
            raise ArtifactError(f"{folder}: {name} does not match its sha256 in meta.json; the artifact was changed "
                                "after it was saved")


def load(path: str | os.PathLike[str]) -> CompiledModel:
    """Load an artifact folder written by ``CompiledModel.save`` or ``cuvil compile -o``.

    The original model is not needed. meta.json is checked, and every file
    against its size and sha256, before the library is loaded."""
    folder = Path(path)
    meta = read_meta(folder)
    check_files(folder, meta)
    module = importlib.import_module(BACKENDS[meta["backend"]])
    load_executor = getattr(module, "load_executor", None)
    if load_executor is None:
        raise ArtifactError(f"{folder}: this Cuvil's {meta['backend']} backend cannot load saved artifacts")
    executor: Executor = load_executor(folder, meta)
    return CompiledModel(Signature.from_json(meta), executor, meta["target"], None,
                         CompileInfo.from_json(meta["compile"]))
