"""Importers of ONNX If, Loop and Scan as structured regions (an If that import decides: its branch, inlined).

A value that crosses into a region takes the type the region declares for it
only where the two agree: a Loop's carried value and its body's declared input
are unified here (a static size the body declares is kept, and the generated
code checks it on every iteration), and refused when they disagree.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import onnx

from cuvil.errors import ModelError
from cuvil.frontends.onnx.conditions import condition_symbols, truth
from cuvil.frontends.onnx.dims import declared_dim
from cuvil.frontends.onnx.importer import ImportCtx, dtype_of, importer
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value
from cuvil.ir.symbolic import UNKNOWN, Dim
from cuvil.ir.types import TensorType

_log = logging.getLogger(__name__)


@importer("If")
def _if(ctx: ImportCtx) -> Sequence[Value | None]:
    """An If whose condition import can decide (cuvil/frontends/onnx/conditions.py) is the branch it
    takes, inlined: the other branch is never converted, so what it would compute (another rank, an
    op that fails for these types) cannot matter.  Otherwise both become regions of an ``if`` node."""
    cond = ctx.input(0)
    if cond is None:
        raise ctx.fail("needs a condition input")
    n = len(ctx.node.output)
    taken = truth(cond, ctx.symbols)
    if taken is not None:
        outs = ctx.inline("then_branch" if taken else "else_branch")
        if len(outs) != n:
            raise ctx.fail(f"has {n} outputs, but the branch it takes returns {len(outs)}")
        _log.debug("onnx If %r: the condition is always %s; the %s branch is inlined", ctx.name, taken,
                   "then" if taken else "else")
        return outs
    then_g = ctx.subgraph("then_branch")
    else_g = ctx.subgraph("else_branch")
    try:
        return ctx.emit("if", [cond], {"then_branch": then_g, "else_branch": else_g}, num_outputs=n)
    except ModelError as exc:
        names = sorted(condition_symbols(cond))
        if not names:
            raise
        hint = (f" (the condition depends on {', '.join(names)}: constraints that decide it, given with dims=, "
                "let the If fold at compile time)")
        raise ModelError(f"{exc}{hint}") from None


def _declared(vi: onnx.ValueInfoProto, what: str) -> tuple[DType | None, tuple[Dim, ...] | None]:
    """What a region declares for one of its inputs: element type and dims (``None``: not declared).

    Symbolic dims come back as symbols for display only; they are not facts about the value."""
    if vi.type.WhichOneof("value") != "tensor_type":
        return None, None
    tt = vi.type.tensor_type
    dtype = dtype_of(tt.elem_type, what) if tt.elem_type else None
    if not tt.HasField("shape"):
        return dtype, None
    # an unknown extent (-1, 0, an empty dim_param: cuvil/frontends/onnx/dims.py) declares nothing
    dims = [UNKNOWN if d is None else d for d in (declared_dim(d) for d in tt.shape.dim)]
    return dtype, tuple(dims)


def _describe(dtype: DType | None, dims: tuple[Dim, ...] | None) -> str:
    if dims is None:
        return f"{dtype or '?'} (shape not declared)"
    if dtype is None:
        return f"?[{', '.join(str(d) for d in dims)}]"
    return str(TensorType(dtype, dims))


def _carried_type(ctx: ImportCtx, k: int, init: Value, vi: onnx.ValueInfoProto | None) -> TensorType:
    """The type the body sees for carried value ``k``: the initial value's, unified with the body's declaration.

    A carried value may change shape between iterations, so a dim is trusted inside the
    body only where the body declares it statically; the C checks that dim on every
    iteration.  A static dim of the initial value that the body contradicts, another rank or
    another element type is refused here."""
    t = init.type
    if vi is None:
        return TensorType(t.dtype, tuple(UNKNOWN for _ in t.shape))
    dtype, dims = _declared(vi, f"body input {vi.name!r}")

    def refuse() -> Exception:
        return ctx.fail(f"carried value {k} ({init.name!r}) is {t}, but the body declares its input "
                        f"{vi.name!r} as {_describe(dtype, dims)}")

    if dtype is not None and dtype is not t.dtype:
        raise refuse()
    if dims is None:
        return TensorType(t.dtype, tuple(UNKNOWN for _ in t.shape))
    if len(dims) != t.rank:
        raise refuse()
    out: list[Dim] = []
    for d, s in zip(dims, t.shape):
        if isinstance(d, int):
            if isinstance(s, int) and s != d:
                raise refuse()
            out.append(d)
        else:
            out.append(UNKNOWN)
    return TensorType(t.dtype, tuple(out))


def _check_counter(ctx: ImportCtx, vi: onnx.ValueInfoProto | None, dtype: DType, what: str) -> None:
    """The body's iteration number and condition inputs are i64 and bool; another declared element type is refused."""
    if vi is None:
        return
    declared, _ = _declared(vi, f"body input {vi.name!r}")
    if declared is not None and declared is not dtype:
        raise ctx.fail(f"the body declares its {what} input {vi.name!r} as {declared}, but Loop passes {dtype}")


