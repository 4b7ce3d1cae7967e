"""The TensorFlow / Keras front end: Keras 3 models, ``tf.function``s and SavedModels to Cuvil IR,
through tf2onnx and the ONNX front end.

What it takes (:func:`is_tensorflow_model`, :func:`is_tensorflow_path`): a Keras model or layer
(functional, sequential or subclassed), a ``tf.function`` with an input signature, an object
``tf.saved_model.load`` returned, the path of a SavedModel folder, or a ``.keras`` file.  Neither
check imports TensorFlow: a model object exists only once its framework is loaded, and a path is
recognised by its contents (``saved_model.pb``) or its suffix.

How it converts (:func:`load_tensorflow`):

1. The model is wrapped in a ``tf.function`` of one argument per input (:mod:`.signature` gives
   their ``tf.TensorSpec``s and the names of their dynamic dims) that calls it in inference mode:
   a Keras model with ``training=False``, a SavedModel through its ``serving_default`` signature.
   Its outputs are renamed after the model's own output names, in the model's order.  (tf2onnx's
   ``from_keras`` cannot read Keras 3 models; converting this function is the route that works.)
2. The traced TensorFlow graph is checked for training-mode semantics (:mod:`.layers`): a model
   that updates its variables while it runs (BatchNorm's moving statistics, a Dropout's seed) or
   draws random numbers (an active Dropout) is refused, naming each such layer.
3. tf2onnx converts the function (opset :data:`ONNX_OPSET`), its log kept at DEBUG; the dynamic
   dims it wrote as ``unk__N`` are renamed to the symbols the signature names (``batch`` for a
   leading ``None``), and the ONNX front end imports the model with the ``dims=`` constraints.
4. An op that cannot be compiled, a TensorFlow op tf2onnx left unconverted or an ONNX op Cuvil does
   not import, is one :class:`UnsupportedOpError` listing every such op with the Keras layer that
   holds it (tf2onnx names each ONNX node after the TensorFlow op it comes from, whose name is the
   path of layer name scopes).

tf2onnx writes NHWC models as NCHW ONNX convolutions between transposes; the ``convert-layout``
pass takes a transposed NHWC value as its own channels-last twin, so those pairs cancel
(``cuvil.compile``'s DEBUG log lists the transposes a compiled graph still holds).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuvil.errors import ModelError
from cuvil.ir.graph import Graph
from cuvil.ir.types import SymbolInfo

log = logging.getLogger("cuvil.frontends.tensorflow")

#: The ONNX opset tf2onnx converts to.
ONNX_OPSET = 17
KERAS_SUFFIX = ".keras"


def is_tensorflow_model(model: object) -> bool:
    """A Keras model or layer, a ``tf.function``, or a loaded SavedModel (only when its framework is
    loaded: otherwise it cannot be one)."""
    keras = sys.modules.get("keras")
    if keras is not None and isinstance(model, keras.layers.Layer):
        return True
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return False
    if isinstance(model, tf.types.experimental.GenericFunction):
        return True
    # what tf.saved_model.load returns: a trackable object of TensorFlow's with its signatures
    return type(model).__module__.startswith("tensorflow.") and "serving_default" in (
        getattr(model, "signatures", None) or {})


def is_tensorflow_path(model: object) -> bool:
    """Whether ``model`` is the path of a SavedModel folder or a ``.keras`` file (it need not be a valid one)."""
    if not isinstance(model, str | os.PathLike):
        return False
    path = Path(model)
    return (path.is_dir() and (path / "saved_model.pb").is_file()) or path.suffix.lower() == KERAS_SUFFIX


@dataclass
class TensorFlowImport:
    """A converted TensorFlow model: its graph, the ONNX model tf2onnx wrote, what was compiled, and
    stage timings.  ``layers`` maps ONNX node names to the Keras layer path each came from (where
    known); ``keras_model`` is the Keras model, when there is one; ``function`` is the inference-mode
    ``tf.function`` that was converted (inputs by position, a list of outputs in order): the source
    framework's run of the model, for verification."""

    graph: Graph
    onnx_model: Any
    sha256: str
    kind: str
    layers: dict[str, str] = field(default_factory=dict)
    keras_model: Any = None
    function: Any = None
    seconds: dict[str, float] = field(default_factory=dict)


