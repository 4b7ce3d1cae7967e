"""Static memory planning for the C backend: one arena per call, an offset for every intermediate.

A :class:`MemoryPlan` says where each intermediate tensor of the top-level schedule lives in
the call's arena.  It is computed by :func:`plan_memory` (run by the ``plan-memory`` pass,
``cuvil/passes/plan_memory.py``) and read by the code generator (``codegen.py``).

The rules:

1. Liveness runs over the top-level schedule: a value lives from the node that defines it to
   the last node that reads it, counting reads from inside that node's If/Loop regions
   (``cuvil.ir.graph.reads``).  A value nothing reads lives at its own node only.
2. Planned: every output of a top-level node that is not a graph output (those are handed to
   the caller, zero-copy), not a constant (weights), not an ``if``/``loop`` output (control
   flow copies and grows its results itself), whose dims are all known and expressible in the
   symbols the inputs bind, and whose node has no input with a data-dependent dim.  Everything
   else, and every value defined inside a region, keeps a dynamic allocation of its own.
3. In place: a node whose C kernel is registered ``in_place`` (it reads element i of each
   operand before writing element i of its output, and reads nothing else of it) writes its
   output over an input that dies at this node and has the output's element type and shape;
   the two values then form one *buffer*.  No other kernel ever shares memory with its inputs.
4. Buffers are placed greedy by size with best fit (Pisarchyk and Lee, "Efficient Memory
   Management for Deep Neural Net Inference", 2020) at *representative* symbol values: each
   symbol's maximum, or when it has none, 64 (at least its minimum, rounded to its multiple).
5. Exact for every symbol value: the placement fixes, for every two buffers whose lifetimes
   overlap, which one lies below the other.  Offsets are then computed (in Python when every
   size is static, else by the generated C once the inputs bind the symbols) as
   ``offset(X) = max over buffers Y below X of (offset(Y) + size(Y))``, visiting buffers in
   representative-offset order; the arena's size is the largest end.  Two overlapping
   lifetimes therefore never share bytes, whatever the sizes; at the representative values
   no offset is above the greedy one.  Sizes are rounded up to 64 bytes, so offsets are
   64-byte aligned.
6. The lower bound reported beside the arena size is the largest sum of (rounded) buffer sizes
   live at one node: no placement of these buffers can use less.

A plan refers to values by position (top-level node index, output index), so it stays valid
for a copy of the graph (``copy_graph``); the code generator checks that it still describes
the graph it is given and refuses a stale one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from cuvil import faults
from cuvil.errors import CuvilError
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Value, reads
from cuvil.ir.symbolic import Dim, DimExpr, evaluate, format_dim, is_unknown, linear_form, sym
from cuvil.ir.types import SymbolInfo

ALIGN = 64
# A symbol with no maximum is planned as if it were this (rule 4); any value still works (rule 5).
UNBOUNDED_REPRESENTATIVE = 64
_log = logging.getLogger(__name__)


class MemoryPlanError(CuvilError):
    """A memory plan that does not fit the graph, or symbol values it cannot be evaluated at."""


@dataclass(frozen=True)
class PlannedValue:
    """One intermediate tensor in the arena."""

    node: int  # index of its producer in the top-level schedule
    output: int  # which output of that node
    name: str
    dtype: DType
    shape: tuple[Dim, ...]
    start: int  # schedule interval of the value itself (inclusive)
    end: int
    buffer: int  # the buffer (index into MemoryPlan.buffers) holding it

    @property
    def nbytes(self) -> Dim:
        n: Dim = self.dtype.itemsize
        for d in self.shape:
            n = n * d
        return n


@dataclass(frozen=True)
class Buffer:
    """A region of the arena: one value, or a chain of values computed in place over each other."""

    values: tuple[int, ...]  # indices into MemoryPlan.values, in schedule order
    nbytes: Dim  # unrounded
    start: int
    end: int
    below: tuple[int, ...]  # buffers whose end bounds this one's offset from below (rule 5)
    offset: int | None  # the offset, when every size in the plan is static


@dataclass(frozen=True)
class MemoryPlan:
    """Where every planned intermediate lives; buffers are in offset order (rule 5)."""

    values: tuple[PlannedValue, ...]
    buffers: tuple[Buffer, ...]
    num_nodes: int
    symbols: Mapping[str, SymbolInfo]
    representative: Mapping[str, int]
    poison: bool = False
    in_place: bool = True
    _static: bool = field(default=False, repr=False)
    # what the plan's liveness was computed from (structure_key): a copy with other outputs or readers is stale
    structure: str = field(default="", repr=False)

    # ---- evaluation ---------------------------------------------------------------------------------------------
    @property
    def is_static(self) -> bool:
        """Whether every offset and the arena size are constants."""
        return self._static

    @property
    def bounded(self) -> bool:
        """Whether every symbol the sizes depend on has a maximum (so figures need no ``dims``)."""
        used = {s for v in self.values for d in v.shape if isinstance(d, DimExpr) for s in d.symbols()}
        return all(self.symbols[s].max is not None for s in used)

    def env(self, dims: Mapping[str, int] | None = None) -> dict[str, int]:
        """Symbol values to evaluate at: ``dims`` where given, else each symbol's maximum.

        A symbol with no maximum must be given."""
        out: dict[str, int] = {}
        for name, info in self.symbols.items():
            if dims is not None and name in dims:
                out[name] = int(dims[name])
            elif info.max is not None:
                out[name] = info.max
        used = {s for v in self.values for d in v.shape if isinstance(d, DimExpr) for s in d.symbols()}
        missing = sorted(used - set(out))
        if missing:
            raise MemoryPlanError(f"the memory plan depends on {', '.join(missing)}, which has no maximum: "
                                  "give its value (dims=)")
        unknown = sorted(set(dims or {}) - set(self.symbols))
        if unknown:
            raise MemoryPlanError(f"the memory plan has no symbol(s) {', '.join(unknown)}")
        return out

    def buffer_sizes(self, dims: Mapping[str, int] | None = None) -> list[int]:
        """Each buffer's size in bytes, rounded up to the 64-byte alignment."""
        env = self.env(dims)
        return [_round(evaluate(b.nbytes, env)) for b in self.buffers]

    def buffer_offsets(self, dims: Mapping[str, int] | None = None) -> list[int]:
        """Each buffer's offset, by rule 5 (what the generated C computes)."""
        return _offsets(self.buffers, self.buffer_sizes(dims))

    def arena_bytes(self, dims: Mapping[str, int] | None = None) -> int:
        sizes = self.buffer_sizes(dims)
        offs = _offsets(self.buffers, sizes)
        return max((o + s for o, s in zip(offs, sizes)), default=0)

    def live_bytes(self, dims: Mapping[str, int] | None = None) -> list[int]:
        """The bytes of the buffers live at each node of the schedule."""
        sizes = self.buffer_sizes(dims)
        live = [0] * self.num_nodes
        for b, s in zip(self.buffers, sizes):
            for i in range(b.start, b.end + 1):
                live[i] += s
        return live

    def lower_bound_bytes(self, dims: Mapping[str, int] | None = None) -> int:
        """The most bytes live at any one node (rule 6)."""
        return max(self.live_bytes(dims), default=0)

    def value_layout(self, dims: Mapping[str, int] | None = None) -> dict[str, tuple[int, int]]:
        """Each planned value's (offset, bytes), by name."""
        env = self.env(dims)
        offs = self.buffer_offsets(dims)
        return {v.name: (offs[v.buffer], evaluate(v.nbytes, env)) for v in self.values}

    def free_blocks(self, node: int | None = None, dims: Mapping[str, int] | None = None) -> list[tuple[int, int]]:
        """The free (offset, bytes) gaps of the arena while ``node`` runs (default: the node with the most live
        bytes), the gap above the highest live buffer up to the arena's end included."""
        sizes = self.buffer_sizes(dims)
        offs = _offsets(self.buffers, sizes)
        total = max((o + s for o, s in zip(offs, sizes)), default=0)
        if node is None:
            live = self.live_bytes(dims)
            node = live.index(max(live)) if live else 0
        used = sorted((offs[i], sizes[i]) for i, b in enumerate(self.buffers) if b.start <= node <= b.end)
        gaps: list[tuple[int, int]] = []
        pos = 0
        for o, s in used:
            if o > pos:
                gaps.append((pos, o - pos))
            pos = max(pos, o + s)
        if total > pos:
            gaps.append((pos, total - pos))
        return gaps

    def largest_free_block(self, node: int | None = None, dims: Mapping[str, int] | None = None) -> int:
        return max((s for _, s in self.free_blocks(node, dims)), default=0)

    def fragmentation(self, node: int | None = None, dims: Mapping[str, int] | None = None) -> float:
        """1 - largest free block / total free bytes at ``node`` (0 when nothing is free)."""
        gaps = self.free_blocks(node, dims)
        free = sum(s for _, s in gaps)
        return 0.0 if free == 0 else 1.0 - max(s for _, s in gaps) / free

    def summary(self, dims: Mapping[str, int] | None = None) -> dict[str, object]:
        """The plan's figures as data (JSON-ready)."""
        arena, bound = self.arena_bytes(dims), self.lower_bound_bytes(dims)
        return {
            "values": len(self.values),
            "buffers": len(self.buffers),
            "in_place": sum(len(b.values) - 1 for b in self.buffers),
            "static": self.is_static,
            "dims": self.env(dims),
            "arena_bytes": arena,
            "lower_bound_bytes": bound,
            "ratio": arena / bound if bound else 1.0,
            "largest_free_block": self.largest_free_block(None, dims),
            "fragmentation": self.fragmentation(None, dims),
        }

    def format(self, dims: Mapping[str, int] | None = None) -> str:
        """The plan as text: one line per buffer (offset, size, lifetime, values), then the figures."""
        env = self.env(dims)
        sizes = self.buffer_sizes(dims)
        offs = _offsets(self.buffers, sizes)
        at = ", ".join(f"{k}={v}" for k, v in env.items())
        lines = [f"memory plan: {len(self.values)} values in {len(self.buffers)} buffers"
                 + (f" (at {at})" if at else "") + (", poisoned" if self.poison else "")]
        for i, (b, o, s) in enumerate(zip(self.buffers, offs, sizes)):
            names = " <- ".join(f"%{self.values[k].name}" for k in b.values)
            size = format_dim(b.nbytes)
            above = f", above {' '.join(map(str, b.below))}" if b.below else ""
            lines.append(f"  buffer {i}: offset {o}, {s} bytes ({size}){above}, nodes {b.start}..{b.end}: {names}")
        arena, bound = max((o + s for o, s in zip(offs, sizes)), default=0), self.lower_bound_bytes(dims)
        lines.append(f"arena {arena} bytes, lower bound {bound} bytes"
                     + (f" ({arena / bound:.3f}x)" if bound else ""))
        return "\n".join(lines) + "\n"

    # ---- the graph it describes ---------------------------------------------------------------------------------
    def check(self, graph: Graph) -> None:
        """Raise :class:`MemoryPlanError` unless the plan describes ``graph`` (it was not changed since)."""
        if len(graph.nodes) != self.num_nodes:
            raise MemoryPlanError(f"the memory plan is stale: it was made for {self.num_nodes} top-level nodes, the "
                                  f"graph has {len(graph.nodes)} (run plan-memory last)")
        if self.structure and structure_key(graph) != self.structure:
            raise MemoryPlanError("the memory plan is stale: the graph's nodes, their operands or its outputs "
                                  "changed since it was planned (run plan-memory last)")
        for v in self.values:
            n = graph.nodes[v.node]
            o = n.outputs[v.output] if v.output < len(n.outputs) else None
            if o is None or o.type.dtype is not v.dtype or o.type.shape != v.shape:
                raise MemoryPlanError(f"the memory plan is stale: node {v.node} ({n.op}) no longer defines "
                                      f"%{v.name} as planned (run plan-memory last)")


