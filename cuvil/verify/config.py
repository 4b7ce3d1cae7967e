"""The verification suite's configuration: ``cuvil.toml``, or ``[tool.cuvil.verify]`` in ``pyproject.toml``.

Both hold the same keys (in ``cuvil.toml`` at the top level)::

    select = ["compatibility", "layerwise"]   # checks or groups to run (default: all registered)
    targets = ["ref", "native"]               # or ["all"]: every target available here
    strict = false                            # warnings fail the run too
    seed = 0                                  # seed of the generated inputs

    [checks.layerwise]                        # options and thresholds of one check, passed to it as is
    rel_l2 = 1e-5

    [baseline]                                # how far a figure may move against a baseline
    relative = 0.10                           # default margin: 10 % worse than the baseline
    absolute = 0.0                            # ... or this much, whichever is larger
    higher_is_better = ["*throughput*"]       # extra figure-name globs where larger is better

    [baseline.figures]                        # per-figure margins, matched by glob on "check.figure"
    "latency.*" = 0.25                        # a number: a relative margin
    "layerwise.*" = { relative = 1.0, absolute = 1e-7 }

    [checks.precision]                        # int8 too: calibrate on these samples (a folder of .npz)
    calibration = "calib"                     # relative to this file's folder

    [inputs]
    data = "samples"                          # real inputs: a folder of .npz, as for calibration
    [inputs.input_ids]                        # what one input is drawn from, over what Cuvil infers
    range = [0, 30521]                        # from the graph: integers (or floats) in [lo, hi] ...
    [inputs.attention_mask]
    values = [0, 1]                           # ... or one of these values
    [inputs.image]                            # the extents of its dims, over what Cuvil derives from
    dims = [1, 3, 32, { min = 32, typical = 320 }]   # the graph: per axis an extent or a table of
                                              # min, max, multiple_of and typical (samples use it);
                                              # or by symbol name: dims = { width = 320 }

Selection is named ``select`` because ``checks`` is the table of per-check options. A check
option that names a file or folder (:data:`PATH_OPTIONS`) is resolved against the folder of
the config file that sets it, so a configuration means the same from any working folder. Unknown
top-level keys are errors, so a misspelt key does not silently do nothing. Explicit arguments
(``cuvil verify --checks ...``, ``cuvil.verify(model, checks=...)``) override the file.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cuvil.ir.domains import Domain
from cuvil.verify.base import VerifyError

CONFIG_FILE = "cuvil.toml"
KEYS = frozenset({"select", "targets", "strict", "seed", "checks", "baseline", "inputs"})
INPUT_KEYS = frozenset({"range", "values", "dims"})
DIM_KEYS = frozenset({"min", "max", "multiple_of", "typical"})
BASELINE_KEYS = frozenset({"relative", "absolute", "higher_is_better", "figures"})
#: Per check, its options that name a file or folder: relative ones are relative to the config file.
PATH_OPTIONS: Mapping[str, tuple[str, ...]] = {"precision": ("calibration", "int8_samples")}


@dataclass(frozen=True)
class DeclaredDim:
    """What ``[inputs.NAME] dims`` says of one dim: bounds for the samples and a typical extent."""

    min: int | None = None
    max: int | None = None
    multiple_of: int | None = None
    typical: int | None = None


#: ``[inputs.NAME] dims``: a list with one entry per axis, or a table keyed by symbol name.
DeclaredDims = tuple[DeclaredDim, ...] | Mapping[str, DeclaredDim]


@dataclass(frozen=True)
class Margin:
    """How much worse than its baseline a figure may get: ``max(relative * |baseline|, absolute)``."""

    relative: float = 0.10
    absolute: float = 0.0

    def allowed(self, base: float) -> float:
        return max(self.relative * abs(base), self.absolute)


@dataclass(frozen=True)
class BaselineConfig:
    """Margins for baseline comparisons: a default, and per-figure overrides by glob."""

    default: Margin = Margin()
    figures: tuple[tuple[str, Margin], ...] = ()
    higher_is_better: tuple[str, ...] = ()


@dataclass(frozen=True)
class VerifyConfig:
    """The parsed configuration; ``path`` is the file it came from (None: defaults or a mapping)."""

    select: tuple[str, ...] | None = None
    targets: tuple[str, ...] | None = None
    strict: bool = False
    seed: int = 0
    checks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    baseline: BaselineConfig = BaselineConfig()
    path: Path | None = None
    #: Declared input domains (``[inputs.NAME]``), by input name.
    inputs: Mapping[str, Domain] = field(default_factory=dict)
    #: A folder of real input samples (``[inputs] data``, ``--inputs``): ``.npz`` files, one per sample.
    input_data: str | None = None
    #: Declared extents of input dims (``[inputs.NAME] dims``), by input name.
    dims: Mapping[str, DeclaredDims] = field(default_factory=dict)

    def as_context_config(self) -> dict[str, Any]:
        """The mapping VerifyContext reads (``ctx.check_config(name)`` looks in its "checks", its
        ``input_domains`` in "inputs")."""
        return {"checks": {k: dict(v) for k, v in self.checks.items()}, "seed": self.seed, "strict": self.strict,
                "inputs": dict(self.inputs), "input_data": self.input_data, "dims": dict(self.dims)}


def _where(path: Path | None) -> str:
    return f"{path}: " if path is not None else "verify config: "


def _str_list(value: Any, key: str, path: Path | None) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [x.strip() for x in value.split(",") if x.strip()]
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise VerifyError(f"{_where(path)}{key} must be a list of strings, got {value!r}")
    return tuple(value)


def _number(value: Any, key: str, path: Path | None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise VerifyError(f"{_where(path)}{key} must be a non-negative number, got {value!r}")
    return float(value)


def _margin(value: Any, key: str, default: Margin, path: Path | None) -> Margin:
    if isinstance(value, Mapping):
        unknown = set(value) - {"relative", "absolute"}
        if unknown:
            raise VerifyError(f"{_where(path)}{key}: unknown keys {sorted(unknown)} (known: relative, absolute)")
        return Margin(_number(value.get("relative", default.relative), f"{key}.relative", path),
                      _number(value.get("absolute", default.absolute), f"{key}.absolute", path))
    return Margin(_number(value, key, path), default.absolute)


def _baseline(table: Any, path: Path | None) -> BaselineConfig:
    if not isinstance(table, Mapping):
        raise VerifyError(f"{_where(path)}baseline must be a table")
    unknown = set(table) - BASELINE_KEYS
    if unknown:
        raise VerifyError(f"{_where(path)}baseline: unknown keys {sorted(unknown)} (known: {', '.join(sorted(BASELINE_KEYS))})")
    default = _margin({k: table[k] for k in ("relative", "absolute") if k in table}, "baseline", Margin(), path)
    figures = table.get("figures", {})
    if not isinstance(figures, Mapping):
        raise VerifyError(f"{_where(path)}baseline.figures must be a table of glob = margin")
    per = tuple((str(k), _margin(v, f"baseline.figures.{k!r}", default, path)) for k, v in figures.items())
    hib = _str_list(table.get("higher_is_better", []), "baseline.higher_is_better", path)
    return BaselineConfig(default, per, hib)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _domain(name: str, table: Any, path: Path | None) -> Domain | None:
    """The declared domain of input ``name`` from its ``[inputs.NAME]`` table (None: it declares only dims)."""
    where = f"{_where(path)}inputs.{name}"
    if not isinstance(table, Mapping):
        raise VerifyError(f"{where} must be a table: [inputs.{name}] with range = [lo, hi] or values = [...]")
    unknown = set(table) - INPUT_KEYS
    if unknown:
        raise VerifyError(f"{where}: unknown keys {sorted(unknown)} (known: {', '.join(sorted(INPUT_KEYS))})")
    values = {k: v for k, v in table.items() if k != "dims"}
    if not values and "dims" in table:
        return None
    if len(values) != 1:
        raise VerifyError(f"{where} needs exactly one of range = [lo, hi] or values = [...]")
    if "range" in table:
        r = table["range"]
        if not (isinstance(r, list) and len(r) == 2 and all(_is_number(x) for x in r) and r[0] <= r[1]):
            raise VerifyError(f"{where}.range must be [lo, hi] with lo <= hi, got {r!r}")
        return Domain("declared in the configuration", low=float(r[0]), high=float(r[1]))
    v = table["values"]
    if not (isinstance(v, list) and v and all(_is_number(x) or isinstance(x, bool) for x in v)):
        raise VerifyError(f"{where}.values must be a non-empty list of numbers, got {v!r}")
    return Domain("declared in the configuration", values=tuple(float(x) for x in v))


def parse_config(data: Mapping[str, Any], path: Path | None = None) -> VerifyConfig:
    """A VerifyConfig from the keys of one config table; raises VerifyError on unknown or mistyped keys."""
    unknown = set(data) - KEYS
    if unknown:
        raise VerifyError(f"{_where(path)}unknown keys {sorted(unknown)} (known: {', '.join(sorted(KEYS))})")
    checks = data.get("checks", {})
    if not isinstance(checks, Mapping) or not all(isinstance(v, Mapping) for v in checks.values()):
        raise VerifyError(f"{_where(path)}checks must hold one table per check: [checks.NAME]")
    strict = data.get("strict", False)
    if not isinstance(strict, bool):
        raise VerifyError(f"{_where(path)}strict must be true or false, got {strict!r}")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise VerifyError(f"{_where(path)}seed must be an integer, got {seed!r}")
    return VerifyConfig(
        select=_str_list(data["select"], "select", path) if "select" in data else None,
        targets=_str_list(data["targets"], "targets", path) if "targets" in data else None,
        strict=strict,
        seed=seed,
        checks={str(k): _resolve_paths(str(k), dict(v), path) for k, v in checks.items()},
        baseline=_baseline(data.get("baseline", {}), path),
        path=path,
        inputs=_inputs(data.get("inputs", {}), path),
        input_data=_input_data(data.get("inputs", {}), path),
        dims=_dims(data.get("inputs", {}), path),
    )


def _inputs(table: Any, path: Path | None) -> dict[str, Domain]:
    if not isinstance(table, Mapping):
        raise VerifyError(f"{_where(path)}inputs must hold one table per input: [inputs.NAME]")
    out = {str(k): _domain(str(k), v, path) for k, v in table.items() if not (k == "data" and isinstance(v, str))}
    return {k: d for k, d in out.items() if d is not None}


def _dim(value: Any, where: str) -> DeclaredDim:
    """One entry of a ``dims`` declaration: an extent (its typical value) or a table of bounds."""
    if _is_int(value):
        if value < 0:
            raise VerifyError(f"{where} must not be negative, got {value!r}")
        return DeclaredDim(typical=int(value))
    if not isinstance(value, Mapping):
        raise VerifyError(f"{where} must be an extent or a table of min, max, multiple_of and typical, got {value!r}")
    unknown = set(value) - DIM_KEYS
    if unknown:
        raise VerifyError(f"{where}: unknown keys {sorted(unknown)} (known: {', '.join(sorted(DIM_KEYS))})")
    for k, v in value.items():
        if not _is_int(v) or v < (1 if k == "multiple_of" else 0):
            raise VerifyError(f"{where}.{k} must be a {'positive' if k == 'multiple_of' else 'non-negative'} "
                              f"integer, got {v!r}")
    d = DeclaredDim(**{k: int(v) for k, v in value.items()})
    if d.min is not None and d.max is not None and d.min > d.max:
        raise VerifyError(f"{where}: min {d.min} is above max {d.max}")
    if d.typical is not None and ((d.min is not None and d.typical < d.min) or (d.max is not None and d.typical > d.max)
                                  or (d.multiple_of and d.typical % d.multiple_of)):
        raise VerifyError(f"{where}: typical {d.typical} is outside its own min, max or multiple_of")
    return d


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _dims(table: Any, path: Path | None) -> dict[str, DeclaredDims]:
    """``[inputs.NAME] dims`` of every input that declares them."""
    out: dict[str, DeclaredDims] = {}
    if not isinstance(table, Mapping):
        return out
    for name, t in table.items():
        if not isinstance(t, Mapping) or "dims" not in t:
            continue
        where = f"{_where(path)}inputs.{name}.dims"
        dims = t["dims"]
        if isinstance(dims, list):
            out[str(name)] = tuple(_dim(v, f"{where}[{i}]") for i, v in enumerate(dims))
        elif isinstance(dims, Mapping):
            out[str(name)] = {str(k): _dim(v, f"{where}.{k}") for k, v in dims.items()}
        else:
            raise VerifyError(f"{where} must be a list (one entry per axis) or a table keyed by symbol name, "
                              f"got {dims!r}")
    return out


def _input_data(table: Any, path: Path | None) -> str | None:
    """``[inputs] data``: the folder of real samples, relative to the config file's folder."""
    value = table.get("data") if isinstance(table, Mapping) else None
    if not isinstance(value, str):
        return None
    if not value:
        raise VerifyError(f"{_where(path)}inputs.data must name a folder of .npz samples")
    return str(path.resolve().parent / value) if path is not None and not Path(value).is_absolute() else value


