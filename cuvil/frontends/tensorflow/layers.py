"""Which Keras layer a TensorFlow op (and so the ONNX node tf2onnx made from it) belongs to, and
the refusal of models that run with training-mode semantics.

A TensorFlow op's name is the path of the name scopes it was made in: a Keras layer opens a
scope named after itself for each call (TensorFlow makes it unique with a ``_<k>`` suffix:
``cnn_1/conv1_1/convolution``), tf2onnx names an ONNX node after the op it converts (a
``__<k>`` suffix on the nodes it adds), and a SavedModel's signature wraps the model's ops in
``StatefulPartitionedCall`` scopes.  Where the Keras model is at hand, the layer of a name is the
run of its leading scopes that are names of the model's layers (a nested layer reads
``encoder/mha/query``; the model's own scope is left out); without it (a ``tf.function`` or a
SavedModel), it is the op's name scope as written.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cuvil.errors import ModelError

_WRAPPERS = re.compile(r"^(Stateful)?PartitionedCall(_\d+)?$")
_UNIQUE = re.compile(r"_\d+$")
#: TensorFlow ops that write a variable: a layer updating its state as it runs (training mode)
VARIABLE_WRITES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "Assign", "AssignAdd",
                             "AssignSub", "ScatterUpdate", "ResourceScatterUpdate"})
#: TensorFlow ops that draw random numbers (an active Dropout or noise layer)
_RANDOM = re.compile(r"Random|Multinomial|TruncatedNormal")


@dataclass(frozen=True)
class LayerNames:
    """The layer names of a Keras model (empty for a model that is not one) and its own name."""

    names: frozenset[str]
    root: str | None

    @staticmethod
    def of(model: Any) -> LayerNames:
        keras = sys.modules.get("keras")
        if keras is None or not isinstance(model, keras.layers.Layer):
            return LayerNames(frozenset(), None)
        layers = list(model._flatten_layers(include_self=True, recursive=True))
        return LayerNames(frozenset(str(la.name) for la in layers), str(model.name))

    def layer_of(self, op_name: str) -> str | None:
        """The Keras layer path of a TensorFlow op (or ONNX node) name; without a Keras model, its name
        scope; None when it has none (a node tf2onnx made of constants)."""
        parts = [p for p in op_name.split("/") if p]
        while parts and _WRAPPERS.match(parts[0]):
            parts = parts[1:]
        if not self.names:
            return "/".join(parts[:-1]) or None
        path: list[str] = []
        for p in parts[:-1]:
            name = p if p in self.names else _UNIQUE.sub("", p)
            if name not in self.names:
                break
            path.append(name)
        if len(path) > 1 and path[0] == self.root:
            path = path[1:]
        return "/".join(path) or None

    def layers_of(self, op_names: Iterable[str]) -> tuple[str, ...]:
        """The distinct layers of ``op_names``, in first-seen order."""
        out: dict[str, None] = {}
        for n in op_names:
            layer = self.layer_of(n)
            if layer is not None:
                out.setdefault(layer, None)
        return tuple(out)


def graph_ops(graph_def: Any) -> list[tuple[str, str]]:
    """``(op type, name)`` of every node of a GraphDef and of the functions in its library."""
    ops = [(n.op, n.name) for n in graph_def.node]
    for f in graph_def.library.function:
        ops.extend((n.op, n.name) for n in f.node_def)
    return ops


def check_inference_mode(function: Any, specs: Sequence[Any], names: LayerNames) -> None:
    """Refuse a model whose traced graph updates variables or draws random numbers, naming the layers."""
    try:
        concrete = function.get_concrete_function(*specs)
    except Exception as exc:
        raise ModelError(f"TensorFlow could not trace the model for the given inputs: {type(exc).__name__}: "
                         f"{_first_line(exc)}") from exc
    writes: dict[str, set[str]] = {}
    random: dict[str, set[str]] = {}
    for op, name in graph_ops(concrete.graph.as_graph_def()):
        if op in VARIABLE_WRITES:
            writes.setdefault(names.layer_of(name) or name, set()).add(op)
        elif _RANDOM.search(op):
            random.setdefault(names.layer_of(name) or name, set()).add(op)
    if not writes and not random:
        return
    parts = [f"layer {layer!r} updates its variables as it runs ({', '.join(sorted(ops))})"
             for layer, ops in writes.items()]
    parts += [f"layer {layer!r} draws random numbers ({', '.join(sorted(ops))})" for layer, ops in random.items()]
    raise ModelError(
        f"the model runs with training-mode semantics: {'; '.join(parts)}; in training mode Dropout is active and "
        "BatchNorm uses batch statistics. Compile the model as it runs for inference: cuvil.compile calls a Keras "
        "model with training=False; a tf.function or SavedModel must call it with training=False itself")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= 300 else line[:297] + "..."


def layer_outputs(model: Any, inputs: Sequence[Any]) -> dict[str, Any]:
    """The output of every top-level layer of a functional or sequential Keras model on ``inputs``
    (NumPy arrays by layer name, in inference mode); {} for a model whose layers' outputs are not
    graph tensors (a subclassed model).  A layer with several outputs is left out."""
    import keras
    import numpy as np

    try:
        inner = [la for la in model.layers if not isinstance(la, keras.layers.InputLayer)]
        tapped = keras.Model(model.inputs, [la.output for la in inner])
    except (AttributeError, ValueError, TypeError):
        return {}
    outs = tapped(list(inputs), training=False)  # model.inputs is a list, one tensor or more
    outs = outs if isinstance(outs, list | tuple) else [outs]
    return {la.name: np.asarray(o.numpy()) for la, o in zip(inner, outs) if hasattr(o, "numpy")}
