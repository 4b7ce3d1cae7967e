"""Generating one C translation unit for a whole graph.

The unit holds the model's API (``cuvil_api.h``): loading the weights blob,
and ``cuvil_run_graph`` (called by ``cuvil_run`` in ``cuvil_model_api.inc``,
in the call's thread context), which checks inputs, binds symbols, runs every node's
kernel in order, frees each intermediate after its last use, and hands the
outputs to the caller.  All memory a call uses belongs to that call.  When the
graph carries a memory plan (the ``plan-memory`` pass, ``memplan.py``), the
planned intermediates instead live at their offsets in one arena the call
allocates once its inputs have bound the symbols.

Output shapes come from the op registry's inference: for a node whose input
dims are only known at run time, inference is re-run with those dims as
run-time symbols, so no op's shape logic is written twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil._version import __version__
from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.kernel import CVal, Kernel, KernelCtx, find_kernel
from cuvil.backends.c.memplan import MemoryPlan, MemoryPlanError, PlannedValue
from cuvil.backends.c.toolchain import header_closure
from cuvil.backends.c.writer import CWriter, Names, c_comment, c_string
from cuvil.errors import CuvilError, UnsupportedOpError, UnsupportedUse
from cuvil.ir.graph import Graph, Node, Value, captures
from cuvil.ir.symbolic import Dim, DimExpr, format_dim, is_unknown, linear_form, render_dim, sym
from cuvil.ir.types import TensorType

WEIGHT_ALIGN = 64
# Bit sets the runtime headers read to compile only what the unit's kernels run, by the header
# that reads each: kernels set bits with KernelCtx.enable, and a file that includes the header
# (directly or through another) defines the macro before its includes (0: nothing).
BIT_SETS = {
    "CUVIL_WINO_TILES": "cuvil_winograd.h",  # Winograd F(m x m, 3 x 3) tile sizes m
}
_log = logging.getLogger(__name__)


class CodegenError(CuvilError):
    """The C backend cannot generate code for this graph."""


@dataclass(frozen=True)
class CodegenOptions:
    target: str = "generic"
    model_name: str = "model"
    # Emit a timestamp after input binding, after every top-level node and after the outputs, readable
    # with the exported ``cuvil_profile_read`` (cuvil/verify/checks/latency.py). Off for every real build.
    profile: bool = False
    # Which algorithm convolutions run (cuvil/backends/c/kernels/conv_algorithm.py): one name for
    # every node, or (node name, algorithm) pairs.
    conv_algorithm: str | tuple[tuple[str, str], ...] = "auto"
    # The planted faults of this compile (cuvil/faults.py; CompileOptions.faults): the kernels at a
    # fault's place read them from here.
    faults: frozenset[str] = frozenset()


@dataclass
class GeneratedModule:
    source: str
    weights: bytes
    line_origins: list[str | None]
    meta: dict[str, Any] = field(default_factory=dict)


def missing_kernels(graph: Graph) -> list[UnsupportedUse]:
    import cuvil.backends.c.kernels  # noqa: F401  (fills the kernel table)

    found: dict[str, list[str]] = {}
    for n in graph.walk():
        if find_kernel(n.op) is None and n.op not in ("constant", "if", "loop"):
            found.setdefault(n.op, []).append(n.name)
    return [UnsupportedUse(op, "cuvil", None, tuple(names), "no C kernel") for op, names in sorted(found.items())]


def _layout_weights(graph: Graph) -> tuple[dict[Value, int], bytes]:
    offsets: dict[Value, int] = {}
    chunks: list[bytes] = []
    pos = 0
    for n in graph.walk():
        if n.op != "constant":
            continue
        a = np.ascontiguousarray(n.attrs["value"])
        data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        pad = (-pos) % WEIGHT_ALIGN
        chunks.append(b"\0" * pad)
        pos += pad
        offsets[n.outputs[0]] = pos
        chunks.append(data)
        pos += len(data)
    return offsets, b"".join(chunks)


class FunctionEmitter:
    """Emits the body of ``cuvil_run``.

    A code generator that runs the kernels elsewhere (the CUDA backend: ``cuvil/backends/cuda``)
    subclasses it and changes where constants live (:attr:`weights_base`), which kernel table it
    reads (:meth:`find_kernel`, :attr:`kernel_ctx`) and how memory is filled (:meth:`fill_bytes`);
    input binding, shape checks and the memory plan's arithmetic are shared."""

    #: The C expression of the loaded weights' first byte, which constants point into.
    weights_base = "m->weights"
    #: The context each kernel emitter is given.
    kernel_ctx: type[KernelCtx] = KernelCtx
    #: What the kernels of this emitter are called in messages.
    kernel_kind = "C kernel"

    def __init__(self, graph: Graph, options: CodegenOptions, weight_offsets: dict[Value, int]) -> None:
        self.graph = graph
        self.options = options
        self.w = CWriter()
        self.names = Names()
        self.offsets = weight_offsets
        self.vals: dict[Value, CVal] = {}
        self.sym_c: dict[str, str] = {name: self.names.fresh("sym") for name in graph.symbols}
        self.rt_syms: dict[str, str] = {}
        self.includes: set[str] = set()
        self.bitsets: dict[str, int] = dict.fromkeys(BIT_SETS, 0)
        # File-scope C that kernels add (KernelCtx.define), in first-use order: the node order fixes it.
        self.definitions: dict[str, str] = {}
        # The memory plan: each planned value, and each buffer's offset and size as C expressions.
        plan = graph.memory_plan
        if plan is not None and not isinstance(plan, MemoryPlan):
            raise CodegenError(f"the graph's memory plan is a {type(plan).__name__}, not a MemoryPlan")
        self.plan: MemoryPlan | None = plan
        self.planned: dict[Value, PlannedValue] = {}
        if plan is not None:
            try:
                plan.check(graph)
            except MemoryPlanError as exc:
                raise CodegenError(str(exc)) from None
            for pv in plan.values:
                self.planned[graph.nodes[pv.node].outputs[pv.output]] = pv
        # values written over the buffer of an earlier value (rule 3 of memplan.py)
        self.in_place = {v for v, pv in self.planned.items()
                         if plan is not None and plan.values[plan.buffers[pv.buffer].values[0]] is not pv}
        self.arena = ""
        self.buf_off: list[str] = []
        self.buf_size: list[str] = []

    # values -----------------------------------------------------------------
    def cval(self, v: Value) -> CVal:
        if v not in self.vals:
            ptr = self.names.fresh("v")
            const = v.producer.attrs["value"] if v.producer is not None and v.producer.op == "constant" else None
            self.vals[v] = CVal(v, ptr, f"{ptr}_s", v.type.dtype, v.type.rank, const)
        return self.vals[v]

    def declare_all(self) -> None:
        def visit(g: Graph) -> None:
            for v in g.inputs:
                self.cval(v)
            for n in g.nodes:
                for o in n.outputs:
                    self.cval(o)
                for _, r in n.regions():
                    visit(r)

        visit(self.graph)
        for c in self.vals.values():
            self.w.line(f"{c.ctype} *{c.ptr} = NULL; int64_t {c.shape}[{max(c.rank, 1)}] = {{0}};")
            self.w.line(f"(void){c.ptr}; (void){c.shape};")

    def find_kernel(self, op: str) -> Kernel | None:
        """The emitter of ``op``'s kernel, from this generator's kernel table."""
        return find_kernel(op)

    def fill_bytes(self, ptr: str, size: str) -> str:
        """A C statement setting ``size`` bytes at ``ptr`` to 0xFF (a poisoned memory plan)."""
        return f"memset({ptr}, 0xFF, (size_t){size});"

    def render(self, d: Dim) -> str:
        def symbol(name: str) -> str:
            if name in self.rt_syms:
                return self.rt_syms[name]
            return self.sym_c[name]

        def call(fn: str, args: list[str]) -> str:
            return f"cuvil_{fn}({', '.join(args)})"

        return render_dim(d, symbol, call)

    def computes_in_place(self, node: Node) -> bool:
        """Whether the memory plan puts an output of ``node`` over one of its inputs."""
        return any(o in self.in_place for o in node.outputs)

    def emit_arena(self) -> None:
        """Size the arena (once the inputs bound the symbols), allocate it and give every buffer its offset."""
        plan = self.plan
        if plan is None or not plan.values:
            return
        w = self.w
        self.arena = self.names.fresh("arena")
        size = self.names.fresh("arena_bytes")
        w.comment(f"memory plan: {len(plan.values)} intermediates in {len(plan.buffers)} buffers of one arena")
        if plan.is_static:
            total = plan.arena_bytes()
            self.buf_off = [str(b.offset) for b in plan.buffers]
            self.buf_size = [str(s) for s in plan.buffer_sizes()]
            w.line(f"const int64_t {size} = {total};")
        else:
            for b in plan.buffers:
                pv = plan.values[b.values[0]]
                sz, off = self.names.fresh("mb"), self.names.fresh("mo")
                dims = ", ".join(f"(int64_t){self.render(d)}" for d in pv.shape) or "1"
                w.line(f"int64_t {sz}; {{ const int64_t d_[] = {{{dims}}}; "
                       f"{sz} = cuvil_arena_round(cuvil_nbytes({pv.dtype.itemsize}, d_, {len(pv.shape)})); }}")
                w.line(f"int64_t {off} = 0;")
                for j in b.below:
                    w.line(f"{off} = cuvil_arena_above({off}, {self.buf_off[j]}, {self.buf_size[j]});")
                self.buf_off.append(off)
                self.buf_size.append(sz)
            w.line(f"int64_t {size} = 0;")
            covered = {j for b in plan.buffers for j in b.below}
            for i in range(len(plan.buffers)):
                if i not in covered:
                    w.line(f"{size} = cuvil_arena_above({size}, {self.buf_off[i]}, {self.buf_size[i]});")
            w.line(f'if ({size} < 0) {{ cuvil_fail(call, "the intermediate tensors are too large for these input '
                   f'shapes"); goto fail; }}')
        w.line(f"unsigned char *{self.arena} = (unsigned char *)cuvil_arena_get(call, m->shared, {size});")
        w.line(f'if (!{self.arena}) {{ cuvil_fail(call, "out of memory for the %lld-byte arena", (long long){size}); '
               "goto fail; }")
        if plan.poison:  # every byte not yet written reads as NaN (or -1, or true)
            w.line(f"if ({size} > 0) {self.fill_bytes(self.arena, size)}")

    def place_value(self, c: CVal, node: Node) -> None:
        """Point a value at its arena offset when the plan holds it, else allocate it on its own."""
        pv = self.planned.get(c.value)
        if pv is None:
            self.alloc_value(c, node)
            return
        self.w.line(f"{c.ptr} = ({c.ctype} *)({self.arena} + {self.buf_off[pv.buffer]});")

    def release_value(self, v: Value) -> None:
        """Free a value after its last use (a planned value's memory goes back to the arena by the plan)."""
        if v not in self.planned:
            self.w.line(f"cuvil_release(call, {self.cval(v).ptr}); {self.cval(v).ptr} = NULL;")

    def poison_dead_buffers(self, i: int) -> None:
        """With a poisoned plan: refill the buffers whose lifetime ends at top-level node ``i``."""
        plan = self.plan
        if plan is None or not plan.poison:
            return
        for k, b in enumerate(plan.buffers):
            if b.end == i:
                self.w.line(self.fill_bytes(f"{self.arena} + {self.buf_off[k]}", self.buf_size[k]))

    def alloc_value(self, c: CVal, node: Node | None) -> None:
        size = f"cuvil_nbytes((int64_t)sizeof({c.ctype}), {c.shape}, {c.rank})"
        self.w.line(f"{c.ptr} = ({c.ctype} *)cuvil_alloc(call, {size});")
        where = c_string(node.name if node else c.value.name)
        self.w.line(f'if (!{c.ptr}) {{ cuvil_fail(call, "node %s: out of memory", {where}); goto fail; }}')

    # inputs -----------------------------------------------------------------
    def bind_inputs(self) -> None:
        w = self.w
        bound: set[str] = set()
        first_use: dict[str, tuple[int, int]] = {}
        for i, v in enumerate(self.graph.inputs):
            c = self.cval(v)
            name = c_string(v.name)
            w.line(f"if (inputs[{i}].dtype != {ct.code(v.type.dtype)}) {{ cuvil_fail(call, "
                   f'"input %s: expected element type {v.type.dtype}, got code %d", {name}, (int)inputs[{i}].dtype); goto fail; }}')
            w.line(f"if (inputs[{i}].rank != {c.rank}) {{ cuvil_fail(call, "
                   f'"input %s: expected rank {c.rank}, got %d", {name}, (int)inputs[{i}].rank); goto fail; }}')
            w.line(f"{c.ptr} = ({c.ctype} *)inputs[{i}].data;")
            for j, d in enumerate(v.type.shape):
                w.line(f"{c.shape}[{j}] = inputs[{i}].shape[{j}];")
                w.line(f'if ({c.shape}[{j}] < 0) {{ cuvil_fail(call, "input %s: dim {j} is negative", {name}); goto fail; }}')
                if isinstance(d, int):
                    w.line(f"if ({c.shape}[{j}] != {d}) {{ cuvil_fail(call, "
                           f'"input %s: dim {j} must be {d}, got %lld", {name}, (long long){c.shape}[{j}]); goto fail; }}')
                elif isinstance(d, DimExpr) and len(d.symbols()) == 1 and d == sym(next(iter(d.symbols()))):
                    s = next(iter(d.symbols()))
                    cs = self.sym_c[s]
                    if s in bound:
                        w.line(f"if ({c.shape}[{j}] != {cs}) {{ cuvil_fail(call, "
                               f'"input %s: dim {j} is %s=%lld, but an earlier input gave %lld", {name}, '
                               f"{c_string(s)}, (long long){c.shape}[{j}], (long long){cs}); goto fail; }}")
                    else:
                        w.line(f"{cs} = {c.shape}[{j}];")
                        bound.add(s)
                        first_use[s] = (i, j)
                elif (lin := linear_form(d)) is not None and lin[0] not in bound:
                    s, k, off = lin  # a derived dim such as 32*h: solve for h
                    cs = self.sym_c[s]
                    w.line(f"if (cuvil_floormod({c.shape}[{j}] - ({off}), {k}) != 0) {{ cuvil_fail(call, "
                           f'"input %s: dim {j} is %s, got %lld", {name}, {c_string(format_dim(d))}, '
                           f"(long long){c.shape}[{j}]); goto fail; }}")
                    w.line(f"{cs} = ({c.shape}[{j}] - ({off})) / {k};")
                    bound.add(s)
                    first_use[s] = (i, j)
        from cuvil.runtime.guards import dropped_guard

        dropped = dropped_guard(self.graph.symbols, self.options.faults)  # a planted fault (cuvil/faults.py), None otherwise
        for s in [s for s in self.graph.symbols if s in bound]:  # graph order: the C must not depend on set order
            info = self.graph.symbols[s]
            cs = self.sym_c[s]
            if info.min is not None:
                w.line(f"if ({cs} < {info.min}) {{ cuvil_fail(call, \"%s=%lld is below its minimum {info.min}\", "
                       f"{c_string(s)}, (long long){cs}); goto fail; }}")
            if info.max is not None and s != dropped:
                w.line(f"if ({cs} > {info.max}) {{ cuvil_fail(call, \"%s=%lld is above its maximum {info.max}\", "
                       f"{c_string(s)}, (long long){cs}); goto fail; }}")
            if info.multiple_of is not None:
                w.line(f"if ({cs} % {info.multiple_of} != 0) {{ cuvil_fail(call, \"%s=%lld is not a multiple of "
                       f"{info.multiple_of}\", {c_string(s)}, (long long){cs}); goto fail; }}")
        for i, v in enumerate(self.graph.inputs):  # dims that are expressions of bound symbols
            c = self.cval(v)
            for j, d in enumerate(v.type.shape):
                lin = linear_form(d)
                if lin is not None and first_use.get(lin[0]) == (i, j):
                    continue  # this dim bound its symbol
                if isinstance(d, DimExpr) and not is_unknown(d) and d.symbols() <= bound and not (
                    len(d.symbols()) == 1 and d == sym(next(iter(d.symbols())))
                ):
                    w.line(f"if ({c.shape}[{j}] != {self.render(d)}) {{ cuvil_fail(call, "
                           f'"input %s: dim {j} does not match its declared expression", {c_string(v.name)}); goto fail; }}')
        self.emit_shape_checks(bound)

    def emit_shape_checks(self, bound: set[str]) -> None:
        """The shape relations the ops need (cuvil/ir/assumptions.py), checked before any kernel runs.

        The same list and wording as the Python input guard, so standalone C and wasm callers are
        protected too; a relation over a symbol no input binds is left to the kernels, as there."""
        from cuvil.ir.assumptions import BROADCAST, EQUAL
        from cuvil.ops.common import graph_assumptions

        for chk in graph_assumptions(self.graph):
            if not chk.symbols() <= bound:
                continue
            a, b = self.names.fresh("lhs"), self.names.fresh("rhs")
            if chk.kind == EQUAL:
                ok, head = f"{a} == {b}", "%s differ: %lld != %lld"
            elif chk.kind == BROADCAST:
                ok, head = f"{a} == {b} || {a} == 1 || {b} == 1", "%s do not broadcast: %lld vs %lld"
            else:
                ok, head = f"{a} == {b} || {a} == 1", "%s do not broadcast: %lld is neither 1 nor %lld"
            sides = [(d, v) for d, v in ((chk.lhs, a), (chk.rhs, b)) if not isinstance(d, int)]
            fmt = "node '%s' (%s): " + head + " (" + ", ".join("%s = %lld" for _ in sides) + ")"
            args = [c_string(chk.node), c_string(chk.op), c_string(chk.what), f"(long long){a}", f"(long long){b}"]
            for d, v in sides:
                args += [c_string(format_dim(d)), f"(long long){v}"]
            with self.w.block(""):
                self.w.line(f"const int64_t {a} = {self.render(chk.lhs)}, {b} = {self.render(chk.rhs)};")
                self.w.line(f"if (!({ok})) {{ cuvil_fail(call, {c_string(fmt)}, {', '.join(args)}); goto fail; }}")

    # nodes -------------------------------------------------------------------
    def out_dims(self, node: Node) -> list[list[str | None]]:
        """Each output dim as a C expression, or None when only the kernel can know it."""
        from cuvil.ops.common import infer_types

        types: Sequence[TensorType] = [o.type for o in node.outputs]
        if any(v is not None and any(is_unknown(d) for d in v.type.shape) for v in node.inputs):
            stand_ins: list[Value | None] = []
            for v in node.inputs:
                if v is None or not any(is_unknown(d) for d in v.type.shape):
                    stand_ins.append(v)
                    continue
                dims: list[Dim] = []
                for j, d in enumerate(v.type.shape):
                    if is_unknown(d):
                        name = f"__rt{len(self.rt_syms)}"
                        while name in self.graph.symbols:
                            name += "_"
                        self.rt_syms[name] = f"{self.cval(v).shape}[{j}]"
                        dims.append(sym(name))
                    else:
                        dims.append(d)
                stand_ins.append(Value(v.name, TensorType(v.type.dtype, tuple(dims))))
            try:
                types, _ = infer_types(node.op, stand_ins, node.attrs, len(node.outputs), self.graph.symbols)
            except CuvilError:
                types = [o.type for o in node.outputs]
        out: list[list[str | None]] = []
        for t in types:
            out.append([None if is_unknown(d) else self.render(d) for d in t.shape])
        return out

    def emit_node(self, node: Node) -> None:
        w = self.w
        outs = [self.cval(o) for o in node.outputs]
        if node.op == "constant":
            c = outs[0]
            w.line(f"{c.ptr} = ({c.ctype} *)({self.weights_base} + {self.offsets[c.value]});")
            for j, d in enumerate(c.value.type.shape):
                w.line(f"{c.shape}[{j}] = {d};")
            return
        ins = [self.cval(v) if v is not None else None for v in node.inputs]
        args = ", ".join("_" if v is None else f"%{v.name}" for v in node.inputs)
        res = ", ".join(f"%{o.name}" for o in node.outputs)
        w.comment(f"node '{node.name}': {res} = {node.op}({args})")
        if node.op in ("if", "loop"):
            from cuvil.backends.c import control

            _log.debug("node %r (%s): control flow, its regions emitted inline (cuvil.backends.c.control)",
                       node.name, node.op)
            with w.block(""):
                control.emit(self, node, ins, outs)
            return
        k = self.find_kernel(node.op)
        if k is None:
            raise CodegenError(f"op {node.op} has no {self.kernel_kind}")
        _log.debug("node %r (%s): %s %s from %s, for %s", node.name, node.op, self.kernel_kind, k.emit.__name__,
                   k.emit.__module__,
                   ", ".join(str(v.type) for v in node.inputs if v is not None) or "no inputs")
        dims = self.out_dims(node)
        allocated: list[bool] = []
        with w.block(""):
            for c, ds in zip(outs, dims):
                for j, e in enumerate(ds):
                    if e is not None:
                        w.line(f"{c.shape}[{j}] = {e};")
                    elif not k.computes_shape:
                        raise CodegenError(
                            f"node {node.name!r} ({node.op}): output dim {j} is only known at run time, "
                            f"and this op's {self.kernel_kind} cannot compute it"
                        )
                checks = [f"{c.shape}[{j}] < 0" for j, e in enumerate(ds) if e is not None and not e.isdigit()]
                if checks:
                    w.line(f"if ({' || '.join(checks)}) {{ cuvil_fail(call, \"node %s ({node.op}): input shapes "
                           f"do not fit together\", {c_string(node.name)}); goto fail; }}")
                allocated.append(all(e is not None for e in ds))
                if allocated[-1]:
                    self.place_value(c, node)
            k.emit(self.kernel_ctx(self, node, ins, outs, allocated))

    def emit_graph(self, g: Graph, keep: set[Value]) -> None:
        """Emit ``g``'s nodes, releasing each value it defines after its last use (except ``keep``)."""
        last: dict[Value, int] = {}
        for i, n in enumerate(g.nodes):
            # operands in order, then region captures: the release order in the C follows it
            for v in [*(x for x in n.inputs if x is not None), *sorted(captures(n), key=lambda x: x.uid)]:
                last[v] = i
        defined_here = {o for n in g.nodes for o in n.outputs}
        for i, n in enumerate(g.nodes):
            with self.w.node(n.name):
                self.emit_node(n)
            profiled = self.options.profile and g is self.graph
            for o in n.outputs:
                if o not in last and o not in keep and n.op != "constant":
                    self.release_value(o)
            for v, li in last.items():
                if li == i and v in defined_here and v not in keep and v.producer is not None and v.producer.op != "constant":
                    self.release_value(v)
            if g is self.graph:
                self.poison_dead_buffers(i)
            if profiled:
                self.w.line(f"cuvil_prof_stamp({i + 2});")

    def emit_outputs(self) -> None:
        w = self.w
        seen: set[Value] = set()
        for i, v in enumerate(self.graph.outputs):
            c = self.cval(v)
            owned = v.producer is not None and v.producer.op != "constant" and v not in seen
            seen.add(v)
            if owned:
                w.line(f"cuvil_forget(call, {c.ptr});")
                w.line(f"outputs[{i}].data = {c.ptr};")
            else:
                tmp = self.names.fresh("copy")
                size = f"(size_t)sizeof({c.ctype}) * (size_t)cuvil_numel({c.shape}, {c.rank})"
                w.line(f"void *{tmp} = malloc(({size}) ? ({size}) : 1);")
                w.line(f'if (!{tmp}) {{ cuvil_fail(call, "out of memory"); goto fail; }}')
                w.line(f"if (({size}) != 0) memcpy({tmp}, {c.ptr}, {size});")
                w.line(f"outputs[{i}].data = {tmp};")
            w.line(f"outputs[{i}].rank = {c.rank}; outputs[{i}].dtype = {ct.code(v.type.dtype)};")
            for j in range(c.rank):
                w.line(f"outputs[{i}].shape[{j}] = {c.shape}[{j}];")