def _resolve_paths(check: str, options: dict[str, Any], path: Path | None) -> dict[str, Any]:
    """``options`` with its relative file and folder options (PATH_OPTIONS) made relative to ``path``'s folder."""
    if path is None:
        return options
    for key in PATH_OPTIONS.get(check, ()):
        value = options.get(key)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            options[key] = str(path.resolve().parent / value)
    return options


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise VerifyError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise VerifyError(f"{path}: cannot read the config file: {exc.strerror or exc}") from None


def _pyproject_table(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    table: Any = doc
    for key in ("tool", "cuvil", "verify"):
        if not isinstance(table, Mapping) or key not in table:
            return None
        table = table[key]
    return table if isinstance(table, Mapping) else None


def load_config(path: str | Path) -> VerifyConfig:
    """The configuration in one file: a ``pyproject.toml`` (its ``[tool.cuvil.verify]``) or a ``cuvil.toml``."""
    p = Path(path)
    doc = _read_toml(p)
    if p.name == "pyproject.toml":
        table = _pyproject_table(doc)
        if table is None:
            raise VerifyError(f"{p}: no [tool.cuvil.verify] table")
        return parse_config(table, p)
    return parse_config(doc, p)


def find_config(start: str | Path = ".") -> VerifyConfig:
    """The configuration that applies in ``start``: the nearest ``cuvil.toml``, or ``pyproject.toml`` with a
    ``[tool.cuvil.verify]`` table, in ``start`` or a folder above it; defaults when there is none.

    The search stops at the first folder holding either file (a ``pyproject.toml`` without the table
    still ends it: it marks the project root)."""
    here = Path(start).resolve()
    for folder in (here, *here.parents):
        own = folder / CONFIG_FILE
        if own.is_file():
            return load_config(own)
        py = folder / "pyproject.toml"
        if py.is_file():
            table = _pyproject_table(_read_toml(py))
            return parse_config(table, py) if table is not None else VerifyConfig()
    return VerifyConfig()


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B?)\s*", re.IGNORECASE)
_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(value: int | float | str, what: str = "size") -> int:
    """Bytes from a number of bytes or a size such as ``"512M"``, ``"2GiB"``, ``"64KB"`` (binary units:
    K, KB and KiB are all 1024 bytes); anything else is a :class:`VerifyError` naming ``what``."""
    if isinstance(value, bool):
        raise VerifyError(f"{what} must be a size such as 512M, 2GiB or a number of bytes, got {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise VerifyError(f"{what} must be positive, got {value!r}")
        return int(value)
    m = _SIZE.fullmatch(str(value))
    if m is None or (m.group(3) and not m.group(2) and m.group(3).upper() != "B"):
        raise VerifyError(f"{what} must be a size such as 512M, 2GiB or a number of bytes, got {value!r}")
    size = int(float(m.group(1)) * _UNIT[m.group(2).upper()])
    if size <= 0:
        raise VerifyError(f"{what} must be positive, got {value!r}")
    return size


def with_options(config: VerifyConfig, options: Mapping[str, Mapping[str, Any]]) -> VerifyConfig:
    """``config`` with per-check options set over its ``[checks.NAME]`` tables (command-line options win)."""
    if not options:
        return config
    checks = {k: dict(v) for k, v in config.checks.items()}
    for name, opts in options.items():
        checks.setdefault(name, {}).update(opts)
    return replace(config, checks=checks)


def resolve_config(config: VerifyConfig | Mapping[str, Any] | str | Path | None, start: str | Path = ".") -> VerifyConfig:
    """Whatever ``cuvil.verify(config=...)`` accepts, as a VerifyConfig (None: search from ``start``)."""
    if config is None:
        return find_config(start)
    if isinstance(config, VerifyConfig):
        return config
    if isinstance(config, (str, Path)):
        return load_config(config)
    if isinstance(config, Mapping):
        return parse_config(config)
    raise VerifyError(f"config must be a path, a mapping or a VerifyConfig, not {type(config).__name__}")
