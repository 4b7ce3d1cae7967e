"""Reduced precision and quantization: what they cost in accuracy, measured per layer.

``cuvil.quant.accuracy`` compares a reduced-precision or quantized graph with its float32 graph
value by value (:func:`layer_errors`, :func:`precision_report`) and finds values that overflow the
reduced type.  The conversion itself is the ``convert-precision`` pass
(``cuvil.passes.convert_precision``), which ``cuvil.compile(..., precision="fp16")`` runs.
"""

from __future__ import annotations

from cuvil.passes.convert_precision import PrecisionOverflowError
from cuvil.quant.accuracy import LayerError, Overflow, PrecisionReport, layer_errors, precision_report

__all__ = ["LayerError", "Overflow", "PrecisionOverflowError", "PrecisionReport", "layer_errors", "precision_report"]
