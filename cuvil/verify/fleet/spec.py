"""The fleet file: which models ``cuvil verify-fleet`` verifies, on which targets, with which checks.

A TOML file with ``[defaults]`` and one ``[[model]]`` table per model or glob of models::

    [defaults]
    targets = ["ref", "native"]       # the targets of every model (each one job per check group)
    checks = ["compat"]               # check groups or checks, each entry one job: ["compat", "layerwise"]
    timeout = 600                     # seconds a job may run before it is killed (a hang)
    memory = "8GiB"                   # the address space a job may use (default: the node's RAM)
    strict = false                    # warnings fail too
    seed = 0
    config = "cuvil.toml"             # a verify configuration the models share
    faults = []                       # planted faults (cuvil/faults.py): the fleet's own tests use them

    [defaults.thresholds.cross-target]   # per-check options and thresholds, as [checks.NAME] of cuvil.toml
    max_rel_l2 = 1e-5

    [[model]]
    path = "models/*.onnx"            # relative to this file; globs allowed
    baseline = "baselines/{stem}.json"   # a stored run per model ({stem}, {name}: of each matched model)

    [[model]]
    path = "detector.onnx"
    targets = ["native", "wasm32"]    # every default can be set per model
    inputs = "samples/detector"       # real input samples (a folder of .npz), as cuvil verify --inputs
    [model.thresholds.precision]
    max_rel_l2 = 1e-4

    [[model]]
    path = "nets.py:resnet_tiny"      # path/to/file.py:factory, as cuvil verify takes it

    [resources.cuda]                  # Ray resources a target's jobs ask for besides one CPU
    num_gpus = 1

Paths are relative to the fleet file's folder, so the file means the same from any working folder.
Unknown keys, unknown targets or checks, globs matching nothing, a model listed twice and missing
files are :class:`VerifyError` s naming the file and the entry (exit status 2), raised before any
job runs.
"""

from __future__ import annotations

import glob
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuvil.verify.base import VerifyError
from cuvil.verify.config import PATH_OPTIONS, parse_size

#: What [defaults] and every [[model]] may set.
SETTINGS = frozenset({"targets", "checks", "timeout", "memory", "strict", "seed", "config", "faults", "thresholds",
                      "inputs", "baseline"})
MODEL_KEYS = SETTINGS | {"path", "name"}
TOP_KEYS = frozenset({"defaults", "model", "resources"})
RESOURCE_KEYS = frozenset({"num_cpus", "num_gpus", "resources"})
DEFAULT_TIMEOUT = 600.0


@dataclass(frozen=True)
class ModelEntry:
    """One model of the fleet with its settings resolved (defaults, then the entry's own)."""

    name: str  # how reports call it: its path relative to the fleet file, or file.py:factory
    source: str  # what cuvil.verify is given: an absolute path, or /abs/file.py:factory
    files: tuple[Path, ...]  # the files whose bytes are the model's digest
    targets: tuple[str, ...]
    checks: tuple[str, ...]
    timeout: float
    memory: int | None
    strict: bool
    seed: int | None
    config: Path | None
    faults: tuple[str, ...]
    thresholds: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    inputs: Path | None = None
    baseline: Path | None = None


@dataclass(frozen=True)
class Fleet:
    """A parsed fleet file."""

    path: Path
    models: tuple[ModelEntry, ...]
    #: Per target, the Ray resources its jobs ask for (``num_cpus``, ``num_gpus``, ``resources``).
    resources: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def job_count(self) -> int:
        return sum(len(m.targets) * len(m.checks) for m in self.models)


def _fail(path: Path, where: str, message: str) -> VerifyError:
    return VerifyError(f"{path}: {where}: {message}")


def _strings(value: Any, path: Path, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(x, str) and x.strip() for x in value):
        raise _fail(path, where, f"must be a non-empty list of strings, got {value!r}")
    return tuple(dict.fromkeys(x.strip() for x in value))


def _settings(table: Mapping[str, Any], path: Path, where: str, allowed: frozenset[str]) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        raise _fail(path, where, "must be a table")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _fail(path, where, f"unknown keys {', '.join(unknown)} (known: {', '.join(sorted(allowed))})")
    return dict(table)


