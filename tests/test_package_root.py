"""The lazy package root (cuvil/__init__.py): every public name resolves on first use, ``dir`` and
``__all__`` list them, and ``cuvil.verify`` is the callable verification package however it was
first imported (cuvil/_callable.py)."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

import cuvil
from tests.support.paths import REPO


def run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          check=True).stdout.strip()


def test_every_public_name_resolves_to_its_owner() -> None:
    from cuvil.api import compile as compile_fn
    from cuvil.api import multiple_of
    from cuvil.errors import CuvilError
    from cuvil.ir.spec import TensorSpec
    from cuvil.runtime.artifact import load

    assert (cuvil.compile, cuvil.multiple_of, cuvil.CuvilError, cuvil.TensorSpec, cuvil.load) == (
        compile_fn, multiple_of, CuvilError, TensorSpec, load)
    for name in cuvil.__all__:
        assert getattr(cuvil, name) is not None, name
    assert set(cuvil.__all__) <= set(dir(cuvil))
    from cuvil import CompiledModel, set_log_level  # from-imports go through the same lookup

    assert CompiledModel.__module__ == "cuvil.runtime.compiled" and callable(set_log_level)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        cuvil.no_such_name
    assert not hasattr(cuvil, "_private")


def test_a_subpackage_named_as_an_attribute_loads() -> None:
    assert run("import cuvil; print(cuvil.api.import_model.__module__)") == "cuvil.api"


@pytest.mark.parametrize("first", ["import cuvil", "import cuvil.verify", "import cuvil.verify.runner",
                                   "from cuvil.verify import Report", "import cuvil.verify.checks"])
def test_verify_is_the_callable_package_however_it_is_imported(first: str) -> None:
    out = run(f"{first}\nimport cuvil, inspect\nv = cuvil.verify\n"
              "print(callable(v), v.__name__, hasattr(v, '__path__'), inspect.signature(v.__call__).parameters['model'].kind.name)")
    assert out == "True cuvil.verify True POSITIONAL_OR_KEYWORD"


def test_the_verify_package_is_created_callable_not_reclassed() -> None:
    from cuvil._callable import CallablePackage

    assert type(cuvil.verify) is CallablePackage and issubclass(CallablePackage, types.ModuleType)
    source = (REPO / "cuvil" / "verify" / "__init__.py").read_text()
    assert "__class__" not in source and "sys.modules" not in source
    assert cuvil.verify.__call__ is cuvil.verify.verify


def test_calling_the_package_runs_the_suite() -> None:
    # a usage error from the suite itself shows the call reached cuvil.verify.verify
    from cuvil.verify import VerifyError

    with pytest.raises(VerifyError):
        cuvil.verify(str(REPO / "cuvil" / "examples" / "tiny_cnn.onnx"), checks=["no-such-check"], targets=["ref"])
