"""Packages whose module object can be called: ``cuvil.verify(model, ...)`` is the verify package.

``cuvil.verify`` has to be two things at once: the verification entry point users call, and the
package whose modules (``cuvil.verify.runner``, ``cuvil.verify.checks ...``) stay importable by their
dotted names.  A function bound to the name cannot be both: importing any ``cuvil.verify.*`` module
rebinds ``cuvil.verify`` to the package (the import system always sets a submodule on its parent).
So the package module itself is callable.

It is *created* callable, never re-classed after it ran: the package root installs a meta-path
finder (:func:`install`) that answers for the named packages with the ordinary file-system spec,
wrapped in a loader whose ``create_module`` (the PEP 451 hook for a custom module type) returns a
:class:`CallablePackage`; the wrapped loader then executes the package's ``__init__.py`` as usual.
Calling the package calls the function its namespace binds to ``__call__``
(``cuvil/verify/__init__.py``: ``__call__ = verify``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any


class CallablePackage(types.ModuleType):
    """A module whose calls go to the ``__call__`` its own namespace defines."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self.__dict__.get("__call__")
        if fn is None:
            raise TypeError(f"module {self.__name__!r} is not callable: it defines no __call__")
        return fn(*args, **kwargs)


class _Loader(importlib.abc.Loader):
    """The file-system loader of a package, creating its module as a CallablePackage."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return CallablePackage(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader ...: the file loader's
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install(*names: str) -> None:
    """Make the packages ``names`` callable when they are imported (once per process; they must not
    be imported yet, which holds when their parent package calls this as it starts)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(frozenset(names)))