def _thresholds(value: Any, base: Path, path: Path, where: str) -> dict[str, dict[str, Any]]:
    if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
        raise _fail(path, where, "thresholds must be a table of [thresholds.CHECK] tables of options")
    out: dict[str, dict[str, Any]] = {}
    for check, options in value.items():
        opts = dict(options)
        for key in PATH_OPTIONS.get(check, ()):  # files named by a check's options: relative to the fleet file
            if isinstance(opts.get(key), str):
                opts[key] = str((base / opts[key]).resolve())
        out[str(check)] = opts
    return out


def _merged(defaults: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """The entry's settings over the defaults; thresholds merge per check (the entry's options win)."""
    merged = {**defaults, **own}
    if "thresholds" in defaults and "thresholds" in own:
        th = {k: dict(v) for k, v in defaults["thresholds"].items()}
        for check, opts in own["thresholds"].items():
            th.setdefault(check, {}).update(opts)
        merged["thresholds"] = th
    return merged


def _check_targets(targets: tuple[str, ...], path: Path, where: str) -> None:
    from cuvil.backends.registry import backend_names

    known = backend_names()
    for t in targets:
        if t not in known:
            raise _fail(path, where, f"unknown target {t!r} (known: {', '.join(known)})")


def _check_checks(checks: tuple[str, ...], path: Path, where: str) -> None:
    from cuvil.verify.runner import load_builtin_checks, select_checks

    load_builtin_checks()
    for c in checks:
        try:
            select_checks([c])
        except VerifyError as exc:
            raise _fail(path, where, str(exc)) from None


def _existing(value: Any, base: Path, path: Path, where: str, key: str, *, folder: bool = False) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, where, f"{key} must be a path, got {value!r}")
    p = (base / value).resolve()
    ok = p.is_dir() if folder else p.is_file()
    if not ok:
        raise _fail(path, where, f"{key} {value!r}: no such {'folder' if folder else 'file'} ({p})")
    return p


def _number(value: Any, path: Path, where: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _fail(path, where, f"{key} must be a positive number of seconds, got {value!r}")
    return float(value)


def _matches(pattern: str, base: Path, path: Path, where: str) -> list[tuple[str, str, tuple[Path, ...]]]:
    """(name, source, files) of every model a ``path`` entry names."""
    from cuvil.verify.loader import split_factory

    factory = split_factory(pattern)
    if factory is not None:
        file, fn = factory
        p = (base / file).resolve()
        if not p.is_file():
            raise _fail(path, where, f"path {pattern!r}: no such file ({p})")
        return [(f"{file.as_posix()}:{fn}", f"{p}:{fn}", (p,))]
    if glob.has_magic(pattern):
        found = sorted(Path(m) for m in glob.glob(str(base / pattern), recursive=True))
        found = [m for m in found if m.is_file()]
        if not found:
            raise _fail(path, where, f"path {pattern!r} matches no file under {base}")
    else:
        found = [base / pattern]
        if not found[0].is_file():
            raise _fail(path, where, f"path {pattern!r}: no such file ({found[0].resolve()})")
    out: list[tuple[str, str, tuple[Path, ...]]] = []
    for m in found:
        r = m.resolve()
        try:
            name = r.relative_to(base.resolve()).as_posix()
        except ValueError:
            name = str(r)
        out.append((name, str(r), (r,)))
    return out


def _entry(name: str, source: str, files: tuple[Path, ...], s: Mapping[str, Any], base: Path, path: Path,
           where: str) -> ModelEntry:
    from cuvil.errors import CuvilError
    from cuvil.faults import checked

    if "targets" not in s or "checks" not in s:
        missing = [k for k in ("targets", "checks") if k not in s]
        raise _fail(path, where, f"no {' or '.join(missing)}: set them in [defaults] or in the entry")
    targets = _strings(s["targets"], path, f"{where}: targets")
    _check_targets(targets, path, where)
    checks = _strings(s["checks"], path, f"{where}: checks")
    _check_checks(checks, path, where)
    # {stem} in a path: the model file's stem, or a factory's function name
    stem = source.rpartition(":")[2] if source.rpartition(":")[0].endswith(".py") else Path(source).stem
    memory = s.get("memory")
    mem = parse_size(memory, f"{path}: {where}: memory") if memory is not None else None
    planted = _strings(s["faults"], path, f"{where}: faults") if s.get("faults") else ()
    try:
        faults = tuple(sorted(checked(planted)))
    except CuvilError as exc:  # an unknown fault, named
        raise _fail(path, where, str(exc)) from None
    strict = s.get("strict", False)
    if not isinstance(strict, bool):
        raise _fail(path, where, f"strict must be true or false, got {strict!r}")
    seed = s.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _fail(path, where, f"seed must be an integer, got {seed!r}")

    def templated(key: str) -> str:
        value = s[key]
        if not isinstance(value, str):
            raise _fail(path, where, f"{key} must be a path, got {value!r}")
        return value.replace("{stem}", stem).replace("{name}", name.replace("/", "_").replace(":", "_"))

    return ModelEntry(
        name=name, source=source, files=files, targets=targets, checks=checks,
        timeout=_number(s.get("timeout", DEFAULT_TIMEOUT), path, where, "timeout"), memory=mem, strict=strict,
        seed=seed, faults=faults,
        config=_existing(s["config"], base, path, where, "config") if "config" in s else None,
        thresholds={k: dict(v) for k, v in s.get("thresholds", {}).items()},  # checked and resolved when read
        inputs=_existing(templated("inputs"), base, path, where, "inputs", folder=True) if "inputs" in s else None,
        baseline=_existing(templated("baseline"), base, path, where, "baseline") if "baseline" in s else None)


def _resources(table: Any, path: Path) -> dict[str, dict[str, Any]]:
    if not isinstance(table, Mapping):
        raise _fail(path, "resources", "must be a table of [resources.TARGET] tables")
    out: dict[str, dict[str, Any]] = {}
    for target, spec in table.items():
        where = f"resources.{target}"
        s = _settings(spec, path, where, RESOURCE_KEYS)
        _check_targets((str(target),), path, where)
        for key in ("num_cpus", "num_gpus"):
            if key in s and (isinstance(s[key], bool) or not isinstance(s[key], (int, float)) or s[key] < 0):
                raise _fail(path, where, f"{key} must be a non-negative number, got {s[key]!r}")
        extra = s.get("resources", {})
        if not isinstance(extra, Mapping) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                     for v in extra.values()):
            raise _fail(path, where, "resources must be a table of name = amount")
        out[str(target)] = s
    return out


