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


@pytest.mark.parametrize(
    "damage, fragments",
    [
        ("opset_zero", ("opset_import", "version 0")),
        ("opset_twice", ("imported twice",)),
        ("unnamed_initializer", ("initializer 0 has no name",)),
        ("initializer_shadows_initializer", ("'w' is defined twice",)),
        ("node_overwrites_input", ("'x' is defined twice", "'add'")),
        ("node_without_op_type", ("has no op_type",)),
        ("unknown_element_type", ("'w'", "element type 77")),
        ("duplicate_in_branch", ("node 'if'/", "'b' is defined twice")),
    ],
)
def test_structural_damage(tmp_path: Path, damage: str, fragments: tuple[str, ...]) -> None:
    """Damage the importer must never see: the loader names the graph part and the broken rule."""
    model = tiny_model()
    g = model.graph
    if damage == "opset_zero":
        model.opset_import[0].version = 0
    elif damage == "opset_twice":
        model.opset_import.append(helper.make_opsetid("", OPSET - 1))
    elif damage == "unnamed_initializer":
        g.initializer[0].name = ""
    elif damage == "initializer_shadows_initializer":
        g.initializer.append(g.initializer[0])
    elif damage == "node_overwrites_input":
        g.node[0].output[0] = "x"
    elif damage == "node_without_op_type":
        g.node[1].op_type = ""
    elif damage == "unknown_element_type":
        g.initializer[0].data_type = 77
    elif damage == "duplicate_in_branch":
        branch = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["b"], name="r1"), helper.make_node("Relu", ["x"], ["b"], name="r2")],
            "then",
            [],
            [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3])],
        )
        cond = helper.make_node("Constant", [], ["c"], name="cond", value=numpy_helper.from_array(np.array(True)))
        g.node.extend([cond, helper.make_node("If", ["c"], ["z"], name="if", then_branch=branch, else_branch=branch)])
    o = compile_one(write(tmp_path, "m.onnx", model))
    expect_model_error(o, o.path, *fragments)


def test_sparse_initializer_is_unsupported(tmp_path: Path) -> None:
    """A valid ONNX feature Cuvil does not take: an UnsupportedOpError, not a confusing 'undefined value'."""
    model = tiny_model()
    dense = model.graph.initializer.pop()
    values = numpy_helper.from_array(np.array([1.0], np.float32), "w")
    indices = numpy_helper.from_array(np.array([0], np.int64), "")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, list(dense.dims)))
    o = compile_one(write(tmp_path, "m.onnx", model))
    expect_model_error(o, "sparse", "'w'", kinds=("UnsupportedOpError",))


