"""What the ATen mapping modules share: registration with a type check, operands, dtype promotion.

Every mapping is registered through :func:`mapping`, which checks the Cuvil
type of each result against the type torch.export recorded for the node
(element type, rank, and every dim Cuvil knows), so a mapping that gets
PyTorch's semantics wrong fails at the node that produced it, naming both
types, instead of giving wrong numbers later.

Dtype promotion follows PyTorch's own rules by asking ``torch.result_type``
about stand-in tensors of the same element type and dimensionality (a 0-d
tensor promotes differently from an n-d one, a Python scalar differently
again), so ``add.Tensor(x_f32, 2)`` stays f32 and ``add.Tensor(x_i64, 0.5)``
becomes f32 as in eager mode.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from cuvil.frontends.torch.converter import TorchCtx, aten, torch_dtype
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value
from cuvil.ir.symbolic import format_dim, is_unknown
from cuvil.ir.types import TensorType

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


Fn = TypeVar("Fn", bound=Callable[[TorchCtx], Any])


def mapping(*targets: str) -> Callable[[Fn], Fn]:
    """Register ``fn`` for ``targets`` (see :func:`converter.aten`), checking its results' types."""

    def wrap(fn: Fn) -> Fn:
        @functools.wraps(fn)
        def checked(ctx: TorchCtx) -> Any:
            result = fn(ctx)
            check_result(ctx, result)
            return result

        aten(*targets)(checked)
        return fn

    return wrap


def check_result(ctx: TorchCtx, result: Any) -> None:
    """Each result's type must agree with what torch.export recorded (dims Cuvil cannot know are skipped)."""
    val = ctx.meta()
    if isinstance(result, Value):
        pairs: list[tuple[int | None, Value, Any]] = [(None, result, val)]
    else:
        if not isinstance(val, (list, tuple)):
            return
        pairs = [(i, r, v) for i, (r, v) in enumerate(zip(result, val)) if isinstance(r, Value)]
    for index, got, want_val in pairs:
        if not hasattr(want_val, "dtype") or not hasattr(want_val, "shape"):
            continue
        want = ctx.out_type(index)
        if not types_agree(got.type, want):
            which = "" if index is None else f" (result {index})"
            raise ctx.fail(f"the mapping gives {got.type}{which} but torch.export recorded {want}")


def types_agree(got: TensorType, want: TensorType) -> bool:
    if got.dtype != want.dtype or got.rank != want.rank:
        return False
    return all(is_unknown(g) or is_unknown(w) or g == w for g, w in zip(got.shape, want.shape))


# operands ---------------------------------------------------------------------------------------


def is_node(arg: Any) -> bool:
    return hasattr(arg, "op") and hasattr(arg, "meta")


def is_sym_scalar(arg: Any) -> bool:
    """A node whose value is a SymInt / SymFloat / SymBool rather than a tensor."""
    return is_node(arg) and not hasattr(arg.meta.get("val"), "dtype")


def cast(ctx: TorchCtx, v: Value, dtype: DType) -> Value:
    return v if v.type.dtype == dtype else ctx.emit1("cast", [v], {"to": dtype})


def scalar_value(ctx: TorchCtx, arg: Any, dtype: DType) -> Value:
    """A Python number, or a symbolic size node, as a 0-d tensor of ``dtype``."""
    if is_sym_scalar(arg):
        v = ctx.value(arg)
        if v.type.rank != 0:
            v = ctx.emit1("reshape", [v, ctx.constant(np.zeros(0, np.int64))])
        return cast(ctx, v, dtype)
    if isinstance(arg, (bool, int, float)):
        if dtype.is_int and isinstance(arg, float) and not float(arg).is_integer():
            raise ctx.fail(f"the scalar {arg} cannot be represented in {dtype}")
        return ctx.constant(np.array(arg, dtype=dtype.np))
    raise ctx.fail(f"expected a number, got {arg!r}")


def operand(ctx: TorchCtx, arg: Any, dtype: DType) -> Value:
    """A tensor argument cast to ``dtype``, or a scalar argument as a 0-d tensor of ``dtype``."""
    if is_node(arg) and not is_sym_scalar(arg):
        return cast(ctx, ctx.value(arg), dtype)
    return scalar_value(ctx, arg, dtype)


def _stand_in(arg: Any) -> Any:
    """Something with ``arg``'s promotion category for ``torch.result_type``."""
    import torch

    if is_node(arg):
        val = arg.meta.get("val")
        if hasattr(val, "dtype"):
            return torch.empty([0] * val.dim(), dtype=val.dtype)
        kind = type(val).__name__
        return {"SymBool": True, "SymFloat": 1.0}.get(kind, 1)
    return arg


def result_dtype(ctx: TorchCtx, *args: Any) -> DType:
    """PyTorch's promoted element type of tensors and scalars combined elementwise (``None`` skipped)."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    items = [_stand_in(a) for a in args if a is not None]
    if not items:
        raise ctx.fail("no operand to take an element type from")
    _, dt = elementwise_dtypes(*items, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    return torch_dtype(dt)


def optional_value(ctx: TorchCtx, arg: Any) -> Value | None:
    return None if arg is None else ctx.value(arg)


def axis_of(ctx: TorchCtx, dim: int, rank: int) -> int:
    """A dim argument in ``[-rank, rank)`` (rank 0 takes 0 and -1, as PyTorch) as an index."""
    r = max(rank, 1)
    if not -r <= dim < r:
        raise ctx.fail(f"dim {dim} is out of range for a tensor of rank {rank}")
    return dim % r


def ints_const(ctx: TorchCtx, values: Sequence[int]) -> Value:
    return ctx.constant(np.array(list(values), dtype=np.int64).reshape(len(values)))


def used_results(ctx: TorchCtx) -> set[int]:
    """Which items of a multi-output node later nodes pick with getitem."""
    used: set[int] = set()
    for user in ctx.node.users:
        if "getitem" in str(user.target) and isinstance(user.args[1], int):
            used.add(user.args[1])
        else:
            used.update(range(len(ctx.meta() or ())))
    return used


def static_size(ctx: TorchCtx, node: Any, dim: int) -> int:
    """The size PyTorch recorded for ``node``'s dim ``dim``; it must be a plain int."""
    val = ctx.meta(node)
    d = val.shape[dim]
    if not isinstance(d, int):
        try:
            return int(d)
        except (TypeError, ValueError):
            pass
        raise ctx.fail(f"needs dim {dim} of {node.name} to be static, but it is symbolic ({d})")
    return d


def shape_str(t: TensorType) -> str:
    return "[" + ", ".join(format_dim(d) for d in t.shape) + "]"


def tensor_dtype_arg(ctx: TorchCtx, name: str) -> DType | None:
    dt = ctx.kwargs.get(name)
    return None if dt is None else torch_dtype(dt)
