"""PyTorch custom ops (``torch.library.custom_op``), mapped by name onto custom ops (``cuvil.register_op``).

``torch.library.custom_op("mylib::scale_add", ...)`` appears in an exported
graph as the target ``mylib.scale_add.default``; it maps to the Cuvil op
registered as ``"mylib::scale_add"`` (any overload).  Arguments bind by
name: each Tensor argument of the torch op is the Cuvil input of that name,
each other argument (int, float, bool as int) the attribute of that name, and
their values must be constants of the export.  The result types torch.export
recorded (from the op's fake implementation) must agree with the registered
shape function's.  A custom op that is not registered has no mapping, so the
converter's scan lists it in the one unsupported-op error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from cuvil.custom import CustomOp, custom_op
from cuvil.frontends.torch.converter import MappingFn, TorchCtx, mapping_fallback
from cuvil.ir.graph import Value
from cuvil.ir.symbolic import is_unknown
from cuvil.ir.types import TensorType

_TARGET = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\Z")
_STANDARD = frozenset({"aten", "prims", "prim", "_operator", "getitem"})


@mapping_fallback
def _custom_mapping(target: str) -> MappingFn | None:
    m = _TARGET.match(target)
    if m is None or m.group(1) in _STANDARD:
        return None
    name = f"{m.group(1)}::{m.group(2)}"
    if custom_op(name) is None:
        return None

    def fn(ctx: TorchCtx) -> Value | Sequence[Value | None]:
        return _convert(ctx, name)

    return fn


def _convert(ctx: TorchCtx, name: str) -> Value | Sequence[Value | None]:
    op = custom_op(name)
    if op is None:  # unregistered between the scan and the conversion
        raise ctx.unsupported(f"{name} is not a registered custom op")
    schema = getattr(ctx.node.target, "_schema", None)
    if schema is None:
        raise ctx.fail(f"target {ctx.target} has no torch schema to bind its arguments by name")
    tensors: dict[str, Any] = {}
    others: dict[str, Any] = {}
    for i, a in enumerate(schema.arguments):
        has_default = a.has_default_value() if hasattr(a, "has_default_value") else a.default_value is not None
        value = ctx.arg(i, a.name, a.default_value if has_default else None)
        if "Tensor" in str(a.type):
            tensors[a.name] = value
        else:
            others[a.name] = value
    inputs = [x.name for x in op.schema.inputs]
    kinds = op.schema.attr_kinds()
    mismatch = sorted(set(tensors) ^ set(inputs)) + sorted(set(others) - set(kinds))
    if mismatch:
        raise ctx.fail(f"torch op {schema.name} has Tensor arguments ({', '.join(tensors)}) and others "
                       f"({', '.join(others) or 'none'}); Cuvil op {name} declares inputs ({', '.join(inputs)}) and "
                       f"attributes ({', '.join(kinds) or 'none'}): they must match by name (mismatched: "
                       f"{', '.join(mismatch)})")
    values: list[Value | None] = []
    for n in inputs:
        if tensors[n] is None:
            raise ctx.fail(f"input {n!r} of {name} is None; custom ops take every declared input")
        values.append(ctx.value(tensors[n]))
    attrs = {k: _attr(ctx, name, k, kinds[k][0], v) for k, v in others.items() if v is not None}
    returns = [str(r.type) for r in schema.returns]
    single = returns == ["Tensor"]
    if not single and returns != ["Tensor"] * len(op.schema.outputs) and returns != ["Tensor[]"]:
        raise ctx.fail(f"torch op {schema.name} returns ({', '.join(returns)}); Cuvil op {name} declares "
                       f"{len(op.schema.outputs)} tensor output(s)")
    if single and len(op.schema.outputs) != 1:
        raise ctx.fail(f"torch op {schema.name} returns one Tensor; Cuvil op {name} declares {len(op.schema.outputs)}")
    outs = ctx.emit(name, values, attrs, num_outputs=len(op.schema.outputs))
    for i, v in enumerate(outs):
        _check_type(ctx, op, v, i, ctx.out_type(None if single else i))
    return outs[0] if single else outs


def _attr(ctx: TorchCtx, name: str, key: str, kind: str, v: Any) -> int | float:
    if hasattr(v, "op"):
        raise ctx.fail(f"argument {key!r} of {name} is computed in the graph; custom op attributes must be constants")
    if kind == "float" and isinstance(v, int | float):
        return float(v)
    if kind == "int" and isinstance(v, int):
        return int(v)
    raise ctx.fail(f"argument {key!r} of {name} is declared {kind}, the graph passes {v!r}")


def _check_type(ctx: TorchCtx, op: CustomOp, v: Value, i: int, expected: TensorType) -> None:
    """Torch's recorded result type (from the op's fake implementation) against the registered functions'."""
    got = v.type
    if got.dtype is expected.dtype and got.rank == expected.rank and all(
            a == b or is_unknown(a) or is_unknown(b) for a, b in zip(got.shape, expected.shape)):
        return
    raise ctx.fail(f"output {i} of custom op {op.name}: the registered shape and dtype functions give {got}, "
                   f"torch.export recorded {expected} (from the op's fake implementation)")
