"""Kernels of the fused ops (``cuvil/ops/fused.py``): elementwise chains as one loop, and
Conv/Gemm/MatMul with an elementwise epilogue.

A fused region is a tree of elementwise ops (the fusion passes never put a value read twice
inside one), so it composes into one C expression from the ops' scalar expressions
(:data:`~cuvil.backends.c.kernels.elementwise.SCALAR`): the region's inputs are the loop's
local variables, each intermediate is substituted where it is read.  Every value is f32 or
f64, whose compute type is its storage type, so keeping intermediates in registers rounds
exactly as the unfused kernels storing them do.

The epilogue of ``fused_conv`` / ``fused_gemm`` / ``fused_matmul`` runs right after the base
kernel (the same emitter the unfused op uses), in place over the result: a row loop whose
body reads each extra operand as one element, a full tensor (a residual) or a vector along
the last axis (a bias).  It is a separate pass over the output, not applied to the GEMM tile
while it is in registers.
"""

from __future__ import annotations

from collections.abc import Sequence

from cuvil.backends.c.codegen import CodegenError
from cuvil.backends.c.kernel import CVal, KernelCtx, find_kernel, kernel
from cuvil.backends.c.kernels.common import elementwise
from cuvil.backends.c.kernels.elementwise import MATH_HEADER, SCALAR, Scalar, nan_max, nan_min
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ops.fused import EPILOGUE_BASES, extra_kind
from cuvil.ops.registry import get


def _clip(s: Scalar, node: Node, args: dict[Value, str]) -> str:
    y = args[node.inputs[0]]  # type: ignore[index]
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        y = nan_max(s, y, args[node.inputs[1]])
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        y = nan_min(s, y, args[node.inputs[2]])
    return y


def describe(k: KernelCtx, region: Graph) -> None:
    """One comment per node of ``region``, as the generator writes for every node it emits."""
    for n in region.nodes:
        args = ", ".join("_" if v is None else f"%{v.name}" for v in n.inputs)
        k.w.comment(f"  fused node '{n.name}': {', '.join(f'%{o.name}' for o in n.outputs)} = {n.op}({args})")


def compose(body: Graph, leaves: Sequence[str]) -> str:
    """The C expression of ``body``'s output with its inputs named ``leaves`` (compute-type locals)."""
    names: dict[Value, str] = dict(zip(body.inputs, leaves))
    for n in body.nodes:
        present = [v for v in n.inputs if v is not None]
        s = Scalar(tuple(v.type.dtype for v in present), n.outputs[0].type.dtype, get(n.op).fill_attrs(n.attrs))
        if n.op == "clip":
            expr = _clip(s, n, names)
        elif n.op in SCALAR:
            expr = SCALAR[n.op](s, [names[v] for v in present])
        else:
            raise CodegenError(f"{n.op} in a fused region has no scalar expression")
        names[n.outputs[0]] = f"({expr})"
    return names[body.outputs[0]]


@kernel("fused_elementwise")
def _fused_elementwise(k: KernelCtx) -> None:
    k.include(MATH_HEADER)
    body = k.attrs["body"]
    k.note(f"fused elementwise loop: {', '.join(n.op for n in body.nodes)}")
    describe(k, body)
    elementwise(k, lambda args: compose(body, args))


@kernel(*EPILOGUE_BASES)
def _fused_linear(k: KernelCtx) -> None:
    """The base op's kernel, then the epilogue in place over its result."""
    k.include(MATH_HEADER)
    base = EPILOGUE_BASES[k.node.op]
    n_base = len(get(base).inputs)
    attrs = {key: v for key, v in k.attrs.items() if key != "epilogue"}
    node = Node(base, k.node.inputs[:n_base], [], attrs, k.node.name)
    node.outputs = list(k.node.outputs)  # shared, not re-pointed: the graph's values keep their producer
    sub = KernelCtx(k._fn, node, k.ins[:n_base], k.outs, k.allocated)  # the same function emitter
    emitter = find_kernel(base)
    if emitter is None:
        raise CodegenError(f"{base} has no C kernel")
    emitter.emit(sub)
    epilogue: Graph = k.attrs["epilogue"]
    k.note(f"epilogue after the {base} kernel, one pass over its result: {', '.join(n.op for n in epilogue.nodes)}")
    describe(k, epilogue)
    _apply_epilogue(k, epilogue, k.out(0), [v for v in k.ins[n_base:] if v is not None])


def _apply_epilogue(k: KernelCtx, epilogue: Graph, y: CVal, extras: Sequence[CVal]) -> None:
    """``y = epilogue(y, extras...)`` in place, row by row (rows along ``y``'s last axis)."""
    w = k.w
    with w.block(""):
        last = y.dim(y.rank - 1) if y.rank else "1"
        n_last, rows = k.tmp("nl"), k.tmp("rows")
        w.line(f"const int64_t {n_last} = {last};")
        w.line(f"const int64_t {rows} = {n_last} > 0 ? {y.numel()} / {n_last} : 0;")
        acc, py, j = k.tmp("acc"), k.tmp("py"), k.tmp("j")
        leaves = [acc]
        row_ptrs: list[tuple[str, CVal, str]] = []
        for e in extras:
            kind = extra_kind(y.value.type.shape, e.value.type.shape)
            if kind == "scalar":
                name = k.tmp("s")
                w.line(f"const {e.ctype_compute} {name} = {e.load('0')};")
                leaves.append(name)
            elif kind in ("full", "row"):
                p = k.tmp("pe")
                row_ptrs.append((p, e, kind))
                leaves.append(f"{p}[{j}]")
            else:
                raise CodegenError(f"node {k.node.name!r}: epilogue operand {e.value} does not fit {y.value}")
        r = k.tmp("r")
        with w.block(f"for (int64_t {r} = 0; {r} < {rows}; {r}++)"):
            w.line(f"{y.ctype} *{py} = {y.ptr} + {r} * {n_last};")
            for p, e, kind in row_ptrs:
                offset = f" + {r} * {n_last}" if kind == "full" else ""
                w.line(f"const {e.ctype} *{p} = {e.ptr}{offset};")
            with w.block(f"for (int64_t {j} = 0; {j} < {n_last}; {j}++)"):
                w.line(f"const {y.ctype_compute} {acc} = {py}[{j}];")
                w.line(f"{py}[{j}] = {compose(epilogue, leaves)};")
