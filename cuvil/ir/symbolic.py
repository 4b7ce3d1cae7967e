"""Symbolic dimensions: integer polynomials over named symbols.

A dimension is either a Python ``int`` or a :class:`DimExpr`.  A ``DimExpr`` is
kept in a canonical form (a sum of monomials with integer coefficients), so two
expressions that are equal as polynomials compare equal and print the same.
Non-polynomial pieces (floor division that does not divide exactly, the
broadcast of two unrelated dims) become opaque *atoms* inside the polynomial.

``UNKNOWN`` stands for a data-dependent extent (``NonZero``'s output length, a
``Reshape`` whose target shape is computed at run time).  It absorbs every
operation: anything combined with an unknown dim is unknown.

Arithmetic returns a plain ``int`` whenever the result is constant, so shape
inference is written once with ``+ - * // %`` and works for static and
symbolic shapes alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Union

Dim = Union[int, "DimExpr"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RESERVED = frozenset({"floordiv", "bcast"})


def format_symbol(name: str) -> str:
    """A symbol name as it appears in text: bare when it is an identifier."""
    if _IDENT.match(name) and name not in _RESERVED:
        return name
    return json.dumps(name, ensure_ascii=False)


class _Atom:
    """Base of the non-polynomial building blocks of an expression."""

    def key(self) -> str:
        raise NotImplementedError

    def evaluate(self, env: Mapping[str, int]) -> int:
        raise NotImplementedError

    def symbols(self) -> set[str]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Atom) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __str__(self) -> str:
        return self.key()


class _Sym(_Atom):
    def __init__(self, name: str) -> None:
        self.name = name

    def key(self) -> str:
        return format_symbol(self.name)

    def evaluate(self, env: Mapping[str, int]) -> int:
        try:
            return int(env[self.name])
        except KeyError:
            raise KeyError(f"symbol {self.name!r} has no value") from None

    def symbols(self) -> set[str]:
        return {self.name}


class _FloorDiv(_Atom):
    def __init__(self, num: Dim, den: Dim) -> None:
        self.num, self.den = num, den

    def key(self) -> str:
        return f"floordiv({format_dim(self.num)}, {format_dim(self.den)})"

    def evaluate(self, env: Mapping[str, int]) -> int:
        den = evaluate(self.den, env)
        if den == 0:
            raise ZeroDivisionError(f"division by zero in {self.key()}")
        return evaluate(self.num, env) // den

    def symbols(self) -> set[str]:
        return free_symbols(self.num) | free_symbols(self.den)


class _Bcast(_Atom):
    """The broadcast of two dims: equal to whichever is not 1."""

    def __init__(self, a: Dim, b: Dim) -> None:
        self.a, self.b = sorted((a, b), key=format_dim)

    def key(self) -> str:
        return f"bcast({format_dim(self.a)}, {format_dim(self.b)})"

    def evaluate(self, env: Mapping[str, int]) -> int:
        a, b = evaluate(self.a, env), evaluate(self.b, env)
        if a == 1:
            return b
        if b == 1 or a == b:
            return a
        raise ValueError(f"dims {a} and {b} do not broadcast")

    def symbols(self) -> set[str]:
        return free_symbols(self.a) | free_symbols(self.b)


class _Unknown(_Atom):
    def key(self) -> str:
        return "?"

    def evaluate(self, env: Mapping[str, int]) -> int:
        raise ValueError("a data-dependent dim has no value before run time")

    def symbols(self) -> set[str]:
        return set()


Monomial = tuple[_Atom, ...]


class DimExpr:
    """A canonical integer polynomial over atoms. Immutable and hashable."""

    __slots__ = ("_key", "_terms")

    def __init__(self, terms: Mapping[Monomial, int]) -> None:
        items = sorted(
            ((m, c) for m, c in terms.items() if c != 0),
            key=lambda mc: (-len(mc[0]), tuple(a.key() for a in mc[0])),
        )
        self._terms: tuple[tuple[Monomial, int], ...] = tuple(items)
        self._key = _render(self._terms)

    # construction -------------------------------------------------------
    @staticmethod
    def symbol(name: str) -> DimExpr:
        return DimExpr({(_Sym(name),): 1})

    @staticmethod
    def _atom(atom: _Atom) -> DimExpr:
        return DimExpr({(atom,): 1})

    @staticmethod
    def _lift(x: Dim) -> DimExpr:
        if isinstance(x, DimExpr):
            return x
        return DimExpr({(): int(x)})

    def _norm(self) -> Dim:
        if self.is_unknown:
            return UNKNOWN
        if not self._terms:
            return 0
        if len(self._terms) == 1 and self._terms[0][0] == ():
            return self._terms[0][1]
        return self

    # queries ------------------------------------------------------------
    @property
    def is_unknown(self) -> bool:
        return any(isinstance(a, _Unknown) for m, _ in self._terms for a in m)

    def symbols(self) -> set[str]:
        out: set[str] = set()
        for m, _ in self._terms:
            for a in m:
                out |= a.symbols()
        return out

    def evaluate(self, env: Mapping[str, int]) -> int:
        total = 0
        for m, c in self._terms:
            v = c
            for a in m:
                v *= a.evaluate(env)
            total += v
        return total

    def constant_term(self) -> int:
        return dict(self._terms).get((), 0)

    # arithmetic ---------------------------------------------------------
    def __add__(self, other: Dim) -> Dim:
        if not isinstance(other, (int, DimExpr)):
            return NotImplemented
        o = DimExpr._lift(other)
        if self.is_unknown or o.is_unknown:
            return UNKNOWN
        terms = dict(self._terms)
        for m, c in o._terms:
            terms[m] = terms.get(m, 0) + c
        return DimExpr(terms)._norm()

    __radd__ = __add__

    def __neg__(self) -> Dim:
        return DimExpr({m: -c for m, c in self._terms})._norm()

    def __sub__(self, other: Dim) -> Dim:
        if not isinstance(other, (int, DimExpr)):
            return NotImplemented
        return self + (-other)

    def __rsub__(self, other: Dim) -> Dim:
        return (-self) + other

    def __mul__(self, other: Dim) -> Dim:
        if not isinstance(other, (int, DimExpr)):
            return NotImplemented
        o = DimExpr._lift(other)
        if self.is_unknown or o.is_unknown:
            return UNKNOWN
        terms: dict[Monomial, int] = {}
        for m1, c1 in self._terms:
            for m2, c2 in o._terms:
                m = tuple(sorted(m1 + m2, key=lambda a: a.key()))
                terms[m] = terms.get(m, 0) + c1 * c2
        return DimExpr(terms)._norm()

    __rmul__ = __mul__

    def __floordiv__(self, other: Dim) -> Dim:
        if not isinstance(other, (int, DimExpr)):
            return NotImplemented
        return floordiv(self, other)

    def __rfloordiv__(self, other: Dim) -> Dim:
        return floordiv(other, self)

    def __mod__(self, other: Dim) -> Dim:
        return self - floordiv(self, other) * other

    def __rmod__(self, other: Dim) -> Dim:
        return other - floordiv(other, self) * self

    # identity -----------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return isinstance(other, DimExpr) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __str__(self) -> str:
        return self._key

    def __repr__(self) -> str:
        return f"DimExpr({self._key!r})"


def _render(terms: tuple[tuple[Monomial, int], ...]) -> str:
    if not terms:
        return "0"
    if any(isinstance(a, _Unknown) for m, _ in terms for a in m):
        return "?"
    parts: list[str] = []
    for m, c in terms:
        factors = [a.key() for a in m]
        if not factors:
            body = str(abs(c))
        elif abs(c) == 1:
            body = "*".join(factors)
        else:
            body = "*".join([str(abs(c)), *factors])
        if not parts:
            parts.append(body if c > 0 else f"-{body}")
        else:
            parts.append(f"+ {body}" if c > 0 else f"- {body}")
    return " ".join(parts)


UNKNOWN: DimExpr = DimExpr({(_Unknown(),): 1})


def sym(name: str) -> DimExpr:
    """The dim that is the value of the symbol ``name``."""
    return DimExpr.symbol(name)


def is_static(d: Dim) -> bool:
    return isinstance(d, int)


def is_unknown(d: Dim) -> bool:
    return isinstance(d, DimExpr) and d.is_unknown


def free_symbols(d: Dim) -> set[str]:
    return d.symbols() if isinstance(d, DimExpr) else set()


def evaluate(d: Dim, env: Mapping[str, int]) -> int:
    return d.evaluate(env) if isinstance(d, DimExpr) else int(d)


def format_dim(d: Dim) -> str:
    return str(d)


def _nested_floordiv(e: DimExpr) -> tuple[Dim, int, int] | None:
    """``(x, c, k)`` when ``e`` is ``x // c + k`` with ``c`` a positive int, else None."""
    k, atom = 0, None
    for m, coef in e._terms:
        if m == ():
            k = coef
        elif len(m) == 1 and coef == 1 and isinstance(m[0], _FloorDiv) and atom is None:
            atom = m[0]
        else:
            return None
    if atom is None or not isinstance(atom.den, int) or atom.den <= 0:
        return None
    return atom.num, atom.den, k


