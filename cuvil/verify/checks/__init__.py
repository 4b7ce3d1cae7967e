"""The verification checks. Importing this package registers every check module in it.

Each module defines one or two :class:`~cuvil.verify.base.Check` subclasses decorated with
:func:`~cuvil.verify.base.register_check`; a new module dropped in this folder is picked up
without editing this file.
"""

from __future__ import annotations

import importlib
import pkgutil

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")
