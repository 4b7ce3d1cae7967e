"""Turning an ONNX graph into Cuvil IR.

Each ONNX op type has one importer function, registered with
:func:`importer`, that receives an :class:`ImportCtx` for the node and
returns one Cuvil value per ONNX output.  Importers map every opset version
of their op to Cuvil's op set (which follows the newest ONNX semantics), so
older forms (attributes that later became inputs, changed defaults) are
upgraded here and nowhere else.

Before converting anything, the whole model (regions included) is scanned
for op types without an importer, so the user sees every unsupported op in
one error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from cuvil.errors import CuvilError, ModelError, ShapeError, StorageTypeError, UnsupportedOpError, UnsupportedUse
from cuvil.frontends.onnx.attributes import ONNX_DOMAINS as ONNX_DOMAINS
from cuvil.frontends.onnx.attributes import attr_value, check_attribute_types, known_dtype
from cuvil.frontends.onnx.attributes import dtype_of as dtype_of
from cuvil.frontends.onnx.attributes import tensor_to_array as tensor_to_array
from cuvil.frontends.onnx.attributes import to_onnx_elem as to_onnx_elem
from cuvil.frontends.onnx.dims import (
    bindable,
    check_model_output,
    check_region_output,
    declared_shape,
    dim_params,
    dim_texts,
)
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.symbolic import Dim, free_symbols, sym
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.passes.fold_constants import fold_node

ImporterFn = Callable[["ImportCtx"], Sequence[Value | None]]


@dataclass(frozen=True)
class Importer:
    fn: ImporterFn
    since: int = 1


_IMPORTERS: dict[tuple[str, str], Importer] = {}


def importer(op_type: str, *, domain: str = "", since: int = 1) -> Callable[[ImporterFn], ImporterFn]:
    """Register the importer of an ONNX op type (all versions from ``since`` on)."""

    def wrap(fn: ImporterFn) -> ImporterFn:
        _IMPORTERS[(domain, op_type)] = Importer(fn, since)
        return fn

    return wrap


def simple(op_type: str, cuvil_op: str, *, since: int = 1, drop_attrs: Sequence[str] = ()) -> None:
    """An ONNX op whose inputs and attributes map unchanged to a Cuvil op."""

    def fn(ctx: ImportCtx) -> Sequence[Value | None]:
        attrs = {k: v for k, v in ctx.attrs.items() if k not in drop_attrs}
        return ctx.emit(cuvil_op, ctx.inputs(), attrs, num_outputs=ctx.num_outputs)

    importer(op_type, since=since)(fn)


# Lookups for op types no importer is registered for (custom domains: ops_custom.py).
_FALLBACKS: list[Callable[[str, str], Importer | None]] = []


def importer_fallback(fn: Callable[[str, str], Importer | None]) -> Callable[[str, str], Importer | None]:
    """Register ``fn(domain, op_type)``, asked when no importer is registered for an op type."""
    _FALLBACKS.append(fn)
    return fn


def find_importer(domain: str, op_type: str) -> Importer | None:
    dom = "" if domain in ONNX_DOMAINS else domain
    found = _IMPORTERS.get((dom, op_type))
    for fallback in _FALLBACKS if found is None else ():
        if (found := fallback(dom, op_type)) is not None:
            break
    return found


def supported_op_types() -> list[str]:
    return sorted(f"{d + '::' if d else ''}{t}" for d, t in _IMPORTERS)


@dataclass
class Scope:
    """ONNX names visible in a graph: its own, then its enclosing graph's."""

    values: dict[str, Value] = field(default_factory=dict)
    parent: Scope | None = None

    def lookup(self, name: str) -> Value | None:
        s: Scope | None = self
        while s is not None:
            if name in s.values:
                return s.values[name]
            s = s.parent
        return None