@importer("Loop")
def _loop(ctx: ImportCtx) -> Sequence[Value | None]:
    inputs = ctx.inputs()
    while len(inputs) < 2:
        inputs.append(None)
    carried = inputs[2:]
    if any(v is None for v in carried):
        raise ctx.fail("loop-carried inputs cannot be omitted")
    body_proto = ctx.attrs.get("body")
    if not isinstance(body_proto, onnx.GraphProto):
        raise ctx.fail("needs a graph attribute 'body'")
    declared = list(body_proto.input)
    _check_counter(ctx, declared[0] if declared else None, DType.i64, "iteration number")
    _check_counter(ctx, declared[1] if len(declared) > 1 else None, DType.bool, "condition")
    types = [TensorType(DType.i64, ()), TensorType(DType.bool, ())]
    for k, v in enumerate(carried):
        assert v is not None
        types.append(_carried_type(ctx, k, v, declared[2 + k] if 2 + k < len(declared) else None))
    body = ctx.subgraph("body", types)
    n = len(ctx.node.output)
    return ctx.emit("loop", inputs, {"body": body}, num_outputs=n)


# Scan --------------------------------------------------------------------------------------------
#
# A Scan is a Loop over the scanned axis: the Loop's body (written here as an ONNX graph) takes
# slice ``i`` of every scan input (``length - 1 - i`` when reversed) with a Gather of the outer
# value, then runs the Scan body.  The Loop stacks the scan outputs along a new leading axis in
# iteration order; a reversed one is flipped and a scan output axis other than 0 transposed in.
# Scan-8's batch axis (states [batch, ...], scan inputs [batch, sequence, ...]) runs one such loop
# per batch entry (a static batch) and stacks the results.


def _axes_attr(ctx: ImportCtx, name: str, n: int, what: str) -> list[int]:
    values = [int(v) for v in ctx.attr(name, [0] * n)]
    if len(values) != n:
        raise ctx.fail(f"{name} has {len(values)} values for {n} {what}")
    return values


def _scan_loop(ctx: ImportCtx, body: onnx.GraphProto, states: Sequence[Value], scans: Sequence[Value],
               in_axes: Sequence[int], in_dirs: Sequence[int], out_axes: Sequence[int], out_dirs: Sequence[int],
               tag: str) -> list[Value]:
    n_state, n_scan = len(states), len(scans)
    n_out = len(body.output) - n_state
    if len(body.input) != n_state + n_scan or n_out < 0:
        raise ctx.fail(f"the body takes {len(body.input)} inputs and returns {len(body.output)} values, for "
                       f"{n_state} states and {n_scan} scan inputs")
    if len(out_axes) != n_out or len(out_dirs) != n_out:
        raise ctx.fail(f"scan_output_axes / scan_output_directions need {n_out} values (the body's scan outputs)")
    axes: list[int] = []
    for k, (v, a) in enumerate(zip(scans, in_axes)):
        if not -v.type.rank <= a < v.type.rank:
            raise ctx.fail(f"scan input {k} ({v.type}) has no axis {a}")
        axes.append(a % v.type.rank)
    for d in (*in_dirs, *out_dirs):
        if d not in (0, 1):
            raise ctx.fail(f"scan directions must be 0 (forward) or 1 (reverse), got {d}")
    sizes = [v.type.shape[a] for v, a in zip(scans, axes)]
    static = {d for d in sizes if isinstance(d, int)}
    if len(static) > 1:
        raise ctx.fail(f"the scan inputs' scanned axes differ in length: {sizes}")
    i64 = onnx.TensorProto.INT64
    if isinstance(sizes[0], int):
        length = ctx.constant(np.int64(sizes[0]))
    else:
        shape = ctx.emit1("shape", [scans[0]], {"start": axes[0], "end": axes[0] + 1})
        length = ctx.emit1("squeeze", [shape, ctx.constant(np.array([0], np.int64))])
    names = {"last": f"{tag}last"}
    ctx.bind(names["last"], ctx.emit1("sub", [length, ctx.constant(np.int64(1))]))
    helper = onnx.helper
    it, cond_in, cond_out = f"{tag}i", f"{tag}cond_in", f"{tag}cond_out"
    nodes: list[onnx.NodeProto] = []
    for k, v in enumerate(scans):
        outer = f"{tag}scan{k}"
        ctx.bind(outer, v)
        at = it
        if in_dirs[k]:
            at = f"{tag}at{k}"
            nodes.append(helper.make_node("Sub", [names["last"], it], [at], name=f"{tag}reverse{k}"))
        nodes.append(helper.make_node("Gather", [outer, at], [body.input[n_state + k].name], axis=axes[k],
                                      name=f"{tag}slice{k}"))
    nodes += list(body.node)
    nodes.append(helper.make_node("Identity", [cond_in], [cond_out], name=f"{tag}cond"))
    loop_body = helper.make_graph(
        nodes, f"{tag}body",
        [helper.make_tensor_value_info(it, i64, []), helper.make_tensor_value_info(cond_in, onnx.TensorProto.BOOL, []),
         *body.input[:n_state]],
        [helper.make_tensor_value_info(cond_out, onnx.TensorProto.BOOL, []), *body.output],
        initializer=list(body.initializer), value_info=list(body.value_info))
    types = [TensorType(DType.i64, ()), TensorType(DType.bool, ())]
    types += [_carried_type(ctx, k, v, body.input[k]) for k, v in enumerate(states)]
    region = ctx.region(loop_body, "body", types)
    outs = ctx.emit("loop", [length, None, *states], {"body": region}, num_outputs=n_state + n_out)
    results = outs[:n_state]
    for j, y in enumerate(outs[n_state:]):
        if out_dirs[j]:
            y = ctx.emit1("slice", [y, ctx.constant(np.array([-1], np.int64)),
                                    ctx.constant(np.array([np.iinfo(np.int64).min], np.int64)),
                                    ctx.constant(np.array([0], np.int64)), ctx.constant(np.array([-1], np.int64))])
        r = y.type.rank
        if not -r <= out_axes[j] < r:
            raise ctx.fail(f"scan output {j} ({y.type}) has no axis {out_axes[j]}")
        a = out_axes[j] % r
        if a:
            perm = [*range(1, a + 1), 0, *range(a + 1, r)]
            y = ctx.emit1("transpose", [y], {"perm": perm})
        results.append(y)
    return results


