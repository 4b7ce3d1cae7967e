"""The model argument of ``cuvil verify``: what the user names, as a :class:`ModelSource`.

- ``model.onnx``: an ONNX file (read and checked once; external data loaded);
- ``path/to/file.py:factory``: a Python file and a function in it; ``factory()`` returns
  ``(module, input_spec)`` or ``(module, input_spec, dynamic_shapes)`` with the meanings of
  ``cuvil.compile``'s arguments of those names (a PyTorch ``nn.Module`` in eval mode), or
  ``(keras_model, input_spec)`` (a Keras model, ``tf.function`` or loaded SavedModel; ``input_spec``
  None where the model declares its inputs);
- a TensorFlow SavedModel folder or a ``.keras`` file;
- from Python, also an ONNX ``ModelProto``, a Cuvil ``Graph``, a PyTorch module (with
  ``input_spec=``) or a ready ``ModelSource``.

Anything else is a usage error (:class:`VerifyError`, exit status 2), raised before any check runs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from cuvil.errors import CuvilError
from cuvil.ir.graph import Graph
from cuvil.verify.base import VerifyError
from cuvil.verify.context import ModelSource


def split_factory(text: str) -> tuple[Path, str] | None:
    """``("path/to/file.py", "factory")`` for a ``file.py:factory`` argument, else None."""
    head, sep, name = text.rpartition(":")
    if not sep or not head.endswith(".py"):
        return None
    if not name.isidentifier():
        raise VerifyError(f"{text}: {name!r} is not a function name (expected path/to/file.py:factory)")
    return Path(head), name


def _import_file(path: Path) -> Any:
    if not path.is_file():
        raise VerifyError(f"{path}: no such file")
    name = f"_cuvil_verify_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise VerifyError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    # the file may import its neighbours, as it could when run as a script
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise VerifyError(f"{path}: importing it failed: {type(exc).__name__}: {exc}") from exc
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return module


def load_factory(path: Path, name: str) -> ModelSource:
    """Call ``name()`` in the Python file ``path`` and wrap what it returns."""
    module = _import_file(path)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise VerifyError(f"{path}: has no function {name!r}")
    try:
        made = factory()
    except Exception as exc:
        raise VerifyError(f"{path}:{name}() failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise VerifyError(f"{path}:{name}() must return (module, input_spec) or (module, input_spec, dynamic_shapes), "
                          f"not {type(made).__name__}")
    model, input_spec, *rest = made
    if _is_tensorflow(model):
        if rest:
            raise VerifyError(f"{path}:{name}() returned dynamic_shapes, which apply to PyTorch modules; a TensorFlow "
                              "model's dynamic dims are the None dims of its input_spec")
        return ModelSource("tensorflow", model, input_spec, label=f"{path}:{name}")
    if input_spec is None:
        raise VerifyError(f"{path}:{name}() returned no input_spec: a PyTorch module needs one to be exported")
    return ModelSource("torch", model, input_spec, rest[0] if rest else None, label=f"{path}:{name}")


def load_model(model: Any, *, input_spec: Any = None, dynamic_shapes: Any = None, label: str | None = None) -> ModelSource:
    """The model to verify, from a command-line argument or a Python object."""
    if isinstance(model, ModelSource):
        return model
    if isinstance(model, Graph):
        return ModelSource("graph", model, label=label or model.name or "graph")
    if isinstance(model, (str, Path)):
        text = str(model)
        factory = split_factory(text)
        if factory is not None:
            return load_factory(*factory)
        if _is_tensorflow(text):
            return ModelSource("tensorflow", text, input_spec, label=label or text)
        return _onnx(text, label or text)
    if type(model).__name__ == "ModelProto":
        return _onnx(model, label or (model.graph.name or "model"))
    if _is_tensorflow(model):
        return ModelSource("tensorflow", model, input_spec, label=label or str(getattr(model, "name", "model")))
    if _is_torch(model):
        if input_spec is None:
            raise VerifyError("a PyTorch module needs input_spec= (example tensors or cuvil.TensorSpec objects)")
        return ModelSource("torch", model, input_spec, dynamic_shapes, label=label or type(model).__name__)
    raise VerifyError(f"cannot verify a {type(model).__name__}: give an ONNX file, path/to/file.py:factory, an ONNX "
                      "ModelProto, a Cuvil Graph, a PyTorch module or a TensorFlow model")


def _onnx(model: Any, label: str) -> ModelSource:
    from cuvil.frontends.onnx import read_model

    if isinstance(model, str) and not model.endswith(".onnx") and not Path(model).is_file():
        raise VerifyError(f"{model}: no such file (expected an ONNX file or path/to/file.py:factory)")
    try:
        proto, _ = read_model(model)
    except CuvilError as exc:
        raise VerifyError(str(exc)) from exc
    return ModelSource("onnx", proto, label=label)


def _is_torch(model: Any) -> bool:
    # torch is only imported by the torch front end, and a torch module exists only once torch is loaded
    if "torch" not in sys.modules:
        return False
    from cuvil.frontends.torch.export import is_torch_model

    return bool(is_torch_model(model))


def _is_tensorflow(model: Any) -> bool:
    # a SavedModel folder or .keras file, or a Keras / tf.function object (its framework is loaded then)
    from cuvil.frontends.tensorflow import is_tensorflow_model, is_tensorflow_path

    return bool(is_tensorflow_path(model) or is_tensorflow_model(model))
