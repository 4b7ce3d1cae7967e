"""Bad model files: every one gives a clear Cuvil error, never a crash and never a hang.

Compiles run in a child process with a timeout, so a parser or importer that
loops forever fails the test (naming the case) instead of stalling the suite;
the child reports each case's outcome as one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil

REPO = Path(cuvil.__file__).resolve().parents[1]
OPSET = 18

# Compiles every path given on the command line; one JSON line per path.
_WORKER = r"""
import json, sys, traceback
import cuvil
for path in sys.argv[1:]:
    rec = {"path": path}
    try:
        cuvil.compile(path, target="ref")
        rec["outcome"] = "ok"
    except BaseException as exc:
        rec.update(outcome="error", type=type(exc).__name__, cuvil=isinstance(exc, cuvil.CuvilError),
                   message=str(exc), traceback=traceback.format_exc())
    print(json.dumps(rec), flush=True)
"""


@dataclass(frozen=True)
class Outcome:
    path: str
    outcome: str  # ok | error
    type: str = ""
    cuvil: bool = False
    message: str = ""
    traceback: str = ""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def compile_all(paths: Sequence[Path], timeout: float = 120.0) -> list[Outcome]:
    """``cuvil.compile`` of each path in a child process; fails the test if the child hangs or dies."""
    args = [sys.executable, "-c", _WORKER, *map(str, paths)]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=_env(), check=False)
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        done = len(out.splitlines())
        pytest.fail(f"compile did not finish within {timeout:.0f}s on {paths[done]} (case {done} of {len(paths)})")
    outcomes = [Outcome(**json.loads(line)) for line in stdout.splitlines() if line.startswith("{")]
    if rc != 0 or len(outcomes) != len(paths):
        stuck = paths[len(outcomes)] if len(outcomes) < len(paths) else "?"
        pytest.fail(f"the compiling process died (status {rc}) on {stuck}:\n{stderr[-3000:]}")
    return outcomes


def compile_one(path: Path) -> Outcome:
    return compile_all([path])[0]


def expect_ok(o: Outcome) -> None:
    assert o.outcome == "ok", f"{o.path}: {o.type}: {o.message}\n{o.traceback}"


def expect_model_error(o: Outcome, *fragments: str, kinds: tuple[str, ...] = ("ModelError",)) -> None:
    """The outcome is a Cuvil error of one of ``kinds`` whose message holds every fragment."""
    assert o.outcome == "error", f"{o.path}: compiled without error"
    assert o.type in kinds, f"{o.path}: raised {o.type}, expected {' or '.join(kinds)}:\n{o.traceback}"
    assert o.cuvil
    for f in fragments:
        assert f in o.message, f"{o.path}: message {o.message!r} lacks {f!r}"


# A small valid model -------------------------------------------------------------------------------


def tiny_model(**graph_changes: object) -> onnx.ModelProto:
    """``y = relu(x + w)`` with a 2x3 float initializer; a valid model Cuvil compiles."""
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5, "w")
    nodes = [helper.make_node("Add", ["x", "w"], ["s"], name="add"), helper.make_node("Relu", ["s"], ["y"], name="relu")]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [w],
    )
    for k, v in graph_changes.items():
        field = getattr(graph, k)
        del field[:]
        field.extend(v)  # type: ignore[arg-type]
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)


def write(tmp: Path, name: str, data: bytes | onnx.ModelProto) -> Path:
    path = tmp / name
    path.write_bytes(data if isinstance(data, bytes) else data.SerializeToString())
    return path


def test_tiny_model_is_valid(tmp_path: Path) -> None:
    """The control: the unbroken model compiles and computes relu(x + w), in and out of process."""
    path = write(tmp_path, "tiny.onnx", tiny_model())
    expect_ok(compile_one(path))
    x = np.ones((2, 3), np.float32)
    (y,) = cuvil.compile(path)(x)
    np.testing.assert_array_equal(y, np.maximum(x + np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5, 0))


# Not a model at all ---------------------------------------------------------------------------------


def test_empty_file(tmp_path: Path) -> None:
    path = write(tmp_path, "empty.onnx", b"")
    expect_model_error(compile_one(path), str(path), "empty")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.onnx"
    expect_model_error(compile_one(path), str(path), "no such file")


def test_folder(tmp_path: Path) -> None:
    expect_model_error(compile_one(tmp_path), str(tmp_path), "folder")


def test_truncated_model(tmp_path: Path) -> None:
    """Every proper prefix of a valid model (half of it among them) is rejected."""
    data = tiny_model().SerializeToString()
    cuts = sorted(set(range(1, len(data))) | {len(data) // 2})
    paths = [write(tmp_path, f"cut{n}.onnx", data[:n]) for n in cuts]
    for o in compile_all(paths):
        expect_model_error(o, o.path)
        assert "not a valid ONNX model" in o.message or "not an ONNX model" in o.message, o.message


@pytest.mark.parametrize("seed", range(6))
def test_random_bytes(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    paths = [write(tmp_path, f"rand{n}.onnx", rng.bytes(n)) for n in (1, 2, 3, 16, 100, 1000, 100_000)]
    for o in compile_all(paths):
        expect_model_error(o, o.path)


def test_other_protobufs(tmp_path: Path) -> None:
    """Valid protobufs of other ONNX messages, like a test-data ``input_0.pb`` passed by mistake."""
    model = tiny_model()
    tensor = numpy_helper.from_array(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32), "x")
    cases = {
        "tensor.pb": tensor.SerializeToString(),
        "graph.pb": model.graph.SerializeToString(),
        "node.pb": model.graph.node[0].SerializeToString(),
        "opset.pb": model.opset_import[0].SerializeToString(),
    }
    paths = [write(tmp_path, name, data) for name, data in cases.items()]
    for o in compile_all(paths):
        expect_model_error(o, o.path)
        assert "ONNX model" in o.message, o.message


# Models that parse but are inconsistent -------------------------------------------------------------


def test_node_reads_undefined_value(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Add", ["x", "w"], ["s"], name="add"),
        helper.make_node("Relu", ["ghost"], ["y"], name="relu"),
    ]
    o = compile_one(write(tmp_path, "m.onnx", tiny_model(node=nodes)))
    expect_model_error(o, "'relu'", "'ghost'")


def test_graph_output_undefined(tmp_path: Path) -> None:
    outputs = [helper.make_tensor_value_info("nowhere", TensorProto.FLOAT, [2, 3])]
    o = compile_one(write(tmp_path, "m.onnx", tiny_model(output=outputs)))
    expect_model_error(o, "graph output 'nowhere'", "not defined")


def test_no_outputs(tmp_path: Path) -> None:
    o = compile_one(write(tmp_path, "m.onnx", tiny_model(output=[])))
    expect_model_error(o, "no outputs")


def test_no_opset_import(tmp_path: Path) -> None:
    model = tiny_model()
    del model.opset_import[:]
    expect_model_error(compile_one(write(tmp_path, "m.onnx", model)), "opset_import")


def test_initializer_data_does_not_match_dims(tmp_path: Path) -> None:
    bad = numpy_helper.from_array(np.zeros(6, np.float32), "w")
    bad.raw_data = bad.raw_data[:10]  # 2.5 floats for a [6] tensor
    o = compile_one(write(tmp_path, "m.onnx", tiny_model(initializer=[bad])))
    expect_model_error(o, "'w'")


def test_input_without_type(tmp_path: Path) -> None:
    o = compile_one(write(tmp_path, "m.onnx", tiny_model(input=[onnx.ValueInfoProto(name="x")])))
    expect_model_error(o, "input 'x'")


def test_input_with_undefined_element_type(tmp_path: Path) -> None:
    inputs = [helper.make_tensor_value_info("x", TensorProto.UNDEFINED, [2, 3])]
    o = compile_one(write(tmp_path, "m.onnx", tiny_model(input=inputs)))
    expect_model_error(o, "'x'", "element type")


def test_value_defined_twice(tmp_path: Path) -> None:
    """ONNX graphs are SSA: two nodes writing one name is malformed, not 'the last one wins'."""
    nodes = [
        helper.make_node("Add", ["x", "w"], ["s"], name="add"),
        helper.make_node("Relu", ["x"], ["s"], name="relu0"),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    o = compile_one(write(tmp_path, "m.onnx", tiny_model(node=nodes)))
    expect_model_error(o, "'s'", "'relu0'")


# External data ---------------------------------------------------------------------------------------


def _with_external_w(tmp: Path, location: str) -> Path:
    model = tiny_model()
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "24")):
        entry = w.external_data.add()
        entry.key, entry.value = k, v
    return write(tmp, "m.onnx", model)


def test_external_data_missing(tmp_path: Path) -> None:
    expect_model_error(compile_one(_with_external_w(tmp_path, "weights.bin")), "'weights.bin'", "not found")


def test_external_data_outside_the_model_folder(tmp_path: Path) -> None:
    (tmp_path / "secret.bin").write_bytes(bytes(24))
    sub = tmp_path / "model"
    sub.mkdir()
    expect_model_error(compile_one(_with_external_w(sub, "../secret.bin")), "outside the model's folder")


def test_external_data_too_short(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(bytes(8))  # the tensor wants 24 bytes
    expect_model_error(compile_one(_with_external_w(tmp_path, "weights.bin")), "'w'")


def test_external_data_loads(tmp_path: Path) -> None:
    """The control for the three above: the same layout with a complete file compiles and computes."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    (tmp_path / "weights.bin").write_bytes(w.tobytes())
    m = cuvil.compile(_with_external_w(tmp_path, "weights.bin"))
    (y,) = m(np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(y, np.maximum(w, 0))


# Fuzzing: damaged copies of a valid model -------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_flipped_bytes(tmp_path: Path, seed: int) -> None:
    """A valid model with a few random bytes changed either compiles or gives a Cuvil error."""
    data = bytearray(tiny_model().SerializeToString())
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(60):
        d = bytearray(data)
        for pos in rng.integers(0, len(d), size=int(rng.integers(1, 4))):
            d[pos] = int(rng.integers(0, 256))
        paths.append(write(tmp_path, f"flip{i}.onnx", bytes(d)))
    for o in compile_all(paths):
        if o.outcome == "error":
            assert o.cuvil, f"{o.path}: {o.type} escaped:\n{o.traceback}"


# Unsupported ops ----------------------------------------------------------------------------------------


def test_every_unsupported_op_in_one_error(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Frobnicate", ["x"], ["f1"], name="frob_a", domain="com.example"),
        helper.make_node("Det", ["f1"], ["d1"], name="det_a"),
        helper.make_node("Add", ["x", "w"], ["s"], name="add"),
        helper.make_node("Frobnicate", ["s"], ["f2"], name="frob_b", domain="com.example"),
        helper.make_node("Det", ["f2"], ["d2"], name="det_b"),
        helper.make_node("Add", ["d1", "d2"], ["y"], name="sum"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])]
    model = tiny_model(node=nodes, output=outputs)
    model.opset_import.append(helper.make_opsetid("com.example", 3))
    path = write(tmp_path, "m.onnx", model)
    expect_model_error(compile_one(path), kinds=("UnsupportedOpError",))
    with pytest.raises(cuvil.UnsupportedOpError) as e:
        cuvil.compile(path)
    uses = {(u.domain, u.op_type): u for u in e.value.uses}
    assert set(uses) == {("com.example", "Frobnicate"), ("", "Det")}, uses
    assert uses["com.example", "Frobnicate"].nodes == ("frob_a", "frob_b")
    assert uses["com.example", "Frobnicate"].opset == 3
    assert uses["", "Det"].nodes == ("det_a", "det_b")
    assert uses["", "Det"].opset == OPSET
    msg = str(e.value)
    assert msg.startswith("unsupported ops (2):"), msg
    for fragment in (
        "com.example::Frobnicate (opset 3)",
        "'frob_a', 'frob_b'",
        f"ai.onnx::Det (opset {OPSET})",
        "'det_a', 'det_b'",
    ):
        assert fragment in msg, msg


