"""The verify suite draws each input from its domain: declared in the configuration, else inferred
from the graph (token ids within their embedding tables, a 0/1 attention mask), else the default;
the report says which, per input, and warns that every input was generated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil.verify import verify
from cuvil.verify.base import VerifyError
from cuvil.verify.config import parse_config
from cuvil.verify.context import ModelSource, VerifyContext
from cuvil.verify.render.markdown import render_markdown
from cuvil.verify.runner import GENERATED_ONLY


def bert_front(path: Path) -> Path:
    """A BERT embedding front with dynamic batch and sequence: word (30x8) and token-type (2x8)
    lookups, and the additive attention mask (1 - mask) * -10000 before a softmax."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((30, 8)).astype(np.float32), "word_embeddings"),
             numpy_helper.from_array(rng.standard_normal((2, 8)).astype(np.float32), "token_type_embeddings"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(-10000.0, np.float32), "big"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    nodes = [
        helper.make_node("Gather", ["word_embeddings", "input_ids"], ["words"], name="word_lookup"),
        helper.make_node("Gather", ["token_type_embeddings", "token_type_ids"], ["types"], name="type_lookup"),
        helper.make_node("Add", ["words", "types"], ["emb"]),
        helper.make_node("Transpose", ["emb"], ["emb_t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["emb", "emb_t"], ["scores"]),
        helper.make_node("Unsqueeze", ["attention_mask", "axis1"], ["mask3"]),
        helper.make_node("Cast", ["mask3"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "maskf"], ["inv"]),
        helper.make_node("Mul", ["inv", "big"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "emb"], ["out"]),
    ]
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
            for n in ("input_ids", "token_type_ids", "attention_mask")]
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", 8])
    model = helper.make_model(helper.make_graph(nodes, "bert_front", ints, [out], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path / "bert_front.onnx")
    return path / "bert_front.onnx"


def test_ids_stay_in_their_tables_and_the_mask_is_a_mask(tmp_path: Path) -> None:
    ctx = VerifyContext(ModelSource("onnx", str(bert_front(tmp_path))), ["ref"], work_dir=tmp_path)
    domains = ctx.input_domains()
    assert "indexes word_embeddings" in domains["input_ids"].source
    assert "indexes token_type_embeddings" in domains["token_type_ids"].source
    assert domains["attention_mask"].mask
    for seed in range(4):
        ids, types, mask = ctx.inputs(seed=seed, symbols={"batch": 3, "seq": 7})
        assert ids.min() >= 0 and ids.max() <= 29 and set(np.unique(types)) <= {0, 1}
        assert set(np.unique(mask)) <= {0, 1} and mask[:, 0].all()
        ctx.reference([ids, types, mask])  # the interpreter accepts every index


def test_declared_domains_override_the_inferred_ones(tmp_path: Path) -> None:
    config = parse_config({"inputs": {"input_ids": {"range": [3, 4]}, "attention_mask": {"values": [1]}}})
    ctx = VerifyContext(ModelSource("onnx", str(bert_front(tmp_path))), ["ref"], work_dir=tmp_path,
                        config=config.as_context_config())
    ids, types, mask = ctx.inputs(seed=1, symbols={"batch": 2, "seq": 16})
    assert set(np.unique(ids)) == {3, 4} and mask.all() and types.max() <= 1
    assert ctx.input_domains()["input_ids"].source == "declared in the configuration"


@pytest.mark.parametrize("table", [{"range": [4, 3]}, {"values": []}, {"range": [0, 1], "values": [0]},
                                   {"low": 0}, "0..1"])
def test_a_malformed_declared_domain_is_a_usage_error(table: object) -> None:
    with pytest.raises(VerifyError, match="inputs"):
        parse_config({"inputs": {"input_ids": table}})


def test_a_declared_domain_for_no_input_is_a_usage_error(tmp_path: Path) -> None:
    config = parse_config({"inputs": {"input_idz": {"range": [0, 1]}}})
    ctx = VerifyContext(ModelSource("onnx", str(bert_front(tmp_path))), ["ref"], work_dir=tmp_path,
                        config=config.as_context_config())
    with pytest.raises(VerifyError, match="input_idz"):
        ctx.input_domains()


def test_dynamic_shapes_and_concurrency_do_not_crash_and_the_report_names_the_sources(tmp_path: Path) -> None:
    report = verify(str(bert_front(tmp_path)), checks="dynamic-shapes,concurrency", targets=["ref", "native"],
                    cache_dir=tmp_path / "cache", work_dir=tmp_path)
    crashed = [(r.check, r.target, r.summary) for r in report if "error" in r.details]
    assert not crashed, crashed
    assert report.exit_status == 0, [(r.check, r.target, r.status, r.summary) for r in report]
    data = report.to_json()
    sources = {i["name"]: i["source"] for i in data["inputs"]}
    assert sources["input_ids"].startswith("inferred from the graph: indexes word_embeddings")
    assert "mask" in sources["attention_mask"]
    assert data["warnings"] == [GENERATED_ONLY]
    md = render_markdown(report)
    assert "### Inputs" in md and "indexes token_type_embeddings" in md and GENERATED_ONLY in md


def _real_samples(folder: Path, n: int = 3) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(5)
    for i in range(n):
        ids = rng.integers(10, 20, size=(2, 5))
        mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
        np.savez(folder / f"s{i}.npz", input_ids=ids, token_type_ids=np.zeros((2, 5), np.int64), attention_mask=mask)
    return folder


def test_the_users_samples_come_first_and_lend_their_values_to_generated_shapes(tmp_path: Path) -> None:
    folder = _real_samples(tmp_path / "samples")
    ctx = VerifyContext(ModelSource("onnx", str(bert_front(tmp_path))), ["ref"], work_dir=tmp_path,
                        config={"input_data": str(folder)})
    first = np.load(folder / "s0.npz")
    np.testing.assert_array_equal(ctx.inputs()[0], first["input_ids"])
    np.testing.assert_array_equal(ctx.inputs(seed=ctx.seed + 1)[0], np.load(folder / "s1.npz")["input_ids"])
    ids, types, mask = ctx.inputs(symbols={"batch": 4, "seq": 9})  # a shape no sample has: drawn like them
    assert ids.shape == (4, 9) and ids.min() >= 10 and ids.max() <= 19 and not types.any()
    assert set(np.unique(mask)) <= {0, 1}
    assert {d.source for d in ctx.input_domains().values()} == {"user data"}


def test_samples_of_the_wrong_type_are_a_usage_error(tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    np.savez(folder / "s.npz", input_ids=np.zeros((2, 5), np.float32), token_type_ids=np.zeros((2, 5), np.int64),
             attention_mask=np.ones((2, 5), np.int64))
    ctx = VerifyContext(ModelSource("onnx", str(bert_front(tmp_path))), ["ref"], work_dir=tmp_path,
                        config={"input_data": str(folder)})
    with pytest.raises(VerifyError, match="input_ids as float32"):
        ctx.inputs()


def test_cli_inputs_folder_is_reported_as_user_data(tmp_path: Path) -> None:
    from cuvil.cli import main

    folder = _real_samples(tmp_path / "samples")
    model = bert_front(tmp_path)
    status = main(["verify", str(model), "--targets", "ref", "--checks", "concurrency", "--inputs", str(folder),
                   "--report-dir", str(tmp_path / "rep"), "--quiet"])
    assert status == 0
    import json

    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert {i["source"] for i in data["inputs"]} == {"user data"} and data["warnings"] == []


def test_config_inputs_data_is_relative_to_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "cuvil.toml").write_text('[inputs]\ndata = "samples"\n[inputs.attention_mask]\nvalues = [1]\n')
    from cuvil.verify.config import load_config

    cfg = load_config(tmp_path / "cuvil.toml")
    assert cfg.input_data == str(tmp_path.resolve() / "samples") and cfg.inputs["attention_mask"].values == (1.0,)