def structure_key(graph: Graph) -> str:
    """A digest of everything liveness and placement depend on: each top-level node's op, what it reads
    (by position, region captures included) and its output types, and which values are graph outputs."""
    pos: dict[Value, tuple[object, int]] = {v: ("in", k) for k, v in enumerate(graph.inputs)}
    h = hashlib.sha256()
    for i, n in enumerate(graph.nodes):
        for j, o in enumerate(n.outputs):
            pos[o] = (i, j)
        operands = sorted(repr(pos.get(v, ("outer", v.name))) for v in reads(n))
        h.update(repr((n.op, [repr(pos.get(v)) if v is not None else None for v in n.inputs], operands,
                       [str(o.type) for o in n.outputs])).encode())
    h.update(repr([pos.get(v) for v in graph.outputs]).encode())
    return h.hexdigest()


def _round(n: int) -> int:
    if n < 0:
        raise MemoryPlanError(f"a tensor of {n} bytes")
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _offsets(buffers: Iterable[Buffer], sizes: list[int]) -> list[int]:
    offs: list[int] = []
    for b in buffers:
        offs.append(max((offs[j] + sizes[j] for j in b.below), default=0))
    return offs


# ---- planning ----------------------------------------------------------------------------------------------------


def bound_symbols(graph: Graph) -> set[str]:
    """The symbols the generated C binds from the inputs' shapes (as ``FunctionEmitter.bind_inputs`` does)."""
    out: set[str] = set()
    for v in graph.inputs:
        for d in v.type.shape:
            if isinstance(d, DimExpr) and len(d.symbols()) == 1 and d == sym(next(iter(d.symbols()))):
                out |= d.symbols()
            elif (lin := linear_form(d)) is not None:
                out.add(lin[0])
    return out


