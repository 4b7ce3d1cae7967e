"""Random valid graphs from the op registry, run on every target and compared (differential testing in the
spirit of NNSmith).

Each ``OpDef`` declares its inputs, attributes and inference, so a graph is grown one node at a time: an op
is drawn from the registry (ops with a reference, no regions, no randomness, no low-bit storage types, and
default values for every attribute), its operands from the values built so far or fresh seeded constants
shaped after them, and the op's own inference accepts or rejects the draw.  Graphs hold 2 to 30 nodes over
float32 inputs with a symbolic batch dim, and ops that change the element type (comparisons, arg-max,
casts) mix dtypes in.  An ``if`` region now and then picks between two unary ops of a value on a condition
computed from the data (its sum's sign), so both branches run across seeds.  Not generated yet: loops,
attributes other than the defaults.

A graph's outputs on a C target are compared with the reference interpreter's under the project's comparison
policy (``cuvil.metrics``): shapes and dtypes equal, integer and bool outputs exactly, float outputs within a
relative L2 of ``FLOAT_BOUND``; values the reference computes as NaN or inf must be the same there.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import cuvil
from cuvil.errors import CuvilError, InputError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Value
from cuvil.ir.symbolic import sym
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.metrics import compare
from cuvil.ops.registry import REQUIRED, all_ops
from cuvil.passes import default_pipeline

EXCLUDED_TRAITS = frozenset({"control_flow", "nondeterministic", "storage_types"})
# ops whose operands are integer codes or indices that random floats cannot stand for, or whose output size
# depends on the data
EXCLUDED_OPS = frozenset({"constant", "constant_of_shape", "eye_like", "range", "non_zero", "one_hot",
                          "gather", "gather_elements", "gather_nd", "scatter_elements", "scatter_nd",
                          "dynamic_quantize_linear", "matmul_integer", "conv_integer", "qlinear_matmul",
                          "qlinear_conv", "qlinear_add", "qlinear_matmul_float", "expand", "tile", "slice",
                          "pad", "resize", "split", "top_k", "attention", "trilu"})
FLOAT_BOUND = 1e-3


def candidate_ops() -> list[str]:
    return sorted(n for n, d in all_ops().items()
                  if d.reference is not None and not (d.traits & EXCLUDED_TRAITS) and n not in EXCLUDED_OPS
                  and all(s.default is not REQUIRED for s in d.attrs.values()))


@dataclass
class Generated:
    graph: Graph
    seed: int


def _constant_like(b: Builder, v: Value, rng: random.Random) -> Value:
    """A seeded constant broadcastable against ``v``: its trailing dim, or a full static copy of its shape."""
    shape = [d if isinstance(d, int) else 1 for d in v.type.shape]
    if shape and rng.random() < 0.5:
        shape = shape[-1:]
    data = np.random.default_rng(rng.randrange(2**32)).uniform(0.5, 1.5, shape).astype(v.type.dtype.np)
    return b.constant(data)


UNARY = ("relu", "neg", "abs", "sigmoid", "tanh", "exp", "softsign", "sin")


def _if_region(b: Builder, v: Value, rng: random.Random) -> Value | None:
    """``if sum(v) > 0 then f(v) else g(v)`` for two unary ops f, g; None when ``v`` is not float32."""
    if v.type.dtype is not DType.f32:
        return None
    before = len(b.graph.nodes)
    try:
        total = b.add1("reduce_sum", [v], {"keepdims": 0})
        cond = b.add1("greater", [total, b.constant(np.zeros((), np.float32))])
        branches = []
        for name in ("then", "else"):
            g = Graph(name=name)
            nb = b.nested(g)
            nb.output(nb.add1(rng.choice(UNARY), [v]))
            branches.append(g)
        return b.add1("if", [cond], {"then_branch": branches[0], "else_branch": branches[1]})
    except CuvilError:
        del b.graph.nodes[before:]
        return None


def generate(seed: int, max_nodes: int = 30) -> Generated:
    """A random valid graph and seeded inputs for it."""
    rng = random.Random(seed)
    b = Builder()
    b.graph.symbols["n"] = SymbolInfo("n", min=1, max=4)
    n = sym("n")
    pool: list[Value] = []
    for i in range(rng.randint(1, 3)):
        dims = [rng.choice([2, 3, 4, 5]) for _ in range(rng.randint(1, 3))]
        pool.append(b.input(f"x{i}", TensorType(DType.f32, (n, *dims))))
    ops = candidate_ops()
    target = rng.randint(2, max_nodes)
    attempts = 0
    while sum(1 for nd in b.graph.nodes if nd.op != "constant") < target and attempts < target * 30:
        attempts += 1
        if rng.random() < 0.08:
            made = _if_region(b, rng.choice(pool[-6:]), rng)
            if made is not None:
                pool.append(made)
            continue
        op = rng.choice(ops)
        d = all_ops()[op]
        lo, hi = d.input_arity()
        count = rng.randint(lo, hi if hi is not None else lo + 2)
        operands: list[Value | None] = []
        for _ in range(count):
            base = rng.choice(pool[-6:])
            operands.append(_constant_like(b, base, rng) if operands and rng.random() < 0.4 else base)
        before = len(b.graph.nodes)
        try:
            outs = b.add(op, operands, {}, num_outputs=max(1, d.output_arity()[0]))
        except (CuvilError, ValueError, TypeError, KeyError, IndexError):
            del b.graph.nodes[before:]  # rejected by the op's own inference: drop its constants too
            continue
        if any(o.type.rank > 5 or 0 in o.type.shape for o in outs):
            del b.graph.nodes[before:]
            continue
        pool.extend(outs)
    computed = [v for nd in b.graph.nodes if nd.op != "constant" for v in nd.outputs]
    b.output(*(computed[-2:] if len(computed) >= 2 else computed or pool[:1]))
    return Generated(b.graph, seed)


def inputs_for(gen: Generated, batch: int) -> list[np.ndarray]:
    data_rng = np.random.default_rng(gen.seed)
    return [data_rng.standard_normal([batch if not isinstance(d, int) else d for d in v.type.shape])
            .astype(np.float32) for v in gen.graph.inputs]


def disagreements(gen: Generated, targets: Sequence[str], cache_dir: Path) -> list[str]:
    """What each target gets wrong against the reference on ``gen`` (empty when all agree)."""
    ref = cuvil.compile(gen.graph, target="ref")
    # the batch extent: the first the graph's own constraints allow (inference may have tied it to a constant)
    for batch in (3, 2, 1):
        args = inputs_for(gen, batch)
        try:
            with np.errstate(all="ignore"):
                want = ref(*args)
            break
        except InputError:
            continue
    else:
        return []
    found = []
    for target in targets:
        try:
            # the arena poisoned, so that a kernel reading memory it never wrote shows
            passes = default_pipeline(target).replace("plan-memory", "plan-memory{poison=true}")
            got = cuvil.compile(gen.graph, target=target, passes=passes, cache_dir=str(cache_dir))(*args)
        except CuvilError as exc:
            found.append(f"{target}: {type(exc).__name__}: {' '.join(str(exc).split())[:400]}")
            continue
        for i, (g, w) in enumerate(zip(got, want)):
            if g.dtype != w.dtype or g.shape != w.shape:
                found.append(f"{target}: output {i} is {g.dtype}{list(g.shape)}, the reference's {w.dtype}{list(w.shape)}")
            elif w.dtype.kind in "iub":
                if not np.array_equal(g, w):
                    found.append(f"{target}: output {i}: {int(np.sum(g != w))} of {w.size} values differ")
            else:
                c = compare(g, w)
                if c.problem is not None or c.rel_l2 > FLOAT_BOUND:
                    found.append(f"{target}: output {i}: {c.problem or f'relative L2 {c.rel_l2:.3g}'}")
    return found
