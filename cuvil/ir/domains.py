"""Input domains: the values each graph input is drawn from, and inferring them from the graph.

Random values outside a model's domain make a verification meaningless or crash it: a token id
of -4 is not a row of an embedding table, and an attention mask of 7 is not a mask. A
:class:`Domain` says what one input holds (an integer range, a set of values, or a 0/1 mask with
the patterns real masks have) and where that came from; :func:`infer_domains` derives it from
the graph alone, not from input names:

- an integer input that reaches the index operand of ``gather``, ``gather_elements``,
  ``gather_nd`` or ``one_hot`` through value-preserving ops (casts, reshapes, ``unsqueeze``,
  ``squeeze``, ``expand``, ``flatten``, ``identity``, ``slice``, ``transpose``, ``concat``, a
  gather of it as data) and adds or subtracts of constants is drawn within the valid index range
  of every table it indexes (non-negative indices only, although negative ones wrap), the
  constants shifting the range;
- an input used as a 0/1 mask through the same ops (cast to float and multiplied, subtracted
  from 1, compared with 0 or 1, cast to bool, the condition of ``where``) is drawn from {0, 1} as real masks are:
  all ones, or ones followed by right padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cuvil.ir.dtypes import DType, int_bounds
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.types import TensorType

#: Ops whose output holds (a rearrangement or a subset of) the values of their first input.
PRESERVING = frozenset({"cast", "reshape", "unsqueeze", "squeeze", "expand", "flatten", "identity", "slice",
                        "transpose", "tile", "concat", "split"})
#: Comparisons: comparing an input with 0 or 1 uses it as a mask.
COMPARISONS = frozenset({"equal", "not_equal", "greater", "greater_or_equal", "less", "less_or_equal"})


@dataclass(frozen=True)
class Domain:
    """The values one input is drawn from, and where that knowledge came from (``source``).

    Exactly one of: ``low``/``high`` (a range, both ends included), ``values`` (a finite set),
    ``mask`` (0/1 with realistic patterns: each row all ones, or ones then right-padding zeros)."""

    source: str = "default"
    low: float | None = None
    high: float | None = None
    values: tuple[float, ...] | None = None
    mask: bool = False

    def describe(self) -> str:
        """The values, in words, and where they came from."""
        return f"{self.what()} ({self.source})"

    def what(self) -> str:
        """The values, in words: "range [0, 29]", "0/1 mask", ..."""
        if self.mask:
            what = "0/1 mask"
        elif self.values is not None:
            what = "values " + ", ".join(f"{v:g}" for v in self.values)
        elif self.low is not None and self.high is not None:
            what = f"range [{self.low:g}, {self.high:g}]"
        else:
            what = "standard normal floats, integers -10..10, fair booleans"
        return what

    def draw(self, t: TensorType, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
        """One array of type ``t`` and ``shape`` drawn from this domain (clipped to the dtype's range)."""
        shape = tuple(shape)
        if self.mask:
            return _mask(shape, rng).astype(t.dtype.np)
        if self.values is not None:
            return np.asarray(rng.choice(np.asarray(self.values), size=shape)).astype(t.dtype.np)
        if t.dtype is DType.bool:
            return rng.random(shape) < 0.5
        if t.dtype.holds_floats:
            if self.low is None or self.high is None:
                return rng.standard_normal(shape).astype(t.dtype.np)
            return rng.uniform(self.low, self.high, size=shape).astype(t.dtype.np)
        tmin, tmax = int_bounds(t.dtype)
        lo = -10 if self.low is None else int(np.ceil(self.low))
        hi = 10 if self.high is None else int(np.floor(self.high))
        lo, hi = max(tmin, lo), min(tmax, hi)
        return rng.integers(lo, max(lo, hi), size=shape, endpoint=True).astype(t.dtype.np)


DEFAULT = Domain()


def _mask(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """0/1 rows along the last axis: half of them all ones, the others ones then right padding
    (at least one position kept, as a tokenizer's batch never holds an empty sequence)."""
    if not shape:
        return np.ones((), dtype=np.int64)
    out = np.ones(shape, dtype=np.int64)
    n = shape[-1]
    rows = out.reshape(-1, n) if n else out.reshape(0, 0)
    for row in rows:
        if n > 1 and rng.random() < 0.5:
            row[int(rng.integers(1, n)):] = 0
    return out


# ---- inference -----------------------------------------------------------------------------------------------


@dataclass
class _Facts:
    """What the uses of one input say: index ranges (with what they index) and mask evidence."""

    low: int | None = None
    high: int | None = None
    indexes: list[str] | None = None
    mask_uses: list[str] | None = None
    conflict: bool = False

    def bound(self, lo: int, hi: int, what: str) -> None:
        self.low = lo if self.low is None else max(self.low, lo)
        self.high = hi if self.high is None else min(self.high, hi)
        self.indexes = [*(self.indexes or []), what]

    def masked(self, what: str) -> None:
        self.mask_uses = [*(self.mask_uses or []), what]


def _const_values(v: Value | None, consts: dict[Value, np.ndarray]) -> np.ndarray | None:
    if v is None:
        return None
    if v in consts:
        return np.asarray(consts[v])
    p = v.producer
    # a constant seen through a cast or reshape (an exporter's `1.0` cast to the mask's type)
    if p is not None and p.op in {"cast", "reshape", "unsqueeze", "expand", "identity"} and p.inputs:
        return _const_values(p.inputs[0], consts)
    return None


def _label(node: Node) -> str:
    return node.name or (node.outputs[0].name if node.outputs else node.op)


def _table(v: Value | None) -> str:
    if v is None:
        return "?"
    p = v.producer
    if p is not None and p.op == "constant" and p.name:
        return p.name
    return v.name


def _extent(node: Node) -> int | None:
    """The number of valid (non-negative) indices of a lookup node, when it is static."""
    data = node.inputs[0].type if node.inputs and node.inputs[0] is not None else None
    if node.op in ("gather", "gather_elements") and data is not None:
        axis = int(node.attrs.get("axis", 0))
        axis = axis + data.rank if axis < 0 else axis
        d = data.shape[axis] if 0 <= axis < data.rank else None
        return d if isinstance(d, int) else None
    if node.op == "gather_nd" and data is not None and node.inputs[1] is not None:
        depth = node.inputs[1].type.shape[-1] if node.inputs[1].type.rank else None
        b = int(node.attrs.get("batch_dims", 0))
        if not isinstance(depth, int):
            return None
        dims = [d for d in data.shape[b:b + depth] if isinstance(d, int)]
        return min(dims) if dims and len(dims) == depth else None
    return None


def _follow(graph: Graph, start: Value, facts: _Facts) -> None:
    """Walk ``start``'s uses forward: each reached value is ``start`` plus an offset in [a, b]."""
    users = graph.users()
    consts = graph.constants()
    seen: set[tuple[int, int, int]] = set()
    todo: list[tuple[Value, int, int]] = [(start, 0, 0)]
    while todo:
        v, a, b = todo.pop()
        if (v.uid, a, b) in seen:
            continue
        seen.add((v.uid, a, b))
        for node in users.get(v, []):
            if not node.outputs:
                continue
            pos = [i for i, x in enumerate(node.inputs) if x is v]
            op = node.op
            out = node.outputs[0]
            if op in ("gather", "gather_elements", "gather_nd") and 1 in pos:
                n = _extent(node)
                if n is not None:
                    facts.bound(-a, n - 1 - b, f"indexes {_table(node.inputs[0])} ({_label(node)})")
            if op == "one_hot" and 0 in pos:
                depth = _const_values(node.inputs[1], consts)
                if depth is not None and depth.size:
                    facts.bound(-a, int(depth.reshape(-1)[0]) - 1 - b, f"one-hot of depth "
                                f"{int(depth.reshape(-1)[0])} ({_label(node)})")
            if (op in PRESERVING and 0 in pos) or (op == "concat" and pos):
                if op == "cast" and out.type.dtype is DType.bool:
                    if (a, b) == (0, 0):
                        facts.masked(f"cast to bool ({_label(node)})")
                    continue
                for o in node.outputs:
                    todo.append((o, a, b))
            elif op in ("gather", "gather_elements", "gather_nd") and pos == [0]:
                todo.append((out, a, b))
            elif op in ("add", "sub") and len(pos) == 1:
                other = _const_values(node.inputs[1 - pos[0]], consts)
                if op == "sub" and pos[0] == 1:
                    if other is not None and other.size and np.all(other == 1) and (a, b) == (0, 0):
                        facts.masked(f"subtracted from 1 ({_label(node)})")
                    continue
                if other is None or not other.size or (other.dtype.kind not in "iub" and not np.all(other == np.round(other))):
                    continue
                lo, hi = int(other.min()), int(other.max())
                todo.append((out, a + lo, b + hi) if op == "add" else (out, a - hi, b - lo))
            elif op == "mul" and (a, b) == (0, 0) and v.type.dtype.holds_floats:
                # cast to float and multiplied: a mask (an integer product is arithmetic, as often as not)
                facts.masked(f"multiplied ({_label(node)})")
            elif op == "where" and pos == [0]:
                facts.masked(f"condition of where ({_label(node)})")
            elif op in COMPARISONS and len(pos) == 1 and (a, b) == (0, 0):
                other = _const_values(node.inputs[1 - pos[0]], consts)
                if other is not None and other.size and np.all((other == 0) | (other == 1)):
                    facts.masked(f"compared with {other.reshape(-1)[0]:g} ({_label(node)})")


def infer_domains(graph: Graph) -> dict[str, Domain]:
    """The domain of each integer input of ``graph`` that its uses determine (others are absent).

    An input that indexes tables is drawn within every table's range (their intersection; when
    that is empty, nothing is inferred); one used only as a mask is a 0/1 mask."""
    out: dict[str, Domain] = {}
    for inp in graph.inputs:
        if inp.type.dtype.holds_floats or inp.type.dtype is DType.bool:
            continue
        facts = _Facts()
        _follow(graph, inp, facts)
        if facts.indexes:
            assert facts.low is not None and facts.high is not None
            lo, hi = max(facts.low, 0), facts.high
            if lo <= hi:
                out[inp.name] = Domain(f"inferred from the graph: {'; '.join(dict.fromkeys(facts.indexes))}",
                                       low=lo, high=hi)
        elif facts.mask_uses:
            out[inp.name] = Domain(f"inferred from the graph: a mask, {'; '.join(dict.fromkeys(facts.mask_uses))}",
                                   mask=True)
    return out