def representative_env(symbols: Mapping[str, SymbolInfo]) -> dict[str, int]:
    """The symbol values buffers are placed at (rule 4)."""
    env: dict[str, int] = {}
    for name, info in symbols.items():
        if info.max is not None:
            env[name] = info.max
            continue
        v = max(info.min or 1, UNBOUNDED_REPRESENTATIVE)
        m = info.multiple_of
        env[name] = -(-v // m) * m if m else v
    return env


def plan_memory(graph: Graph, *, in_place: bool = True, poison: bool = False,
                planted: Collection[str] = frozenset()) -> MemoryPlan:
    """The memory plan of ``graph``'s top-level schedule (rules 1-6); ``planted``: the compile's
    planted faults (cuvil/faults.py), two of which live here."""
    import cuvil.backends.c.kernels  # noqa: F401  (fills the kernel table: which kernels work in place)
    from cuvil.backends.c.kernel import find_kernel

    nodes = graph.nodes
    last: dict[object, int] = {}
    first: dict[object, int] = {}
    readers: dict[object, int] = {}
    for i, n in enumerate(nodes):
        for v in reads(n):
            last[v] = i
            first.setdefault(v, i)
            readers[v] = readers.get(v, 0) + 1
    if faults.active("stale-read", planted):  # planted: liveness ends at a value's first reader, not its last
        last = {v: first[v] if readers[v] > 1 else i for v, i in last.items()}
    outputs = set(graph.outputs)
    bound = bound_symbols(graph)

    values: list[PlannedValue] = []
    index: dict[object, int] = {}
    for i, n in enumerate(nodes):
        if n.op in ("constant", "if", "loop"):
            continue
        if any(v is not None and any(is_unknown(d) for d in v.type.shape) for v in n.inputs):
            continue  # its output dims come from run-time shapes: sized only when the node runs
        for j, o in enumerate(n.outputs):
            if o in outputs or any(is_unknown(d) for d in o.type.shape):
                continue
            if not o.type.symbols() <= bound:
                continue
            index[o] = len(values)
            values.append(PlannedValue(i, j, o.name, o.type.dtype, o.type.shape, i, last.get(o, i), -1))

    # rule 3: chains of in-place values share one buffer
    owner = list(range(len(values)))  # value index -> first value of its buffer
    ends: dict[int, int] = {k: v.end for k, v in enumerate(values)}  # buffer root -> its end
    if in_place:
        for i, n in enumerate(nodes):
            kern = find_kernel(n.op)
            if kern is None or not kern.in_place or len(n.outputs) != 1 or n.outputs[0] not in index:
                continue
            out = values[index[n.outputs[0]]]
            for x in n.inputs:
                if x is None or x not in index:
                    continue
                root = owner[index[x]]
                if ends[root] != i or x.type.dtype is not out.dtype or x.type.shape != out.shape:
                    continue
                owner[index[n.outputs[0]]] = root
                ends[root] = out.end
                break

    members: dict[int, list[int]] = {}
    for k in range(len(values)):
        members.setdefault(owner[k], []).append(k)
    spans = [_Span(tuple(members[r]), values[r].nbytes, values[r].start, ends[r]) for r in sorted(members)]

    rep = representative_env(graph.symbols)
    rep_sizes = [_round(evaluate(sp.nbytes, rep)) for sp in spans]
    rep_off = _best_fit(spans, rep_sizes)
    # rule 5: the buffers in representative-offset order (ties: smaller first), each above the
    # conflicting buffers before it
    seq = sorted(range(len(spans)), key=lambda j: (rep_off[j], rep_sizes[j], j))
    below = _below_sets([spans[j] for j in seq], planted)
    static = all(isinstance(sp.nbytes, int) for sp in spans)
    shell = [Buffer(spans[j].values, spans[j].nbytes, spans[j].start, spans[j].end, below[p], None)
             for p, j in enumerate(seq)]
    offsets: list[int | None] = list(_offsets(shell, [_round(b.nbytes) if isinstance(b.nbytes, int) else 0 for b in shell])) if static \
        else [None] * len(shell)
    buffers = tuple(dataclasses.replace(b, offset=o) for b, o in zip(shell, offsets))
    final = list(values)
    for p, buf in enumerate(buffers):
        for k in buf.values:
            final[k] = dataclasses.replace(final[k], buffer=p)
    plan = MemoryPlan(tuple(final), buffers, len(nodes), dict(graph.symbols), rep, poison, in_place, static,
                      structure_key(graph))
    if values and _log.isEnabledFor(logging.DEBUG):  # INFO is one summary line per compile (cuvil/api.py)
        fig = plan.summary(None if plan.bounded else rep)
        _log.debug("memory plan for %r: %d values in %d buffers (%d in place), arena %d bytes, lower bound %d bytes "
                  "(%.3fx)%s", graph.name, fig["values"], fig["buffers"], fig["in_place"], fig["arena_bytes"],
                  fig["lower_bound_bytes"], fig["ratio"], "" if plan.is_static else f" at {fig['dims']}")
    return plan


@dataclass(frozen=True)
class _Span:
    """A buffer before placement: its values, size and lifetime."""

    values: tuple[int, ...]
    nbytes: Dim
    start: int
    end: int

    def meets(self, other: _Span) -> bool:
        return self.start <= other.end and other.start <= self.end


def _best_fit(spans: list[_Span], sizes: list[int]) -> list[int]:
    """Greedy by size (largest first), each into the smallest gap between the placed buffers whose
    lifetimes meet its own, else above them all (rule 4)."""
    order = sorted(range(len(spans)), key=lambda j: (-sizes[j], spans[j].start, j))
    offs = [0] * len(spans)
    placed: list[int] = []
    for j in order:
        conflicts = sorted((offs[c], sizes[c]) for c in placed if spans[c].meets(spans[j]))
        best: int | None = None
        best_gap = 0
        top = 0
        for o, size in conflicts:
            gap = o - top
            if gap >= sizes[j] and (best is None or gap < best_gap):
                best, best_gap = top, gap
            top = max(top, o + size)
        offs[j] = best if best is not None else top
        placed.append(j)
    return offs


def _below_sets(seq: list[_Span], planted: Collection[str]) -> list[tuple[int, ...]]:
    """For each buffer (in offset order), the earlier buffers whose lifetimes meet its own, less
    those another one of them already lies above (rule 5)."""
    reach: list[set[int]] = []
    out: list[tuple[int, ...]] = []
    for p, span in enumerate(seq):
        direct = [q for q in range(p) if seq[q].meets(span)]
        if faults.active("arena-overlap", planted) and direct:  # planted: the nearest block below is overlooked
            direct = direct[:-1]
        implied: set[int] = set()
        for q in direct:
            implied |= reach[q]
        out.append(tuple(q for q in direct if q not in implied))
        reach.append(implied | set(direct))
    return out

