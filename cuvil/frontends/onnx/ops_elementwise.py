"""Importers of ONNX elementwise ops."""

from __future__ import annotations

from cuvil.frontends.onnx.importer import simple

for _onnx, _cuvil in {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Relu": "relu", "Exp": "exp", "Neg": "neg"}.items():
    simple(_onnx, _cuvil, drop_attrs=("consumed_inputs",))