class ImportCtx:
    """What an importer sees for one ONNX node."""

    def __init__(self, conv: _Converter, node: onnx.NodeProto, name: str, scope: Scope, builder: Builder) -> None:
        self._conv = conv
        self.node = node
        self.scope = scope
        self.builder = builder
        self.op_type = node.op_type
        self.name = name
        self.opset = conv.opset(node.domain)
        self.attrs: dict[str, Any] = {a.name: attr_value(a) for a in node.attribute}
        self.created: set[Value] = set()

    # inputs ------------------------------------------------------------
    @property
    def num_inputs(self) -> int:
        return len(self.node.input)

    @property
    def num_outputs(self) -> int:
        n = len(self.node.output)
        while n and not self.node.output[n - 1]:
            n -= 1
        return n

    def input(self, i: int) -> Value | None:
        if i >= len(self.node.input) or not self.node.input[i]:
            return None
        name = self.node.input[i]
        v = self.scope.lookup(name)
        if v is None:
            raise ModelError(f"node {self.name!r} ({self.op_type}) reads {name!r}, which nothing defines before it")
        return v

    def inputs(self) -> list[Value | None]:
        return [self.input(i) for i in range(len(self.node.input))]

    def const_input(self, i: int) -> np.ndarray | None:
        from cuvil.ops.common import const_of

        return const_of(self.input(i))

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    # building ------------------------------------------------------------
    def emit(
        self,
        op: str,
        inputs: Sequence[Value | None],
        attrs: dict[str, Any] | None = None,
        *,
        num_outputs: int = 1,
    ) -> list[Value]:
        """Add a Cuvil node for this ONNX node and return its outputs."""
        names = [self.builder.fresh_name(f"{self.name}/") for _ in range(num_outputs)]
        try:
            outs = self.builder.add(op, inputs, attrs or {}, num_outputs=num_outputs, names=names, node_name=self.name)
        except StorageTypeError as exc:  # an op ONNX may allow on int4/float8 that Cuvil does not compute on
            raise self.unsupported(str(exc)) from None
        except ShapeError as exc:
            raise ModelError(f"node {self.name!r} ({self.op_type}): {exc}") from None
        # One folding rule for import and the fold-constants pass: cuvil.passes.fold_constants.
        values = fold_node(self.builder.graph.nodes[-1], max_elements=_FOLD_LIMIT)
        if values is not None:  # computable now: the node becomes constants of the same names
            self.builder.graph.nodes.pop()
            outs = [self.builder.add1("constant", [], {"value": a}, names=[o.name], node_name=self.name)
                    for o, a in zip(outs, values)]
        self.created.update(outs)
        return outs

    def emit1(self, op: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None) -> Value:
        return self.emit(op, inputs, attrs)[0]

    def constant(self, value: Any, dtype: DType | None = None) -> Value:
        arr = np.asarray(value, dtype=dtype.np if dtype else None)
        return self.emit1("constant", [], {"value": arr})

    def subgraph(self, attr: str, input_types: Sequence[TensorType] | None = None) -> Graph:
        """Convert a graph attribute into a region that can read this graph's values.

        ``input_types`` overrides the types the ONNX subgraph declares for its inputs."""
        g = self.attrs.get(attr)
        if not isinstance(g, onnx.GraphProto):
            raise ModelError(f"node {self.name!r} ({self.op_type}) needs a graph attribute {attr!r}")
        return self.region(g, attr, input_types)

    def region(self, g: onnx.GraphProto, name: str, input_types: Sequence[TensorType] | None = None) -> Graph:
        """Convert an ONNX graph (an attribute, or one an importer wrote) into a region of this node."""
        return self._conv.convert_graph(g, self.scope, input_types=input_types, name=name, prefix=f"{self.name}/{name}/")

    def bind(self, onnx_name: str, value: Value) -> None:
        """Make ``value`` visible under ``onnx_name`` to this node's regions (a name no model value has)."""
        if self.scope.lookup(onnx_name) is not None:
            raise ModelError(f"node {self.name!r} ({self.op_type}): the name {onnx_name!r} is taken")
        self.scope.values[onnx_name] = value

    def import_as(self, op_type: str, inputs: Sequence[Value | None]) -> list[Value | None]:
        """This node imported as the standard-domain ``op_type`` reading ``inputs`` (None: an absent
        optional input), its attributes and outputs unchanged: for an op of another domain that is a
        standard op on rewritten operands.  The standard op's importer and attribute checks apply."""
        node = onnx.NodeProto()
        node.CopyFrom(self.node)
        node.op_type, node.domain = op_type, ""
        del node.input[:]
        scope = Scope(parent=self.scope)
        for i, v in enumerate(inputs):
            key = f"{self.name}/{op_type}_input{i}" if v is not None else ""
            if v is not None:
                scope.values[key] = v
            node.input.append(key)
        imp = find_importer("", op_type)
        if imp is None:
            raise self.unsupported(f"it is imported as {op_type}, which has no importer")
        check_attribute_types(node, self.name, self._conv.opset(""))
        sub = ImportCtx(self._conv, node, self.name, scope, self.builder)
        outs = list(imp.fn(sub))
        self.created.update(sub.created)
        return outs

    def inline(self, attr: str) -> list[Value]:
        """Convert a graph attribute that takes no inputs (an If branch) into this node's graph:
        its nodes join the graph being built, and its outputs come back as this node's values."""
        g = self.attrs.get(attr)
        if not isinstance(g, onnx.GraphProto):
            raise ModelError(f"node {self.name!r} ({self.op_type}) needs a graph attribute {attr!r}")
        first = len(self.builder.graph.nodes)
        outs = self._conv.inline_graph(g, self.scope, self.builder, f"{self.name}/{attr}/")
        self.created.update(o for n in self.builder.graph.nodes[first:] for o in n.outputs)
        return outs

    @property
    def symbols(self) -> Mapping[str, SymbolInfo]:
        """The model's symbols and their constraints (those given up front included)."""
        return self._conv.symbols

    def fail(self, message: str) -> ModelError:
        return ModelError(f"node {self.name!r} ({self.op_type}): {message}")

    def unsupported(self, detail: str) -> UnsupportedOpError:
        dom = self.node.domain
        return UnsupportedOpError([UnsupportedUse(self.op_type, dom, self.opset, (self.name,), detail)])


