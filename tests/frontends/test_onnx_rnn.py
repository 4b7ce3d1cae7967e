"""ONNX RNN, GRU and LSTM, unrolled by the importer (cuvil/frontends/onnx/ops_rnn.py), against
onnxruntime: directions, layouts, biases, initial states, peepholes, clip, activation lists with
their parameters, sequence_lens, weights as initializers or as inputs; and the refusals."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil
from cuvil.errors import CuvilError

ort = pytest.importorskip("onnxruntime")

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 6


def _model(op: str, attrs: dict[str, Any], *, layout: int = 0, bias: bool = True, initial: bool = False,
           peepholes: bool = False, lens: bool = False, weights_as_inputs: bool = False,
           batch: int | str = BATCH) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(len(op) + len(attrs))  # the same operands for either layout
    nd = 2 if attrs.get("direction") == "bidirectional" else 1
    g = GATES[op]
    x_shape: list[int | str] = [batch, SEQ, INPUT] if layout else [SEQ, batch, INPUT]
    state_shape: list[int | str] = [batch, nd, HIDDEN] if layout else [nd, batch, HIDDEN]
    consts = {"W": rng.standard_normal((nd, g * HIDDEN, INPUT)).astype(np.float32) * 0.5,
              "R": rng.standard_normal((nd, g * HIDDEN, HIDDEN)).astype(np.float32) * 0.5}
    if bias:
        consts["B"] = rng.standard_normal((nd, 2 * g * HIDDEN)).astype(np.float32) * 0.3
    feeds = {"X": rng.standard_normal([BATCH if isinstance(d, str) else d for d in x_shape]).astype(np.float32)}
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    names = ["X", "W", "R", "B" if bias else "", "", "", "", ""]
    if lens:
        names[4] = "sequence_lens"
        inputs.append(helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, [batch]))
        feeds["sequence_lens"] = np.array([SEQ, 2, 0][:BATCH], np.int32)
    if initial:
        names[5] = "initial_h"
        inputs.append(helper.make_tensor_value_info("initial_h", TensorProto.FLOAT, state_shape))
        feeds["initial_h"] = rng.standard_normal([BATCH if isinstance(d, str) else d for d in state_shape]).astype(
            np.float32)
        if op == "LSTM":
            names[6] = "initial_c"
            inputs.append(helper.make_tensor_value_info("initial_c", TensorProto.FLOAT, state_shape))
            feeds["initial_c"] = rng.standard_normal(feeds["initial_h"].shape).astype(np.float32)
    if peepholes:
        names[7] = "P"
        consts["P"] = rng.standard_normal((nd, 3 * HIDDEN)).astype(np.float32) * 0.3
    n_in = 8 if op == "LSTM" else 6
    names = names[:n_in]
    while names and not names[-1]:
        names.pop()
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, hidden_size=HIDDEN, **({"layout": layout} if layout else {}), **attrs)
    inits = []
    for k, v in consts.items():
        if weights_as_inputs:
            inputs.append(helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)))
            feeds[k] = v
        else:
            inits.append(onnx.numpy_helper.from_array(v, k))
    graph = helper.make_graph([node], op.lower(), inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                           for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    return model, feeds


CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "rnn-defaults": ("RNN", {}, {}),
    "rnn-bidirectional-relu-lens": ("RNN", {"direction": "bidirectional", "activations": ["Relu", "Tanh"]},
                                    {"lens": True, "initial": True}),
    "rnn-reverse-batchwise": ("RNN", {"direction": "reverse"}, {"layout": 1, "initial": True}),
    "gru-defaults": ("GRU", {}, {}),
    "gru-linear-before-reset": ("GRU", {"linear_before_reset": 1}, {"initial": True}),
    "gru-lbr-weights-as-inputs": ("GRU", {"linear_before_reset": 1, "direction": "bidirectional"},
                                  {"weights_as_inputs": True}),
    "gru-bidirectional-lens-batchwise": ("GRU", {"direction": "bidirectional"}, {"lens": True, "layout": 1}),
    "gru-activation-params": ("GRU", {"activations": ["HardSigmoid", "ScaledTanh"], "activation_alpha": [0.3, 0.8],
                                      "activation_beta": [0.4, 1.2]}, {}),
    "lstm-defaults": ("LSTM", {}, {}),
    "lstm-peepholes-initial": ("LSTM", {}, {"peepholes": True, "initial": True}),
    "lstm-bidirectional-lens": ("LSTM", {"direction": "bidirectional"}, {"lens": True, "peepholes": True}),
    "lstm-reverse-batchwise-inputs": ("LSTM", {"direction": "reverse"},
                                      {"layout": 1, "initial": True, "weights_as_inputs": True}),
    "lstm-clip": ("LSTM", {"clip": 0.7}, {"initial": True}),
    "gru-clip": ("GRU", {"clip": 0.5, "linear_before_reset": 1}, {"initial": True}),
    "rnn-clip": ("RNN", {"clip": 0.4}, {}),
    "lstm-activations": ("LSTM", {"activations": ["LeakyRelu", "Affine", "Softsign"], "activation_alpha": [0.1, 0.5],
                                  "activation_beta": [0.2]}, {}),
    "lstm-no-bias-symbolic-batch": ("LSTM", {}, {"bias": False, "batch": "batch"}),
}


@pytest.mark.parametrize("target", ["ref", "native"])
@pytest.mark.parametrize("case", list(CASES))
def test_recurrent_op_matches_onnxruntime(case: str, target: str, tmp_path: Any) -> None:
    op, attrs, kw = CASES[case]
    model, feeds = _model(op, attrs, **kw)
    want = _onnxruntime(op, attrs, kw, feeds)
    m = cuvil.compile(model, target, cache_dir=str(tmp_path))
    got = m(*[feeds[i.name] for i in model.graph.input])
    assert len(got) == len(want)
    for name, g, w in zip(["Y", "Y_h", "Y_c"], got, want):
        assert g.shape == w.shape, (name, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"{case} {name}")


def _onnxruntime(op: str, attrs: dict[str, Any], kw: dict[str, Any], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs; it runs layout 0 only, so a layout-1 case runs as the layout-0 model of the
    same operands, its inputs and outputs transposed."""
    if not kw.get("layout"):
        model, _ = _model(op, attrs, **kw)
        return list(ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds))
    model, _ = _model(op, attrs, **{**kw, "layout": 0})
    swapped = {k: (np.ascontiguousarray(np.swapaxes(v, 0, 1)) if k in ("X", "initial_h", "initial_c") else v)
               for k, v in feeds.items()}
    outs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, swapped)
    return [np.transpose(outs[0], (2, 0, 1, 3)), *(np.swapaxes(o, 0, 1) for o in outs[1:])]