def load_tensorflow(model: Any, input_spec: Any = None, dims: Mapping[str, SymbolInfo] | None = None) -> TensorFlowImport:
    """Convert ``model`` (a Keras model, ``tf.function``, loaded SavedModel, SavedModel folder or
    ``.keras`` file) for the inputs ``input_spec`` describes; ``dims`` constrains its symbols."""
    import cuvil.ops  # noqa: F401  (registers the op set)
    from cuvil.frontends.tensorflow.convert import import_onnx
    from cuvil.frontends.tensorflow.layers import LayerNames

    seconds: dict[str, float] = {}
    proto, obj, kind, fn = _to_onnx(model, input_spec, seconds)
    names = LayerNames.of(obj)
    t0 = time.perf_counter()
    graph = import_onnx(proto, names, dims)
    graph.name = fn.name
    seconds["convert"] = time.perf_counter() - t0
    data = proto.SerializeToString(deterministic=True)
    layers = {n.name: layer for n in proto.graph.node if (layer := names.layer_of(n.name))}
    keras = sys.modules.get("keras")
    keras_model = obj if keras is not None and isinstance(obj, keras.layers.Layer) else None
    log.debug("converted %s %r: %d ONNX nodes, %d Cuvil nodes (tf2onnx %.3f s, import %.3f s)", kind, fn.name,
              len(proto.graph.node), len(graph.nodes), seconds["tf2onnx"], seconds["convert"])
    return TensorFlowImport(graph, proto, hashlib.sha256(data).hexdigest(), kind, layers, keras_model, fn.function,
                            seconds)


def to_onnx(model: Any, input_spec: Any = None) -> Any:
    """The ONNX ModelProto tf2onnx writes for ``model`` in inference mode (steps 1 to 3 above, without
    the import): what ``cuvil inspect`` tabulates."""
    return _to_onnx(model, input_spec, {})[0]


def _to_onnx(model: Any, input_spec: Any, seconds: dict[str, float]) -> tuple[Any, Any, str, Any]:
    from cuvil.frontends.tensorflow.convert import convert_function
    from cuvil.frontends.tensorflow.layers import LayerNames, check_inference_mode
    from cuvil.frontends.tensorflow.signature import inference_function

    t0 = time.perf_counter()
    obj, kind = _load(model)
    seconds["load"] = time.perf_counter() - t0
    fn = inference_function(obj, input_spec)
    t0 = time.perf_counter()
    check_inference_mode(fn.function, fn.specs, LayerNames.of(obj))
    proto = convert_function(fn)
    seconds["tf2onnx"] = time.perf_counter() - t0
    return proto, obj, kind, fn


def _load(model: Any) -> tuple[Any, str]:
    """The model object and what it is (``cuvil.CompileInfo.source_kind``)."""
    if not isinstance(model, str | os.PathLike):
        loaded_keras = sys.modules.get("keras")
        if loaded_keras is not None and isinstance(model, loaded_keras.layers.Layer):
            return model, "keras model"
        if hasattr(model, "signatures"):
            return model, "tensorflow savedmodel"
        return model, "tf.function"
    path = Path(model)
    if path.suffix.lower() == KERAS_SUFFIX:
        if not path.is_file():
            raise ModelError(f"{path}: no such file")
        import keras

        try:
            return keras.models.load_model(path, compile=False), "keras file"
        except Exception as exc:
            raise ModelError(f"{path}: Keras could not load it: {type(exc).__name__}: {exc}") from exc
    import tensorflow as tf

    try:
        loaded = tf.saved_model.load(os.fspath(path))
    except Exception as exc:
        raise ModelError(f"{path}: TensorFlow could not load the SavedModel: {type(exc).__name__}: {exc}") from exc
    if "serving_default" not in (getattr(loaded, "signatures", None) or {}):
        raise ModelError(f"{path}: the SavedModel has no serving_default signature (its signatures: "
                         f"{', '.join(sorted(loaded.signatures)) or 'none'}): save it with model.export(path) or "
                         "tf.saved_model.save(obj, path, signatures=...)")
    return loaded, "tensorflow savedmodel"


__all__ = ["ONNX_OPSET", "TensorFlowImport", "is_tensorflow_model", "is_tensorflow_path", "load_tensorflow", "to_onnx"]
