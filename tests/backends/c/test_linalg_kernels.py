"""The C kernels of matmul, gemm and einsum agree with the reference interpreter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import cuvil
from tests.support.c_reduce_kernels import F16, F32, I32, compare, make_model, rand


def test_matmul_broadcast_and_vectors(cache: Path) -> None:
    nodes = [helper.make_node("MatMul", ["a", "b"], ["ab"]),        # batch broadcast [N,1,3,4] @ [2,4,5]
             helper.make_node("MatMul", ["a", "w"], ["aw"]),        # folded: B is one matrix
             helper.make_node("MatMul", ["v", "b"], ["vb"]),        # 1-D @ batched
             helper.make_node("MatMul", ["a", "v"], ["av"]),        # batched @ 1-D
             helper.make_node("MatMul", ["v", "v"], ["vv"])]        # dot product
    model = make_model(nodes, [("a", F32, ["N", 1, 3, 4]), ("b", F32, [2, 4, 5]), ("w", F32, [4, 6]), ("v", F32, [4])],
                       ["ab", "aw", "vb", "av", "vv"])
    rng = np.random.default_rng(0)
    feeds = [{"a": rand(rng, (n, 1, 3, 4)), "b": rand(rng, (2, 4, 5)), "w": rand(rng, (4, 6)), "v": rand(rng, (4,))}
             for n in (1, 3)]
    compare(model, feeds, cache, targets=("generic", "native"))


def test_matmul_other_types(cache: Path) -> None:
    nodes = [helper.make_node("MatMul", ["i", "j"], ["ij"]), helper.make_node("MatMul", ["h", "g"], ["hg"]),
             helper.make_node("MatMul", ["d", "e"], ["de"])]
    model = make_model(nodes, [("i", I32, [2, 3, 4]), ("j", I32, [4, 2]), ("h", F16, [3, 8]), ("g", F16, [2, 8, 5]),
                               ("d", TensorProto.DOUBLE, [3, 3]), ("e", TensorProto.DOUBLE, [3])], ["ij", "hg", "de"])
    rng = np.random.default_rng(1)
    feed = {"i": rng.integers(-2**20, 2**20, (2, 3, 4)).astype(np.int32), "j": rng.integers(-2**20, 2**20, (4, 2)).astype(np.int32),
            "h": rand(rng, (3, 8), np.float16), "g": rand(rng, (2, 8, 5), np.float16),
            "d": rand(rng, (3, 3), np.float64), "e": rand(rng, (3,), np.float64)}
    compare(model, [feed], cache)


def test_matmul_inner_dims_checked_at_run_time(cache: Path) -> None:
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", F32, [2, "K"]), ("b", F32, ["L", 3])], ["y"])
    m = cuvil.compile(model, target="generic", cache_dir=str(cache))
    with pytest.raises(Exception, match="inner dims differ: 4 != 5"):
        m.run({"a": np.zeros((2, 4), np.float32), "b": np.zeros((5, 3), np.float32)})


def test_gemm(cache: Path) -> None:
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["y1"], alpha=0.5, beta=2.0, transA=1, transB=1),
             helper.make_node("Gemm", ["at", "bt"], ["y2"]),
             helper.make_node("Gemm", ["at", "bt", "cs"], ["y3"], beta=0.0),
             helper.make_node("Gemm", ["ia", "ib", "ic"], ["y4"]),
             helper.make_node("Gemm", ["ia", "ib", "ic"], ["y5"], alpha=2.5),
             helper.make_node("Gemm", ["ha", "hb", "hc"], ["y6"], alpha=0.5, transB=1)]
    model = make_model(nodes, [("a", F32, [4, "M"]), ("b", F32, [5, 4]), ("c", F32, [5]), ("at", F32, ["M", 4]),
                               ("bt", F32, [4, 5]), ("cs", F32, []), ("ia", I32, [2, 3]), ("ib", I32, [3, 2]),
                               ("ic", I32, [2, 1]), ("ha", F16, [2, 3]), ("hb", F16, [4, 3]), ("hc", F16, [1, 4])],
                       ["y1", "y2", "y3", "y4", "y5", "y6"])
    rng = np.random.default_rng(2)
    feeds = [{"a": rand(rng, (4, m)), "b": rand(rng, (5, 4)), "c": rand(rng, (5,)), "at": rand(rng, (m, 4)),
              "bt": rand(rng, (4, 5)), "cs": np.array(3.0, np.float32),
              "ia": rng.integers(-9, 9, (2, 3)).astype(np.int32), "ib": rng.integers(-9, 9, (3, 2)).astype(np.int32),
              "ic": rng.integers(-9, 9, (2, 1)).astype(np.int32), "ha": rand(rng, (2, 3), np.float16),
              "hb": rand(rng, (4, 3), np.float16), "hc": rand(rng, (1, 4), np.float16)} for m in (3, 7)]
    compare(model, feeds, cache, targets=("generic", "native"))


@pytest.mark.parametrize("equation,shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(3, 3)]),
    ("...ij->...ji", [(2, 3, 4, 5)]),
    ("i,i", [(6,), (6,)]),
    ("ij->", [(3, 4)]),
    ("ij,jk", [(3, 4), (4, 2)]),
    ("...i,...i->...", [(2, 1, 4), (3, 4)]),
    ("bii,bi->b", [(2, 3, 3), (1, 3)]),
])
def test_einsum(equation: str, shapes: list[tuple[int, ...]], cache: Path) -> None:
    names = [f"x{i}" for i in range(len(shapes))]
    model = make_model([helper.make_node("Einsum", names, ["y"], equation=equation)],
                       [(n, F32, list(s)) for n, s in zip(names, shapes)], ["y"])
    rng = np.random.default_rng(3)
    compare(model, [{n: rand(rng, s) for n, s in zip(names, shapes)}], cache)


def test_einsum_int_and_symbolic(cache: Path) -> None:
    model = make_model([helper.make_node("Einsum", ["a", "b"], ["y"], equation="nij,jk->nik")],
                       [("a", I32, ["N", 2, 3]), ("b", I32, [3, 4])], ["y"])
    rng = np.random.default_rng(4)
    feeds = [{"a": rng.integers(-5, 5, (n, 2, 3)).astype(np.int32), "b": rng.integers(-5, 5, (3, 4)).astype(np.int32)}
             for n in (1, 4)]
    compare(model, feeds, cache)
