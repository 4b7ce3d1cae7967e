"""Deciding a boolean at import from types, constants and the symbols' constraints.

Exporters (TorchScript's above all) guard code on shapes: ``if x.dim() == 3``,
``if x.size(0) == 1``.  In the graph that is ``Shape -> Size | Gather ->
Equal(constant) -> If``.  Where a shape is static, import folds the chain to a
constant; where it holds symbols, the sizes are known as dims
(``Value.sym_value``, cuvil/ops/sizes.py) and a comparison of two dims may
still be settled by the symbols' constraints (``batch`` in 2..64 is never 1;
any dim is >= 0, so never -1).  :func:`truth` answers for one value:

1. a constant holding one element: its truth;
2. a comparison (``equal``, ``greater``, ``greater_or_equal``, ``less``,
   ``less_or_equal``) of two sizes whose contents are known as dims, one
   element after broadcasting: decided by ``cuvil.ir.assumptions`` (``decide``
   for equality, ``bounds`` of the difference for order);
3. ``not``, ``and``, ``or``, ``xor`` of decided operands (``and`` and ``or``
   need only the operand that settles them);
4. ``identity``, a reshape of one element, and ``cast`` to bool (of a bool, or
   of a size known as a dim: true when it is never 0) pass the question on;
5. anything else, or a data-dependent (unknown) dim: undecided (None).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from cuvil.ir.assumptions import EQUAL, bounds, decide
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value
from cuvil.ir.symbolic import Dim, free_symbols, is_unknown
from cuvil.ir.types import SymbolInfo
from cuvil.ops.common import const_of

_DEPTH = 64  # producers followed at most (a condition is a short chain)

_PASS_THROUGH = frozenset({"identity", "reshape", "squeeze", "unsqueeze", "flatten"})


def _sizes(v: Value | None) -> tuple[Dim, ...] | None:
    """The contents of a small integer tensor as dims, when known."""
    if v is None:
        return None
    c = const_of(v)
    if c is not None:
        return tuple(int(x) for x in c.reshape(-1)) if c.dtype.kind in "iu" and c.size <= 16 else None
    return v.sym_value


def _one(v: Value | None) -> Dim | None:
    s = _sizes(v)
    return s[0] if s is not None and len(s) == 1 and not is_unknown(s[0]) else None


def _order(diff: Dim, symbols: Mapping[str, SymbolInfo], strict: bool) -> bool | None:
    """Whether ``diff > 0`` (``strict``) or ``diff >= 0`` for every allowed value of the symbols."""
    lo, hi = bounds(diff, symbols)
    if (lo > 0) if strict else (lo >= 0):
        return True
    if (hi <= 0) if strict else (hi < 0):
        return False
    return None


def _compare(op: str, a: Dim, b: Dim, symbols: Mapping[str, SymbolInfo]) -> bool | None:
    if op == "equal":
        return decide(EQUAL, a, b, symbols)
    if op in ("greater", "greater_or_equal"):
        return _order(a - b, symbols, op == "greater")
    return _order(b - a, symbols, op == "less")


_COMPARISONS = frozenset({"equal", "greater", "greater_or_equal", "less", "less_or_equal"})
_LOGIC: dict[str, Callable[[bool, bool], bool]] = {
    "and": lambda x, y: x and y,
    "or": lambda x, y: x or y,
    "xor": lambda x, y: x != y,
}


def truth(v: Value | None, symbols: Mapping[str, SymbolInfo], depth: int = _DEPTH) -> bool | None:
    """The value of a one-element boolean ``v`` for every allowed input, or None when only run time can tell."""
    if v is None or depth <= 0:
        return None
    c = const_of(v)
    if c is not None:
        return bool(np.asarray(c).reshape(-1)[0]) if c.size == 1 else None
    node = v.producer
    if node is None or v.type.dtype is not DType.bool:
        return None
    op = node.op
    if op in _COMPARISONS and len(node.inputs) == 2:
        a, b = _one(node.inputs[0]), _one(node.inputs[1])
        return None if a is None or b is None else _compare(op, a, b, symbols)
    if op == "not":
        t = truth(node.inputs[0], symbols, depth - 1)
        return None if t is None else not t
    if op in _LOGIC and len(node.inputs) == 2:
        x, y = (truth(i, symbols, depth - 1) for i in node.inputs)
        if op == "and" and (x is False or y is False):
            return False
        if op == "or" and (x is True or y is True):
            return True
        return None if x is None or y is None else _LOGIC[op](x, y)
    if op in _PASS_THROUGH and node.inputs:
        return truth(node.inputs[0], symbols, depth - 1)
    if op == "cast" and node.inputs and node.inputs[0] is not None:
        src = node.inputs[0]
        if src.type.dtype is DType.bool:
            return truth(src, symbols, depth - 1)
        d = _one(src)
        if d is None:
            return None
        zero = decide(EQUAL, d, 0, symbols)
        return None if zero is None else not zero
    return None


def condition_symbols(v: Value | None, depth: int = _DEPTH) -> set[str]:
    """The symbols whose values the sizes compared in ``v`` (rules 2-4) depend on: constraints on them
    (``dims=``) may decide it."""
    if v is None or depth <= 0 or v.producer is None or const_of(v) is not None:
        return set()
    out: set[str] = set()
    node = v.producer
    for i in node.inputs:
        s = _sizes(i) if node.op in _COMPARISONS or node.op == "cast" else None
        if s is not None:
            out |= set().union(*(free_symbols(d) for d in s))
        elif i is not None and i.type.dtype is DType.bool:
            out |= condition_symbols(i, depth - 1)
    return out
