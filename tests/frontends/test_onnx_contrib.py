"""onnxruntime's com.microsoft transformer ops (cuvil/frontends/onnx/ops_contrib*.py) against onnxruntime's
CPU kernels: every case is one node with seeded inputs; all cases share one model per target (one C build),
each case compared with onnxruntime running its own one-node model (atol 1e-5, rtol 1e-4).  BiasSoftmax
has no CPU kernel in onnxruntime and MultiHeadAttention's packed forms none either: their oracle is
onnxruntime on the equivalent model (Add + opset-11 Softmax; the unpacked inputs).  Then the refusals, and
(slow) a BERT-style encoder exported by torch.onnx and fused by onnxruntime's transformer optimizer."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil
from cuvil.errors import CuvilError

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
ATOL, RTOL = 1e-5, 1e-4
Shape = list[int | str]


@dataclass
class Case:
    """One node: ``inputs`` in the node's order (None leaves one out), ``sym`` symbolic shapes by input index
    (names are prefixed by the case's), ``outputs`` the output slots ("" leaves one out)."""

    op: str
    inputs: list[np.ndarray | None]
    attrs: dict[str, Any] = field(default_factory=dict)
    outputs: int | list[str] = 1
    domain: str = MS
    sym: dict[int, Shape] = field(default_factory=dict)
    oracle: Callable[[list[np.ndarray | None], dict[str, Any]], list[np.ndarray]] | None = None


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _f(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _ints(values: Any, dtype: Any = np.int32) -> np.ndarray:
    return np.asarray(values, dtype)


def _bias_softmax_oracle(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, b = inputs[0], inputs[1]
    assert x is not None and b is not None
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in (("x", x), ("b", b))]
    nodes = [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=attrs["axis"])]
    g = helper.make_graph(nodes, "g", vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    return list(ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x, "b": b}))


def _unpacked_mha_oracle(inputs: list[np.ndarray | None], attrs: dict[str, Any]) -> list[np.ndarray]:
    """MultiHeadAttention on the separate Q, K, V a packed query ([b, s, heads, 3, h]) or key ([.., 2, h]) holds."""
    q, k = inputs[0], inputs[1] if len(inputs) > 1 else None
    assert q is not None

    def flat(t: np.ndarray, i: int) -> np.ndarray:
        return np.ascontiguousarray(t[:, :, :, i].reshape(t.shape[0], t.shape[1], -1))

    if q.ndim == 5:
        parts = [flat(q, i) for i in range(3)]
    else:
        assert k is not None
        parts = [q, flat(k, 0), flat(k, 1)]
    unpacked: list[np.ndarray | None] = [*parts, *inputs[3:]]
    return _ort_case(Case("MultiHeadAttention", unpacked, attrs), "unpacked", None)


