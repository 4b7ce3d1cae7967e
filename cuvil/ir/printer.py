"""The text form of the IR: printing.

    graph main(%x: f32[batch, 3, 224, 224]) {
      symbol batch in 1..256
      %w = constant() {value = dense<f32[2]> [1.0, 2.0]} : f32[2]
      %y = add(%x, %w) : f32[batch, 3, 224, 224] loc("Add_0")
      return %y
    }

Names that are not plain identifiers are printed as JSON strings (``%"a b"``),
so any name a model carries prints safely and parses back.  Attributes equal
to their op's default are left out.  Tensors of up to ``INLINE_LIMIT``
elements print as values; larger ones print as the hex of their bytes, or as
``elided`` with a digest when ``elide=True`` (for reading, not parsing).
``cuvil.ir.parser`` reads this form back; print -> parse -> print is the
identity on the text.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.symbolic import format_dim, format_symbol
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.ops.registry import lookup

INLINE_LIMIT = 16
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*\Z")
_PLAIN_OP = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def quote(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def format_name(name: str) -> str:
    return name if _PLAIN.match(name) else quote(name)


def format_type(t: TensorType) -> str:
    return f"{t.dtype}[{', '.join(format_dim(d) for d in t.shape)}]"


def format_float(x: float) -> str:
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    r = repr(float(x))
    return r if any(c in r for c in ".e") else r + ".0"


def format_tensor(a: np.ndarray, elide: bool) -> str:
    dt = DType.from_np(a.dtype)
    head = f"dense<{format_type(TensorType(dt, a.shape))}>"
    if a.size <= INLINE_LIMIT:
        flat = a.reshape(-1)
        if dt is DType.bool:
            items = ["true" if x else "false" for x in flat]
        elif dt.holds_floats:
            items = [format_float(float(x)) for x in flat]
        else:
            items = [str(int(x)) for x in flat]
        return f"{head} [{', '.join(items)}]"
    data = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    if elide:
        return f"{head} elided {quote('sha256:' + hashlib.sha256(data).hexdigest()[:16])}"
    return f"{head} hex{quote(data.hex())}"


def format_symbol_decl(info: SymbolInfo) -> str:
    parts = [f"symbol {format_symbol(info.name)}"]
    if info.min is not None or info.max is not None:
        lo = "" if info.min is None else str(info.min)
        hi = "" if info.max is None else str(info.max)
        parts.append(f"in {lo}..{hi}")
    if info.multiple_of is not None:
        parts.append(f"multiple_of {info.multiple_of}")
    return " ".join(parts)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, Graph) or isinstance(b, Graph):
        return a is b
    if type(a) is not type(b) and not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b) and type(a) is type(b)


class _Printer:
    def __init__(self, elide: bool) -> None:
        self.elide = elide
        self.lines: list[str] = []
        self.names: dict[Value, str] = {}
        self.used: set[str] = set()

    def name(self, v: Value) -> str:
        if v not in self.names:
            base = v.name
            cand, k = base, 0
            while cand in self.used:
                k += 1
                cand = f"{base}.{k}"
            self.used.add(cand)
            self.names[v] = cand
        return "%" + format_name(self.names[v])

    def ref(self, v: Value | None) -> str:
        if v is None:
            return "_"
        if v not in self.names:  # read before definition: invalid IR, still printable
            return self.name(v)
        return "%" + format_name(self.names[v])

    def attr_value(self, v: Any, indent: str) -> str:
        if isinstance(v, Graph):
            sub = _Printer(self.elide)
            sub.names, sub.used = self.names, self.used
            sub.graph(v, indent, header="graph")
            return "\n".join(sub.lines).lstrip()
        if isinstance(v, np.ndarray):
            return format_tensor(v, self.elide)
        if isinstance(v, DType):
            return str(v)
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            return format_float(v)
        if isinstance(v, str):
            return quote(v)
        if v is None:
            return "none"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(self.attr_value(x, indent) for x in v) + "]"
        raise TypeError(f"cannot print attribute value of type {type(v).__name__}")

    def node(self, n: Node, indent: str) -> None:
        opdef = lookup(n.op)
        outs = ", ".join(self.name(o) for o in n.outputs)
        args = ", ".join(self.ref(v) for v in n.inputs)
        attrs = []
        for k, v in n.attrs.items():
            spec = opdef.attrs.get(k) if opdef else None
            if spec is not None and not isinstance(v, Graph) and _same(v, spec.default):
                continue
            attrs.append(f"{format_name(k)} = {self.attr_value(v, indent + '  ')}")
        op = n.op if _PLAIN_OP.match(n.op) else quote(n.op)
        text = f"{indent}{outs} = {op}({args})" if n.outputs else f"{indent}{op}({args})"
        if attrs:
            text += " {" + ", ".join(attrs) + "}"
        if n.outputs:
            text += " : " + ", ".join(format_type(o.type) for o in n.outputs)
        if n.name:
            text += f" loc({quote(n.name)})"
        self.lines.append(text)

    def graph(self, g: Graph, indent: str, header: str, symbols: Iterable[SymbolInfo] = ()) -> None:
        params = ", ".join(f"{self.name(v)}: {format_type(v.type)}" for v in g.inputs)
        self.lines.append(f"{indent}{header} {format_name(g.name)}({params}) {{")
        inner = indent + "  "
        for info in symbols:
            self.lines.append(inner + format_symbol_decl(info))
        for n in g.nodes:
            self.node(n, inner)
        self.lines.append(f"{inner}return {', '.join(self.ref(v) for v in g.outputs)}")
        self.lines.append(f"{indent}}}")


def print_graph(graph: Graph, *, elide: bool = False) -> str:
    """The text form of ``graph``; ``elide=True`` shortens large tensors (not parsable)."""
    p = _Printer(elide)
    p.graph(graph, "", header="graph", symbols=graph.symbols.values())
    return "\n".join(p.lines) + "\n"