def floordiv(a: Dim, b: Dim) -> Dim:
    """``a // b`` with Python (floor) semantics, simplified where exact."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    if is_unknown(a) or is_unknown(b):
        return UNKNOWN
    if b == 1:
        return a
    ea = DimExpr._lift(a)
    if isinstance(b, int):
        if b <= 0:
            return DimExpr._atom(_FloorDiv(a, b))._norm()
        exact: dict[Monomial, int] = {}
        rest: dict[Monomial, int] = {}
        for m, c in ea._terms:
            if c % b == 0:
                exact[m] = c // b
            else:
                exact[m] = c // b
                rest[m] = c % b
        rem = DimExpr(rest)._norm()
        q = DimExpr(exact)._norm()
        if isinstance(rem, int):
            return q + rem // b
        nested = _nested_floordiv(rem)
        if nested is not None:  # (x // c + k) // b == (x + k*c) // (c*b) for c, b > 0
            num, den, k = nested
            return q + floordiv(num + k * den, den * b)
        return q + DimExpr._atom(_FloorDiv(rem, b))._norm()
    eb = DimExpr._lift(b)
    if len(eb._terms) == 1:
        mono, coef = eb._terms[0]
        out: dict[Monomial, int] = {}
        for m, c in ea._terms:
            rest_atoms = list(m)
            ok = c % coef == 0
            for atom in mono:
                if ok and atom in rest_atoms:
                    rest_atoms.remove(atom)
                else:
                    ok = False
            if not ok:
                break
            out[tuple(rest_atoms)] = c // coef
        else:
            return DimExpr(out)._norm()
    if ea == eb:
        return 1
    return DimExpr._atom(_FloorDiv(a, b))._norm()


def ceildiv(a: Dim, b: Dim) -> Dim:
    return -floordiv(-a, b)


def broadcast_dim(a: Dim, b: Dim) -> Dim:
    """The broadcast of two dims; raises ``ValueError`` when they cannot match."""
    if a == 1:
        return b
    if b == 1 or a == b:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise ValueError(f"dims {a} and {b} do not broadcast")
    # A static extent other than 1 is the result whenever the model is valid: the
    # other dim must then be 1 or equal to it (checked at run time by the kernels).
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    if is_unknown(a) or is_unknown(b):
        return UNKNOWN
    return DimExpr._atom(_Bcast(a, b))._norm()


def dim_min(a: Dim, b: Dim) -> Dim:
    """``min(a, b)`` where decidable, else unknown."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    if a == b:
        return a
    return UNKNOWN


