"""The wasm32 target: the C backend's code compiled with zig cc, run with wasmtime, checked against the ref target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

wasmtime = pytest.importorskip("wasmtime")
pytest.importorskip("ziglang")

import cuvil  # noqa: E402
from cuvil.backends.c.library import RunError  # noqa: E402
from cuvil.backends.c.toolchain import RUNTIME_DIR  # noqa: E402
from cuvil.backends.wasm import runtime  # noqa: E402
from cuvil.backends.wasm.toolchain import BASE_FLAGS, Zig, zig_global_cache  # noqa: E402
from cuvil.errors import CuvilError, InputError  # noqa: E402
from tests.support.wasm_models import assert_same, elementwise_inputs, elementwise_model, make_model  # noqa: E402

F32, F16, I32, I64, BOOL = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One build cache for the session (zig's library cache is the machine's: see zig_global_cache)."""
    return str(tmp_path_factory.mktemp("wasm-cache"))


@pytest.fixture(scope="session")
def elementwise(cache: str) -> cuvil.CompiledModel:
    return cuvil.compile(elementwise_model(), target="wasm32", cache_dir=cache)


@pytest.mark.parametrize("n", [5, 1, 0])
def test_matches_ref_at_several_shapes(elementwise: cuvil.CompiledModel, n: int) -> None:
    ref = cuvil.compile(elementwise_model(), target="ref")
    feeds = elementwise_inputs(np.random.default_rng(n), n)
    assert_same(elementwise.run(feeds), ref.run(feeds))
    assert [a.shape for a in elementwise(*feeds.values())] == [(n, 3), (n,), (n, 4)]


def test_build_is_cached_and_clean(elementwise: cuvil.CompiledModel, cache: str) -> None:
    b = elementwise.build_info
    assert b is not None and b.library.is_file() and b.weights.is_file() and b.source.is_file()
    assert b.warnings == ""
    assert any(zig_global_cache(Path(cache)).iterdir())  # zig's own cache: wasi-libc and compiler-rt
    again = cuvil.compile(elementwise_model(), target="wasm32", cache_dir=cache)
    assert again.build_info is not None and again.build_info.cached and again.build_info.folder == b.folder


