"""ONNX nodes in a custom domain, mapped by name onto custom ops (``cuvil.register_op``).

A node of op type ``T`` in domain ``D`` (any domain but the standard ONNX
ones) becomes the registered op ``"D::T"``: its inputs in order, its
attributes by name (an int attribute also fills a float one).  A node whose
op is not registered has no importer, so the importer's scan lists it in the
one unsupported-op error, with its domain and the nodes that use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cuvil.custom import custom_op
from cuvil.frontends.onnx.importer import ImportCtx, Importer, importer_fallback
from cuvil.ir.graph import Value


@importer_fallback
def _custom_importer(domain: str, op_type: str) -> Importer | None:
    if not domain:  # the standard domain is never custom
        return None
    name = f"{domain}::{op_type}"
    if custom_op(name) is None:
        return None

    def fn(ctx: ImportCtx) -> Sequence[Value | None]:
        return _import(ctx, name)

    return Importer(fn)


def _import(ctx: ImportCtx, name: str) -> Sequence[Value | None]:
    op = custom_op(name)
    if op is None:  # unregistered between the scan and the conversion
        raise ctx.unsupported(f"{name} is not a registered custom op")
    kinds = op.schema.attr_kinds()
    unknown = sorted(set(ctx.attrs) - set(kinds))
    if unknown:
        raise ctx.fail(f"attribute(s) {', '.join(unknown)} are not declared by custom op {name} "
                       f"(it declares {', '.join(kinds) or 'none'})")
    attrs: dict[str, Any] = {}
    for k, (kind, _) in kinds.items():
        if k not in ctx.attrs:
            continue  # the op's default (or its "required" error) applies
        v = ctx.attrs[k]
        if kind == "float" and isinstance(v, int):
            v = float(v)
        if not isinstance(v, int if kind == "int" else float):
            raise ctx.fail(f"attribute {k!r} of custom op {name} is declared {kind}, the node gives {v!r}")
        attrs[k] = v
    n_in, n_out = len(op.schema.inputs), len(op.schema.outputs)
    inputs = ctx.inputs()
    if len(inputs) != n_in or any(v is None for v in inputs):
        raise ctx.fail(f"custom op {name} takes {n_in} inputs ({', '.join(a.name for a in op.schema.inputs)}), "
                       f"the node gives {sum(v is not None for v in inputs)}")
    if ctx.num_outputs > n_out:
        raise ctx.fail(f"custom op {name} has {n_out} outputs, the node asks for {ctx.num_outputs}")
    return ctx.emit(name, inputs, attrs, num_outputs=n_out)
