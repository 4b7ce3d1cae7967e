"""C kernels, one module per op family. Importing this package fills the kernel table."""

from __future__ import annotations

import importlib
import pkgutil

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _m.name.startswith("_") and _m.name != "common":
        importlib.import_module(f"{__name__}.{_m.name}")