def test_zig_cache_is_the_machines_unless_it_cannot_be_written(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    from cuvil.backends.wasm import toolchain

    monkeypatch.setattr(toolchain, "default_cache_dir", lambda: tmp_path / "home-cache")
    assert zig_global_cache(tmp_path / "a") == zig_global_cache(tmp_path / "b") == tmp_path / "home-cache" / "zig"
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(toolchain, "default_cache_dir", lambda: tmp_path / "file" / "cache")  # cannot be made
    assert zig_global_cache(tmp_path / "a") == tmp_path / "a" / "zig"


def test_c_check_reports_bad_shape(elementwise: cuvil.CompiledModel) -> None:
    feeds = elementwise_inputs(np.random.default_rng(0), 2)
    feeds["x"] = np.zeros((2, 4), np.float32)
    with pytest.raises(InputError):  # the Python guard
        elementwise.run(feeds)
    with pytest.raises(RunError, match=r"input x: dim 1 must be 3, got 4"):  # the module's own check
        elementwise._executor.run(list(feeds.values()), {})
    feeds = elementwise_inputs(np.random.default_rng(0), 2)
    feeds["h"] = np.zeros(3, np.float16)
    with pytest.raises(RunError, match=r"input h: dim 0 is n=3, but an earlier input gave 2"):
        elementwise._executor.run(list(feeds.values()), {})
    with pytest.raises(InputError, match="takes 5 inputs, got 1"):
        elementwise._executor.run([feeds["x"]], {})
    # The instance is still usable after reporting errors.
    ok = elementwise_inputs(np.random.default_rng(1), 3)
    assert_same(elementwise.run(ok), cuvil.compile(elementwise_model(), target="ref").run(ok))


def test_threads_get_bitwise_identical_results(elementwise: cuvil.CompiledModel) -> None:
    rng = np.random.default_rng(7)
    cases = [elementwise_inputs(rng, n) for n in (1, 2, 3, 5, 8, 13, 21, 34)]
    serial = [elementwise.run(c) for c in cases]
    results: dict[tuple[int, int], dict[str, np.ndarray]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(t: int) -> None:
        try:
            start.wait()
            for rep in range(20):
                k = (t + rep) % len(cases)
                results[(t, rep)] = elementwise.run(cases[k])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert len(results) == 8 * 20
    for (t, rep), got in results.items():
        want = serial[(t + rep) % len(cases)]
        for name in want:
            assert got[name].dtype == want[name].dtype and got[name].tobytes() == want[name].tobytes()


def _control_flow() -> onnx.ModelProto:
    """If on a run-time condition, and a Loop with a run-time trip count accumulating a symbolic-shape tensor."""
    vi = helper.make_tensor_value_info
    then_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [], [vi("t", F32, ["n"])])
    else_g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["e"])], "else", [], [vi("e", F32, ["n"])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Add", ["acc_in", "x"], ["acc_out"])],
        "body",
        [vi("iter", I64, []), vi("c_in", BOOL, []), vi("acc_in", F32, ["n"])],
        [vi("c_out", BOOL, []), vi("acc_out", F32, ["n"])],
    )
    nodes = [
        helper.make_node("If", ["cond"], ["picked"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Loop", ["trips", "keep_going", "x"], ["summed"], body=body),
    ]
    return make_model(nodes, [vi("cond", BOOL, []), vi("trips", I64, []), vi("keep_going", BOOL, []), vi("x", F32, ["n"])],
                  [vi("picked", F32, ["n"]), vi("summed", F32, ["n"])])


def test_if_and_loop(cache: str) -> None:
    m = cuvil.compile(_control_flow(), target="wasm32", cache_dir=cache)
    ref = cuvil.compile(_control_flow(), target="ref")
    rng = np.random.default_rng(3)
    for cond, trips, n in ((True, 3, 4), (False, 0, 7), (True, 5, 0)):
        feeds = {"cond": np.array(cond), "trips": np.array(trips, np.int64), "keep_going": np.array(True),
                 "x": rng.standard_normal(n).astype(np.float32)}
        assert_same(m.run(feeds), ref.run(feeds))


def test_tensor_record_layout_on_wasm32(cache: str, tmp_path: Path) -> None:
    """The offsets runtime.py (and docs/wasm.md) use are the ones clang gives struct cuvil_tensor on wasm32."""
    src = tmp_path / "layout.c"
    src.write_text(
        '#include <stddef.h>\n#include "cuvil_api.h"\n'
        '__attribute__((export_name("layout"))) int layout(int i) {\n'
        "    static const int v[] = {(int)sizeof(cuvil_tensor), (int)_Alignof(cuvil_tensor),\n"
        "        (int)offsetof(cuvil_tensor, data), (int)offsetof(cuvil_tensor, shape),\n"
        "        (int)offsetof(cuvil_tensor, rank), (int)offsetof(cuvil_tensor, dtype),\n"
        "        (int)sizeof(void *), (int)sizeof(size_t), (int)sizeof(long)};\n"
        "    return v[i];\n}\n",
        encoding="utf-8",
    )
    zig_cache = str(zig_global_cache(Path(cache)))
    out = tmp_path / "layout.wasm"
    env = {**os.environ, "ZIG_GLOBAL_CACHE_DIR": zig_cache, "ZIG_LOCAL_CACHE_DIR": zig_cache}
    subprocess.run([*Zig().argv, "cc", *BASE_FLAGS, f"-I{RUNTIME_DIR}", str(src), "-o", str(out)],
                   check=True, env=env, capture_output=True)
    store = wasmtime.Store()
    linker = wasmtime.Linker(store.engine)
    linker.define_wasi()
    store.set_wasi(wasmtime.WasiConfig())
    inst = linker.instantiate(store, wasmtime.Module.from_file(store.engine, str(out)))
    layout = inst.exports(store)["layout"]
    got = [layout(store, i) for i in range(9)]
    assert got == [runtime.TENSOR.size, 8, runtime.TENSOR_DATA, runtime.TENSOR_SHAPE, runtime.TENSOR_RANK,
                   runtime.TENSOR_DTYPE, 4, 4, 4]
    assert got[:6] == [80, 8, 0, 8, 72, 76]  # as docs/wasm.md states


def test_module_exports_the_api_and_needs_no_system(elementwise: cuvil.CompiledModel) -> None:
    module = wasmtime.Module.from_file(wasmtime.Engine(), str(elementwise.build_info.library))
    names = {e.name for e in module.exports}
    assert {"memory", "_initialize", "cuvil_malloc", "cuvil_free", "cuvil_load_from_memory", "cuvil_unload",
            "cuvil_run", "cuvil_num_inputs", "cuvil_num_outputs"} <= names
    assert "cuvil_load" not in names  # a wasm host passes the weights in memory
    assert all(i.module == "wasi_snapshot_preview1" for i in module.imports)


def test_wasm32_rejects_native_options() -> None:
    with pytest.raises(CuvilError, match="wasm32 builds with zig cc"):
        cuvil.compile(elementwise_model(), target="wasm32", cc="gcc")


def test_python_host_example_in_docs(cache: str) -> None:
    """docs/wasm.md's wasmtime example runs a built module without Cuvil's runtime and gets the same results."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "wasm.md").read_text(encoding="utf-8")
    code = doc.split("## A Python host with wasmtime", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, object] = {}
    exec(compile(code, "docs/wasm.md", "exec"), scope)  # the documented example itself
    vi = helper.make_tensor_value_info
    w = helper.make_tensor("w", F32, [2, 1], [1.5, -4.0])
    model = make_model([helper.make_node("Mul", ["x", "w"], ["y"]), helper.make_node("Neg", ["x"], ["z"])],
                   [vi("x", F32, ["n"])], [vi("y", F32, [2, "n"]), vi("z", F32, ["n"])], [w])
    m = cuvil.compile(model, target="wasm32", cache_dir=cache)
    x = np.arange(5, dtype=np.float32)
    b = m.build_info
    assert b is not None
    got = scope["run_model"](str(b.library), str(b.weights), [x])  # type: ignore[operator]
    want = m(x)
    assert len(got) == len(want) == 2
    for g, e in zip(got, want):
        assert g.shape == e.shape and g.tobytes() == e.tobytes()


def test_tensor_beyond_the_32_bit_address_space_is_a_clean_error(cache: str) -> None:
    """size_t is 32 bits on wasm32: a 16 GiB intermediate must fail as out of memory, not wrap to a small buffer."""
    vi = helper.make_tensor_value_info
    model = make_model([helper.make_node("Expand", ["x", "s"], ["y"]), helper.make_node("ReduceSum", ["y"], ["z"], keepdims=0)],
                   [vi("x", F32, [1]), vi("s", I64, [2])], [vi("z", F32, [])])
    m = cuvil.compile(model, target="wasm32", cache_dir=cache)
    one = np.ones(1, np.float32)
    assert m(one, np.array([4, 5], np.int64))[0] == 20
    with pytest.raises(RunError, match="node Expand_0: out of memory"):
        m(one, np.array([65536, 65537], np.int64))
    assert m(one, np.array([3, 3], np.int64))[0] == 9  # the instance is still usable


def test_saved_artifact_loads_and_rebuilds(elementwise: cuvil.CompiledModel, cache: str, tmp_path: Path) -> None:
    """save/load round trip; the artifact's own rebuild command gives the same module from its files alone."""
    folder = elementwise.save(tmp_path / "art")
    names = sorted(p.name for p in folder.iterdir())
    assert {"meta.json", "model.c", "model.wasm", "weights.bin", "cuvil_api.h", "cuvil_rt.h"} <= set(names)
    loaded = cuvil.load(folder)
    assert loaded.target == "wasm32"
    feeds = elementwise_inputs(np.random.default_rng(11), 6)
    assert_same(loaded.run(feeds), elementwise.run(feeds))
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["backend"] == "wasm" and meta["files"]["library"] == "model.wasm"
    rebuild = meta["rebuild"].split()
    assert rebuild[:4] == ["python", "-m", "ziglang", "cc"]
    zig_cache = str(zig_global_cache(Path(cache)))
    env = {**os.environ, "ZIG_GLOBAL_CACHE_DIR": zig_cache, "ZIG_LOCAL_CACHE_DIR": str(tmp_path / "zig-local")}
    subprocess.run([*Zig().argv, *rebuild[3:-1], "again.wasm"], cwd=folder, check=True, env=env, capture_output=True)
    assert (folder / "again.wasm").read_bytes() == (folder / "model.wasm").read_bytes()


_TRAP_CHILD = """
import sys
import numpy as np
import pytest
import cuvil
from cuvil.backends.c.library import RunError
from tests.support.wasm_models import assert_same, elementwise_model, elementwise_inputs

m = cuvil.compile(elementwise_model(), target="wasm32", cache_dir=sys.argv[1])
model = m._executor.model
feeds = elementwise_inputs(np.random.default_rng(5), 3)
want = m.run(feeds)
broken = model._instance()
broken.handle = 0xFFFFFFF0  # a model pointer past the end of memory: reading the weights traps
with pytest.raises(RunError, match="trapped"):
    m.run(feeds)
assert model._instance() is not broken
assert_same(m.run(feeds), want)
print("trap handled")
"""


def test_trap_is_an_error_and_the_next_call_gets_a_fresh_instance(cache: str) -> None:
    """In a process of its own: wasmtime catches the trap with a SIGSEGV handler, which a handler
    installed after it (a test runner's faulthandler, say) would run before (docs/wasm.md)."""
    repo = Path(__file__).resolve().parents[3]
    r = subprocess.run([sys.executable, "-c", _TRAP_CHILD, cache], capture_output=True, text=True, cwd=repo,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(repo)})
    assert r.returncode == 0 and "trap handled" in r.stdout, r.stderr[-3000:]
