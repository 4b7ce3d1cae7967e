"""The reference interpreter: runs a graph with NumPy. It defines Cuvil's semantics.

Each node runs its op's ``reference`` implementation from the registry.
Control-flow ops receive a callback that runs a region with the values of
the enclosing graphs in scope.  Two optional hooks watch a run: ``on_node``
after every node (nested ones included), and ``on_region`` every time a
control-flow node runs one of its regions (which ``if`` branch, each ``loop``
iteration).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, MutableMapping, Sequence

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.graph import Graph, Node, Value
from cuvil.limits import RunLimitError
from cuvil.ops.registry import RefCtx, get

Env = MutableMapping[Value, np.ndarray]
NodeHook = Callable[[Node, list[np.ndarray]], None]
#: ``on_region(node, region, region_inputs)``: ``node`` is about to run ``region`` (one of its graph attributes).
RegionHook = Callable[[Node, Graph, Sequence[np.ndarray | None]], None]


class InterpreterError(CuvilError):
    """A node failed while the reference interpreter ran it."""


def run_graph(
    graph: Graph,
    inputs: Sequence[np.ndarray | None],
    outer: Env | None = None,
    *,
    check_types: bool = True,
    on_node: NodeHook | None = None,
    on_region: RegionHook | None = None,
) -> list[np.ndarray]:
    """Run ``graph`` on ``inputs`` (in graph-input order) and return its outputs."""
    env: Env = ChainMap({}, outer) if outer is not None else {}
    for v, a in zip(graph.inputs, inputs):
        if a is not None:
            env[v] = a
    for node in graph.nodes:
        outs = run_node(node, env, check_types=check_types, on_node=on_node, on_region=on_region)
        for v, a in zip(node.outputs, outs):
            env[v] = a
    return [env[v] for v in graph.outputs]


def run_node(node: Node, env: Env, *, check_types: bool = True, on_node: NodeHook | None = None,
             on_region: RegionHook | None = None) -> list[np.ndarray]:
    opdef = get(node.op)
    if opdef.reference is None:
        raise InterpreterError(f"op {node.op} has no reference implementation")
    args = [env[v] if v is not None else None for v in node.inputs]

    def region(g: Graph, region_inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        if on_region is not None:
            on_region(node, g, region_inputs)
        if check_types:  # the region's code is typed for what it declares: a value that crosses must match
            for v, a in zip(g.inputs, region_inputs):
                if a is not None:
                    _check_crossing(node, g, v, np.asarray(a))
        return run_graph(g, region_inputs, env, check_types=check_types, on_node=on_node, on_region=on_region)

    # the attributes as inference sees them: a node made by a pass may leave defaults out
    ctx = RefCtx(node.op, args, opdef.fill_attrs(node.attrs), [v.type for v in node.outputs], region)
    try:
        outs = [np.asarray(o) for o in opdef.reference(ctx)]
    except RunLimitError as exc:  # named by the innermost node that passed the limit
        if getattr(exc, "node", None) is None:
            named = RunLimitError(f"node {node.name!r} ({node.op}): {exc}")
            named.node = node.name  # type: ignore[attr-defined]
            raise named from None
        raise
    except CuvilError:
        raise
    except Exception as exc:  # a NumPy failure names the node that caused it
        raise InterpreterError(f"node {node.name!r} ({node.op}) failed: {type(exc).__name__}: {exc}") from exc
    if len(outs) < len(node.outputs):
        raise InterpreterError(f"node {node.name!r} ({node.op}) returned {len(outs)} outputs, expected {len(node.outputs)}")
    outs = outs[: len(node.outputs)]
    if check_types:
        for v, a in zip(node.outputs, outs):
            _check(node, v, a)
    if on_node is not None:
        on_node(node, outs)
    return outs


def _check_crossing(node: Node, g: Graph, v: Value, a: np.ndarray) -> None:
    shape = v.type.shape
    if a.dtype != v.type.dtype.np or len(shape) != a.ndim or any(
            isinstance(d, int) and d != s for d, s in zip(shape, a.shape)):
        raise InterpreterError(
            f"node {node.name!r} ({node.op}): region {g.name!r} input {v.name!r} is given {a.dtype}{list(a.shape)}, "
            f"its type says {v.type}"
        )


def _check(node: Node, v: Value, a: np.ndarray) -> None:
    if a.dtype != v.type.dtype.np:
        raise InterpreterError(
            f"node {node.name!r} ({node.op}) output {v.name!r}: produced {a.dtype}, its type says {v.type.dtype}"
        )
    shape = v.type.shape
    if len(shape) != a.ndim or any(isinstance(d, int) and d != s for d, s in zip(shape, a.shape)):
        raise InterpreterError(
            f"node {node.name!r} ({node.op}) output {v.name!r}: produced shape {list(a.shape)}, its type says {v.type}"
        )