def test_pytorch_lstm_and_gru_exported_to_onnx_match_onnxruntime(tmp_path: Any) -> None:
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(4, 8, num_layers=2, batch_first=True, bidirectional=True)
            self.gru = torch.nn.GRU(16, 5, batch_first=True)

        def forward(self, x: Any) -> Any:
            return self.gru(self.lstm(x)[0])[0]

    torch.manual_seed(0)
    path = tmp_path / "rnn.onnx"
    x = torch.randn(2, 7, 4)
    torch.onnx.export(Net().eval(), (x,), str(path), dynamo=False, opset_version=17, input_names=["x"])
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    got = cuvil.compile(str(path), "native", cache_dir=str(tmp_path))(x.numpy())[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("op", "attrs", "kw", "message"), [
    ("LSTM", {"input_forget": 1}, {}, "input_forget=1"),
    ("GRU", {"activations": ["Sigmoid", "Gelu"]}, {}, "activation 'Gelu'"),
    ("RNN", {}, {"layout": 0, "seq": "steps"}, "sequence length steps"),
    ("RNN", {"direction": "sideways"}, {}, "direction must be"),
])
def test_what_the_importer_cannot_unroll_is_refused_by_name(op: str, attrs: dict[str, Any], kw: dict[str, Any],
                                                           message: str) -> None:
    seq = kw.pop("seq", None)
    model, _ = _model(op, attrs, **kw)
    if seq is not None:
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = seq
    with pytest.raises(CuvilError) as info:
        cuvil.compile(model, "ref")
    assert message in str(info.value) and op in str(info.value), str(info.value)
