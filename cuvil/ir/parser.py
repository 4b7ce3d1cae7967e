"""The text form of the IR: parsing (see ``cuvil.ir.printer`` for the grammar by example).

Types of node outputs are read from the text, then checked against the op's
inference by the verifier; attributes are coerced to the kind the op
declares, so ``[]`` is an empty float list where the op expects floats.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil.errors import IRError
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.symbolic import Dim, parse_dim
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.ops.common import infer_all
from cuvil.ops.registry import REQUIRED, lookup  # importing the op set registers every built-in op

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<value>%(?:"(?:[^"\\]|\\.)*"|[A-Za-z0-9_][A-Za-z0-9_.]*))
  | (?P<number>-?(?:\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+|inf\b|nan\b))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<arrow>->)
  | (?P<dots>\.\.)
  | (?P<punct>[()\[\]{}<>,=:?*+\-_])
    """,
    re.VERBOSE,
)


@dataclass
class _Tok:
    kind: str
    text: str
    pos: int


def _tokenize(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            line = text.count("\n", 0, pos) + 1
            raise IRError(f"line {line}: unexpected character {text[pos]!r}")
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append(_Tok(kind, m.group(), pos))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.symbols: dict[str, SymbolInfo] = {}  # declared, in declaration order
        self.used: dict[str, SymbolInfo] = {}  # seen in types

    # token helpers ---------------------------------------------------------
    def error(self, msg: str) -> IRError:
        pos = self.toks[self.i].pos if self.i < len(self.toks) else len(self.text)
        line = self.text.count("\n", 0, pos) + 1
        return IRError(f"line {line}: {msg}")

    def peek(self, k: int = 0) -> _Tok | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def at(self, text: str) -> bool:
        t = self.peek()
        return t is not None and t.text == text and t.kind != "string"

    def take(self, text: str | None = None, kind: str | None = None) -> _Tok:
        t = self.peek()
        if t is None:
            raise self.error(f"unexpected end of text, expected {text or kind}")
        if (text is not None and (t.text != text or t.kind == "string")) or (kind is not None and t.kind != kind):
            raise self.error(f"expected {text or kind}, found {t.text[:40]!r}")
        self.i += 1
        return t

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.i += 1
            return True
        return False

    def name(self) -> str:
        t = self.take()
        if t.kind == "string":
            s: str = json.loads(t.text)
            return s
        if t.kind in ("ident", "number"):
            return t.text
        raise self.error(f"expected a name, found {t.text!r}")

    # pieces ------------------------------------------------------------------
    def value_name(self) -> str:
        t = self.take(kind="value")
        body = t.text[1:]
        return str(json.loads(body)) if body.startswith('"') else body

    def type(self) -> TensorType:
        dt = self.take(kind="ident").text
        try:
            dtype = DType.parse(dt)
        except ValueError as exc:
            raise self.error(str(exc)) from None
        self.take("[")
        dims: list[Dim] = []
        while not self.at("]"):
            start = self.peek()
            depth = 0
            while True:
                t = self.peek()
                if t is None:
                    raise self.error("unterminated shape")
                if t.text in ("(",) and t.kind == "punct":
                    depth += 1
                elif t.text == ")" and t.kind == "punct":
                    depth -= 1
                elif depth == 0 and t.kind == "punct" and t.text in (",", "]"):
                    break
                self.i += 1
            assert start is not None
            end = self.peek()
            assert end is not None
            try:
                d = parse_dim(self.text[start.pos : end.pos])
            except ValueError as exc:
                raise self.error(str(exc)) from None
            for s in sorted(d.symbols()) if not isinstance(d, int) else ():
                self.used.setdefault(s, SymbolInfo(s))
            dims.append(d)
            self.accept(",")
        self.take("]")
        return TensorType(dtype, tuple(dims))

    def number(self) -> int | float:
        t = self.take(kind="number")
        s = t.text
        if s in ("inf", "-inf", "nan", "-nan") or any(c in s for c in ".eE"):
            return float(s)
        return int(s)

    def tensor(self) -> np.ndarray:
        self.take("<")
        t = self.type()
        self.take(">")
        shape = tuple(int(d) if isinstance(d, int) else -1 for d in t.shape)
        if any(d < 0 for d in shape):
            raise self.error("a dense tensor needs a static shape")
        if self.accept("elided"):
            self.take(kind="string")
            raise self.error("this constant was elided when printed; print without elide to parse it back")
        if self.at("hex"):
            self.take("hex")
            raw = bytes.fromhex(json.loads(self.take(kind="string").text))
            dt = t.dtype.np.newbyteorder("<")
            count = int(np.prod(shape)) if shape else 1
            if len(raw) != count * dt.itemsize:
                raise self.error(f"hex data holds {len(raw)} bytes, {t} needs {count * dt.itemsize}")
            return np.frombuffer(raw, dtype=dt).astype(t.dtype.np).reshape(shape)
        self.take("[")
        items: list[Any] = []
        while not self.at("]"):
            if self.accept("true"):
                items.append(True)
            elif self.accept("false"):
                items.append(False)
            else:
                items.append(self.number())
            self.accept(",")
        self.take("]")
        count = int(np.prod(shape)) if shape else 1
        if len(items) != count:
            raise self.error(f"{len(items)} values given for {t}")
        with np.errstate(all="ignore"):
            return np.array(items, dtype=np.float64 if t.dtype.holds_floats else None).astype(t.dtype.np).reshape(shape)

    def attr_value(self, scope: dict[str, Value]) -> Any:
        t = self.peek()
        if t is None:
            raise self.error("expected an attribute value")
        if t.kind == "string":
            self.i += 1
            return json.loads(t.text)
        if t.kind == "number":
            return self.number()
        if t.text == "[" and t.kind == "punct":
            self.i += 1
            items = []
            while not self.at("]"):
                items.append(self.attr_value(scope))
                self.accept(",")
            self.take("]")
            return items
        if t.kind == "ident":
            if t.text == "dense":
                self.i += 1
                return self.tensor()
            if t.text == "graph":
                return self.graph(scope)
            if t.text in ("true", "false"):
                self.i += 1
                return t.text == "true"
            if t.text == "none":
                self.i += 1
                return None
            try:
                dt = DType.parse(t.text)
            except ValueError:
                raise self.error(f"unexpected {t.text!r} in an attribute value") from None
            self.i += 1
            return dt
        raise self.error(f"unexpected {t.text!r} in an attribute value")

    def symbol_decl(self) -> None:
        self.take("symbol")
        name = self.name()
        lo = hi = mult = None
        if self.accept("in"):
            if self.peek() and self.peek().kind == "number":  # type: ignore[union-attr]
                lo = int(self.number())
            self.take(kind="dots")
            if self.peek() and self.peek().kind == "number":  # type: ignore[union-attr]
                hi = int(self.number())
        if self.accept("multiple_of"):
            mult = int(self.number())
        self.symbols[name] = SymbolInfo(name, lo, hi, mult)

    def node(self, g: Graph, scope: dict[str, Value]) -> None:
        out_names: list[str] = []
        if self.peek() and self.peek().kind == "value":  # type: ignore[union-attr]
            out_names.append(self.value_name())
            while self.accept(","):
                out_names.append(self.value_name())
            self.take("=")
        op = self.name()
        opdef = lookup(op)
        if opdef is None:
            raise self.error(f"unknown op {op!r}")
        self.take("(")
        inputs: list[Value | None] = []
        while not self.at(")"):
            if self.accept("_"):
                inputs.append(None)
            else:
                n = self.value_name()
                if n not in scope:
                    raise self.error(f"%{n} is used before it is defined")
                inputs.append(scope[n])
            self.accept(",")
        self.take(")")
        attrs: dict[str, Any] = {}
        if self.accept("{"):
            while not self.at("}"):
                k = self.name()
                self.take("=")
                spec = opdef.attrs.get(k)
                attrs[k] = _coerce(self.attr_value(scope), spec.kind if spec else None)
                self.accept(",")
            self.take("}")
        types: list[TensorType] = []
        if self.accept(":"):
            types.append(self.type())
            while self.accept(","):
                types.append(self.type())
        if len(types) != len(out_names):
            raise self.error(f"{op}: {len(out_names)} results but {len(types)} types")
        name = ""
        if self.accept("loc"):
            self.take("(")
            name = json.loads(self.take(kind="string").text)
            self.take(")")
        filled = {k: spec.default for k, spec in opdef.attrs.items() if k not in attrs}
        filled = {k: v for k, v in filled.items() if v is not REQUIRED}
        outs = [Value(n, t) for n, t in zip(out_names, types)]
        for v in outs:
            if v.name in scope:
                raise self.error(f"%{v.name} is defined twice")
            scope[v.name] = v
        node = Node(op, inputs, outs, {**filled, **attrs}, name)
        g.nodes.append(node)
        try:  # sizes computed from shapes: derived, as the builder derives them
            _, _, syms = infer_all(op, inputs, node.attrs, len(outs), self.symbols)
            for v, sv in zip(outs, syms):
                v.sym_value = sv
        except Exception:  # an invalid node is the verifier's to report
            pass

    def graph(self, outer: dict[str, Value] | None) -> Graph:
        self.take("graph")
        g = Graph(name=self.name(), symbols=self.symbols)
        scope: dict[str, Value] = dict(outer or {})
        self.take("(")
        while not self.at(")"):
            n = self.value_name()
            self.take(":")
            v = Value(n, self.type())
            if n in scope:
                raise self.error(f"%{n} is defined twice")
            scope[n] = v
            g.inputs.append(v)
            self.accept(",")
        self.take(")")
        self.take("{")
        while self.at("symbol"):
            self.symbol_decl()
        while not self.at("return"):
            self.node(g, scope)
        self.take("return")
        while not self.at("}"):
            n = self.value_name()
            if n not in scope:
                raise self.error(f"return of undefined %{n}")
            g.outputs.append(scope[n])
            self.accept(",")
        self.take("}")
        return g


def _coerce(v: Any, kind: str | None) -> Any:
    if kind == "float" and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    if kind == "floats" and isinstance(v, list):
        return [float(x) for x in v]
    if kind == "int" and isinstance(v, bool):
        return int(v)
    return v


def parse_graph(text: str) -> Graph:
    """Parse the text form back into a graph (the inverse of ``print_graph``)."""
    p = _Parser(text)
    g = p.graph(None)
    if p.peek() is not None:
        raise p.error("text after the end of the graph")
    for k, v in p.used.items():
        p.symbols.setdefault(k, v)
    g.symbols = p.symbols
    g.share_symbols()
    return g
