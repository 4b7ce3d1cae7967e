"""ONNX RNN, GRU and LSTM (cuvil/frontends/onnx/ops_rnn.py, cuvil/frontends/recurrent.py) against
onnxruntime: directions, layouts, biases, initial states, peepholes, clip, activation lists with
their parameters, sequence_lens, weights as initializers or as inputs; short static sequences
(unrolled), long static and symbolic ones (a loop over the run-time length), a CRNN exported by
torch.onnx; and the refusals."""

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


@pytest.mark.parametrize("case", list(CASES))
def test_recurrent_op_matches_onnxruntime(case: str, tmp_path: Any) -> None:
    op, attrs, kw = CASES[case]
    model, feeds = _model(op, attrs, **kw)
    want = _onnxruntime(op, attrs, kw, feeds)
    m = cuvil.compile(model, "ref", cache_dir=str(tmp_path))
    got = m(*[feeds[i.name] for i in model.graph.input])
    assert len(got) == len(want)
    for name, g, w in zip(["Y", "Y_h", "Y_c"], got, want):
        assert g.shape == w.shape, (name, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"{case} {name}")


@pytest.mark.slow
def test_recurrent_ops_match_onnxruntime_natively(tmp_path: Any) -> None:
    """Every case above, as one model: one C build."""
    m = cuvil.compile(_combined(CASES, steps=SEQ), "native", cache_dir=str(tmp_path))
    _assert_matches_onnxruntime(m, CASES, lengths=(SEQ,), steps=SEQ)


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


@pytest.mark.slow
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
    ("RNN", {"direction": "sideways"}, {}, "direction must be"),
])
def test_what_the_importer_cannot_build_is_refused_by_name(op: str, attrs: dict[str, Any], kw: dict[str, Any],
                                                          message: str) -> None:
    model, _ = _model(op, attrs, **kw)
    with pytest.raises(CuvilError) as info:
        cuvil.compile(model, "ref")
    assert message in str(info.value) and op in str(info.value), str(info.value)


# symbolic and long sequences: one model of many recurrent nodes, built once per target ---------------------

LONG = 20  # a static length above UNROLL_MAX_STEPS: looped, not unrolled
RUN_LENGTHS = (4, 23)  # the run-time lengths each compiled symbolic model runs at

# name -> (op, attributes, options): every op x direction, plain and with sequence_lens and initial states,
# then the other operands and attributes; "x" names the input a node reads (X: [steps, batch, input];
# X_bw: its layout-1 form [batch, steps, input]; X_long: [LONG, batch, input])
GRID: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    f"{op.lower()}-{direction}{'-lens-initial' if full else ''}": (
        op, {"direction": direction}, {"lens": full, "initial": full})
    for op in ("RNN", "GRU", "LSTM") for direction in ("forward", "reverse", "bidirectional") for full in (False, True)
}
GRID.update({
    "lstm-batchwise-peepholes-clip": ("LSTM", {"direction": "bidirectional", "clip": 0.7},
                                      {"layout": 1, "peepholes": True, "lens": True, "initial": True}),
    "gru-lbr-weights-as-inputs": ("GRU", {"direction": "reverse", "linear_before_reset": 1},
                                  {"initial": True, "weights_as_inputs": True}),
    "gru-activation-params-batchwise": ("GRU", {"direction": "bidirectional",
                                                "activations": ["HardSigmoid", "ScaledTanh", "Sigmoid", "Tanh"],
                                                "activation_alpha": [0.3, 0.8], "activation_beta": [0.4, 1.2]},
                                        {"layout": 1, "lens": True}),
    "rnn-relu-clip-no-bias": ("RNN", {"activations": ["Relu"], "clip": 0.4}, {"bias": False, "initial": True}),
    "lstm-long-bidirectional-lens": ("LSTM", {"direction": "bidirectional"}, {"x": "X_long", "lens": True,
                                                                               "initial": True}),
    "gru-long-reverse": ("GRU", {"direction": "reverse"}, {"x": "X_long"}),
})


Cases = dict[str, tuple[str, dict[str, Any], dict[str, Any]]]