def _profile_definitions(n: int) -> str:
    """The timestamps of a profiling build (``CodegenOptions.profile``): slot 0 on entry, 1 after the
    input checks, 2 + i after top-level node i (its releases included), n - 1 after the outputs.

    One process-wide buffer, so a profiling build is for one calling thread at a time; real builds
    never contain it."""
    return f"""#include <time.h>
static int64_t cuvil_prof_ns[{n}];
static void cuvil_prof_stamp(int k) {{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    cuvil_prof_ns[k] = (int64_t)ts.tv_sec * INT64_C(1000000000) + (int64_t)ts.tv_nsec;
}}
CUVIL_EXPORT int cuvil_profile_read(int64_t *out, int n) {{
    const int count = n < {n} ? n : {n};
    for (int k = 0; k < count; k++) out[k] = cuvil_prof_ns[k];
    return {n};
}}
"""


def library_signature(graph: Graph, target: str) -> str:
    """The facts a library reports about itself (``cuvil_signature()``), as JSON: its target, and the
    element type and rank of each input and output."""
    def side(values: Sequence[Value]) -> list[list[object]]:
        return [[str(v.type.dtype), v.type.rank] for v in values]

    return json.dumps({"target": target, "inputs": side(graph.inputs), "outputs": side(graph.outputs)},
                      separators=(",", ":"))


