"""Fused ops: what the fusion passes (``cuvil/passes/fuse_*.py``) build.

A fused op carries the computation it replaces as a region (a nested graph
attribute), so its reference implementation runs exactly that computation
and the reference interpreter defines its semantics:

* ``fused_elementwise(inputs...) {body}``: ``body`` is a closed graph of
  elementwise ops from the node's inputs (one region input per node input,
  same types) to one output; the C kernel composes the ops' scalar
  expressions into one loop.
* ``fused_conv(X, W, B?, extras...)``, ``fused_gemm(A, B, C?, extras...)``,
  ``fused_matmul(A, B, extras...)``: the base op with its attributes, then
  ``epilogue`` applied to its result: a closed graph of elementwise ops whose
  inputs are the base op's result followed by the extras, and whose one
  output has the base result's type (the C kernel applies it in place).

Rules every fused region keeps (checked by inference, so by the verifier):

1. Every region node is an elementwise op (:data:`~cuvil.ops.registry.ELEMENTWISE`)
   with no regions of its own; the region reads only its own inputs.
2. Every value in the region has a float element type (:data:`FUSABLE_DTYPES`).
   Each region node means what it means outside a region: its result is rounded
   to its element type.  For f32 and f64 the compute type is the storage type,
   so an intermediate kept in a register is already rounded; an f16 or bf16
   intermediate is computed in float32 and rounded to its type before it is
   read, so the fused form gives exactly what the unfused ops give.
3. An epilogue extra is, against the result's shape, one element (``scalar``),
   the same shape (``full``: a residual), or a vector along the last axis
   (``row``: a bias of a matmul); see :func:`extra_kind`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from cuvil.ir.dtypes import FLOATS
from cuvil.ir.graph import Graph, Value
from cuvil.ir.symbolic import Dim, is_unknown
from cuvil.ir.types import TensorType
from cuvil.ops import conv as _conv  # noqa: F401  (the bases are registered before their fused forms)
from cuvil.ops import layout as _layout  # noqa: F401
from cuvil.ops import linalg as _linalg  # noqa: F401
from cuvil.ops.common import infer_all
from cuvil.ops.registry import ELEMENTWISE, AttrSpec, InferCtx, OpDef, RefCtx, get, lookup, register

FUSABLE_DTYPES = FLOATS

EPILOGUE_BASES = {"fused_conv": "conv", "fused_conv_nhwc": "conv_nhwc", "fused_gemm": "gemm",
                  "fused_matmul": "matmul"}
"""Each epilogue-carrying op and the op it extends."""

FUSED_OPS = frozenset({"fused_elementwise", *EPILOGUE_BASES})


def extra_kind(out: Sequence[Dim], operand: Sequence[Dim]) -> str | None:
    """How an epilogue operand of shape ``operand`` is read against a result of shape ``out``.

    ``"scalar"``: one element; ``"full"``: provably the result's shape; ``"row"``: ones
    but for a last dim provably equal to the result's (a bias of ``[N]`` or ``[1, N]``);
    None when it is none of these (such an operand is not fused)."""
    if all(d == 1 for d in operand):
        return "scalar"
    if len(operand) > len(out) or any(is_unknown(d) for d in operand):
        return None
    if tuple(operand) == tuple(out):
        return "full"
    if out and operand[-1] == out[-1] and all(d == 1 for d in operand[:-1]):
        return "row"
    return None


def _fits(region_type: TensorType, operand: TensorType) -> bool:
    """Whether an operand of type ``operand`` may feed a region input declared ``region_type``.

    Equal types, except that a dim the region only knows at run time may be any dim (the C
    generator re-infers a node with such dims as run-time symbols)."""
    return region_type.dtype == operand.dtype and region_type.rank == operand.rank and all(
        a == b or is_unknown(a) for a, b in zip(region_type.shape, operand.shape))


def region_problem(body: Graph, input_types: Sequence[TensorType | None], what: str) -> str | None:
    """Why ``body`` is not a valid fused region for inputs of ``input_types`` (None when it is)."""
    if len(body.inputs) != len(input_types):
        return f"{what} has {len(body.inputs)} inputs for {len(input_types)} operands"
    for i, (v, t) in enumerate(zip(body.inputs, input_types)):
        if t is None or not _fits(v.type, t):
            return f"{what} input {i} has type {v.type}, its operand {t}"
    if len(body.outputs) != 1:
        return f"{what} must have one output, has {len(body.outputs)}"
    defined = set(body.inputs)
    for n in body.nodes:
        opdef = lookup(n.op)
        if opdef is None or ELEMENTWISE not in opdef.traits or any(True for _ in n.regions()):
            return f"{what} holds {n.op}, which is not an elementwise op"
        for a in n.inputs:
            if a is not None and a not in defined:
                return f"{what}: {n.op} reads %{a.name}, which the region does not define"
        for b in [*n.inputs, *n.outputs]:
            if b is not None and b.type.dtype not in FUSABLE_DTYPES:
                return f"{what}: %{b.name} has element type {b.type.dtype}; fused regions hold float values only"
        defined.update(n.outputs)
    if body.outputs[0] not in defined:
        return f"{what}'s output is not defined in it"
    return None


def region_result(ctx: InferCtx, body: Graph, input_types: Sequence[TensorType]) -> TensorType:
    """The type of ``body``'s output for inputs of ``input_types``, by each region node's own inference.

    For the types the region was built with this is its output's type; for operands whose dims
    are run-time symbols it says what the output's dims are in those symbols."""
    env: dict[Value, Value] = {rv: Value(rv.name, t) for rv, t in zip(body.inputs, input_types)}
    for n in body.nodes:
        ins = [env[v] if v is not None else None for v in n.inputs]
        types, _, syms = infer_all(n.op, ins, n.attrs, len(n.outputs), ctx.symbols)
        for o, t, sv in zip(n.outputs, types, syms):
            env[o] = Value(o.name, t)
            env[o].sym_value = sv
    return env[body.outputs[0]].type


