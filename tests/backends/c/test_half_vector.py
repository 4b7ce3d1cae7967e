"""float16 storage loops in chunks (fused epilogues, products with a constant operand) give bitwise
the reference's result: round to nearest even per value, as NumPy's float16 does.

The operands are chosen so that every float32 sum is exact (integers times a power of two, few
terms): the only rounding is the one to float16, which then must match bit for bit, ties and
tails of every length (sizes that are no multiple of 16 or of the 256-value chunk) included.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import cuvil
from tests.support.c_reduce_kernels import F16, F32, make_model

TARGETS = ("native", "generic")


def _grid(rng: np.random.Generator, shape: tuple[int, ...], scale: int, lo: int = -1024, hi: int = 1024) -> np.ndarray:
    """Integers times 2**-scale, exact in float16 (|integer| <= 2048)."""
    return (rng.integers(lo, hi, shape) * 2.0 ** -scale).astype(np.float16)


def _same_f16(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == np.float16 and want.dtype == np.float16 and got.shape == want.shape, what
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), what
    diff = got.view(np.uint16)[~nan] != want.view(np.uint16)[~nan]
    assert not diff.any(), f"{what}: {int(diff.sum())} values differ, first at {np.argwhere(~nan)[np.argmax(diff)]}"


def _fused(m: cuvil.CompiledModel, op: str) -> list[str]:  # type: ignore[name-defined]
    return [n.op for n in m.graph.nodes if n.op.startswith("fused_") and op in n.op]


@pytest.mark.parametrize("target", TARGETS)
def test_conv_epilogues_f16_bitwise(cache: Path, target: str) -> None:
    """Conv -> Clip and Conv -> Add(residual) -> Relu: the epilogue runs in chunks over the float16 result."""
    rng = np.random.default_rng(0)
    w = rng.integers(-7, 8, (24, 16, 1, 1)).astype(np.float16)
    b = _grid(rng, (24,), 6)
    consts = {"w": w, "b": b, "lo": np.array(-3.3, np.float16), "hi": np.array(700.0, np.float16)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"]),
             helper.make_node("Conv", ["x", "w"], ["c2"]),
             helper.make_node("Add", ["c2", "r"], ["s"]),
             helper.make_node("Relu", ["s"], ["z"])]
    model = make_model(nodes, [("x", F16, [2, 16, 7, 9]), ("r", F16, [2, 24, 7, 9])], ["y", "z"], consts)
    ref = cuvil.compile(model, target="ref")
    m = cuvil.compile(model, target=target, cache_dir=str(cache))
    assert m.build_info.warnings == ""  # type: ignore[union-attr]
    assert len(_fused(m, "conv")) == 2
    x = _grid(rng, (2, 16, 7, 9), 6)
    r = _grid(rng, (2, 24, 7, 9), 3)
    r.flat[[0, 17, 1000, 2000]] = [np.inf, -np.inf, np.nan, np.float16(6.1e-5)]  # specials reach the chunks
    want, got = ref.run({"x": x, "r": r}), m.run({"x": x, "r": r})
    for name in ("y", "z"):
        _same_f16(got[name], want[name], f"{name} on {target}")
    assert any(np.float32(v) != np.float32(np.float16(np.float32(v))) for v in
               (x[0, :, 0, 0].astype(np.float32) @ w[:, :, 0, 0].T.astype(np.float32)))  # rounding is exercised


@pytest.mark.parametrize("target", TARGETS)
def test_strided_conv_f16_bitwise(cache: Path, target: str) -> None:
    """A padded, strided f16 convolution (the tiled float32 GEMM on widened operands), bias and ReLU."""
    rng = np.random.default_rng(5)
    consts = {"w": rng.integers(-7, 8, (8, 3, 3, 3)).astype(np.float16), "b": _grid(rng, (8,), 6)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [("x", F16, [1, 3, 21, 19])], ["y"], consts)
    ref = cuvil.compile(model, target="ref")
    m = cuvil.compile(model, target=target, cache_dir=str(cache))
    feed = {"x": _grid(rng, (1, 3, 21, 19), 6)}
    _same_f16(m.run(feed)["y"], ref.run(feed)["y"], f"y on {target}")


@pytest.mark.parametrize("target", TARGETS)
def test_matmul_epilogue_row_and_full_extras_f16(cache: Path, target: str) -> None:
    """MatMul -> Mul(row vector) -> Add(full): a row extra widened once, a full one per chunk."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["a", "bm"], ["p"]),
             helper.make_node("Mul", ["p", "v"], ["q"]),
             helper.make_node("Add", ["q", "r"], ["y"])]
    n = 300  # a row longer than one chunk, with a tail
    model = make_model(nodes, [("a", F16, [5, 8]), ("r", F16, [5, n])], ["y"],
                       {"bm": rng.integers(-7, 8, (8, n)).astype(np.float16), "v": _grid(rng, (n,), 2, -8, 8)})
    ref = cuvil.compile(model, target="ref")
    m = cuvil.compile(model, target=target, cache_dir=str(cache))
    assert m.build_info.warnings == ""  # type: ignore[union-attr]
    assert _fused(m, "matmul") or _fused(m, "gemm")
    feed = {"a": _grid(rng, (5, 8), 6), "r": _grid(rng, (5, n), 4)}
    _same_f16(m.run(feed)["y"], ref.run(feed)["y"], f"y on {target}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rows", [1, 3])