def _cases() -> dict[str, Case]:
    c: dict[str, Case] = {}

    def add(name: str, make: Callable[[np.random.Generator], Case]) -> None:
        c[name] = make(_rng(name))

    # activations
    add("gelu", lambda r: Case("Gelu", [_f(r, 2, 3, 8, scale=3)]))
    add("bias_gelu", lambda r: Case("BiasGelu", [_f(r, 2, 3, 8, scale=3), _f(r, 8)]))
    add("fast_gelu", lambda r: Case("FastGelu", [_f(r, 2, 3, 8, scale=3)]))
    add("fast_gelu_bias", lambda r: Case("FastGelu", [_f(r, 4, 8, scale=3), _f(r, 8)], sym={0: ["n", 8]}))
    add("quick_gelu", lambda r: Case("QuickGelu", [_f(r, 2, 3, 8, scale=3)]))
    add("quick_gelu_alpha", lambda r: Case("QuickGelu", [_f(r, 5, 7, scale=3)], {"alpha": 0.6}))
    # FusedMatMul
    add("matmul_alpha_broadcast", lambda r: Case("FusedMatMul", [_f(r, 2, 4, 5), _f(r, 5, 6)], {"alpha": 0.5}))
    add("matmul_trans", lambda r: Case("FusedMatMul", [_f(r, 2, 3, 5, 4), _f(r, 2, 3, 6, 5)],
                                       {"transA": 1, "transB": 1}))
    add("matmul_trans_batch_a", lambda r: Case("FusedMatMul", [_f(r, 4, 2, 3, 5), _f(r, 2, 3, 5, 6)],
                                               {"transBatchA": 1, "alpha": 2.0}))
    add("matmul_trans_batch_b", lambda r: Case("FusedMatMul", [_f(r, 3, 4, 5), _f(r, 6, 3, 5)],
                                               {"transBatchB": 1, "transB": 1}))
    add("matmul_all_flags", lambda r: Case("FusedMatMul", [_f(r, 5, 2, 3, 4), _f(r, 6, 2, 3, 5)],
                                           {"transA": 1, "transB": 1, "transBatchA": 1, "transBatchB": 1,
                                            "alpha": -1.5}))
    # normalizations
    add("skip_ln_all_outputs", lambda r: Case("SkipLayerNormalization",
                                              [_f(r, 2, 3, 8), _f(r, 2, 3, 8), _f(r, 8), _f(r, 8), _f(r, 8)],
                                              outputs=4))
    add("skip_ln_broadcast_skip", lambda r: Case("SkipLayerNormalization", [_f(r, 2, 3, 8), _f(r, 3, 8), _f(r, 8)],
                                                 {"epsilon": 1e-3}, sym={0: ["b", 3, 8]}))
    add("skip_ln_sum_only", lambda r: Case("SkipLayerNormalization",
                                           [_f(r, 2, 3, 8), _f(r, 1, 3, 8), _f(r, 8), None, _f(r, 8)],
                                           outputs=["y", "", "", "sum"]))
    add("skip_ln_tokens", lambda r: Case("SkipLayerNormalization", [_f(r, 6, 8), _f(r, 6, 8), _f(r, 8), _f(r, 8)]))
    add("rms_norm", lambda r: Case("SimplifiedLayerNormalization", [_f(r, 2, 3, 8), _f(r, 8)], outputs=2, domain=""))
    add("rms_norm_axis", lambda r: Case("SimplifiedLayerNormalization", [_f(r, 2, 3, 4, 5), _f(r, 4, 5)],
                                        {"axis": 2, "epsilon": 1e-2}, domain=""))
    add("skip_rms_norm", lambda r: Case("SkipSimplifiedLayerNormalization",
                                        [_f(r, 2, 3, 8), _f(r, 2, 3, 8), _f(r, 8), _f(r, 8)], outputs=4))
    add("skip_rms_norm_tokens", lambda r: Case("SkipSimplifiedLayerNormalization", [_f(r, 5, 8), _f(r, 5, 8), _f(r, 8)],
                                               {"epsilon": 1e-5}, sym={0: ["t", 8], 1: ["t", 8]}))
    add("embed_ln", lambda r: Case("EmbedLayerNormalization",
                                   [_ints(r.integers(0, 11, (2, 5))), _ints(r.integers(0, 2, (2, 5))), _f(r, 11, 8),
                                    _f(r, 7, 8), _f(r, 2, 8), _f(r, 8), _f(r, 8),
                                    _ints([[1, 1, 1, 0, 0], [1, 0, 1, 2, 1]])], outputs=3))
    add("embed_ln_position_ids", lambda r: Case("EmbedLayerNormalization",
                                                [_ints(r.integers(0, 11, (2, 5))), _ints(r.integers(0, 2, (2, 5))),
                                                 _f(r, 11, 8), _f(r, 7, 8), _f(r, 2, 8), _f(r, 8), _f(r, 8), None,
                                                 _ints(r.integers(0, 7, (2, 5)))], {"epsilon": 1e-5}, outputs=2))
    add("embed_ln_symbolic", lambda r: Case("EmbedLayerNormalization",
                                            [_ints(r.integers(0, 11, (3, 4))), None, _f(r, 11, 8), _f(r, 6, 8),
                                             None, _f(r, 8), _f(r, 8)], outputs=3, sym={0: ["b", "s"]}))
    add("embed_ln_position_row", lambda r: Case("EmbedLayerNormalization",
                                                [_ints(r.integers(0, 11, (2, 5))), None, _f(r, 11, 8), _f(r, 7, 8),
                                                 None, _f(r, 8), _f(r, 8), _ints(np.ones((2, 5))),
                                                 _ints(r.integers(0, 7, (1, 5)))], outputs=2))
    # RotaryEmbedding
    add("rope_4d", lambda r: Case("RotaryEmbedding", [_f(r, 2, 2, 3, 8), _ints(r.integers(0, 10, (2, 3)), np.int64),
                                                      _f(r, 10, 4), _f(r, 10, 4)]))
    add("rope_3d_interleaved", lambda r: Case("RotaryEmbedding",
                                              [_f(r, 2, 3, 16), _ints(r.integers(0, 10, (2, 3)), np.int64),
                                               _f(r, 10, 4), _f(r, 10, 4)], {"interleaved": 1}))
    add("rope_offset_symbolic", lambda r: Case("RotaryEmbedding",
                                               [_f(r, 2, 4, 16), _ints([3], np.int64), _f(r, 10, 4), _f(r, 10, 4)],
                                               {"num_heads": 2}, sym={0: ["b", "s", 16]}))
    add("rope_partial", lambda r: Case("RotaryEmbedding", [_f(r, 2, 3, 16), _ints(r.integers(0, 10, (2, 3)), np.int64),
                                                           _f(r, 10, 2), _f(r, 10, 2)],
                                       {"num_heads": 2, "rotary_embedding_dim": 4}))
    add("rope_partial_4d_interleaved", lambda r: Case("RotaryEmbedding",
                                                      [_f(r, 2, 2, 3, 8), _ints([1], np.int64), _f(r, 10, 2),
                                                       _f(r, 10, 2)],
                                                      {"num_heads": 2, "rotary_embedding_dim": 4, "interleaved": 1}))
    # BiasSoftmax (no onnxruntime CPU kernel: Add + Softmax-11 is the oracle)
    for name, x_shape, b_shape, axis, inner in (("bias_softmax_inner", (2, 3, 4, 5), (2, 1, 1, 5), 3, 1),
                                                ("bias_softmax_outer", (2, 3, 4, 5), (3, 4, 5), 3, 0),
                                                ("bias_softmax_axis2", (2, 3, 4, 5), (2, 1, 4, 5), 2, 1),
                                                ("bias_softmax_broadcast_axis", (2, 3, 4, 5), (2, 1, 1, 5), 3, None)):
        attrs = {"axis": axis, "is_inner_broadcast": inner} if inner is not None else {"axis": axis,
                                                                                      "broadcast_axis": 1}
        add(name, lambda r, x_shape=x_shape, b_shape=b_shape, attrs=attrs: Case(
            "BiasSoftmax", [_f(r, *x_shape, scale=2), _f(r, *b_shape)], attrs, oracle=_bias_softmax_oracle))
    _attention_cases(add)
    _mha_cases(add)
    return c


