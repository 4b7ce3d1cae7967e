"""The CUDA target's generated source run on the CPU under the execution harness (``cuda-sim``),
against the reference interpreter: each kernel family on a small graph, whole models from the
zoo, one build serving every batch size (relative L2 at most 1e-5 in float32)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cuvil
from cuvil.ir.parser import parse_graph
from cuvil.metrics import relative_l2
from tests.cuda.support import GRAPHS, graph, harness_missing

pytestmark = pytest.mark.skipif(harness_missing() is not None, reason=str(harness_missing()))

TOL = 1e-5
EXAMPLES = Path(cuvil.__file__).parent / "examples"


def random_inputs(m: cuvil.CompiledModel, n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for s in m.input_specs:
        shape = [d if isinstance(d, int) else n for d in s.type.shape]
        if str(s.type.dtype).startswith("i"):
            out.append(rng.integers(-4, 4, shape).astype(np.int64))
        else:
            out.append(rng.standard_normal(shape).astype(np.float32))
    return out


def assert_matches_ref(m: cuvil.CompiledModel, model: object, xs: list[np.ndarray]) -> None:
    got = m(*xs)
    want = cuvil.compile(model, target="ref")(*xs)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    want = list(want) if isinstance(want, (list, tuple)) else [want]
    assert len(got) == len(want)
    for name, g, w in zip(m.output_names, got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, name
        err = relative_l2(g, w)
        assert err <= TOL, f"output {name}: relative L2 {err:.3g} > {TOL}"


@pytest.mark.parametrize("family", sorted(GRAPHS))
def test_kernel_family_matches_reference_at_every_batch(family: str, tmp_path: Path) -> None:
    g = graph(family)
    m = cuvil.compile(g, target="cuda-sim", cache_dir=str(tmp_path))
    folder = m.build_info.folder  # type: ignore[union-attr]
    for n in (1, 3, 17):  # one build: the dims are passed at run time
        assert_matches_ref(m, g, random_inputs(m, n, seed=n))
    assert m.build_info.folder == folder  # type: ignore[union-attr]


def test_input_checks_run_before_any_copy(tmp_path: Path) -> None:
    m = cuvil.compile(graph("elementwise"), target="cuda-sim", cache_dir=str(tmp_path))
    xs = random_inputs(m, 65)  # n is at most 64
    with pytest.raises(cuvil.errors.CuvilError, match=r"maximum 64|above"):
        m(*xs)


def test_saved_artifact_runs_in_another_load(tmp_path: Path) -> None:
    g = graph("linalg")
    m = cuvil.compile(g, target="cuda-sim", cache_dir=str(tmp_path / "cache"))
    folder = m.save(tmp_path / "art")
    names = {p.name for p in folder.iterdir()}
    assert {"model.cu", "model.so", "weights.bin", "cuvil_api.h", "cuvil_cuda.h", "cuvil_cuda_host.h",
            "meta.json"} <= names
    loaded = cuvil.load(folder)
    xs = random_inputs(m, 5)
    for a, b in zip(m(*xs), loaded(*xs)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_tiny_cnn_matches_reference(tmp_path: Path) -> None:
    path = EXAMPLES / "tiny_cnn.onnx"
    m = cuvil.compile(path, target="cuda-sim", cache_dir=str(tmp_path))
    for n in (1, 2):
        assert_matches_ref(m, path, random_inputs(m, n, seed=n))


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    from tests.support.exported import ModelStore

    return ModelStore(tmp_path_factory.mktemp("zoo"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_zoo_model_with_symbolic_batch_matches_reference(zoo, name: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    em = zoo.get(name, dynamic=True)
    m = cuvil.compile(em.path, target="cuda-sim", cache_dir=str(tmp_path))
    for b in (1, 3):
        assert_matches_ref(m, em.path, list(em.inputs(b)))


def _reduced_error(model: object, m: cuvil.CompiledModel, xs: list[np.ndarray]) -> float:
    got = m(*xs)
    want = cuvil.compile(model, target="ref")(*xs)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    want = list(want) if isinstance(want, (list, tuple)) else [want]
    return max(relative_l2(np.asarray(g), np.asarray(w)) for g, w in zip(got, want))


def test_fp16_build_of_the_linear_layers_is_within_1e_2(tmp_path: Path) -> None:
    g = graph("linalg")
    m = cuvil.compile(g, target="cuda-sim", precision="fp16", cache_dir=str(tmp_path))
    src = m.build_info.source.read_text()  # type: ignore[union-attr]
    assert "cuvil_f32_to_f16" in src and "wmma::mma_sync" in src  # the products run on tensor cores
    assert _reduced_error(g, m, random_inputs(m, 5)) <= 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_zoo_and_cnn_within_1e_2(zoo, precision: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for model in (EXAMPLES / "tiny_cnn.onnx", zoo.get("mlp", dynamic=True).path):
        m = cuvil.compile(model, target="cuda-sim", precision=precision, cache_dir=str(tmp_path))
        assert _reduced_error(model, m, random_inputs(m, 2)) <= 1e-2


def test_threads_calling_one_model_agree_bitwise_with_single_calls(tmp_path: Path) -> None:
    import threading

    g = graph("linalg")
    m = cuvil.compile(g, target="cuda-sim", cache_dir=str(tmp_path))
    feeds = [random_inputs(m, n, seed=n) for n in (2, 5, 9, 13)]
    alone = [[np.asarray(a) for a in m(*x)] for x in feeds]
    got: dict[int, list[np.ndarray]] = {}
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            for _ in range(3):
                got[i] = [np.asarray(a) for a in m(*feeds[i])]
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(feeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, want in enumerate(alone):
        for a, b in zip(got[i], want):
            np.testing.assert_array_equal(a, b)


GATHER = """graph main(%x: f32[n, 3, 4], %i: i64[k]) {
  symbol n in 1..64
  symbol k in 1..16
  %g = gather(%x, %i) {axis = 2} : f32[n, 3, k] loc("embed/Gather")
  %r = relu(%g) : f32[n, 3, k]
  return %r
}
"""


def test_gather_index_out_of_range_fails_the_call_naming_the_node(tmp_path: Path) -> None:
    g = parse_graph(GATHER)
    m = cuvil.compile(g, target="cuda-sim", cache_dir=str(tmp_path))
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    assert_matches_ref(m, g, [x, np.array([3, -4, 0, -1], dtype=np.int64)])  # in range, negatives wrap
    for bad in (4, -5):
        with pytest.raises(cuvil.errors.CuvilError,
                           match=rf"node embed/Gather \(gather\): index {bad} is out of range for axis 2 of size 4"):
            m(x, np.array([0, bad, 1], dtype=np.int64))
    assert_matches_ref(m, g, [x, np.array([1, 2], dtype=np.int64)])  # a failed call leaves nothing behind