def test_in_memory_forms(tmp_path: Path) -> None:
    """``cuvil.compile`` also takes bytes and a ModelProto; their failures are ModelErrors too."""
    data = tiny_model().SerializeToString()
    assert cuvil.compile(data).output_names == ["y"]
    with pytest.raises(cuvil.ModelError, match=r"<bytes>: not a valid ONNX model"):
        cuvil.compile(data[: len(data) // 2])
    with pytest.raises(cuvil.ModelError, match=r"<bytes>: file is empty"):
        cuvil.compile(b"")
    with pytest.raises(cuvil.ModelError, match=r"cannot read a model from int"):
        cuvil.compile(42)


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


def test_external_data_needs_the_path(tmp_path: Path) -> None:
    """A ModelProto whose weights live in a file cannot be compiled from memory: say so, and how."""
    path = _with_external_w(tmp_path, "weights.bin")
    (tmp_path / "weights.bin").write_bytes(bytes(24))
    proto = onnx.load(str(path), load_external_data=False)
    with pytest.raises(cuvil.ModelError, match=r"tensor 'w' keeps its data in an external file.*from its path"):
        cuvil.compile(proto)


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


def small_cnn(folder: Path) -> Path:
    """Conv -> Relu -> MaxPool -> Reshape -> Gemm -> Softmax with its weights in an external file."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "conv_w"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "conv_b"),
        numpy_helper.from_array(np.array([1, -1], np.int64), "flat"),
        numpy_helper.from_array(rng.standard_normal((36, 10)).astype(np.float32), "fc_w"),
        numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], name="conv", kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p", "flat"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["g"], name="fc"),
        helper.make_node("Softmax", ["g"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)
    path = folder / "cnn.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="cnn.bin", size_threshold=0)
    return path


@pytest.mark.parametrize("seed", range(2))
def test_flipped_bytes_with_external_data(tmp_path: Path, seed: int) -> None:
    """Damage to a multi-op model's structure (names, attributes, external-data entries): compiled or a Cuvil error."""
    src = small_cnn(tmp_path)
    expect_ok(compile_one(src))  # the control
    data = src.read_bytes()
    rng = np.random.default_rng(100 + seed)
    paths = []
    for i in range(80):
        d = bytearray(data)
        for pos in rng.integers(0, len(d), size=int(rng.integers(1, 4))):
            d[pos] = int(rng.integers(0, 256))
        paths.append(write(tmp_path, f"flip{i}.onnx", bytes(d)))  # beside cnn.bin, so the weights are found
    for o in compile_all(paths):
        if o.outcome == "error":
            assert o.cuvil, f"{o.path}: {o.type} escaped:\n{o.traceback}"


@pytest.mark.parametrize(
    "old, new, fragments",
    [
        (b"relu", b"rel\xff", ("name of node 1", "not valid UTF-8")),
        (b"offset", b"offsez", ("'conv_w'", "unknown external data key 'offsez'")),
        (b"offset", b"off\xe4et", ("'conv_w'", "not valid text")),
        (b"cnn.bin", b"cnn.b\xffn", ("'conv_w'", "not valid text")),
    ],
)
def test_damaged_text(tmp_path: Path, old: bytes, new: bytes, fragments: tuple[str, ...]) -> None:
    """Bytes that are not UTF-8 in a name, or a mangled external-data key, are named, not ignored."""
    data = small_cnn(tmp_path).read_bytes()
    assert old in data
    o = compile_one(write(tmp_path, "damaged.onnx", data.replace(old, new, 1)))
    expect_model_error(o, *fragments)


# Unsupported ops ----------------------------------------------------------------------------------------


def test_every_unsupported_op_in_one_error(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Frobnicate", ["x"], ["f1"], name="frob_a", domain="com.example"),
        helper.make_node("Bernoulli", ["f1"], ["d1"], name="bern_a"),
        helper.make_node("Add", ["x", "w"], ["s"], name="add"),
        helper.make_node("Frobnicate", ["s"], ["f2"], name="frob_b", domain="com.example"),
        helper.make_node("Bernoulli", ["f2"], ["d2"], name="bern_b"),
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
    assert set(uses) == {("com.example", "Frobnicate"), ("", "Bernoulli")}, uses
    assert uses["com.example", "Frobnicate"].nodes == ("frob_a", "frob_b")
    assert uses["com.example", "Frobnicate"].opset == 3
    assert uses["", "Bernoulli"].nodes == ("bern_a", "bern_b")
    assert uses["", "Bernoulli"].opset == OPSET
    msg = str(e.value)
    assert msg.startswith("unsupported ops (2):"), msg
    for fragment in (
        "com.example::Frobnicate (opset 3)",
        "'frob_a', 'frob_b'",
        f"ai.onnx::Bernoulli (opset {OPSET})",
        "'bern_a', 'bern_b'",
    ):
        assert fragment in msg, msg


def test_unsupported_op_inside_a_branch_is_listed(tmp_path: Path) -> None:
    """The scan reaches into subgraphs: a Bernoulli in an If branch is reported with the top-level one."""
    branch = helper.make_graph(
        [helper.make_node("Bernoulli", ["x"], ["b"], name="bern_in_branch")],
        "then",
        [],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [])],
    )
    nodes = [
        helper.make_node("Constant", [], ["c"], name="cond", value=numpy_helper.from_array(np.array(True))),
        helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch, else_branch=branch),
        helper.make_node("Bernoulli", ["x"], ["z"], name="bern_top"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])]
    with pytest.raises(cuvil.UnsupportedOpError) as e:
        cuvil.compile(tiny_model(node=nodes, output=outputs))
    (bern,) = [u for u in e.value.uses if u.op_type == "Bernoulli"]
    assert set(bern.nodes) >= {"bern_top"} and any("bern_in_branch" in n for n in bern.nodes), bern


# The command line -----------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cuvil", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env(), check=False)


@pytest.mark.parametrize("kind", ["empty", "truncated", "random", "missing", "folder", "undefined_value"])
def test_cli_inspect_bad_file(tmp_path: Path, kind: str) -> None:
    data = tiny_model().SerializeToString()
    if kind == "undefined_value":
        nodes = [helper.make_node("Relu", ["ghost"], ["y"], name="relu")]
        path = write(tmp_path, "m.onnx", tiny_model(node=nodes))
    elif kind == "missing":
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
    assert (str(path) if kind != "undefined_value" else "'ghost'") in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