def _attention_cases(add: Callable[[str, Callable[[np.random.Generator], Case]], None]) -> None:
    b, s, d, n, h = 2, 4, 6, 2, 3

    def att(inputs: Callable[[np.random.Generator], list[np.ndarray | None]], attrs: dict[str, Any] | None = None,
            outputs: int = 1, sym: dict[int, Shape] | None = None, width: int = 3 * n * h
            ) -> Callable[[np.random.Generator], Case]:
        def make(r: np.random.Generator) -> Case:
            ins = [_f(r, b, s, d), _f(r, d, width), _f(r, width), *inputs(r)]
            return Case("Attention", ins, {"num_heads": n, **(attrs or {})}, outputs, sym=sym or {})
        return make

    past = (2, b, n, 3, h)
    add("attention", att(lambda r: []))
    add("attention_key_lengths", att(lambda r: [_ints([2, 4])]))
    add("attention_start_end", att(lambda r: [_ints([3, 4, 1, 0])]))
    add("attention_raw_mask", att(lambda r: [_ints([[1, 2, 0, 1], [-1, 1, 1, 0]])]))  # a value > 0 attends
    add("attention_3d_mask", att(lambda r: [_ints(r.integers(0, 2, (b, s, s)) | np.eye(s, dtype=np.int64))]))
    add("attention_causal_raw_mask", att(lambda r: [_ints([[0, 1, 1, 1], [1, 1, 1, 0]])], {"unidirectional": 1}))
    add("attention_bias_scale_filter", att(lambda r: [_ints([3, 4]), None, _f(r, 1, n, s, s)],
                                           {"scale": 0.3, "mask_filter_value": -50.0}))
    add("attention_qkv_hidden_sizes", att(lambda r: [], {"qkv_hidden_sizes": [n * h, n * h, n * 5]},
                                          width=2 * n * h + n * 5))
    add("attention_past_causal", att(lambda r: [_ints([[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 1, 1]]), _f(r, *past)],
                                     {"unidirectional": 1}, outputs=2))
    add("attention_present", att(lambda r: [None, None, _f(r, b, 1, s, s)], outputs=2))
    add("attention_symbolic_causal", att(lambda r: [_ints([[1, 1, 0, 1], [0, 1, 1, 1]])], {"unidirectional": 1},
                                         sym={0: ["b", "s", d], 3: ["b", "s"]}))
    add("attention_symbolic_past_lengths", att(lambda r: [_ints([7, 5]), _f(r, *past)], {"unidirectional": 1},
                                               outputs=2, sym={0: ["b", "s", d], 3: ["b"], 4: [2, "b", n, "p", h]}))