def product(dims: Iterable[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = out * d
    return out


# parsing ----------------------------------------------------------------

_TOKEN = re.compile(r'\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|("(?:[^"\\]|\\.)*")|(\S))')


def parse_dim(text: str) -> Dim:
    """Parse the text form of a dim (``3``, ``batch``, ``2*h + 1``, ``?``)."""
    toks: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            break
        pos = m.end()
        if m.group(1):
            toks.append(("int", m.group(1)))
        elif m.group(2):
            toks.append(("name", m.group(2)))
        elif m.group(3):
            toks.append(("name", json.loads(m.group(3))))
        elif m.group(4):
            toks.append(("op", m.group(4)))
    p = _DimParser(toks, text)
    d = p.expr()
    if p.i != len(toks):
        raise ValueError(f"bad dim expression {text!r}")
    return d


@dataclass
class _DimParser:
    toks: list[tuple[str, str]]
    text: str
    i: int = 0

    def _peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def _take(self, value: str | None = None) -> tuple[str, str]:
        t = self._peek()
        if t is None or (value is not None and t[1] != value):
            raise ValueError(f"bad dim expression {self.text!r}")
        self.i += 1
        return t

    def expr(self) -> Dim:
        out = self.term()
        while (t := self._peek()) in (("op", "+"), ("op", "-")):
            assert t is not None
            self.i += 1
            rhs = self.term()
            out = out + rhs if t[1] == "+" else out - rhs
        return out

    def term(self) -> Dim:
        out = self.unary()
        while self._peek() == ("op", "*"):
            self.i += 1
            out = out * self.unary()
        return out

    def unary(self) -> Dim:
        if self._peek() == ("op", "-"):
            self.i += 1
            return -self.unary()
        return self.atom()

    def atom(self) -> Dim:
        kind, val = self._take()
        if kind == "int":
            return int(val)
        if kind == "op" and val == "?":
            return UNKNOWN
        if kind == "op" and val == "(":
            d = self.expr()
            self._take(")")
            return d
        if kind == "name" and val in _RESERVED and self._peek() == ("op", "("):
            self._take("(")
            a = self.expr()
            self._take(",")
            b = self.expr()
            self._take(")")
            return floordiv(a, b) if val == "floordiv" else broadcast_dim(a, b)
        if kind == "name":
            return sym(val)
        raise ValueError(f"bad dim expression {self.text!r}")


def render_dim(d: Dim, symbol: Callable[[str], str], call: Callable[[str, list[str]], str]) -> str:
    """Render a dim as an expression of another language (C): ``symbol(name)`` gives a
    symbol's spelling and ``call("floordiv" | "bcast", args)`` a call; ints print as-is.

    Raises ``ValueError`` for an unknown dim."""
    if isinstance(d, int):
        return str(d)
    if d.is_unknown:
        raise ValueError("an unknown dim has no expression")

    def atom(a: _Atom) -> str:
        if isinstance(a, _Sym):
            return symbol(a.name)
        if isinstance(a, _FloorDiv):
            return call("floordiv", [render_dim(a.num, symbol, call), render_dim(a.den, symbol, call)])
        if isinstance(a, _Bcast):
            return call("bcast", [render_dim(a.a, symbol, call), render_dim(a.b, symbol, call)])
        raise ValueError("an unknown dim has no expression")

    parts: list[str] = []
    for mono, coef in d._terms:
        factors = [atom(a) for a in mono]
        if not factors:
            parts.append(f"({coef})")
        else:
            parts.append("*".join(([f"({coef})"] if coef != 1 else []) + factors))
    return "(" + " + ".join(parts) + ")"


def linear_form(d: Dim) -> tuple[str, int, int] | None:
    """``(symbol, k, c)`` when ``d`` is ``k*symbol + c`` with ``k != 0``, else None."""
    if not isinstance(d, DimExpr) or d.is_unknown:
        return None
    name: str | None = None
    k = 0
    c = 0
    for mono, coef in d._terms:
        if not mono:
            c = coef
        elif len(mono) == 1 and isinstance(mono[0], _Sym) and name is None:
            name, k = mono[0].name, coef
        else:
            return None
    return (name, k, c) if name is not None and k != 0 else None