@importer("Scan", since=8)
def _scan(ctx: ImportCtx) -> Sequence[Value | None]:
    body = ctx.attrs.get("body")
    if not isinstance(body, onnx.GraphProto):
        raise ctx.fail("needs a graph attribute 'body'")
    n_scan = int(ctx.attr("num_scan_inputs", 0))
    if ctx.opset < 9:
        extra = sorted(set(ctx.attrs) - {"body", "num_scan_inputs", "directions"})
    else:
        extra = sorted(set(ctx.attrs) - {"body", "num_scan_inputs", "scan_input_axes", "scan_input_directions",
                                         "scan_output_axes", "scan_output_directions"})
    if extra:
        raise ctx.unsupported(f"attribute(s) {', '.join(extra)} are not part of Scan-{ctx.opset}")
    values = ctx.inputs()[1:] if ctx.opset < 9 else ctx.inputs()
    if any(v is None for v in values):
        raise ctx.fail("states and scan inputs cannot be omitted")
    vals = [v for v in values if v is not None]
    if not 1 <= n_scan <= len(vals):
        raise ctx.fail(f"num_scan_inputs is {n_scan}, with {len(vals)} states and scan inputs")
    states, scans = vals[: len(vals) - n_scan], vals[len(vals) - n_scan :]
    n_out = len(body.output) - len(states)
    if ctx.opset >= 9:
        return _scan_loop(ctx, body, states, scans, _axes_attr(ctx, "scan_input_axes", n_scan, "scan inputs"),
                          _axes_attr(ctx, "scan_input_directions", n_scan, "scan inputs"),
                          _axes_attr(ctx, "scan_output_axes", n_out, "scan outputs"),
                          _axes_attr(ctx, "scan_output_directions", n_out, "scan outputs"), f"{ctx.name}/scan/")
    return _scan8(ctx, body, states, scans, n_out)


def _scan8(ctx: ImportCtx, body: onnx.GraphProto, states: Sequence[Value], scans: Sequence[Value],
           n_out: int) -> list[Value]:
    """Scan-8: every state and scan input has a leading batch axis; one loop per batch entry."""
    lens = ctx.input(0)
    if lens is not None:
        raise ctx.unsupported("sequence_lens (per-batch sequence lengths); Scan-8 without it is supported")
    dirs = _axes_attr(ctx, "directions", len(scans), "scan inputs")
    batch = scans[0].type.shape[0]
    if not isinstance(batch, int) or any(v.type.rank < 1 or v.type.shape[0] != batch for v in (*states, *scans)):
        raise ctx.unsupported("a batch axis that is not the same static size on every state and scan input")

    def entry(v: Value, b: int) -> Value:
        return ctx.emit1("gather", [v, ctx.constant(np.int64(b))], {"axis": 0})

    per_batch = [_scan_loop(ctx, body, [entry(v, b) for v in states], [entry(v, b) for v in scans],
                            [0] * len(scans), dirs, [0] * n_out, [0] * n_out, f"{ctx.name}/scan{b}/")
                 for b in range(batch)]
    axis0 = ctx.constant(np.array([0], np.int64))
    return [ctx.emit1("concat", [ctx.emit1("unsqueeze", [outs[j], axis0]) for outs in per_batch], {"axis": 0})
            for j in range(len(states) + n_out)]
