"""Kernels of elementwise ops: each op is one C expression over its operands."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cuvil.backends.c.kernel import KernelCtx, kernel
from cuvil.backends.c.kernels.common import elementwise

Expr = Callable[[Sequence[str]], str]

BINARY: dict[str, Expr] = {
    "add": lambda a: f"({a[0]} + {a[1]})",
    "sub": lambda a: f"({a[0]} - {a[1]})",
    "mul": lambda a: f"({a[0]} * {a[1]})",
}
UNARY: dict[str, Expr] = {
    "neg": lambda a: f"(-{a[0]})",
}


def _register(table: dict[str, Expr]) -> None:
    for op, fn in table.items():

        def emit(k: KernelCtx, fn: Expr = fn) -> None:
            elementwise(k, fn)

        kernel(op)(emit)


_register(BINARY)
_register(UNARY)
