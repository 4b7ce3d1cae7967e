"""Shape relations that op inference relies on: proven, refuted, or checked at run time.

Some ops only make sense when two dims agree: MatMul's inner dims, the
non-concatenated dims of Concat's inputs, two dims that broadcast, a
normalization's parameter shape.  When both dims are ints inference simply
compares them.  When one is symbolic, inference calls
:meth:`~cuvil.ops.registry.InferCtx.assume_equal` (or ``assume_broadcast`` /
``assume_broadcast_to``), and :func:`decide` settles the relation from the
symbols' constraints (``min``/``max``/``multiple_of``):

1. proven (the same expression, or forced by the constraints): nothing is kept;
2. provably false (two different ints, ``n`` vs ``n + 1``, ``batch`` in 1..64
   vs 128, a multiple of 32 vs 17): inference raises a ``ShapeError`` naming
   the relation and the constraints, so the model fails to compile;
3. otherwise the relation becomes an :class:`Assumption`: a run-time check.

Nothing is silently assumed.  Relations over a data-dependent (``UNKNOWN``)
dim cannot be checked before the model runs; the kernels check those while it
runs (the C kernels' ``require``, NumPy in the reference interpreter).

Where the checks live.  Assumptions are *not* stored on the graph, and the
text IR does not print them: ``graph_assumptions`` (cuvil/ops/common.py) re-derives them by
re-running every node's inference, exactly as the verifier re-derives types.
A pass that rewrites the graph therefore can never leave a stale or missing
check behind, and a graph parsed from text has the same checks as the one
printed.  The compiled model's signature (``cuvil.runtime.compiled``) holds the
derived list (saved in an artifact's meta.json, since a loaded artifact has no
graph); the input guard (``cuvil.runtime.guards``) evaluates it right after
binding the symbols, before any kernel runs, for every target, and the C code
generator emits the same checks into ``cuvil_run`` so standalone C and wasm
artifacts check them too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cuvil.ir import symbolic as _s
from cuvil.ir.symbolic import Dim, evaluate, format_dim, free_symbols, is_unknown, parse_dim
from cuvil.ir.types import SymbolInfo

EQUAL = "equal"  # lhs == rhs
BROADCAST = "broadcast"  # lhs == rhs, or either is 1
BROADCAST_TO = "broadcast_to"  # lhs == rhs, or lhs is 1 (lhs stretches to rhs; rhs is kept)
KINDS = (EQUAL, BROADCAST, BROADCAST_TO)


@dataclass(frozen=True)
class Assumption:
    """A relation between two dims that must hold for a node to be valid, checked at run time.

    ``what`` is a plural noun phrase written by Cuvil ("inner dims"), read as
    "<what> differ" or "<what> do not broadcast"."""

    kind: str
    lhs: Dim
    rhs: Dim
    what: str
    op: str = ""
    node: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown assumption kind {self.kind!r}")

    def symbols(self) -> set[str]:
        return free_symbols(self.lhs) | free_symbols(self.rhs)

    def holds_for(self, a: int, b: int) -> bool:
        if self.kind == EQUAL:
            return a == b
        if self.kind == BROADCAST:
            return a == b or a == 1 or b == 1
        return a == b or a == 1

    def describe(self) -> str:
        """The relation as a formula: ``K == L``, ``a ~ b`` (broadcast), ``c ~> n``."""
        sign = {EQUAL: "==", BROADCAST: "~", BROADCAST_TO: "~>"}[self.kind]
        return f"{format_dim(self.lhs)} {sign} {format_dim(self.rhs)}"

    def where(self) -> str:
        return f"node {self.node!r} ({self.op})" if self.node else self.op

    def violation(self, a: int, b: int) -> str:
        """The sentence reporting that the relation fails for the values ``a`` (lhs) and ``b`` (rhs)."""
        if self.kind == EQUAL:
            head = f"{self.what} differ: {a} != {b}"
        elif self.kind == BROADCAST:
            head = f"{self.what} do not broadcast: {a} vs {b}"
        else:
            head = f"{self.what} do not broadcast: {a} is neither 1 nor {b}"
        shown = [f"{format_dim(d)} = {v}" for d, v in ((self.lhs, a), (self.rhs, b)) if not isinstance(d, int)]
        return f"{self.where()}: {head} ({', '.join(shown)})"

    def check(self, env: Mapping[str, int]) -> str | None:
        """None when the relation holds (or cannot be evaluated with ``env``), else the violation.

        A relation over a symbol ``env`` lacks (one no input dim binds) is left to the kernels; a
        ``bcast`` atom that fails to evaluate was reported by an earlier check of its operands."""
        try:
            a, b = evaluate(self.lhs, env), evaluate(self.rhs, env)
        except (KeyError, ValueError, ZeroDivisionError):
            return None
        return None if self.holds_for(a, b) else self.violation(a, b)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "lhs": format_dim(self.lhs), "rhs": format_dim(self.rhs), "what": self.what,
                "op": self.op, "node": self.node}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Assumption:
        return Assumption(str(d["kind"]), parse_dim(str(d["lhs"])), parse_dim(str(d["rhs"])), str(d["what"]),
                          str(d.get("op", "")), str(d.get("node", "")))


# deciding a relation from the constraints -------------------------------------------------------

Interval = tuple[float, float]
_ANY: Interval = (-math.inf, math.inf)


def _mul(x: Interval, y: Interval) -> Interval:
    def times(a: float, b: float) -> float:
        return 0.0 if a == 0 or b == 0 else a * b  # 0 * inf is 0 here: a dim of 0 empties the product

    corners = [times(a, b) for a in x for b in y]
    return min(corners), max(corners)


def _symbol_interval(name: str, symbols: Mapping[str, SymbolInfo]) -> Interval:
    info = symbols.get(name)
    lo = float(max(info.min, 0)) if info is not None and info.min is not None else 0.0
    hi = float(info.max) if info is not None and info.max is not None else math.inf
    if info is not None and info.multiple_of:
        m = info.multiple_of
        lo = float(math.ceil(lo / m) * m)
        if hi != math.inf:
            hi = float(math.floor(hi / m) * m)
    return lo, hi


def _atom_interval(atom: Any, symbols: Mapping[str, SymbolInfo]) -> Interval:
    # The atom classes are symbolic.py's own; this module is its companion in the IR package.
    if isinstance(atom, _s._Sym):
        return _symbol_interval(atom.name, symbols)
    if isinstance(atom, _s._FloorDiv) and isinstance(atom.den, int) and atom.den > 0:
        lo, hi = bounds(atom.num, symbols)
        return (math.floor(lo / atom.den) if lo != -math.inf else lo,
                math.floor(hi / atom.den) if hi != math.inf else hi)
    if isinstance(atom, _s._Bcast):
        (alo, ahi), (blo, bhi) = bounds(atom.a, symbols), bounds(atom.b, symbols)
        return min(alo, blo), max(ahi, bhi)
    return _ANY


def bounds(d: Dim, symbols: Mapping[str, SymbolInfo]) -> Interval:
    """An interval holding every value ``d`` takes when each symbol meets its constraints (dims are >= 0)."""
    if isinstance(d, int):
        return float(d), float(d)
    lo, hi = 0.0, 0.0
    for mono, coef in d._terms:
        t: Interval = (1.0, 1.0)
        for atom in mono:
            t = _mul(t, _atom_interval(atom, symbols))
        t = _mul(t, (float(coef), float(coef)))
        lo, hi = lo + t[0], hi + t[1]
    return lo, hi


def _stride(d: Dim, symbols: Mapping[str, SymbolInfo]) -> tuple[int, int]:
    """``(g, k)`` such that ``d`` is always ``k`` plus a multiple of ``g`` (``g = 0``: always ``k``)."""
    if isinstance(d, int):
        return 0, d
    g, k = 0, 0
    for mono, coef in d._terms:
        if not mono:
            k += coef
            continue
        f = abs(coef)
        for atom in mono:
            if isinstance(atom, _s._Sym) and (info := symbols.get(atom.name)) is not None and info.multiple_of:
                f *= info.multiple_of
        g = math.gcd(g, f)
    return g, k


def _never_equal(a: Dim, b: Dim, symbols: Mapping[str, SymbolInfo]) -> bool:
    diff = a - b
    if isinstance(diff, int):
        return diff != 0
    lo, hi = bounds(diff, symbols)
    if lo > 0 or hi < 0:
        return True
    g, k = _stride(diff, symbols)
    return g > 0 and k % g != 0


def _always_equal(a: Dim, b: Dim, symbols: Mapping[str, SymbolInfo]) -> bool:
    diff = a - b
    return diff == 0 or bounds(diff, symbols) == (0.0, 0.0)


def decide(kind: str, a: Dim, b: Dim, symbols: Mapping[str, SymbolInfo]) -> bool | None:
    """True when the relation holds for every allowed value of the symbols, False when it never
    does, None when only run time can tell (or a dim is data-dependent)."""
    if a == b or (kind == BROADCAST and (a == 1 or b == 1)) or (kind == BROADCAST_TO and a == 1):
        return True  # the common case, without arithmetic
    if is_unknown(a) or is_unknown(b):
        return None
    if _always_equal(a, b, symbols):
        return True
    a_one = True if _always_equal(a, 1, symbols) else (False if _never_equal(a, 1, symbols) else None)
    b_one = True if _always_equal(b, 1, symbols) else (False if _never_equal(b, 1, symbols) else None)
    never = _never_equal(a, b, symbols)
    if kind == EQUAL:
        return False if never else None
    if kind == BROADCAST:
        if a_one or b_one:
            return True
        return False if never and a_one is False and b_one is False else None
    if a_one:
        return True
    return False if never and a_one is False else None


def constraints_of(dims: tuple[Dim, ...], symbols: Mapping[str, SymbolInfo]) -> str:
    """The constraints of the symbols in ``dims``, for messages: ``batch in 1..64, h %32``."""
    names = sorted(set().union(*(free_symbols(d) for d in dims)))
    parts = [f"{n} {symbols[n].describe()}" for n in names if n in symbols and symbols[n].is_constrained]
    return ", ".join(parts)


def refutation(kind: str, what: str, a: Dim, b: Dim, symbols: Mapping[str, SymbolInfo]) -> str:
    """The compile-time error for a relation that can never hold."""
    if kind == EQUAL:
        head = f"{what} differ: {format_dim(a)} != {format_dim(b)}"
    elif kind == BROADCAST:
        head = f"{what} do not broadcast: {format_dim(a)} and {format_dim(b)}"
    else:
        head = f"{what} do not broadcast: {format_dim(a)} is neither 1 nor {format_dim(b)}"
    known = constraints_of((a, b), symbols)
    if isinstance(a, int) and isinstance(b, int):
        return head
    return f"{head} for any allowed value" + (f" ({known})" if known else "")