# The largest result (in elements) folded at import: enough for shape arithmetic and
# small tables, without copying weights into the graph a second time.  Folding is what lets
# shape computations written as ops (Shape -> Slice -> Concat -> Reshape, as in ONNX function
# expansions) give later nodes constant shape operands, and so static output shapes.
_FOLD_LIMIT = 1 << 16


_log = logging.getLogger(__name__)


def _log_mapping(node: onnx.NodeProto, ctx: ImportCtx, made: Sequence[Node]) -> None:
    """DEBUG: which Cuvil ops one ONNX node became (constants: folded at import, or made by the importer)."""
    ops = [n.op for n in made]
    dom = node.domain or "ai.onnx"
    if not made:
        what = "no node (it forwards an existing value)"
    elif all(op == "constant" for op in ops):
        what = "constant (computed at import)"
    else:
        what = ", ".join(ops)
    _log.debug("onnx %s::%s %r (opset %d) -> %s", dom, node.op_type, ctx.name, ctx.opset, what)


def node_name(node: onnx.NodeProto, index: int, prefix: str) -> str:
    """The node's own name, or a stable one made from its position."""
    return node.name or f"{prefix}{node.op_type}_{index}"


class _Converter:
    def __init__(self, proto: onnx.ModelProto) -> None:
        self.proto = proto
        self.opsets: dict[str, int] = {}
        for o in proto.opset_import:
            self.opsets["" if o.domain in ONNX_DOMAINS else o.domain] = int(o.version)
        if not proto.opset_import:  # IR version < 3: opset 1 implied
            self.opsets[""] = 1
        self.symbols: dict[str, SymbolInfo] = {}
        self._root_graph: Graph | None = None
        self.used_symbols: set[str] = set()
        # names the model's dim_params use: a fresh symbol for an unknown dim avoids them
        self.taken_names = dim_params(proto.graph)
        self.conditional: list[UnsupportedUse] = []  # unsupported ops inside If branches (check_supported)

    def opset(self, domain: str) -> int:
        return self.opsets.get("" if domain in ONNX_DOMAINS else domain, 1)

    # scanning ------------------------------------------------------------
    def check_supported(self) -> None:
        """Refuse the model when an op has no importer, naming every such op at once.

        An op inside an If branch only counts when the branch is converted: import may decide the
        condition and drop the branch (ops_control.py).  When the model has no other unsupported
        op, those are kept in ``conditional`` and reported, all of them, by the first one met."""
        found: dict[tuple[str, str], list[str]] = {}
        branch: set[tuple[str, str]] = set()  # keys met only inside If branches

        def scan(g: onnx.GraphProto, prefix: str, in_branch: bool) -> None:
            for i, n in enumerate(g.node):
                name = node_name(n, i, prefix)
                imp = find_importer(n.domain, n.op_type)
                if imp is None or self.opset(n.domain) < imp.since:
                    key = ("" if n.domain in ONNX_DOMAINS else n.domain, n.op_type)
                    if key not in found and in_branch:
                        branch.add(key)
                    elif not in_branch:
                        branch.discard(key)
                    found.setdefault(key, []).append(name)
                for a in n.attribute:
                    inner = in_branch or (n.op_type == "If" and n.domain in ONNX_DOMAINS)
                    if a.type == onnx.AttributeProto.GRAPH:
                        scan(a.g, f"{name}/{a.name}/", inner)
                    elif a.type == onnx.AttributeProto.GRAPHS:
                        for sg in a.graphs:
                            scan(sg, f"{name}/{a.name}/", inner)

        scan(self.proto.graph, "", False)
        if found:
            uses = [UnsupportedUse(t, d, self.opset(d), tuple(names)) for (d, t), names in sorted(found.items())]
            if set(found) != branch:
                raise UnsupportedOpError(uses)
            self.conditional = uses

    # conversion ------------------------------------------------------------
    def value_type(self, vi: onnx.ValueInfoProto, what: str) -> TensorType:
        """The type of a declared input (cuvil/frontends/onnx/dims.py says how each dim reads)."""
        tp = vi.type
        if tp.WhichOneof("value") != "tensor_type":
            kind = tp.WhichOneof("value") or "no type"
            raise UnsupportedOpError([UnsupportedUse(f"{kind} value", "", None, (vi.name,), "only tensors are supported")])
        tt = tp.tensor_type
        dtype = dtype_of(tt.elem_type, f"{what} {vi.name!r}")
        declared = declared_shape(vi)
        if declared is None:
            raise ModelError(f"{what} {vi.name!r} has no shape (its rank must be known)")
        dims = [sym(self._fresh_name(f"{vi.name}_dim{axis}")) if d is None else d for axis, d in enumerate(declared)]
        return TensorType(dtype, tuple(dims))

    def _fresh_name(self, hint: str) -> str:
        """``hint``, or ``hint_<k>`` where a dim_param of the model already uses that name."""
        name, k = hint, 0
        while name in self.taken_names:
            k += 1
            name = f"{hint}_{k}"
        return name

    def input_types(self, g: onnx.GraphProto) -> dict[str, TensorType]:
        """The model's input types: each expression dim over symbols no input dim binds is instead the
        one symbol its text names (rule 4 of dims.py), so every input size can be bound at run time."""
        inits = {t.name for t in g.initializer}
        vis = [vi for vi in g.input if vi.name not in inits]
        types = {vi.name: self.value_type(vi, "input") for vi in vis}
        bound = bindable(t.shape for t in types.values())
        for vi in vis:
            t = types[vi.name]
            if all(free_symbols(d) <= bound for d in t.shape):
                continue
            texts = dim_texts(vi)
            types[vi.name] = t.with_shape([d if free_symbols(d) <= bound else sym(texts[axis])
                                           for axis, d in enumerate(t.shape)])
        return types

    def use_symbols(self, t: TensorType) -> TensorType:
        """Declare the symbols of a type read from the file (a symbol given constraints up front keeps them)."""
        for name in sorted(t.symbols()):
            self._symbol(name)
        return t

    def _symbol(self, name: str) -> Dim:
        self.symbols.setdefault(name, SymbolInfo(name))
        self.used_symbols.add(name)
        return sym(name)

    def convert_graph(
        self,
        g: onnx.GraphProto,
        parent: Scope | None,
        *,
        input_types: Sequence[TensorType] | None = None,
        name: str = "main",
        prefix: str = "",
    ) -> Graph:
        graph = Graph(name=name if parent is not None else (g.name or "main"))
        graph.symbols = self.symbols  # one table, shared while importing
        root = self._root_graph if parent is not None and self._root_graph is not None else graph
        builder = Builder(graph, symbols_from=root)
        if parent is None:
            self._root_graph = graph
        scope = Scope(parent=parent)
        inits = {t.name for t in g.initializer}
        for t in g.initializer:
            arr = tensor_to_array(t, t.name)
            scope.values[t.name] = builder.add1("constant", [], {"value": arr}, names=[t.name], node_name=t.name)
        k = 0
        top_types = self.input_types(g) if parent is None else {}
        for vi in g.input:
            if vi.name in inits and parent is None:
                continue  # an initializer listed as an input keeps its stored value
            if input_types is not None and k < len(input_types):
                t = input_types[k]
            else:
                t = self.use_symbols(top_types[vi.name] if parent is None else self.value_type(vi, "input"))
            k += 1
            scope.values[vi.name] = builder.input(vi.name, t)
        known = {s for t in top_types.values() for s in t.symbols()}  # the symbols the model's inputs bind
        self.convert_nodes(g, scope, builder, prefix)
        for vi in g.output:
            v = scope.lookup(vi.name)
            if v is None:
                raise ModelError(f"graph output {vi.name!r} is not defined by any node, input or initializer")
            if v in graph.outputs or (parent is not None and scope.values.get(vi.name) is not v) or v in graph.inputs:
                v = builder.add1("identity", [v], names=[vi.name], node_name=vi.name)
            graph.outputs.append(v)
            _check_output_dtype(vi, v)
            if parent is not None:
                check_region_output(vi, v, prefix)
            else:
                check_model_output(vi, v, known)
        return graph

    def convert_nodes(self, g: onnx.GraphProto, scope: Scope, builder: Builder, prefix: str) -> None:
        """Convert the nodes of ``g`` in order, each ONNX output name bound in ``scope``."""
        graph = builder.graph
        named: set[Value] = set()
        for i, node in enumerate(g.node):
            ctx = ImportCtx(self, node, node_name(node, i, prefix), scope, builder)
            imp = find_importer(node.domain, node.op_type)
            if imp is None or ctx.opset < imp.since:  # inside an If branch import kept (check_supported)
                raise UnsupportedOpError(self.conditional)
            check_attribute_types(node, ctx.name, ctx.opset)
            first = len(graph.nodes)
            try:
                outs = list(imp.fn(ctx))
            except CuvilError:
                raise
            except (ValueError, TypeError, IndexError, KeyError) as exc:
                raise ModelError(f"node {ctx.name!r} ({node.op_type}): {exc}") from None
            if _log.isEnabledFor(logging.DEBUG):
                _log_mapping(node, ctx, graph.nodes[first:])
            for i, oname in enumerate(node.output):
                if not oname:
                    continue
                v = outs[i] if i < len(outs) else None
                if v is None:
                    raise ModelError(f"node {ctx.name!r} ({node.op_type}) cannot produce output {i} ({oname!r})")
                if v in ctx.created and v not in named:
                    named.add(v)
                    v.name = oname
                    scope.values[oname] = v
                else:  # an importer that returns an existing value (Identity-like)
                    scope.values[oname] = builder.add1("identity", [v], names=[oname], node_name=ctx.name)

    def inline_graph(self, g: onnx.GraphProto, parent: Scope, builder: Builder, prefix: str) -> list[Value]:
        """Convert a graph that takes no inputs (an If branch) into the graph ``builder`` builds, not as a
        region: its nodes join that graph, and its outputs are returned."""
        if g.input:
            raise ModelError(f"region {prefix.rstrip('/')!r} takes {len(g.input)} inputs; an If branch takes none")
        scope = Scope(parent=parent)
        for t in g.initializer:
            arr = tensor_to_array(t, t.name)
            scope.values[t.name] = builder.add1("constant", [], {"value": arr}, names=[t.name], node_name=t.name)
        self.convert_nodes(g, scope, builder, prefix)
        outs: list[Value] = []
        for vi in g.output:
            v = scope.lookup(vi.name)
            if v is None:
                raise ModelError(f"region {prefix.rstrip('/')!r}: output {vi.name!r} is not defined by any node")
            _check_output_dtype(vi, v)
            check_region_output(vi, v, prefix)
            outs.append(v)
        return outs


def _check_output_dtype(vi: onnx.ValueInfoProto, v: Value) -> None:
    elem = vi.type.tensor_type.elem_type if vi.type.WhichOneof("value") == "tensor_type" else 0
    declared = known_dtype(elem) if elem else None
    if declared is not None and declared is not v.type.dtype:
        raise ModelError(f"graph output {vi.name!r} is declared {declared} but computes {v.type.dtype}")


def convert_model(proto: onnx.ModelProto, symbols: Mapping[str, SymbolInfo] | None = None) -> Graph:
    conv = _Converter(proto)
    conv.symbols.update(symbols or {})
    conv.check_supported()
    graph = conv.convert_graph(proto.graph, None)
    graph.symbols = {k: v for k, v in conv.symbols.items() if k in conv.used_symbols}
    graph.share_symbols()
    return graph