def test_gemm_constant_transposed_weight_f16(cache: Path, target: str, rows: int) -> None:
    """A constant (transposed) f16 weight is read from the model's widened copy: same bits, every call."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Gemm", ["a", "w", "c"], ["y"], transB=1)]
    model = make_model(nodes, [("a", F16, [rows, 40])], ["y"],
                       {"w": rng.integers(-7, 8, (37, 40)).astype(np.float16), "c": _grid(rng, (37,), 6)})
    ref = cuvil.compile(model, target="ref")
    m = cuvil.compile(model, target=target, cache_dir=str(cache))
    for seed in (3, 4):
        feed = {"a": _grid(np.random.default_rng(seed), (rows, 40), 6)}
        want = ref.run(feed)["y"]
        first, again = m.run(feed)["y"], m.run(feed)["y"]
        _same_f16(first, want, f"first call on {target}")
        _same_f16(again, want, f"second call on {target}")


@pytest.mark.parametrize("target", TARGETS)
def test_fused_elementwise_f16_intermediates(cache: Path, target: str) -> None:
    """A fused f16 chain rounds each intermediate to float16 as the unfused ops do: products and sums
    that tie, overflow to infinity, fall into subnormals or meet NaN."""
    nodes = [helper.make_node("Mul", ["a", "b"], ["p"]),
             helper.make_node("Add", ["p", "c"], ["q"]),
             helper.make_node("Div", ["q", "b"], ["d"]),
             helper.make_node("Sub", ["d", "a"], ["y"])]
    n = 4099
    model = make_model(nodes, [("a", F16, [n]), ("b", F16, [n]), ("c", F16, [n])], ["y"])
    ref = cuvil.compile(model, target="ref")
    m = cuvil.compile(model, target=target, cache_dir=str(cache))
    assert [nd.op for nd in m.graph.nodes if nd.op.startswith("fused")] == ["fused_elementwise"]
    rng = np.random.default_rng(6)
    scale = 2.0 ** rng.integers(-14, 9, (3, n))
    a, b, c = (rng.standard_normal((3, n)) * scale).astype(np.float16)
    a[:8] = [6e4, 1e-4, 3e-5, np.inf, np.nan, -0.0, 65504, 2.0 ** -24]
    b[:8] = [4.0, 1e-4, -2.0 ** -10, 0.0, 1.0, 3.0, 1.0, 0.5]
    feed = {"a": a, "b": b, "c": c}
    with np.errstate(all="ignore"):
        want = ref.run(feed)["y"]
    _same_f16(m.run(feed)["y"], want, f"y on {target}")


def _cast_model(src: int, dst: int, n: int) -> object:
    return make_model([helper.make_node("Cast", ["x"], ["y"], to=dst)], [("x", src, [n])], ["y"])


@pytest.mark.parametrize("target", TARGETS)
def test_bulk_conversions_match_numpy(cache: Path, target: str) -> None:
    """Every float16 widened exactly; float32 values at, around and between float16 ones (ties to
    even, subnormals, overflow to infinity) rounded as NumPy rounds them."""
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)[:65533]  # a tail of 13
    widen = cuvil.compile(_cast_model(F16, F32, every.size), target=target, cache_dir=str(cache))
    got = widen.run({"x": every})["y"]
    nan = np.isnan(every)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), every[~nan].astype(np.float32).view(np.uint32))

    h = np.arange(0, 0x7c00, 7, dtype=np.uint16).view(np.float16).astype(np.float32)
    ulp = np.spacing(np.abs(h.astype(np.float16))).astype(np.float32)
    xs = np.concatenate([h, h + ulp / 2, h - ulp / 4, h + ulp * 0.75, -(h + ulp / 2),
                         np.array([65504, 65519.99, 65520, 1e30, np.inf, -np.inf, np.nan, 2.0 ** -25,
                                   2.0 ** -25 * 1.0001, 2.0 ** -24 * 1.5, -0.0], np.float32)]).astype(np.float32)
    xs = xs[: xs.size - xs.size % 16 + 5]  # a tail of 5
    narrow = cuvil.compile(_cast_model(F32, F16, xs.size), target=target, cache_dir=str(cache))
    with np.errstate(over="ignore"):
        want = xs.astype(np.float16)
    _same_f16(narrow.run({"x": xs})["y"], want, f"float32 -> float16 on {target}")