def parse_fleet(doc: Mapping[str, Any], path: Path) -> Fleet:
    """A fleet from the parsed TOML ``doc`` of the file ``path`` (paths are relative to its folder)."""
    base = path.resolve().parent
    unknown = sorted(set(doc) - TOP_KEYS)
    if unknown:
        raise VerifyError(f"{path}: unknown top-level keys {', '.join(unknown)} (known: defaults, model, resources)")
    defaults = _settings(doc.get("defaults", {}), path, "[defaults]", SETTINGS)
    if "thresholds" in defaults:
        defaults["thresholds"] = _thresholds(defaults["thresholds"], base, path, "[defaults]")
    entries = doc.get("model")
    if not isinstance(entries, list) or not entries:
        raise VerifyError(f"{path}: no [[model]] entries (each names a model: path = \"model.onnx\")")
    models: list[ModelEntry] = []
    seen: dict[str, str] = {}
    for i, table in enumerate(entries, 1):
        where = f"[[model]] {i}"
        own = _settings(table, path, where, MODEL_KEYS)
        if not isinstance(own.get("path"), str) or not own["path"].strip():
            raise _fail(path, where, "needs path = \"model.onnx\" (a file, a glob or path/to/file.py:factory)")
        where = f"[[model]] {i} ({own['path']})"
        if "thresholds" in own:
            own["thresholds"] = _thresholds(own["thresholds"], base, path, where)
        matched = _matches(own.pop("path"), base, path, where)
        name = own.pop("name", None)
        if name is not None:
            if not isinstance(name, str) or not name.strip() or len(matched) != 1:
                raise _fail(path, where, "name must be a non-empty string, on an entry naming one model")
            matched = [(name.strip(), matched[0][1], matched[0][2])]
        settings = _merged(defaults, own)
        for model_name, source, files in matched:
            if source in seen or model_name in seen.values():
                raise _fail(path, where, f"{model_name} is listed twice (also by {seen.get(source, model_name)})")
            seen[source] = model_name
            models.append(_entry(model_name, source, files, settings, base, path, where))
    return Fleet(path=path.resolve(), models=tuple(models), resources=_resources(doc.get("resources", {}), path))


def load_fleet(path: str | Path) -> Fleet:
    """The fleet file at ``path``."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            doc = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise VerifyError(f"{p}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise VerifyError(f"{p}: cannot read the fleet file: {exc.strerror or exc}") from None
    return parse_fleet(doc, p)