def _combined(cases: Cases, *, steps: int | str = "steps", for_onnxruntime: bool = False) -> onnx.ModelProto:
    """One model holding a recurrent node per case, its outputs named ``<case>.Y`` ..., over ``steps``
    steps (a symbol, or a static length); the weights are initializers unless a case takes them as
    inputs, and a case with a symbolic ``batch`` reads an input of its own.  ``for_onnxruntime`` writes
    each layout-1 node as its layout-0 equivalent between transposes (onnxruntime runs layout 0 only)."""
    f32, i32 = TensorProto.FLOAT, TensorProto.INT32
    inputs = {"X": helper.make_tensor_value_info("X", f32, [steps, BATCH, INPUT]),
              "lens": helper.make_tensor_value_info("lens", i32, [BATCH])}
    nodes, inits, outputs = [], [], []
    for n, (case, (op, attrs, kw)) in enumerate(cases.items()):
        rng = np.random.default_rng(100 + n)
        nd = 2 if attrs.get("direction") == "bidirectional" else 1
        g, layout = GATES[op], int(kw.get("layout", 0))
        x = kw.get("x", "X_bw" if layout else "X")
        if kw.get("batch", BATCH) != BATCH:
            x = f"{case}.X"
            inputs[x] = helper.make_tensor_value_info(x, f32, [steps, kw["batch"], INPUT])
        if x == "X_bw":
            inputs[x] = helper.make_tensor_value_info(x, f32, [BATCH, steps, INPUT])
        elif x == "X_long":
            inputs[x] = helper.make_tensor_value_info(x, f32, [LONG, BATCH, INPUT])
            inputs["lens_long"] = helper.make_tensor_value_info("lens_long", i32, [BATCH])
        weights = {"W": rng.standard_normal((nd, g * HIDDEN, INPUT)) * 0.5,
                   "R": rng.standard_normal((nd, g * HIDDEN, HIDDEN)) * 0.5}
        if kw.get("bias", True):
            weights["B"] = rng.standard_normal((nd, 2 * g * HIDDEN)) * 0.3
        if kw.get("peepholes"):
            weights["P"] = rng.standard_normal((nd, 3 * HIDDEN)) * 0.3
        for k, v in weights.items():
            name = f"{case}.{k}"
            if kw.get("weights_as_inputs"):
                inputs[name] = helper.make_tensor_value_info(name, f32, list(v.shape))
            else:
                inits.append(onnx.numpy_helper.from_array(v.astype(np.float32), name))
        state = [BATCH, nd, HIDDEN] if layout else [nd, BATCH, HIDDEN]
        names = [x, f"{case}.W", f"{case}.R", f"{case}.B" if "B" in weights else "",
                 ("lens_long" if x == "X_long" else "lens") if kw.get("lens") else "", "", "",
                 f"{case}.P" if "P" in weights else ""]
        if kw.get("initial"):
            for i, s in ((5, "h0"), (6, "c0")) if op == "LSTM" else ((5, "h0"),):
                names[i] = f"{case}.{s}"
                inputs[names[i]] = helper.make_tensor_value_info(names[i], f32, state)
        names = names[:8 if op == "LSTM" else 6]
        while not names[-1]:
            names.pop()
        outs = [f"{case}.{o}" for o in ("Y", "Y_h", "Y_c")[:3 if op == "LSTM" else 2]]
        outputs += [helper.make_tensor_value_info(o, f32, None) for o in outs]
        if layout and for_onnxruntime:
            moved = [f"{case}.t.{v}" if v and i in (0, 5, 6) else v for i, v in enumerate(names)]
            nodes += [helper.make_node("Transpose", [v], [m], perm=[1, 0, 2])
                      for i, (v, m) in enumerate(zip(names, moved)) if v and i in (0, 5, 6)]
            raw = [f"{o}.raw" for o in outs]
            nodes.append(helper.make_node(op, moved, raw, hidden_size=HIDDEN, **attrs))
            nodes += [helper.make_node("Transpose", [r], [o], perm=[2, 0, 1, 3] if k == 0 else [1, 0, 2])
                      for k, (r, o) in enumerate(zip(raw, outs))]
        else:
            nodes.append(helper.make_node(op, names, outs, hidden_size=HIDDEN, **attrs,
                                          **({"layout": 1} if layout else {})))
    graph = helper.make_graph(nodes, "recurrent", list(inputs.values()), outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def _feeds(model: onnx.ModelProto, steps: int) -> dict[str, np.ndarray]:
    """Inputs for a run of ``steps`` steps: one sequence runs them all, one about half, one none."""
    rng = np.random.default_rng(steps)
    out: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in ("lens", "lens_long"):
            n = steps if vi.name == "lens" else LONG
            out[vi.name] = np.array([n, n // 2 + 1, 0], np.int32)
            continue
        dims = [{"steps": steps, "batch": BATCH}[d.dim_param] if d.dim_param else d.dim_value
                for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = (rng.standard_normal(dims) * (0.5 if vi.name.endswith((".W", ".R")) else 1.0)).astype(
            np.float32)
    return out


def _assert_matches_onnxruntime(m: Any, cases: Cases, lengths: tuple[int, ...] = RUN_LENGTHS,
                                steps: int | str = "steps") -> None:
    model = _combined(cases, steps=steps)
    sess = ort.InferenceSession(_combined(cases, steps=steps, for_onnxruntime=True).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    for steps in lengths:
        feeds = _feeds(model, steps)
        want = dict(zip(names, sess.run(names, feeds)))
        got = dict(zip(m.output_names, m(*[feeds[i.name] for i in model.graph.input])))
        for name in names:
            assert got[name].shape == want[name].shape, (steps, name, got[name].shape, want[name].shape)
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=f"{name} at {steps} steps")


def test_symbolic_and_long_sequences_loop_over_the_run_time_length() -> None:
    """Each direction of a symbolic or long static sequence is one loop (none is unrolled), and the
    outputs keep the sequence length as a symbol."""
    from cuvil.frontends.onnx import convert_model

    graph = convert_model(_combined(GRID))
    loops = [n for n in graph.nodes if n.op == "loop"]
    directions = sum(2 if attrs.get("direction") == "bidirectional" else 1 for _, attrs, _ in GRID.values())
    assert len(loops) == directions
    assert not any(n.op == "gather" and n.inputs[0] is not None and n.inputs[0].type.rank == 3
                   and n.inputs[0].type.shape[0] in ("steps", LONG) for n in graph.nodes)
    types = {v.name: str(v.type) for v in graph.outputs}
    assert types["lstm-bidirectional-lens-initial.Y"] == f"f32[steps, 2, {BATCH}, {HIDDEN}]"
    assert types["gru-activation-params-batchwise.Y"] == f"f32[{BATCH}, steps, 2, {HIDDEN}]"
    assert types["lstm-long-bidirectional-lens.Y"] == f"f32[{LONG}, 2, {BATCH}, {HIDDEN}]"


def test_unrolling_stops_at_the_threshold() -> None:
    from cuvil.frontends.onnx import convert_model
    from cuvil.frontends.recurrent import UNROLL_MAX_STEPS

    for steps, loops in ((UNROLL_MAX_STEPS, 0), (UNROLL_MAX_STEPS + 1, 1)):
        model, _ = _model("GRU", {})
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = steps
        assert sum(n.op == "loop" for n in convert_model(model).nodes) == loops, steps


@pytest.mark.parametrize("target", ["ref", pytest.param("native", marks=pytest.mark.slow)])
def test_symbolic_length_matches_onnxruntime_at_two_lengths(target: str, tmp_path: Any) -> None:
    """One compiled model of every case, run at two run-time lengths."""
    m = cuvil.compile(_combined(GRID), target, cache_dir=str(tmp_path))
    _assert_matches_onnxruntime(m, GRID)


@pytest.mark.slow
def test_symbolic_length_on_wasm32(wasm_cache: str) -> None:
    pytest.importorskip("wasmtime")
    pytest.importorskip("ziglang")
    cases = {k: GRID[k] for k in ["lstm-bidirectional-lens-initial"]}
    m = cuvil.compile(_combined(cases), "wasm32", cache_dir=wasm_cache)
    _assert_matches_onnxruntime(m, cases)


@pytest.mark.slow
def test_crnn_over_a_symbolic_width_matches_onnxruntime(tmp_path: Any) -> None:
    """Conv layers, the feature map read as a sequence over the image width, a bidirectional LSTM and a
    classifier per step, as torch.onnx writes it with the width dynamic: one model, two widths."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class CRNN(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, 2),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d((2, 1), (2, 1)))
            self.rnn = nn.LSTM(16 * 4, 12, bidirectional=True)
            self.fc = nn.Linear(24, 10)

        def forward(self, image: Any) -> Any:
            f = self.conv(image)  # [batch, 16, 4, width / 2]
            b, c, h, w = f.shape
            y, _ = self.rnn(f.reshape(b, c * h, w).permute(2, 0, 1))  # over the width: [width / 2, batch, 24]
            return self.fc(y).log_softmax(-1)

    torch.manual_seed(0)
    path = tmp_path / "crnn.onnx"
    torch.onnx.export(CRNN().eval(), (torch.randn(2, 1, 16, 40),), str(path), dynamo=False, opset_version=17,
                      input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {3: "width"}, "logits": {0: "steps"}})
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = cuvil.compile(str(path), "ref")
    assert ref.graph is not None and sum(n.op == "loop" for n in ref.graph.walk()) == 2
    native = cuvil.compile(str(path), "native", cache_dir=str(tmp_path))
    for width in (40, 72):
        image = np.random.default_rng(width).standard_normal((2, 1, 16, width)).astype(np.float32)
        want = sess.run(None, {"image": image})[0]
        assert want.shape == (width // 2, 2, 10)
        for m in (ref, native):
            got = m(image)[0]
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"width {width}")
