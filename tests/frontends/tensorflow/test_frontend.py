"""The TensorFlow front end on small models: what input_spec takes and the symbols it makes, the
model forms (Keras functional / sequential / subclassed, tf.function, SavedModel, .keras file),
the refusals (training-mode semantics, ops that cannot be compiled, with their Keras layers), and
the command line on a SavedModel folder.  Tolerance: relative L2 <= 1e-5 against TensorFlow."""

from __future__ import annotations

import contextlib
import io
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="the TensorFlow front end needs tensorflow (pip install 'cuvil[tensorflow]')")
pytest.importorskip("tf2onnx", reason="the TensorFlow front end needs tf2onnx (pip install 'cuvil[tensorflow]')")
import keras  # noqa: E402

import cuvil  # noqa: E402
from cuvil.cli import main  # noqa: E402
from cuvil.errors import CuvilError, InputError, ModelError, UnsupportedOpError  # noqa: E402
from cuvil.frontends.tensorflow import is_tensorflow_model, is_tensorflow_path  # noqa: E402
from cuvil.frontends.tensorflow.layers import LayerNames  # noqa: E402
from cuvil.metrics import relative_l2  # noqa: E402
from tests.frontends.tensorflow import models  # noqa: E402
from tests.support.paths import REPO  # noqa: E402

L = keras.layers
RTOL_L2 = 1e-5
# Keras's own use of NumPy 2's deprecated __array__ signature while exporting a SavedModel
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def mlp() -> tuple[Any, np.ndarray]:
    return models.build("mlp", batch=3)


def close(got: np.ndarray, want: Any) -> bool:
    want = want.numpy() if hasattr(want, "numpy") else want
    return relative_l2(np.asarray(got), np.asarray(want)) <= RTOL_L2


def test_none_dims_become_symbols_that_dims_constrains(mlp: tuple[Any, np.ndarray]) -> None:
    model, x = mlp
    spec = [tf.TensorSpec((None, 20), tf.float32)]
    m = cuvil.compile(model, input_spec=spec, dims={"batch": (1, 4)})
    assert [(s.name, str(s.type)) for s in m.input_specs] == [("features", "f32[batch, 20]")]
    assert [s.name for s in m.output_specs] == ["scores"]  # the Keras model's own output name
    assert (m.symbols["batch"].min, m.symbols["batch"].max) == (1, 4)
    assert close(m(x)[0], model(x, training=False))
    with pytest.raises(InputError, match="batch"):
        m(np.zeros((5, 20), np.float32))
    with pytest.raises(CuvilError, match="no symbolic dim 'n'"):
        cuvil.compile(model, input_spec=spec, dims={"n": (1, 4)})


def test_input_spec_forms(mlp: tuple[Any, np.ndarray]) -> None:
    model, x = mlp
    named = cuvil.compile(model, input_spec=[cuvil.TensorSpec(("rows", 20), "float32")])
    assert str(named.input_specs[0].type) == "f32[rows, 20]" and list(named.symbols) == ["rows"]
    static = cuvil.compile(model, input_spec=[x])
    assert str(static.input_specs[0].type) == "f32[3, 20]" and not static.symbols
    assert close(static(x)[0], model(x, training=False))
    inner = keras.Input((6, 4), name="seq")
    two = keras.Model(inner, L.Dense(2, name="d")(inner))
    m = cuvil.compile(two, input_spec=[tf.TensorSpec((None, None, 4), tf.float32)])
    assert str(m.input_specs[0].type) == "f32[batch, seq_dim1, 4]"
    with pytest.raises(CuvilError, match=r"expected a tf\.TensorSpec"):
        cuvil.compile(model, input_spec=["features"])


def test_subclassed_model_and_tf_function() -> None:
    class Gated(keras.Model):
        def __init__(self) -> None:
            super().__init__(name="gated")
            self.value = L.Dense(8, name="value")
            self.gate = L.Dense(8, activation="sigmoid", name="gate")

        def call(self, x: Any, training: bool = False) -> Any:
            return self.value(x) * self.gate(x)

    keras.utils.set_random_seed(0)
    model = Gated()
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    model(x)
    with pytest.raises(CuvilError, match="needs input_spec"):
        cuvil.compile(model)
    m = cuvil.compile(model, input_spec=[tf.TensorSpec((None, 5), tf.float32, name="x")])
    assert m.input_names == ["x"] and m.info.source_kind == "keras model"
    assert close(m(x)[0], model(x))

    fn = tf.function(lambda t: tf.nn.relu(model(t)) + 1.0, input_signature=[tf.TensorSpec((None, 5), tf.float32)])
    assert is_tensorflow_model(fn)
    f = cuvil.compile(fn)
    assert f.info.source_kind == "tf.function" and str(f.input_specs[0].type) == "f32[batch, 5]"
    assert close(f(x)[0], fn(x))


