"""Structured control flow: ``if`` and ``loop``, each with nested graphs (regions).

Regions read the values of the graphs around them directly.  The reference
interpreter runs them through ``RefCtx.run_region``.

``loop`` follows ONNX ``Loop``: inputs ``(max_trip_count?, cond?, carried*)``;
its body maps ``(iteration, cond, carried...)`` to ``(cond, carried..., scanned...)``.
Outputs are the final carried values, then each scanned value stacked along a
new leading axis.  That axis has the trip count's size when the loop has no
condition and the trip count is a constant, or a size computed from shapes
(``shape(x)[0]``: the recurrent layers' loop over a run-time sequence length).
"""

from __future__ import annotations

import numpy as np

from cuvil.ir.assumptions import bounds
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.symbolic import UNKNOWN, Dim, is_unknown
from cuvil.ir.types import TensorType
from cuvil.limits import RunLimitError
from cuvil.limits import current as current_limits
from cuvil.ops.registry import CONTROL_FLOW, AttrSpec, InferCtx, OpDef, RefCtx, register


def merge_types(a: TensorType, b: TensorType, what: str, ctx: InferCtx,
                sides: tuple[str, str] = ("the first", "the second")) -> TensorType:
    """The type that covers both: equal dims kept, differing dims unknown (extents known at run time).

    Another element type or rank is an error naming both types (``sides`` says whose they are)."""
    differ = "element types" if a.dtype is not b.dtype else "ranks" if a.rank != b.rank else None
    if differ is not None:
        raise ctx.fail(f"{what}: {sides[0]} gives {a}, {sides[1]} gives {b}: the {differ} differ, "
                       "and the result must have one element type and rank whichever runs")
    dims: list[Dim] = [x if x == y else UNKNOWN for x, y in zip(a.shape, b.shape)]
    return TensorType(a.dtype, tuple(dims))


def _scalar_like(ctx: InferCtx, i: int, dtype: DType, what: str) -> None:
    t = ctx.type(i)
    if t.dtype is not dtype:
        raise ctx.fail(f"{what} must be {dtype}, got {t.dtype}")
    if t.rank > 1 or (t.rank == 1 and t.shape[0] != 1 and isinstance(t.shape[0], int)):
        raise ctx.fail(f"{what} must hold a single element, got {t}")


def _if_infer(ctx: InferCtx) -> list[TensorType]:
    _scalar_like(ctx, 0, DType.bool, "if: the condition")
    then_g: Graph = ctx.attrs["then_branch"]
    else_g: Graph = ctx.attrs["else_branch"]
    if len(then_g.outputs) != len(else_g.outputs):
        raise ctx.fail(f"branches return {len(then_g.outputs)} and {len(else_g.outputs)} values")
    return [
        merge_types(a.type, b.type, f"output {i}", ctx, ("then_branch", "else_branch"))
        for i, (a, b) in enumerate(zip(then_g.outputs, else_g.outputs))
    ]


def _if_ref(ctx: RefCtx) -> list[np.ndarray]:
    assert ctx.run_region is not None
    branch = ctx.attrs["then_branch"] if bool(np.asarray(ctx.input(0)).reshape(-1)[0]) else ctx.attrs["else_branch"]
    return [np.asarray(o) for o in ctx.run_region(branch, [])]


register(
    OpDef(
        name="if",
        inputs=("cond",),
        outputs=("outputs*",),
        attrs={"then_branch": AttrSpec("graph"), "else_branch": AttrSpec("graph")},
        infer=_if_infer,
        reference=_if_ref,
        traits=frozenset({CONTROL_FLOW}),
        doc="Runs then_branch when cond is true, else else_branch; returns that branch's outputs.",
    )
)