def test_unsupported_op_inside_a_branch_is_listed(tmp_path: Path) -> None:
    """The scan reaches into subgraphs: a Det in an If branch is reported with the top-level one."""
    branch = helper.make_graph(
        [helper.make_node("Det", ["x"], ["b"], name="det_in_branch")],
        "then",
        [],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [])],
    )
    nodes = [
        helper.make_node("Constant", [], ["c"], name="cond", value=numpy_helper.from_array(np.array(True))),
        helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch, else_branch=branch),
        helper.make_node("Det", ["x"], ["z"], name="det_top"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])]
    with pytest.raises(cuvil.UnsupportedOpError) as e:
        cuvil.compile(tiny_model(node=nodes, output=outputs))
    (det,) = [u for u in e.value.uses if u.op_type == "Det"]
    assert set(det.nodes) >= {"det_top"} and any("det_in_branch" in n for n in det.nodes), det


# The command line -----------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cuvil", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env(), check=False)


@pytest.mark.parametrize("kind", ["empty", "truncated", "random", "missing", "folder"])
def test_cli_inspect_bad_file(tmp_path: Path, kind: str) -> None:
    data = tiny_model().SerializeToString()
    if kind == "missing":
        path = tmp_path / "absent.onnx"
    elif kind == "folder":
        path = tmp_path
    else:
        body = {"empty": b"", "truncated": data[: len(data) // 2], "random": np.random.default_rng(1).bytes(500)}
        path = write(tmp_path, f"{kind}.onnx", body[kind])
    proc = _cli("inspect", str(path))
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cuvil: error: "), proc.stderr
    assert str(path) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