def test_savedmodel_and_keras_file(tmp_path: Path, mlp: tuple[Any, np.ndarray]) -> None:
    model, x = mlp
    saved = tmp_path / "saved"
    model.export(str(saved), verbose=False)
    assert is_tensorflow_path(saved) and not is_tensorflow_path(tmp_path)
    m = cuvil.compile(str(saved))
    assert m.info.source_kind == "tensorflow savedmodel" and str(m.input_specs[0].type) == "f32[batch, 20]"
    assert close(m(x)[0], model(x, training=False))
    m2 = cuvil.compile(tf.saved_model.load(str(saved)))
    assert close(m2(x)[0], model(x, training=False))
    path = tmp_path / "mlp.keras"
    model.save(path)
    k = cuvil.compile(str(path))
    assert k.info.source_kind == "keras file" and close(k(x)[0], model(x, training=False))
    with pytest.raises(ModelError, match="no such file"):
        cuvil.compile(str(tmp_path / "missing.keras"))


def test_training_mode_semantics_are_refused() -> None:
    class Trains(keras.Model):
        def __init__(self) -> None:
            super().__init__(name="trains")
            self.dense = L.Dense(8, name="dense")
            self.bn = L.BatchNormalization(name="bn")
            self.drop = L.Dropout(0.5, name="drop")

        def call(self, x: Any, training: bool = False) -> Any:
            return self.drop(self.bn(self.dense(x), training=True), training=True)

    model = Trains()
    model(np.zeros((2, 4), np.float32))
    with pytest.raises(ModelError) as info:
        cuvil.compile(model, input_spec=[tf.TensorSpec((None, 4), tf.float32)])
    text = str(info.value)
    assert "training-mode semantics" in text and "training=False" in text
    assert "layer 'bn' updates its variables as it runs (AssignVariableOp)" in text
    assert "layer 'drop' draws random numbers" in text


def test_ops_that_cannot_be_compiled_are_one_error_naming_their_layers() -> None:
    inp = keras.Input((8,), name="v")
    y = L.Dense(8, name="dense")(inp)
    y = L.Lambda(lambda t: tf.math.lgamma(t) + tf.math.igamma(t, t), name="special")(y)
    y = L.Lambda(lambda t: tf.bitcast(t, tf.int32), name="bits")(y)
    model = keras.Model(inp, y, name="odd")
    with pytest.raises(UnsupportedOpError) as info:
        cuvil.compile(model)
    uses = {u.op_type: u for u in info.value.uses}
    assert {"Lgamma", "Igamma", "Bitcast"} <= set(uses)
    assert uses["Lgamma"].domain == "tensorflow" and uses["Lgamma"].layers == ("special",)
    assert uses["Bitcast"].layers == ("bits",)
    text = str(info.value)
    assert "tensorflow::Lgamma: a TensorFlow op tf2onnx has no conversion for" in text
    assert "in layer 'special'" in text


def test_layer_names_of_op_names() -> None:
    enc = models.transformer()
    names = LayerNames.of(enc)
    assert names.layer_of("encoder_1/ln1_1/batchnorm/mul") == "ln1"
    assert names.layer_of("StatefulPartitionedCall/encoder_1/mha_1/query_1/einsum/Einsum") == "mha/query"
    assert names.layer_of("encoder_1/ff1_1/MatMul__12") == "ff1"
    assert names.layer_of("const_fold_opt__19") is None
    # without a Keras model (a tf.function, a SavedModel): the op's name scope
    assert LayerNames.of(None).layer_of("StatefulPartitionedCall/m_1/d_1/MatMul") == "m_1/d_1"


@pytest.mark.slow
def test_cli_compiles_a_savedmodel_folder_and_runs_the_artifact(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                mlp: tuple[Any, np.ndarray]) -> None:
    model, _ = mlp
    saved = tmp_path / "saved"
    model.export(str(saved), verbose=False)
    art = tmp_path / "art"
    assert main(["compile", str(saved), "-t", "native", "-o", str(art)]) == 0
    out = capsys.readouterr().out
    assert "input  features: f32[batch, 20]" in out and f"saved to {art}" in out
    assert main(["run", str(art), "--random", "--seed", "0"]) == 0
    assert "output_0: float32[1, 4]" in capsys.readouterr().out  # the SavedModel signature's output name
    assert main(["run", str(saved), "--random"]) == 0  # a SavedModel folder is compiled, not loaded
    assert "output_0: float32[" in capsys.readouterr().out
    assert main(["inspect", str(saved)]) == 0  # the op table of tf2onnx's conversion
    out = capsys.readouterr().out
    assert "producer: tf2onnx" in out and re.search(r"^MatMul\s+3\s+yes$", out, re.M), out
    assert main(["opt", str(saved), "--passes", "canonicalize"]) == 0
    assert "graph saved_model(%features: f32[batch, 20])" in capsys.readouterr().out


