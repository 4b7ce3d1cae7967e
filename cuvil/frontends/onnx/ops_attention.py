"""Importer of ONNX Attention (opsets 23 and 24) onto Cuvil's ``attention`` op.

The op takes ONNX's inputs, outputs and attributes as they are (``cuvil/ops/attention.py``);
the importer converts ``softmax_precision`` from its TensorProto code and refuses what the op
does not define: attributes of later opsets (sliding windows) and ``nonpad_kv_seqlen`` before
opset 24, which introduced it.
"""

from __future__ import annotations

from collections.abc import Sequence

from cuvil.frontends.onnx.importer import ImportCtx, dtype_of, importer
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.ir.graph import Value

_ATTRS = ("is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale", "softcap",
          "softmax_precision")


@importer("Attention")
def _attention(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, _ATTRS)
    inputs = ctx.inputs()
    if len(inputs) > 6 and inputs[6] is not None and ctx.opset < 24:
        raise ctx.unsupported(f"input nonpad_kv_seqlen at opset {ctx.opset} (it exists from opset 24)")
    if len(inputs) > 7:
        raise ctx.unsupported(f"{len(inputs)} inputs (Attention takes at most 7)")
    attrs: dict[str, object] = {k: ctx.attrs[k] for k in ("is_causal", "kv_num_heads", "q_num_heads",
                                                         "qk_matmul_output_mode") if k in ctx.attrs}
    if "scale" in ctx.attrs:
        attrs["scale"] = float(ctx.attrs["scale"])
    if "softcap" in ctx.attrs:
        attrs["softcap"] = float(ctx.attrs["softcap"])
    if "softmax_precision" in ctx.attrs:
        attrs["softmax_precision"] = dtype_of(ctx.attrs["softmax_precision"], "Attention softmax_precision")
    return ctx.emit("attention", inputs, attrs, num_outputs=max(ctx.num_outputs, 1))
