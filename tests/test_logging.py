"""Logging: ``cuvil.set_log_level`` and what each level shows for a compile."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.log import LOGGER_NAME
from cuvil.passes import default_pipeline

EXAMPLE = Path(cuvil.__file__).parent / "examples" / "tiny_cnn.onnx"


@pytest.fixture(autouse=True)
def restore_level() -> Iterator[None]:
    logger = logging.getLogger(LOGGER_NAME)
    level, handlers = logger.level, list(logger.handlers)
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers


def pointwise_model() -> onnx.ModelProto:
    """A 1x1 conv, a depthwise conv, a MatMul, and an Add of a symbolic-length bias."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w1", (4, 3, 1, 1)), ("wd", (4, 1, 3, 3)), ("m", (8, 5)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="pointwise"),
             helper.make_node("Conv", ["a", "wd"], ["b"], name="depthwise", group=4, pads=[1, 1, 1, 1]),
             helper.make_node("Flatten", ["b"], ["f"], name="flat", axis=2),
             helper.make_node("MatMul", ["f", "m"], ["g"], name="mm"),
             helper.make_node("Add", ["g", "bias"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes, "logged",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 2, 4]),
         helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def messages(caplog: pytest.LogCaptureFixture, level: int | None = None) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith(LOGGER_NAME) and (level is None or r.levelno == level)]


def test_debug_shows_mapping_partitions_kernels_and_stage_times(caplog: pytest.LogCaptureFixture,
                                                                tmp_path: Path) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    # without convert-layout, which would take both convolutions channels-last (tests/passes/test_layout.py)
    passes = default_pipeline("generic").replace("convert-layout,", "")
    m = cuvil.compile(pointwise_model(), target="generic", cache_dir=str(tmp_path), passes=passes)
    text = "\n".join(messages(caplog, logging.DEBUG))
    # the front end's mapping decisions
    assert "onnx ai.onnx::Conv 'pointwise' (opset 17) -> conv" in text
    assert "onnx ai.onnx::MatMul 'mm' (opset 17) -> matmul" in text
    # partitions and fusion groups, as they truly are
    assert "partitions: 1 (the whole graph: 5 nodes besides constants, on the generic code generator)" in text
    assert "fusion groups: 5 (0 fused nodes; every other node is a group of its own)" in text
    assert "fusion group 3: node 'mm' (matmul)" in text
    # the kernel of each node, and why that implementation
    assert "node 'pointwise' (conv): C kernel _conv from cuvil.backends.c.kernels.conv" in text
    assert "node 'pointwise' (conv): 1x1 unit-stride unpadded convolution: one GEMM per image" in text
    assert "node 'depthwise' (conv): direct depthwise 2-D kernel" in text
    assert "node 'mm' (matmul): cuvil_sgemm: one product, A's batch and row dims folded into its rows" in text
    assert "node 'add' (add): elementwise: broadcasting loop nest (an operand has a lower rank)" in text
    # the relation left to run time
    assert "shape check at run time: node 'add' (add) needs 5 ~ n" in text
    # timings of each stage
    for stage in ("import", "verify", "shape checks", "codegen", "c build", "load"):
        assert re.search(rf"^stage {stage}: \d+\.\d ms", text, re.M), stage
    assert m(np.ones((2, 3, 2, 4), np.float32), np.ones(5, np.float32))[0].shape == (8, 5)

    caplog.clear()
    cuvil.compile(pointwise_model(), target="generic", cache_dir=str(tmp_path), passes=passes)
    text = "\n".join(messages(caplog, logging.DEBUG))
    assert re.search(r"^stage cache hit: \d+\.\d ms", text, re.M)
    assert not re.search(r"^stage c build", text, re.M)


def test_debug_on_the_reference_target_names_the_numpy_reference(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    cuvil.compile(pointwise_model(), target="ref")
    text = "\n".join(messages(caplog, logging.DEBUG))
    assert "node 'mm' (matmul): NumPy reference cuvil.ops.linalg._matmul_ref" in text
    assert "partitions: 1 (the whole graph: 5 nodes besides constants, on the reference interpreter)" in text


def test_info_shows_one_summary_per_compile(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    cuvil.compile(EXAMPLE, target="generic", dims={"batch": (1, 64)}, cache_dir=str(tmp_path))
    cuvil.compile(EXAMPLE, target="generic", dims={"batch": (1, 64)}, cache_dir=str(tmp_path))
    assert messages(caplog, logging.DEBUG) == []
    info = messages(caplog, logging.INFO)
    assert len(info) == 2
    pattern = (r"compiled 'tiny_cnn' for generic: 9 nodes \(\+6 constants\), 1 inputs, 1 outputs, "
               r"0 run-time shape checks, \d+\.\d{3} s \((built|build cache hit)\)")
    assert re.fullmatch(pattern, info[0]) and re.fullmatch(pattern, info[1])
    assert info[1].endswith("(build cache hit)")


def test_default_level_prints_nothing(tmp_path: Path) -> None:
    code = (f"import cuvil, numpy as np; m = cuvil.compile({str(EXAMPLE)!r}, target='ref', dims={{'batch': (1, 8)}}); "
            "m(np.zeros((1, 3, 32, 32), np.float32))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert r.stdout == "" and r.stderr == ""


def test_set_log_level_shows_records_on_stderr_and_warnings_by_default(tmp_path: Path) -> None:
    code = ("import logging, cuvil; logging.getLogger('cuvil.x').warning('careful'); "
            "logging.getLogger('cuvil.x').info('hidden'); cuvil.set_log_level('info'); "
            f"cuvil.set_log_level('INFO'); cuvil.compile({str(EXAMPLE)!r}, target='ref')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lines = r.stderr.splitlines()
    assert lines[0] == "careful"  # logging's last-resort handler: warnings show with no setup
    assert "hidden" not in r.stderr
    assert len(lines) == 2 and lines[1].startswith("cuvil.api INFO: compiled 'tiny_cnn' for ref:")  # one handler


def test_set_log_level_rejects_unknown_levels() -> None:
    with pytest.raises(ValueError, match="unknown log level 'LOUD'; choose one of DEBUG, INFO, WARNING, ERROR, CRITICAL"):
        cuvil.set_log_level("LOUD")
    with pytest.raises(TypeError, match="a log level is a name or an int, got float"):
        cuvil.set_log_level(1.5)  # type: ignore[arg-type]
    cuvil.set_log_level(logging.ERROR)
    assert logging.getLogger(LOGGER_NAME).level == logging.ERROR


def test_debug_shows_the_torch_front_end_mapping(caplog: pytest.LogCaptureFixture) -> None:
    torch = pytest.importorskip("torch")
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    cuvil.compile(model, input_spec=[torch.randn(2, 4)], target="ref")
    text = "\n".join(messages(caplog, logging.DEBUG))
    assert re.search(r"^aten aten\.linear\.default 'linear' at \S+linear\.py:\d+ -> gemm$", text, re.M)
    assert re.search(r"^aten aten\.relu\.default 'relu' at \S+activation\.py:\d+ -> relu$", text, re.M)