def generate(graph: Graph, options: CodegenOptions) -> GeneratedModule:
    """The C source, weights blob and line map for ``graph``."""
    missing = missing_kernels(graph)
    if missing:
        raise UnsupportedOpError(missing)
    if options.conv_algorithm != "auto":
        from cuvil.backends.c.kernels import conv_algorithm

        conv_algorithm.check(graph, options.conv_algorithm)
    for v in list(graph.inputs) + list(graph.outputs):
        if v.type.rank > 8:
            raise CodegenError(f"{v.name!r} has rank {v.type.rank}; the C API supports rank 8 at most")
    offsets, weights = _layout_weights(graph)
    fn = FunctionEmitter(graph, options, offsets)
    body = fn.w
    with body.indented():
        body.line("cuvil_call call_ = {0}; cuvil_call *call = &call_;")
        body.line("call->err = err; call->errlen = errlen;")
        body.line("if (err && errlen) err[0] = 0;")
        for name, cs in fn.sym_c.items():
            body.line(f"int64_t {cs} = 0; (void){cs}; /* {c_comment(name)} */")
        fn.declare_all()
        body.line("if (!m || !inputs || !outputs) return cuvil_fail(call, \"null argument\");")
        if options.profile:
            fn.definitions["cuvil.profile"] = _profile_definitions(len(graph.nodes) + 3)
            body.line("cuvil_prof_stamp(0);")
        fn.bind_inputs()
        fn.emit_arena()
        if options.profile:
            body.line("cuvil_prof_stamp(1);")
        fn.emit_graph(graph, keep=set(graph.outputs))
        fn.emit_outputs()
        if options.profile:
            body.line(f"cuvil_prof_stamp({len(graph.nodes) + 2});")
        body.line("cuvil_call_end(call);")
        body.line("return 0;")
    w = CWriter()
    w.line(f"/* Generated by Cuvil {__version__} for target {options.target}. */")
    w.line(f"/* Model: {c_comment(options.model_name)} */")
    headers = sorted(fn.includes | {"cuvil_threads.h"})  # the model API's threads and constant cache
    included = frozenset().union(*(header_closure(h) for h in headers))
    for macro, bits in sorted(fn.bitsets.items()):
        if BIT_SETS[macro] in included:
            w.line(f"#define {macro} {bits:#x}")
    w.line('#include "cuvil_rt.h"')
    for header in headers:  # the model API's threads and constant cache
        w.line(f'#include "{header}"')
    for text in fn.definitions.values():
        w.line("")
        w.lines.extend(text.rstrip("\n").split("\n"))
    w.line("")
    w.line("struct cuvil_model { const unsigned char *weights; size_t size; unsigned char *owned; cuvil_shared *shared; };")
    w.line(f"#define CUVIL_WEIGHTS_SIZE ((size_t){len(weights)})")
    w.line(f"static const int cuvil_n_inputs = {len(graph.inputs)};")
    w.line(f"static const int cuvil_n_outputs = {len(graph.outputs)};")
    # What the library itself says it takes and returns: a loader compares it with what an
    # artifact's meta.json claims (cuvil/backends/c/library.py), so the two cannot disagree unseen.
    w.line(f"static const char cuvil_signature_text[] = {c_string(library_signature(graph, options.target))};")
    w.line('#include "cuvil_model_api.inc"')
    w.line("")
    w.line("static int cuvil_run_graph(const cuvil_model *m, const cuvil_tensor *inputs, cuvil_tensor *outputs, "
           "char *err, size_t errlen) {")
    lines = w.lines + body.lines + ["fail:", "    cuvil_call_end(call);", "    return -1;", "}"]
    origins = [None] * len(w.lines) + body.origins + [None] * 4
    meta = {"weights_size": len(weights)}
    return GeneratedModule("\n".join(lines) + "\n", weights, origins, meta)