def _loop_infer(ctx: InferCtx) -> list[TensorType]:
    body: Graph = ctx.attrs["body"]
    n_carried = len(ctx.types) - 2 if len(ctx.types) >= 2 else 0
    if ctx.has(0):
        _scalar_like(ctx, 0, DType.i64, "loop: the trip count")
    if ctx.has(1):
        _scalar_like(ctx, 1, DType.bool, "loop: the condition")
    if len(body.inputs) != 2 + n_carried:
        raise ctx.fail(f"the body takes {len(body.inputs)} inputs, expected {2 + n_carried}")
    if len(body.outputs) < 1 + n_carried:
        raise ctx.fail(f"the body returns {len(body.outputs)} values, expected at least {1 + n_carried}")
    out: list[TensorType] = []
    for k in range(n_carried):
        init = ctx.type(2 + k)
        out.append(merge_types(init, body.outputs[1 + k].type, f"carried value {k}", ctx,
                               ("the initial value", "the body")))
    trips: Dim = UNKNOWN
    m = ctx.const(0)
    if m is not None and not ctx.has(1):
        trips = max(int(np.asarray(m).reshape(-1)[0]), 0)
    elif ctx.has(0) and not ctx.has(1):
        trips = _symbolic_trips(ctx)
    for v in body.outputs[1 + n_carried :]:
        out.append(TensorType(v.type.dtype, (trips, *v.type.shape)))
    return out


def _symbolic_trips(ctx: InferCtx) -> Dim:
    """The iteration count of a loop without a condition whose trip count is a size computed from
    shapes (``shape(x)[0]``): that size, where it cannot be negative; unknown otherwise."""
    sv = ctx.sym_value(0)
    if sv is None or len(sv) != 1 or is_unknown(sv[0]):
        return UNKNOWN
    n = sv[0]
    if isinstance(n, int):
        return max(n, 0)
    return n if bounds(n, ctx.symbols)[0] >= 0 else UNKNOWN


def _loop_ref(ctx: RefCtx) -> list[np.ndarray]:
    assert ctx.run_region is not None
    body: Graph = ctx.attrs["body"]
    max_trips = int(np.asarray(ctx.input(0)).reshape(-1)[0]) if ctx.has(0) else None
    use_cond = ctx.has(1)
    cond = bool(np.asarray(ctx.input(1)).reshape(-1)[0]) if use_cond else True
    carried = [ctx.input(i) for i in range(2, len(ctx.inputs))]
    n_carried = len(carried)
    scans: list[list[np.ndarray]] = [[] for _ in body.outputs[1 + n_carried :]]
    limits = current_limits()
    scanned = [0] * len(scans)  # bytes each scan output holds so far
    i = 0
    while (max_trips is None or i < max_trips) and cond:
        if limits.max_loop_iterations is not None and i >= limits.max_loop_iterations:
            raise RunLimitError(f"runs more than {limits.max_loop_iterations} iterations (max_loop_iterations)")
        outs = ctx.run_region(body, [np.array(i, dtype=np.int64), np.array(cond), *carried])
        if use_cond:
            cond = bool(np.asarray(outs[0]).reshape(-1)[0])
        carried = [np.asarray(o) for o in outs[1 : 1 + n_carried]]
        for k, o in enumerate(outs[1 + n_carried :]):
            scans[k].append(np.asarray(o))
            scanned[k] += scans[k][-1].nbytes
        if limits.max_output_bytes is not None:
            big = max([a.nbytes for a in carried] + scanned, default=0)
            if big > limits.max_output_bytes:
                raise RunLimitError(f"a value it builds holds {big} bytes after {i + 1} iterations, more than "
                                    f"max_output_bytes ({limits.max_output_bytes})")
        i += 1
    results: list[np.ndarray] = list(carried)
    for k, items in enumerate(scans):
        t = ctx.out_types[n_carried + k]
        if items:
            results.append(np.stack(items).astype(t.dtype.np, copy=False))
        else:
            inner = tuple(d if isinstance(d, int) else 0 for d in t.shape[1:])
            results.append(np.zeros((0, *inner), dtype=t.dtype.np))
    return results


register(
    OpDef(
        name="loop",
        inputs=("max_trip_count?", "cond?", "carried*"),
        outputs=("outputs*",),
        attrs={"body": AttrSpec("graph")},
        infer=_loop_infer,
        reference=_loop_ref,
        traits=frozenset({CONTROL_FLOW}),
        doc="ONNX Loop: runs body while the trip count and condition allow; returns carried values, then scans.",
    )
)
