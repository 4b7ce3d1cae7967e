"""The import directions between Cuvil's layers, held as data and checked on every module's imports.

Layers, lowest first (``ALLOWED`` says which layers each one may import; a layer always imports
itself):

- ``base``: the version, errors, logging set-up, planted faults, run limits, error figures
  (``cuvil.metrics``), the callable-package loader.
- ``ir``: the IR and the op declarations that type it (``cuvil.ir``, ``cuvil.ops``): one layer, since
  the IR's parser, printer, verifier and builder read the op registry and node inference at module
  level, and the declarations are written in the IR's types.  Within the layer the declarations
  import only the IR's core modules (``IR_CORE``), so there is no import cycle.
- ``options``: the compile options object (``cuvil.options``), passed down to every layer above it.
- ``runtime``: the compiled model, its executor protocols, input guards, artifacts.  Backends build
  executors to its protocols and report a ``BuildInfo``; it names backends only by string (an
  artifact's ``meta.json`` says which backend package loads it: cuvil/runtime/artifact.py).
- ``backends``: the reference interpreter, the C and wasm backends and their kernel tables.
- ``passes``: the passes and their manager; the numeric-each instrument runs the reference
  interpreter (the semantic oracle), and plan-memory runs the C backend's planner.
- ``quant``: calibration and int8 quantization.
- ``custom``: the custom-op API (declaration, reference and C kernel registered together).
- ``frontends``: ONNX and PyTorch to Cuvil IR (the only layer that imports torch or onnx).
- ``api``: ``cuvil.compile``, and the package root (its public names load lazily,
  by name, so ``import cuvil`` imports nothing above ``base``).
- ``verify``: the pre-deployment verification suite.
- ``tools``: the command line, the pytest plugin and the conformance runner.

This is the order the code has, not the order a model flows through the compiler (front end, passes,
backends, runtime in DESIGN.md's picture): a layer is below the layers that *use* it.  The backends
build to the runtime's executor protocols, the passes use the reference interpreter and the C
memory planner, and compile (``api``) drives them all.

The rule is the same for every import: at module level or inside a function, a module imports
only its own layer and the layers ``ALLOWED`` lists.  Imports under ``if TYPE_CHECKING:`` are
not run-time imports and are not checked.  ``from cuvil import name`` is an import of the
submodule ``cuvil.name`` where there is one, else of the package root (layer ``api``).  An upward
edge that is known and not yet removed is listed in ``KNOWN_UPWARD`` with its reason; an entry
that no longer matches an import fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import REPO

PACKAGE = REPO / "cuvil"

# module prefix -> layer; the longest matching prefix wins
LAYER_OF: dict[str, str] = {
    "cuvil._version": "base",
    "cuvil._callable": "base",
    "cuvil.errors": "base",
    "cuvil.log": "base",
    "cuvil.faults": "base",
    "cuvil.limits": "base",
    "cuvil.metrics": "base",
    "cuvil.ir": "ir",
    "cuvil.ops": "ir",
    "cuvil.options": "options",
    "cuvil.runtime": "runtime",
    "cuvil.backends": "backends",
    "cuvil.passes": "passes",
    "cuvil.pipeline": "quant",  # the pass pipeline of a (target, options), int8 insertion included
    "cuvil.quant": "quant",
    "cuvil.custom": "custom",
    "cuvil.frontends": "frontends",
    "cuvil.frontends.onnx.cut": "frontends",  # a source ONNX model cut as a cut of its imported graph (cuvil reduce)
    "cuvil": "api",  # the package root
    "cuvil.api": "api",
    "cuvil.verify": "verify",
    "cuvil.verify.fleet": "verify",  # sweeps over many models: jobs of cuvil verify in processes of their own
    "cuvil.cli": "tools",
    "cuvil.commands": "tools",
    "cuvil.__main__": "tools",
    "cuvil.pytest_plugin": "tools",
    "cuvil.conformance": "tools",
    "cuvil.reduce": "tools",
    "cuvil.reduce.forkserver": "tools",  # candidates judged in children forked from one pre-imported process
}

# layer -> the lower layers it may import
ALLOWED: dict[str, frozenset[str]] = {
    "base": frozenset(),
    "ir": frozenset({"base"}),
    "options": frozenset({"base", "ir"}),
    "runtime": frozenset({"base", "ir", "options"}),
    "backends": frozenset({"base", "ir", "options", "runtime"}),
    "passes": frozenset({"base", "ir", "options", "runtime", "backends"}),
    "quant": frozenset({"base", "ir", "options", "runtime", "backends", "passes"}),
    "custom": frozenset({"base", "ir", "options", "runtime", "backends", "passes", "quant"}),
    "frontends": frozenset({"base", "ir", "options", "runtime", "backends", "passes", "quant", "custom"}),
    "api": frozenset({"base", "ir", "options", "runtime", "backends", "passes", "quant", "custom", "frontends"}),
    "verify": frozenset({"base", "ir", "options", "runtime", "backends", "passes", "quant", "custom", "frontends",
                         "api"}),
    "tools": frozenset({"base", "ir", "options", "runtime", "backends", "passes", "quant", "custom", "frontends",
                        "api", "verify"}),
}

# the IR modules the op declarations and the registry may import (the rest of the IR reads the registry)
IR_CORE = ("cuvil.ir", "cuvil.ir.assumptions", "cuvil.ir.dtypes", "cuvil.ir.graph", "cuvil.ir.symbolic",
           "cuvil.ir.types")

# (importing module, imported module) -> why the upward edge is still there
KNOWN_UPWARD: dict[tuple[str, str], str] = {
    ("cuvil.quant.calibrate", "cuvil"): (
        "int8 calibration builds its tapped float graph with cuvil.compile (a native build); it goes when "
        "calibration builds through the backend table instead of the public entry point"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> str:
    best = max((p for p in LAYER_OF if module == p or module.startswith(p + ".")), key=len)
    return LAYER_OF[best]


def _type_checking_only(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(path: Path, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, imported cuvil module) for every run-time import in the file, at any depth."""
    name = module_name(path)
    yield from imports_in(path.read_text(), name if path.name == "__init__.py" else name.rpartition(".")[0], known)


