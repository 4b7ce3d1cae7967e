"""The ``coverage`` check: every source op, the Cuvil op(s) it maps to, and the kernel each target uses.

Source nodes come from the model itself: the ONNX graph (regions included,
named as the importer names them), or, for a PyTorch module, the torch front
end's op-mapping table (one record per FX node: ATen target, FX node name), kept
on the verification context's one conversion of the module (the import every
check shares).  Cuvil nodes keep their source node's name, so
the imported graph says which Cuvil ops each source node became.  For each target the graph
goes through that target's default pass pipeline, as ``cuvil.compile`` runs
it, and each Cuvil node is looked up in the target's kernel table (the C
backend's for the C targets and wasm32, the ops' NumPy references for
``ref``); a node a pass fused into another is served by that node's kernel.

A model that does not import because of unsupported ops gives a failing
result listing each op and the nodes that use it; a target without a kernel
for some op fails with those nodes.  Nothing falls back silently.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from cuvil.errors import CuvilError, UnsupportedOpError
from cuvil.ir.graph import Graph, Node
from cuvil.verify.base import Check, CheckResult, Status, register_check

if TYPE_CHECKING:
    from cuvil.options import CompileOptions

CONTROL_FLOW = ("if", "loop")
SOURCE_KINDS = {"onnx": "the ONNX graph's nodes", "torch": "the torch front end's op-mapping table (FX nodes)",
                "graph": "the Cuvil graph's own node names"}


def onnx_source_nodes(model: Any) -> list[dict[str, str]]:
    """(name, op) of every ONNX node, regions included, named as the ONNX importer names them."""
    import onnx

    from cuvil.frontends.onnx import read_model
    from cuvil.frontends.onnx.importer import node_name

    proto, _ = read_model(model)
    rows: list[dict[str, str]] = []

    def scan(g: onnx.GraphProto, prefix: str) -> None:
        for i, n in enumerate(g.node):
            name = node_name(n, i, prefix)
            dom = "" if n.domain in ("", "ai.onnx") else n.domain
            rows.append({"name": name, "op": f"{dom}::{n.op_type}" if dom else n.op_type})
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    scan(a.g, f"{name}/{a.name}/")
                for sg in a.graphs:
                    scan(sg, f"{name}/{a.name}/")

    scan(proto.graph, "")
    return rows


def torch_source_nodes(mappings: Sequence[Any]) -> list[dict[str, str]]:
    """(name, ATen target) of every converted FX node, from the torch front end's op-mapping table
    (``cuvil.frontends.torch.OpMapping`` records of the context's one conversion)."""
    return [{"name": m.node, "op": m.aten} for m in mappings]


def graph_source_nodes(graph: Graph) -> list[dict[str, str]]:
    """A Cuvil graph is its own source: each node name, with the op of its first node."""
    rows: dict[str, dict[str, str]] = {}
    for n in graph.walk():
        if n.op != "constant":
            rows.setdefault(n.name, {"name": n.name, "op": n.op})
    return list(rows.values())


def _walk(graph: Graph, owner: Node | None = None) -> Iterator[tuple[Node, Node | None]]:
    """Every node with the fused node whose kernel runs it (None: its own kernel)."""
    from cuvil.ops.fused import FUSED_OPS

    for n in graph.nodes:
        yield n, owner
        for _, region in n.regions():
            yield from _walk(region, owner if owner is not None else (n if n.op in FUSED_OPS else None))


def kernel_name(target: str, op: str) -> str | None:
    """The implementation ``target`` runs ``op`` with, or None when it has none."""
    from cuvil.backends.registry import find_backend

    backend = find_backend(target)
    interpreted = backend is not None and backend.kernel_ops() is None  # it runs the ops' NumPy references
    if op == "constant":
        return "constant" if interpreted else "weights"
    if interpreted:
        from cuvil.ops.registry import lookup

        opdef = lookup(op)
        if opdef is None:
            return None
        ref = opdef.reference
        if ref is None:
            return "reference interpreter (control flow)" if op in CONTROL_FLOW else None
        return f"{ref.__module__}.{getattr(ref, '__qualname__', ref.__name__)}"
    if op in CONTROL_FLOW:
        return "cuvil.backends.c.control (inline control flow)"
    import cuvil.backends.c.kernels  # noqa: F401  (fills the kernel table)
    from cuvil.backends.c.kernel import find_kernel

    k = find_kernel(op)
    return None if k is None else f"{k.emit.__module__}.{k.emit.__name__}"


def target_graph(graph: Graph, target: str, options: CompileOptions | None = None) -> Graph:
    """The graph after the pass pipeline ``cuvil.compile`` runs for ``target`` with ``options`` (default
    options when None): what it hands the backend."""
    from cuvil.options import CompileOptions
    from cuvil.passes import PassManager
    from cuvil.passes.rewrite import copy_graph
    from cuvil.pipeline import build_pipeline

    pipeline = build_pipeline(target, options if options is not None else CompileOptions())
    manager = PassManager(list(pipeline.passes))
    return manager.run(copy_graph(graph)) if manager.passes else graph


@register_check
class Coverage(Check):
    """Every source op maps to Cuvil ops with a kernel on each target."""

    name = "coverage"
    group = "compatibility"
    description = "source op -> Cuvil op(s) -> kernel per target; unsupported ops fail with their nodes"

    def builds(self, ctx: Any) -> list[tuple[str, dict[str, Any]]]:
        """None but the reference interpreter's (the imported graph): kernels are looked up, not built."""
        return [("ref", {})]

    def run(self, ctx: Any) -> list[CheckResult]:
        try:
            graph = ctx.graph
        except UnsupportedOpError as exc:
            uses: list[dict[str, Any]] = [{"op": f"{u.domain}::{u.op_type}" if u.domain else u.op_type,
                                           "opset": u.opset, "nodes": list(u.nodes), "detail": u.detail}
                                          for u in exc.uses]
            first = exc.uses[0]
            return [CheckResult(self.name, Status.FAIL, f"the model does not import: {exc}",
                                figures={"unsupported_ops": float(len(uses)),
                                         "unsupported_nodes": float(sum(len(u.nodes) for u in exc.uses))},
                                details={"unsupported": uses},
                                where={"op": str(uses[0]["op"]), "node": ", ".join(first.nodes)})]
        kind = ctx.source.kind
        if kind == "onnx":
            sources = onnx_source_nodes(ctx.source.model)
        elif kind == "torch":
            sources = torch_source_nodes(ctx.torch_mappings)
        else:
            sources = graph_source_nodes(graph)
        imported: dict[str, list[Node]] = {}
        for n, _ in _walk(graph):
            imported.setdefault(n.name, []).append(n)
        results = []
        for target in ctx.targets:
            results.append(self._target(ctx, target, graph, sources, imported, SOURCE_KINDS.get(kind, kind)))
        return results

    def _target(self, ctx: Any, target: str, graph: Graph, sources: list[dict[str, str]],
                imported: dict[str, list[Node]], source: str) -> CheckResult:
        try:
            tg = target_graph(graph, target, ctx.compile_options(target))
        except CuvilError as exc:
            return CheckResult(self.name, Status.FAIL, f"the {target} pass pipeline fails: {exc}", target=target,
                               details={"error": f"{type(exc).__name__}: {exc}"}, where={"target": target})
        by_name: dict[str, list[tuple[Node, Node | None]]] = {}
        by_value: dict[str, tuple[Node, Node | None]] = {}
        missing: dict[str, list[str]] = {}
        for n, owner in _walk(tg):
            by_name.setdefault(n.name, []).append((n, owner))
            for o in n.outputs:
                by_value[o.name] = (n, owner)
            if owner is None and kernel_name(target, n.op) is None:
                missing.setdefault(n.op, []).append(n.name)
        rows = []
        for s in sources:
            cuvil_nodes = imported.get(s["name"], [])
            sites = list(by_name.get(s["name"], []))
            if not sites:  # renamed by a pass: follow the values the source node produced
                sites = list(dict.fromkeys(by_value[o.name] for n in cuvil_nodes for o in n.outputs
                                           if o.name in by_value))
            kernels = []
            for n, owner in sites:
                if owner is not None:
                    kernels.append(f"{kernel_name(target, owner.op)} (fused into {owner.op} {owner.name!r})")
                else:
                    kernels.append(kernel_name(target, n.op) or f"NONE: no {target} kernel for {n.op}")
            cuvil_ops = list(dict.fromkeys(n.op for n in cuvil_nodes))
            if not kernels:
                kernels = ["removed by the pass pipeline (folded or eliminated)"] if cuvil_ops else []
            rows.append({"source_node": s["name"], "source_op": s["op"], "cuvil_ops": cuvil_ops,
                         "kernels": list(dict.fromkeys(kernels))})
        unmapped = [r for r in rows if not r["cuvil_ops"]]
        details: dict[str, Any] = {"ops": rows, "missing_kernels": {op: names for op, names in sorted(missing.items())},
                                   "source": source}
        figures = {"source_nodes": float(len(rows)), "missing_kernel_ops": float(len(missing)),
                   "missing_kernel_nodes": float(sum(len(v) for v in missing.values()))}
        if missing:
            op, names = next(iter(sorted(missing.items())))
            listed = "; ".join(f"{o} (nodes {', '.join(map(repr, ns))})" for o, ns in sorted(missing.items()))
            return CheckResult(self.name, Status.FAIL, f"{target} has no kernel for {listed}", target=target,
                               figures=figures, details=details, where={"op": op, "node": ", ".join(names)})
        summary = (f"{len(rows)} source nodes -> {len({o for r in rows for o in r['cuvil_ops']})} Cuvil ops, "
                   f"every one with a {target} kernel")
        if unmapped:
            details["unmapped"] = [r["source_node"] for r in unmapped]
            summary += (f"; {len(unmapped)} source nodes produced no Cuvil node of their name "
                        "(forwarded values or folded at import)")
        return CheckResult(self.name, Status.PASS, summary, target=target, figures=figures, details=details)