def _mha_cases(add: Callable[[str, Callable[[np.random.Generator], Case]], None]) -> None:
    b, s, kv, n, h, hv = 2, 4, 5, 2, 3, 4

    def mha(inputs: Callable[[np.random.Generator], list[np.ndarray | None]], attrs: dict[str, Any] | None = None,
            outputs: int = 1, sym: dict[int, Shape] | None = None, oracle: Any = None
            ) -> Callable[[np.random.Generator], Case]:
        return lambda r: Case("MultiHeadAttention", inputs(r), {"num_heads": n, **(attrs or {})}, outputs,
                              sym=sym or {}, oracle=oracle)

    def cross(r: np.random.Generator) -> list[np.ndarray | None]:
        return [_f(r, b, s, n * h), _f(r, b, kv, n * h), _f(r, b, kv, n * hv), _f(r, 2 * n * h + n * hv)]

    def self_(r: np.random.Generator) -> list[np.ndarray | None]:
        return [_f(r, b, s, n * h), _f(r, b, s, n * h), _f(r, b, s, n * h)]

    add("mha_cross_bias", mha(cross))
    add("mha_key_lengths", mha(lambda r: [*cross(r), _ints([3, 5])]))
    add("mha_raw_mask", mha(lambda r: [*cross(r), _ints([[1, 1, 0, 1, 1], [0, 1, 1, 1, 0]])]))
    add("mha_3d_mask", mha(lambda r: [*cross(r), _ints(r.integers(0, 2, (b, s, kv)) | 1)]))
    add("mha_attention_bias_scale", mha(lambda r: [*cross(r), None, _f(r, 1, n, s, kv)], {"scale": 0.2}))
    add("mha_bnsh_key_value", mha(lambda r: [_f(r, b, s, n * h), _f(r, b, n, kv, h), _f(r, b, n, kv, h),
                                             _f(r, 3 * n * h)]))
    add("mha_past_causal", mha(lambda r: [*self_(r), _f(r, 3 * n * h), None, None, _f(r, b, n, 3, h),
                                          _f(r, b, n, 3, h)], {"unidirectional": 1}, outputs=3))
    add("mha_bnsh_past", mha(lambda r: [_f(r, b, s, n * h), _f(r, b, n, kv, h), _f(r, b, n, kv, h), None, None, None,
                                         _f(r, b, n, 3, h), _f(r, b, n, 3, h)], outputs=3))
    add("mha_past_key_lengths", mha(lambda r: [*self_(r), None, _ints([6, 4]), None, _f(r, b, n, 3, h),
                                               _f(r, b, n, 3, h)], outputs=3))
    add("mha_present", mha(lambda r: [*self_(r), None, _ints([[1, 1, 1, 0], [1, 0, 1, 1]])], outputs=3))
    add("mha_qk", mha(lambda r: [*cross(r), _ints([[1, 1, 0, 1, 1], [0, 1, 1, 1, 0]]), _f(r, 1, n, s, kv)],
                      {"mask_filter_value": -100.0}, outputs=4))
    add("mha_qk_causal", mha(lambda r: [*self_(r), None, _ints([[1, 1, 0, 1], [0, 1, 1, 1]]), _f(r, b, 1, s, s)],
                             {"unidirectional": 1}, outputs=4))
    add("mha_symbolic_causal", mha(lambda r: [*self_(r), None, _ints([[1, 1, 0, 1], [0, 1, 1, 1]])],
                                   {"unidirectional": 1},
                                   sym={i: ["b", "s", n * h] for i in range(3)} | {4: ["b", "s"]}))
    add("mha_packed_qkv", mha(lambda r: [_f(r, b, s, n, 3, h)], oracle=_unpacked_mha_oracle))
    add("mha_packed_kv", mha(lambda r: [_f(r, b, s, n * h), _f(r, b, kv, n, 2, h), None, None, _ints([4, 5])],
                             oracle=_unpacked_mha_oracle))


