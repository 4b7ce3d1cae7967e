"""torch.export's symbolic sizes (sympy expressions over s0, s1 ...) as Cuvil dims.

Each torch symbol gets the name of the ``torch.export.Dim`` the user gave
(``batch``), found by matching input dims with the ``dynamic_shapes`` spec;
its range becomes the Cuvil symbol's minimum and maximum.  A derived dim
such as ``32 * Dim("h32")`` stays an expression of its root symbol
(``32*h32``), so every value of it is a multiple of 32 by construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cuvil.errors import ModelError
from cuvil.ir.symbolic import Dim, floordiv, sym
from cuvil.ir.types import SymbolInfo


class SymbolTable:
    """Torch symbol name -> Cuvil symbol name, and the constraints of each."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.infos: dict[str, SymbolInfo] = {}

    def name_of(self, torch_symbol: str) -> str:
        if torch_symbol not in self.names:
            base = torch_symbol
            name = base
            k = 1
            while name in self.infos:
                k += 1
                name = f"{base}_{k}"
            self.names[torch_symbol] = name
            self.infos.setdefault(name, SymbolInfo(name))
        return self.names[torch_symbol]

    def bind(self, torch_symbol: str, cuvil_name: str) -> None:
        """Name a torch symbol after the user's Dim (first binding wins)."""
        if torch_symbol in self.names:
            return
        self.names[torch_symbol] = cuvil_name
        self.infos.setdefault(cuvil_name, SymbolInfo(cuvil_name))

    def constrain(self, range_constraints: Mapping[Any, Any], direct: set[str] | None = None) -> None:
        """Apply torch.export's value ranges to the symbols.

        ``direct`` names the torch symbols that are themselves a dim of some
        input.  Any other symbol is the root of derived dims only (``8*s8``):
        torch gives such a root its default lower bound of 2, while the input
        contract it checks, and that its exported program accepts, is the range
        of the derived dims.  Those ranges bound the root here."""
        direct = direct if direct is not None else {str(e) for e in range_constraints if e.is_Symbol}
        bounds: dict[str, tuple[int | None, int | None]] = {}

        def narrow(sym: str, lo: int | None, hi: int | None) -> None:
            old_lo, old_hi = bounds.get(sym, (None, None))
            lo = lo if old_lo is None else old_lo if lo is None else max(lo, old_lo)
            hi = hi if old_hi is None else old_hi if hi is None else min(hi, old_hi)
            bounds[sym] = (lo, hi)

        for expr, vr in range_constraints.items():
            lo, hi = _finite(vr.lower), _finite(vr.upper)
            if expr.is_Symbol:
                if str(expr) in direct:
                    narrow(str(expr), lo, hi)
                continue
            linear = _linear(expr)
            if linear is None:
                continue
            root, a, b = linear  # expr = a*root + b with a > 0
            narrow(root, None if lo is None else -(-(lo - b) // a), None if hi is None else (hi - b) // a)
        for sym_name, (lo, hi) in bounds.items():
            name = self.name_of(sym_name)
            old = self.infos[name]
            self.infos[name] = SymbolInfo(name, lo if lo is not None else old.min, hi if hi is not None else old.max,
                                          old.multiple_of)

    def dim(self, d: Any) -> Dim:
        """A torch size (int, SymInt or sympy expression) as a Cuvil dim."""
        if isinstance(d, int):
            return d
        expr = d.node.expr if hasattr(d, "node") else d
        return self.sympy_to_dim(expr)

    def sympy_to_dim(self, e: Any) -> Dim:
        import sympy

        if isinstance(e, sympy.Integer) or getattr(e, "is_Integer", False):
            return int(e)
        if e.is_Symbol:
            return sym(self.name_of(str(e)))
        if e.is_Add:
            out: Dim = 0
            for a in e.args:
                out = out + self.sympy_to_dim(a)
            return out
        if e.is_Mul:
            out = 1
            for a in e.args:
                out = out * self.sympy_to_dim(a)
            return out
        fname = type(e).__name__
        if fname == "FloorDiv":
            return floordiv(self.sympy_to_dim(e.args[0]), self.sympy_to_dim(e.args[1]))
        if fname in ("Mod", "PythonMod"):
            a, b = self.sympy_to_dim(e.args[0]), self.sympy_to_dim(e.args[1])
            return a - floordiv(a, b) * b
        if isinstance(e, sympy.Pow) and e.args[1].is_Integer and int(e.args[1]) >= 0:
            base = self.sympy_to_dim(e.args[0])
            out = 1
            for _ in range(int(e.args[1])):
                out = out * base
            return out
        raise ModelError(f"a symbolic size {e} ({fname}) cannot be expressed as a Cuvil dim")


def _linear(expr: Any) -> tuple[str, int, int] | None:
    """``(root, a, b)`` when ``expr`` is ``a*root + b`` with integers ``a > 0`` and ``b``, else None."""
    syms = list(expr.free_symbols)
    if len(syms) != 1:
        return None
    (root,) = syms
    poly = expr.as_poly(root)
    if poly is None or poly.degree() != 1:
        return None
    a, b = (int(c) if c.is_Integer else None for c in poly.all_coeffs())
    if a is None or b is None or a <= 0:
        return None
    return str(root), a, b


def _finite(v: Any) -> int | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    if f != f or f in (float("inf"), float("-inf")) or abs(f) >= 2**62:
        return None
    return int(v)