def _run(ctx: RefCtx, body: Graph, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    if ctx.run_region is None:
        raise ValueError(f"{ctx.op}: the interpreter gave no way to run its region")
    return ctx.run_region(body, inputs)[0]


# fused_elementwise ----------------------------------------------------------------------------


def _fused_elementwise_infer(ctx: InferCtx) -> list[TensorType]:
    body = ctx.attrs["body"]
    if not isinstance(body, Graph):
        raise ctx.fail("body must be a graph")
    problem = region_problem(body, ctx.types, "body")
    if problem:
        raise ctx.fail(problem)
    return [region_result(ctx, body, [ctx.type(i) for i in range(len(ctx.types))])]


def _fused_elementwise_ref(ctx: RefCtx) -> list[np.ndarray]:
    return [_run(ctx, ctx.attrs["body"], ctx.inputs)]


register(
    OpDef(
        name="fused_elementwise",
        inputs=("inputs*",),
        attrs={"body": AttrSpec("graph")},
        infer=_fused_elementwise_infer,
        reference=_fused_elementwise_ref,
        doc="A chain of elementwise ops (the region `body`) run as one loop.",
    )
)


# Base op + epilogue ---------------------------------------------------------------------------


def _epilogue_op(name: str, base_name: str) -> None:
    base = get(base_name)
    n_base = len(base.inputs)

    def infer(ctx: InferCtx) -> list[TensorType]:
        epilogue = ctx.attrs["epilogue"]
        if not isinstance(epilogue, Graph):
            raise ctx.fail("epilogue must be a graph")
        attrs = {k: v for k, v in ctx.attrs.items() if k != "epilogue"}
        sub = replace(ctx, op=base_name, types=ctx.types[:n_base], consts=ctx.consts[:n_base], attrs=attrs,
                      sym_values=ctx.sym_values[:n_base], assumptions=ctx.assumptions)
        (out,) = base.infer(sub)[:1]
        extras = ctx.types[n_base:]
        problem = region_problem(epilogue, [out, *extras], "epilogue")
        if problem:
            raise ctx.fail(problem)
        result = region_result(ctx, epilogue, [out, *(t for t in extras if t is not None)])
        if result != out:
            raise ctx.fail(f"epilogue gives {result}, the {base_name} result is {out}")
        for i, t in enumerate(extras):
            if t is None or extra_kind(out.shape, t.shape) is None:
                raise ctx.fail(f"extra input {i} ({t}) is neither one element, the result's shape, nor a "
                               "vector along its last axis")
        return [out]

    def ref(ctx: RefCtx) -> list[np.ndarray]:
        assert base.reference is not None
        attrs = {k: v for k, v in ctx.attrs.items() if k != "epilogue"}
        sub = RefCtx(base_name, ctx.inputs[:n_base], attrs, ctx.out_types, ctx.run_region)
        (y,) = base.reference(sub)[:1]
        return [_run(ctx, ctx.attrs["epilogue"], [y, *ctx.inputs[n_base:]])]

    register(
        OpDef(
            name=name,
            inputs=(*base.inputs, "extras*"),
            attrs={**base.attrs, "epilogue": AttrSpec("graph")},
            infer=infer,
            reference=ref,
            tolerance=base.tolerance,
            doc=f"{base_name} followed by the elementwise region `epilogue` (its result, then the extra inputs).",
        )
    )


for _name, _base in EPILOGUE_BASES.items():
    _epilogue_op(_name, _base)