CASES = _cases()


def _out_names(name: str, case: Case) -> list[str]:
    slots = [f"o{i}" for i in range(case.outputs)] if isinstance(case.outputs, int) else case.outputs
    return [f"{name}.{o}" if o else "" for o in slots]


def _node(name: str, case: Case) -> tuple[onnx.NodeProto, list[onnx.ValueInfoProto], dict[str, np.ndarray]]:
    names, vis, feeds = [], [], {}
    for i, a in enumerate(case.inputs):
        if a is None:
            names.append("")
            continue
        n = f"{name}.in{i}"
        names.append(n)
        shape = [f"{name}.{d}" if isinstance(d, str) else d for d in case.sym.get(i, list(a.shape))]
        vis.append(helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), shape))
        feeds[n] = a
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(case.op, names, _out_names(name, case), name=name, domain=case.domain, **case.attrs)
    return node, vis, feeds


def _model(cases: dict[str, Case], out_types: dict[str, int] | None = None
           ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    nodes, inputs, outputs, feeds = [], [], [], {}
    for name, case in cases.items():
        node, vis, f = _node(name, case)
        nodes.append(node)
        inputs += vis
        feeds.update(f)
        outputs += [helper.make_tensor_value_info(o, (out_types or {}).get(o, TensorProto.UNDEFINED), None)
                    for o in _out_names(name, case) if o]
    graph = helper.make_graph(nodes, "contrib", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    return model, feeds


def _ort_case(case: Case, name: str, like: list[np.ndarray] | None) -> list[np.ndarray]:
    """onnxruntime on the case's own one-node model (outputs float32 unless ``like`` says otherwise)."""
    outs = [o for o in _out_names(name, case) if o]
    types = {o: helper.np_dtype_to_tensor_dtype(a.dtype) if like else TensorProto.FLOAT
             for o, a in zip(outs, like or [np.zeros(0, np.float32)] * len(outs))}
    model, feeds = _model({name: case}, types)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, feeds))


