"""CUDA kernels of the elementwise ops, Cast, Where, Clip and the fused elementwise chains.

The scalar expression of every op is the C backend's (:data:`cuvil.backends.c.kernels.
elementwise.SCALAR`), so one definition serves both targets; a fused chain composes them into one
expression (:func:`cuvil.backends.c.kernels.fused.compose`) and runs as one kernel, one thread per
output element, with the broadcasting of :func:`~cuvil.backends.cuda.kernels.common.elementwise`."""

from __future__ import annotations

import cuvil.backends.c.kernels  # noqa: F401  (fills SCALAR)
from cuvil.backends.c.kernels.elementwise import SCALAR, Scalar, constant_not_nan
from cuvil.backends.c.kernels.fused import _clip, compose
from cuvil.backends.cuda.kernel import CudaKernelCtx, cuda_kernel
from cuvil.backends.cuda.kernels.common import copy, elementwise
from cuvil.ops.registry import get


def _scalar(k: CudaKernelCtx) -> Scalar:
    ins = [k.inp(i) for i in range(len(k.ins)) if k.has(i)]
    return Scalar(tuple(a.dtype for a in ins), k.out(0).dtype, get(k.node.op).fill_attrs(k.attrs))


def _emit_scalar(k: CudaKernelCtx) -> None:
    s = _scalar(k)
    fn = SCALAR[k.node.op]
    elementwise(k, lambda args: fn(s, args))


for _op in sorted(SCALAR):
    cuda_kernel(_op)(_emit_scalar)


@cuda_kernel("clip")
def _clip_kernel(k: CudaKernelCtx) -> None:
    node = k.node
    present = [i for i in range(len(k.ins)) if k.has(i)]
    s = Scalar(tuple(k.inp(i).dtype for i in present), k.out(0).dtype, get("clip").fill_attrs(k.attrs))
    not_nan = frozenset(f"x{j}" for j, i in enumerate(present) if constant_not_nan(k.inp(i).value))

    def expr(args: list[str]) -> str:
        names = {node.inputs[i]: args[j] for j, i in enumerate(present)}
        return _clip(s, node, names, not_nan)  # type: ignore[arg-type]

    elementwise(k, expr)  # type: ignore[arg-type]


@cuda_kernel("identity")
def _identity(k: CudaKernelCtx) -> None:
    copy(k, k.inp(0), k.out(0))


@cuda_kernel("fused_elementwise")
def _fused_elementwise(k: CudaKernelCtx) -> None:
    body = k.attrs["body"]
    k.note(f"fused elementwise kernel: {', '.join(n.op for n in body.nodes)}")
    for n in body.nodes:
        args = ", ".join("_" if v is None else f"%{v.name}" for v in n.inputs)
        k.w.comment(f"  fused node '{n.name}': {', '.join(f'%{o.name}' for o in n.outputs)} = {n.op}({args})")
    operands = [k.inp(i).value for i in range(len(k.ins)) if k.has(i)]
    constant = frozenset(i for i, v in enumerate(operands) if constant_not_nan(v))
    elementwise(k, lambda args: compose(body, args, frozenset(args[i] for i in constant)))
