"""Importers of ONNX Constant, Identity and Dropout.

Dropout is imported for inference, where it is the identity: its optional
mask output is all true (of the input's element type before opset 10, when
the mask was not yet bool).  A model that asks for training mode is refused:
its output would be random.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.frontends.onnx.ops_elementwise import first_opset, input_value, modern_attrs
from cuvil.ir.dtypes import is_float_np
from cuvil.ir.graph import Value

# Constant's value attributes: the element type each one gives (None: the tensor's own), and whether it is a list.
_CONSTANT_FORMS: dict[str, tuple[type[np.generic] | None, bool]] = {
    "value": (None, False),
    "value_float": (np.float32, False),
    "value_floats": (np.float32, True),
    "value_int": (np.int64, False),
    "value_ints": (np.int64, True),
}
_UNSUPPORTED_FORMS = ("value_string", "value_strings", "sparse_value")


@importer("Constant", since=first_opset("Constant"))
def _constant(ctx: ImportCtx) -> Sequence[Value | None]:
    for name in _UNSUPPORTED_FORMS:
        if name in ctx.attrs:
            raise ctx.unsupported(f"attribute {name} (string and sparse constants are not supported)")
    unknown = sorted(set(ctx.attrs) - set(_CONSTANT_FORMS))
    if unknown:
        raise ctx.fail(f"unknown attribute(s) {', '.join(unknown)}")
    if len(ctx.attrs) != 1:
        raise ctx.fail(f"needs exactly one value attribute, got {sorted(ctx.attrs) or 'none'}")
    ((name, value),) = ctx.attrs.items()
    dtype, is_list = _CONSTANT_FORMS[name]
    array = np.asarray(value, dtype=dtype)
    return [ctx.emit1("constant", [], {"value": array.reshape(-1) if is_list else array})]


@importer("Identity", since=first_opset("Identity"))
def _identity(ctx: ImportCtx) -> Sequence[Value | None]:
    if ctx.attrs:
        raise ctx.fail(f"unknown attribute(s) {', '.join(sorted(ctx.attrs))}")
    return [ctx.emit1("identity", [input_value(ctx, 0)])]


def _check_inference_mode(ctx: ImportCtx) -> None:
    """Refuse a Dropout that is (or may be) in training mode."""
    if ctx.opset < 7:  # is_test=0, the default, meant training
        if not ctx.attr("is_test", 0):
            raise ctx.unsupported("training mode (is_test=0): Cuvil compiles for inference only")
        return
    if ctx.opset < 12 or ctx.input(2) is None:
        return
    mode = ctx.const_input(2)
    if mode is None:
        raise ctx.unsupported("training_mode computed at run time: Cuvil compiles for inference only")
    if mode.size != 1 or mode.dtype != np.bool_:
        raise ctx.fail(f"training_mode must be a bool scalar, got {mode.dtype} of shape {list(mode.shape)}")
    if bool(mode.reshape(())):
        raise ctx.unsupported("training_mode=true: Cuvil compiles for inference only")


def _check_ratio(ctx: ImportCtx) -> None:
    """A ratio known at import time must be valid, even though inference does not use it."""
    ratio = ctx.attr("ratio") if ctx.opset < 12 else ctx.const_input(1)
    if ratio is None:
        return
    r = np.asarray(ratio)
    if r.size != 1 or not is_float_np(r.dtype):
        raise ctx.fail(f"ratio must be a float scalar, got {r.dtype} of shape {list(r.shape)}")
    if not 0 <= float(r.reshape(())) < 1:
        raise ctx.fail(f"ratio must be in [0, 1), got {float(r.reshape(()))}")


@importer("Dropout", since=first_opset("Dropout"))
def _dropout(ctx: ImportCtx) -> Sequence[Value | None]:
    max_inputs = 3 if ctx.opset >= 12 else 1
    if ctx.num_inputs > max_inputs:
        raise ctx.fail(f"takes at most {max_inputs} input(s) at opset {ctx.opset}, got {ctx.num_inputs}")
    if ctx.num_outputs > 2:
        raise ctx.fail(f"has at most 2 outputs, got {ctx.num_outputs}")
    _check_inference_mode(ctx)
    _check_ratio(ctx)
    # these attributes only matter in training, which was refused above
    training_attrs = ("seed",) if ctx.opset >= 12 else ("ratio",) if ctx.opset >= 7 else ("ratio", "is_test")
    attrs = modern_attrs(ctx, drop=training_attrs)
    if attrs:
        raise ctx.fail(f"unknown attribute(s) {', '.join(sorted(attrs))}")
    x = input_value(ctx, 0)
    y = ctx.emit1("identity", [x])
    if ctx.num_outputs < 2:
        return [y]
    true = np.asarray(True) if ctx.opset >= 10 else np.asarray(1, dtype=x.type.dtype.np)
    return [y, ctx.emit1("full_like", [x], {"value": true})]