@pytest.mark.slow
def test_debug_log_names_the_transposes_left(caplog: pytest.LogCaptureFixture) -> None:
    model, _ = models.build("mobilenet")
    with caplog.at_level(logging.DEBUG, logger="cuvil"):
        m = cuvil.compile(model, target="native")
    left = [n for n in m.graph.walk() if n.op == "transpose"]
    lines = [r.getMessage() for r in caplog.records if "transpose" in r.getMessage() and "left" in r.getMessage()]
    assert lines and lines[0].startswith(f"transposes left after the passes: {len(left)}")
    # tf2onnx's transpose of the NHWC input and the layout pass's inverse of it cancelled
    assert not any(n.inputs[0] is m.graph.inputs[0] for n in left)


def test_readme_example_runs() -> None:
    """The README's TensorFlow section: its Python block, run here (TensorFlow is loaded already)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### TensorFlow and Keras models"):]
    section = section[: section.index("\n## ")]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert out.getvalue().splitlines() == ["[TensorSpec('image', f32[batch, 32, 32, 3])]", "True"]


def test_an_onnx_op_cuvil_does_not_import_names_its_keras_layer() -> None:
    """An ONNX op tf2onnx emits that Cuvil has no importer for (here a hand-written node named as
    tf2onnx names it, after its TensorFlow op) is reported in the ONNX domain, with its layer."""
    from onnx import TensorProto, helper

    from cuvil.frontends.tensorflow.convert import import_onnx

    inp = keras.Input((4,), name="x")
    model = keras.Model(inp, L.Dense(4, name="head")(inp), name="net")
    node = helper.make_node("Multinomial", ["x"], ["y"], name="net_1/head_1/Multinomial")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOpError) as info:
        import_onnx(proto, LayerNames.of(model), None)
    (use,) = info.value.uses
    assert (use.op_type, use.domain, use.layers) == ("Multinomial", "", ("head",))
    assert "ai.onnx::Multinomial (opset 17): tf2onnx converts to this ONNX op, which Cuvil does not import" in str(
        info.value)
    assert "in layer 'head'" in str(info.value)


def test_outputs_keep_the_models_order_and_names() -> None:
    # tf2onnx flattens outputs by sorted name: the front end keeps the model's order
    keras.utils.set_random_seed(0)
    inp = keras.Input((12, 12, 3), name="image")
    x = L.DepthwiseConv2D(3, padding="same", name="dw")(L.Conv2D(8, 3, strides=2, padding="same", name="c1")(inp))
    model = keras.Model(inp, [L.Conv2D(4, 1, name="seg")(x), L.Dense(3, name="fc")(L.Flatten(name="flat")(x))])
    m = cuvil.compile(model)
    assert m.output_names == ["seg", "fc"]
    x = np.random.default_rng(0).standard_normal((2, 12, 12, 3)).astype(np.float32)
    for got, want in zip(m(x), model(x, training=False)):
        assert close(got, want)


def test_two_inputs_by_position_and_by_name() -> None:
    keras.utils.set_random_seed(0)
    a, b = keras.Input((6,), name="a"), keras.Input((3,), name="b")
    model = keras.Model([a, b], L.Dense(2, name="out")(L.Concatenate(name="cat")([a, b])))
    rng = np.random.default_rng(0)
    xa, xb = rng.standard_normal((2, 6)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    want = model([xa, xb], training=False)
    m = cuvil.compile(model)
    assert m.input_names == ["a", "b"] and [str(s.type) for s in m.input_specs] == ["f32[batch, 6]", "f32[batch, 3]"]
    assert close(m(xa, xb)[0], want)
    named = cuvil.compile(model, input_spec={"b": tf.TensorSpec((None, 3)), "a": tf.TensorSpec((None, 6))})
    assert named.input_names == ["a", "b"] and close(named(xa, xb)[0], want)
    with pytest.raises(CuvilError, match="the model's inputs are"):
        cuvil.compile(model, input_spec={"a": tf.TensorSpec((None, 6))})