@pytest.fixture(scope="module", params=["ref", "native"])
def compiled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[np.ndarray]]:
    """Every case's outputs from one model holding all the nodes, compiled once for the target."""
    model, feeds = _model(CASES)
    m = cuvil.compile(model, request.param, cache_dir=str(tmp_path_factory.mktemp("contrib")))
    got = m(*[feeds[i.name] for i in model.graph.input])
    names = [o.name for o in model.graph.output]
    assert len(got) == len(names)
    by_name = dict(zip(names, got))
    return {name: [by_name[o] for o in _out_names(name, c) if o] for name, c in CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_contrib_op_matches_onnxruntime(name: str, compiled: dict[str, list[np.ndarray]]) -> None:
    case = CASES[name]
    got = compiled[name]
    want = case.oracle(case.inputs, case.attrs) if case.oracle else _ort_case(case, name, got)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (name, i, g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=RTOL, err_msg=f"{name} output {i}")


def _one(op: str, inputs: list[np.ndarray | None], attrs: dict[str, Any] | None = None, outputs: int = 1,
         domain: str = MS) -> onnx.ModelProto:
    return _model({"n": Case(op, inputs, attrs or {}, outputs, domain)})[0]


_R = np.random.default_rng(7)
_X3 = _f(_R, 2, 4, 6)
_W = _f(_R, 6, 18)
REFUSALS: dict[str, tuple[onnx.ModelProto, str]] = {
    "attention-rotary": (_one("Attention", [_X3, _W], {"num_heads": 2, "do_rotary": 1}), "do_rotary=1"),
    "attention-shared-buffer": (_one("Attention", [_X3, _W], {"num_heads": 2, "past_present_share_buffer": 1}),
                                "past_present_share_buffer=1"),
    "attention-4d-mask": (_one("Attention", [_X3, _W, None, np.ones((2, 1, 4, 4), np.int32)], {"num_heads": 2}),
                          "4-D mask_index"),
    "attention-3b+2-mask": (_one("Attention", [_X3, _W, None, np.ones(8, np.int32)], {"num_heads": 2}),
                            "mask_index of shape"),
    "attention-float-mask": (_one("Attention", [_X3, _W, None, np.ones((2, 4), np.float32)], {"num_heads": 2}),
                             "mask_index must be int32"),
    "attention-heads": (_one("Attention", [_X3, _W], {"num_heads": 4}), "qkv_hidden_sizes"),
    "mha-packed-bias": (_one("MultiHeadAttention", [_f(_R, 2, 4, 2, 3, 3), None, None, _f(_R, 18)], {"num_heads": 2}),
                        "a bias with packed"),
    "mha-causal-cross": (_one("MultiHeadAttention", [_X3, _f(_R, 2, 5, 6), _f(_R, 2, 5, 6)],
                              {"num_heads": 2, "unidirectional": 1}), "unidirectional=1 with 5 keys for 4 queries"),
    "mha-beam": (_one("MultiHeadAttention", [_X3, _X3, _X3, None, None, None, None, None, None,
                                             np.zeros((2, 1, 4), np.int32)], {"num_heads": 2}), "cache_indirection"),
    "mha-mask-width": (_one("MultiHeadAttention", [_X3, _X3, _X3, None, np.ones((2, 5), np.int32)], {"num_heads": 2}),
                       "key_padding_mask"),
    "rope-packed": (_one("RotaryEmbedding", [_f(_R, 2, 2, 3, 8), np.zeros((2, 3), np.int64), _f(_R, 9, 4),
                                             _f(_R, 9, 4)], {"is_packed_batching": 1}), "is_packed_batching=1"),
    "rope-scale": (_one("RotaryEmbedding", [_f(_R, 2, 2, 3, 8), np.zeros((2, 3), np.int64), _f(_R, 9, 4),
                                            _f(_R, 9, 4)], {"scale": 2.0}), "scale=2.0"),
    "rope-cache-width": (_one("RotaryEmbedding", [_f(_R, 2, 2, 3, 8), np.zeros((2, 3), np.int64), _f(_R, 9, 3),
                                                  _f(_R, 9, 3)]), "cos_cache"),
    "matmul-trans-batch-rank2": (_one("FusedMatMul", [_f(_R, 3, 4), _f(_R, 3, 5)], {"transBatchA": 1}),
                                 "transBatchA=1"),
    "matmul-flag": (_one("FusedMatMul", [_f(_R, 3, 4), _f(_R, 4, 5)], {"transA": 2}), "transA=2"),
    "fast-gelu-2d-bias": (_one("FastGelu", [_X3, _f(_R, 4, 6)]), "bias must be 1-D"),
    "bias-gelu-width": (_one("BiasGelu", [_X3, _f(_R, 5)]), "B has 5 values"),
    "unknown-attribute": (_one("Gelu", [_X3], {"approximate": "tanh"}), "attribute(s) approximate"),
    "bias-softmax-broadcast": (_one("BiasSoftmax", [_f(_R, 2, 3, 4, 5), _f(_R, 1, 3, 1, 5)],
                                    {"axis": 3, "is_inner_broadcast": 1}), "is_inner_broadcast=1"),
    "bias-softmax-broadcast-axis": (_one("BiasSoftmax", [_f(_R, 2, 3, 4, 5), _f(_R, 2, 3, 1, 5)],
                                         {"axis": 3, "broadcast_axis": 1}), "broadcast_axis=1"),
    "bias-softmax-attribute": (_one("BiasSoftmax", [_f(_R, 2, 3), _f(_R, 2, 3)], {"axis": 1}), "is_inner_broadcast"),
    "embed-mask-index-type": (_one("EmbedLayerNormalization", [np.zeros((2, 3), np.int32), None, _f(_R, 5, 6),
                                                               _f(_R, 5, 6), None, _f(_R, 6), _f(_R, 6)],
                                   {"mask_index_type": 2}), "mask_index_type=2"),
    "embed-int64-ids": (_one("EmbedLayerNormalization", [np.zeros((2, 3), np.int64), None, _f(_R, 5, 6),
                                                         _f(_R, 5, 6), None, _f(_R, 6), _f(_R, 6)]),
                        "input_ids must be int32"),
    "rms-stash": (_one("SimplifiedLayerNormalization", [_X3, _f(_R, 6)], {"stash_type": 11}, domain=""),
                  "stash_type=11"),
    "skip-ln-skip-shape": (_one("SkipLayerNormalization", [_X3, _f(_R, 2, 3, 6), _f(_R, 6)]), "skip"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_what_the_importers_cannot_take_is_refused_by_name(case: str) -> None:
    model, message = REFUSALS[case]
    op = model.graph.node[0].op_type
    with pytest.raises(CuvilError) as info:
        cuvil.compile(model, "ref")
    assert message in str(info.value) and op in str(info.value), str(info.value)


# --- a BERT-style encoder, fused by onnxruntime's transformer optimizer -----------------------------------------------
VOCAB, HIDDEN, HEADS, LAYERS, FFN, MAX_POS = 50, 32, 4, 2, 64, 16


def _bert(torch: Any) -> Any:
    nn = torch.nn

    class Layer(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(HIDDEN, HIDDEN) for _ in range(4))
            self.ln1, self.ln2 = nn.LayerNorm(HIDDEN, eps=1e-12), nn.LayerNorm(HIDDEN, eps=1e-12)
            self.up, self.down = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)
            self.act = nn.GELU(approximate="tanh")

        def heads(self, t: Any) -> Any:
            b, s, _ = t.shape
            return t.view(b, s, HEADS, HIDDEN // HEADS).permute(0, 2, 1, 3)

        def forward(self, x: Any, mask: Any) -> Any:
            q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / (HIDDEN // HEADS) ** 0.5 + mask
            ctx = torch.matmul(scores.softmax(-1), v).permute(0, 2, 1, 3).contiguous()
            x = self.ln1(x + self.o(ctx.view(x.shape)))
            return self.ln2(x + self.down(self.act(self.up(x))))

    class Bert(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.word, self.pos, self.segment = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(MAX_POS, HIDDEN), \
                nn.Embedding(2, HIDDEN)
            self.ln = nn.LayerNorm(HIDDEN, eps=1e-12)
            self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            seq = input_ids.shape[1]
            pos = torch.arange(seq, dtype=torch.long).unsqueeze(0)
            x = self.ln(self.word(input_ids) + self.pos(pos) + self.segment(token_type_ids))
            mask = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
            for layer in self.layers:
                x = layer(x, mask)
            return x

    return Bert().eval()


@pytest.mark.slow
def test_bert_fused_by_onnxruntime_optimizer_matches_onnxruntime(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from onnxruntime.transformers.optimizer import optimize_model

    torch.manual_seed(0)
    model = _bert(torch)
    ids = torch.randint(0, VOCAB, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    types = torch.tensor([[0] * 4 + [1] * 3, [0] * 3 + [1] * 4])
    path, fused = tmp_path / "bert.onnx", tmp_path / "bert_fused.onnx"
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch", 1: "seq"} for n in names}
    torch.onnx.export(model, (ids, mask, types), str(path), dynamo=False, opset_version=17, input_names=names,
                      output_names=["hidden"], dynamic_axes=axes)
    optimize_model(str(path), model_type="bert", num_heads=HEADS, hidden_size=HIDDEN).save_model_to_file(str(fused))
    proto = onnx.load(str(fused))
    ops = {n.op_type for n in proto.graph.node if n.domain == MS}
    assert {"Attention", "SkipLayerNormalization", "FastGelu", "EmbedLayerNormalization"} <= ops, ops
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()}
    feeds = {i.name: feeds[i.name].astype(helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
             for i in proto.graph.input}
    want = ort.InferenceSession(str(fused), providers=["CPUExecutionProvider"]).run(None, feeds)
    eager = model(ids, mask, types).detach().numpy()
    np.testing.assert_allclose(want[0], eager, atol=1e-4, rtol=1e-3)  # the fusion kept the model's meaning
    for target in ("ref", "native"):
        got = cuvil.compile(str(fused), target, cache_dir=str(tmp_path))(*[feeds[i.name] for i in proto.graph.input])
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, atol=ATOL, rtol=RTOL, err_msg=target)
