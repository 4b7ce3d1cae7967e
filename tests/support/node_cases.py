"""Conformance cases made harder: their float inputs redrawn from a seed, their data dims made symbolic
(the registry's and the fused attention's agreement tests)."""

from __future__ import annotations

import numpy as np
import onnx


def randomized_inputs(inputs: list[np.ndarray], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for a in inputs:
        # scalars are parameters (a depth, a delta), not data: keep the case's value
        if (a.dtype.kind == "f" or a.dtype.name == "bfloat16") and a.size > 1:
            out.append(rng.standard_normal(a.shape).astype(a.dtype))
        else:
            out.append(a)
    return out


def symbolic_dims(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    env: dict[str, int] = {}
    inits = {t.name for t in m.graph.initializer}
    for vi in m.graph.input:
        # integer and boolean inputs are shapes, axes and indices: their lengths set output ranks
        if vi.name in inits or vi.type.tensor_type.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32,
                                                                  onnx.TensorProto.BOOL):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 1:
                v = d.dim_value
                d.ClearField("dim_value")
                d.dim_param = f"d{v}"
                env[f"d{v}"] = v
    return m, env