def imports_in(text: str, package: str, known: set[str]) -> Iterator[tuple[int, str]]:
    """``imports`` of module source ``text`` whose package (for relative imports) is ``package``."""

    def visit(node: ast.AST) -> Iterator[tuple[int, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking_only(child):
                for other in child.orelse:
                    yield from visit(other)
                continue
            if isinstance(child, ast.Import):
                for a in child.names:
                    if a.name == "cuvil" or a.name.startswith("cuvil."):
                        yield child.lineno, a.name
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target == "cuvil" or target.startswith("cuvil."):
                    for a in child.names:
                        sub = f"{target}.{a.name}"
                        yield child.lineno, sub if sub in known else target
            yield from visit(child)

    yield from visit(ast.parse(text))


def edges() -> Iterator[tuple[Path, int, str, str]]:
    known = modules()
    for name, path in known.items():
        for line, target in imports(path, set(known)):
            yield path, line, name, target


def test_every_module_has_a_layer_and_the_layers_are_an_order() -> None:
    for name in modules():
        assert layer(name) in ALLOWED, name
    assert set(LAYER_OF.values()) == set(ALLOWED)
    for lay, lower in ALLOWED.items():
        assert lay not in lower
        for other in lower:  # a layer may import what its lower layers may: no cycle between layers
            assert ALLOWED[other] <= lower, (lay, other)


def upward(found: list[tuple[Path, int, str, str]]) -> tuple[list[str], set[tuple[str, str]]]:
    """The edges of ``found`` against the order, as ``file:line: edge`` lines, and the known ones met."""
    bad, met = [], set()
    for path, line, src, dst in found:
        a, b = layer(src), layer(dst)
        if a == b or b in ALLOWED[a]:
            continue
        if (src, dst) in KNOWN_UPWARD:
            met.add((src, dst))
            continue
        bad.append(f"{path.relative_to(REPO)}:{line}: {src} ({a}) imports {dst} ({b})")
    return bad, met


def test_no_upward_imports() -> None:
    found = list(edges())
    assert len(found) > 500  # the walk sees the package's imports
    bad, met = upward(found)
    assert not bad, "imports against the layer order (tests/test_layering.py):\n" + "\n".join(bad)
    assert met == set(KNOWN_UPWARD), f"KNOWN_UPWARD entries no import needs any more: {set(KNOWN_UPWARD) - met}"


def test_an_upward_edge_is_reported_with_file_line_and_edge() -> None:
    ir_file = PACKAGE / "ir" / "graph.py"
    bad, _ = upward([(ir_file, 7, "cuvil.ir.graph", "cuvil.backends.c.codegen"),
                     (ir_file, 8, "cuvil.ir.graph", "cuvil.errors")])
    assert bad == ["cuvil/ir/graph.py:7: cuvil.ir.graph (ir) imports cuvil.backends.c.codegen (backends)"]


def test_op_declarations_import_only_the_ir_core() -> None:
    bad = [f"{path.relative_to(REPO)}:{line}: {src} imports {dst}" for path, line, src, dst in edges()
           if src.startswith("cuvil.ops") and layer(dst) == "ir" and not dst.startswith("cuvil.ops")
           and dst not in IR_CORE]
    assert not bad, "op declarations importing the IR beyond its core (an import cycle):\n" + "\n".join(bad)


def test_the_rule_sees_function_level_and_relative_imports() -> None:
    text = ("from typing import TYPE_CHECKING\nfrom ..ir import graph\nif TYPE_CHECKING:\n    import cuvil.api\n"
            "def f():\n    from cuvil import faults, compile\n    import cuvil.api\n")
    found = list(imports_in(text, "cuvil.passes", {"cuvil.api", "cuvil.faults", "cuvil.ir.graph"}))
    assert found == [(2, "cuvil.ir.graph"), (6, "cuvil.faults"), (6, "cuvil"), (7, "cuvil.api")]


def _loaded_after(statement: str) -> list[str]:
    code = f"{statement}\nimport sys\nprint('\\n'.join(sorted(m for m in sys.modules if m.startswith('cuvil'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    return out.stdout.split()


def test_importing_the_package_root_loads_nothing_above_base() -> None:
    loaded = _loaded_after("import cuvil")
    assert {layer(m) for m in loaded} <= {"base", "api"} and [m for m in loaded if layer(m) == "api"] == ["cuvil"]


def test_importing_the_ir_loads_only_the_ir_and_the_op_declarations() -> None:
    for statement in ("import cuvil.ir", "import cuvil.ir.parser, cuvil.ir.printer, cuvil.ir.verify"):
        loaded = _loaded_after(statement)
        assert {layer(m) for m in loaded if m != "cuvil"} <= {"base", "ir"}, (statement, loaded)
    assert "cuvil.ops.conv" in loaded  # the parser reads the registry, which the declarations fill


def test_the_version_is_written_once() -> None:
    """cuvil/_version.py holds it; pyproject.toml reads it from there, and the package root re-exports it."""
    from cuvil._version import __version__

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "cuvil._version.__version__"}
    import cuvil

    assert cuvil.__version__ is __version__
    written = [str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py") if "__version__ = " in p.read_text()]
    assert written == ["cuvil/_version.py"]


CORE = ("ir", "ops", "passes", "backends", "runtime")


def test_ruff_bans_the_frameworks_in_the_core() -> None:
    """ruff's banned-API rule (TID251, pyproject.toml) refuses torch, onnx and onnxruntime in the core,
    at module level and inside functions, and lets the front ends import them."""
    if shutil.which("ruff") is None:
        pytest.fail("ruff is not installed (it is in the test extra)")
    text = "import torch\nfrom onnx import helper\n\n\ndef f() -> None:\n    import onnxruntime  # noqa: F401\n"
    for package in CORE:
        where = f"cuvil/{package}/probe.py"
        r = subprocess.run(["ruff", "check", "--select", "TID251", "--stdin-filename", where, "-"], input=text,
                           capture_output=True, text=True, cwd=REPO)
        assert r.returncode == 1 and r.stdout.count("TID251") == 3, (where, r.stdout + r.stderr)
    r = subprocess.run(["ruff", "check", "--select", "TID251", "--stdin-filename", "cuvil/frontends/probe.py", "-"],
                       input=text, capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
