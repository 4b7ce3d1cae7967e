"""The suite draws every symbolic dim where the graph is valid: an OCR-style recogniser (conv and
pooling over a symbolic width, then a learned token concatenated along the width) cannot run at
width 1, so its samples take the smallest width every window fits, or a typical width declared
in the configuration, and the report says which extent it derived and why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil.verify import verify
from cuvil.verify.base import Status, VerifyError
from cuvil.verify.config import parse_config
from cuvil.verify.context import ModelSource, VerifyContext
from cuvil.verify.render.markdown import render_markdown


def ocr_model(path: Path) -> Path:
    """image [1, 1, 16, width] -> conv 3x3 (pad 1) -> relu -> max_pool 2/2 -> conv 3x3 -> relu -> max_pool
    2x2 stride (2, 1) -> mean over height -> [1, W', 8], a learned token concatenated in front along
    the width -> matmul to 5 classes. The last window needs floor(width / 2) - 2 >= 2: width >= 8."""
    rng = np.random.default_rng(0)

    def w(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [w("c1w", (4, 1, 3, 3)), w("c1b", (4,)), w("c2w", (8, 4, 3, 3)), w("c2b", (8,)), w("token", (1, 1, 8)),
             w("proj", (8, 5))]
    nodes = [
        helper.make_node("Conv", ["image", "c1w", "c1b"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        helper.make_node("Conv", ["p1", "c2w", "c2b"], ["c2"], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 1], name="pool2"),
        helper.make_node("ReduceMean", ["p2"], ["m"], axes=[2], keepdims=0),
        helper.make_node("Transpose", ["m"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Concat", ["token", "t"], ["seq"], axis=1, name="with_token"),
        helper.make_node("MatMul", ["seq", "proj"], ["logits"]),
    ]
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 1, 16, "width"])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, None, 5])
    model = helper.make_model(helper.make_graph(nodes, "ocr", [image], [out], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path / "ocr.onnx")
    return path / "ocr.onnx"


def test_samples_take_the_smallest_width_every_window_fits(tmp_path: Path) -> None:
    ctx = VerifyContext(ModelSource("onnx", str(ocr_model(tmp_path))), ["ref"], work_dir=tmp_path)
    dom = ctx.dim_domains()["width"]
    assert dom.min == 8 and "pool2" in dom.reasons[0]
    (image,) = ctx.inputs()
    assert image.shape == (1, 1, 16, 8)
    assert ctx.reference([image])[0].shape == (1, 2, 5)  # the token and one window position
    with pytest.raises(Exception, match="window"):  # the draw of before: width 1
        ctx.reference([np.zeros((1, 1, 16, 7), np.float32)])


def test_a_declared_typical_width_is_used_and_declared_bounds_are_checked(tmp_path: Path) -> None:
    model = str(ocr_model(tmp_path))
    for dims in ([1, 1, 16, {"min": 12, "typical": 40}], {"width": {"min": 12, "typical": 40}}):
        config = parse_config({"inputs": {"image": {"dims": dims}}})
        ctx = VerifyContext(ModelSource("onnx", model), ["ref"], work_dir=tmp_path, config=config.as_context_config())
        assert ctx.inputs()[0].shape == (1, 1, 16, 40)
        assert ctx.dim_domains()["width"].min == 12
        assert ctx.inputs(symbols={"width": 20})[0].shape == (1, 1, 16, 20)
    bad = parse_config({"inputs": {"image": {"dims": [1, 2, 16, 40]}}})
    ctx = VerifyContext(ModelSource("onnx", model), ["ref"], work_dir=tmp_path, config=bad.as_context_config())
    with pytest.raises(VerifyError, match="axis 1 of image is fixed at 1"):
        ctx.inputs()


@pytest.mark.parametrize("dims", [{"width": {"min": 5, "max": 4}}, {"width": {"typical": 3, "min": 4}},
                                  {"width": {"low": 1}}, [1, "w"], "320"])
def test_a_malformed_dims_declaration_is_a_usage_error(dims: object) -> None:
    with pytest.raises(VerifyError, match=r"inputs\.image\.dims"):
        parse_config({"inputs": {"image": {"dims": dims}}})


@pytest.mark.slow
def test_every_check_on_ref_and_native_runs_the_ocr_model_and_the_report_names_the_width(tmp_path: Path) -> None:
    """Before, the width was drawn at 1: layerwise, precision and most other checks crashed in a pooling window."""
    report = verify(str(ocr_model(tmp_path)), targets=["ref", "native"], cache_dir=tmp_path / "cache",
                    work_dir=tmp_path)
    crashed = [(r.check, r.target, r.summary) for r in report if "crashed" in r.summary or "error" in r.details]
    assert not crashed, crashed
    failed = [(r.check, r.target, r.summary) for r in report if r.status is Status.FAIL]
    assert not failed and report.exit_status == 0, failed
    ran = {r.check for r in report if r.status in (Status.PASS, Status.WARN)}
    assert {"precision", "layerwise", "cross-target", "dynamic-shapes", "concurrency", "passes"} <= ran
    # the only warnings allowed: the width has no maximum, and a noisy latency spread on a shared machine
    for r in report:
        if r.status is Status.WARN:
            assert r.check in ("dynamic-shapes", "latency"), (r.check, r.summary)
            if r.check == "dynamic-shapes":
                assert "width has no maximum" in r.summary and "--dim width=8:" in r.summary
    runs = [run for r in report.get("dynamic-shapes") for run in r.details["runs"]]
    assert min(run["value"] for run in runs) == 8
    data = json.loads(json.dumps(report.to_json()))
    (width,) = data["dims"]
    assert width["symbol"] == "width" and width["smallest"] == 8 and width["sample"] == 8
    assert "pool2" in width["why"] and "window must fit" in width["why"]
    assert "### Dims" in render_markdown(report)


def test_declared_bounds_are_the_builds_contract_and_dynamic_shapes_probes_them(tmp_path: Path) -> None:
    config = parse_config({"inputs": {"image": {"dims": {"width": {"max": 40, "typical": 32}}}}})
    report = verify(str(ocr_model(tmp_path)), checks="dynamic-shapes", targets=["ref"], config=config,
                    work_dir=tmp_path)
    (r,) = report.get("dynamic-shapes")
    assert r.status is Status.PASS, r.summary  # a maximum: no warning, and 41 is refused
    values = sorted(run["value"] for run in r.details["runs"])
    assert values[0] == 8 and values[-1] == 40
    assert [x["outcome"].split(":")[0] for x in r.details["refusals"]] == ["refused"]
    assert report.to_json()["dims"][0]["sample"] == 32


def test_cuvil_run_random_and_numeric_each_draw_the_width_where_the_graph_is_valid(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cuvil.cli import main

    model = str(ocr_model(tmp_path))
    assert main(["run", model, "--target", "ref", "--random"]) == 0
    assert "logits: float32[1, 2, 5]" in capsys.readouterr().out  # width 8: the token and one window
    assert main(["opt", model, "--numeric-each", "--emit", "none"]) == 0
    assert "cannot run the input graph" not in capsys.readouterr().err
