"""fp16/bf16 conversion of the mask-fill idiom: a float32 constant beyond the reduced type's range used to
fill masked positions before a softmax becomes the reduced extreme; any other such constant is refused."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import cuvil
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.types import TensorType
from cuvil.metrics import max_abs_error
from cuvil.passes.convert_precision import mask_fills
from cuvil.quant import PrecisionOverflowError

F32 = DType.f32
F32_MIN = float(np.finfo(np.float32).min)
SHAPE = (4, 16)


def _where_fill() -> Graph:
    b = Builder()
    x = b.input("x", TensorType(F32, SHAPE))
    m = b.input("m", TensorType(DType.bool, SHAPE))
    f = b.add1("where", [m, x, b.constant(np.array(F32_MIN, np.float32))], names=["filled"], node_name="fill")
    b.output(b.add1("softmax", [f], {"axis": -1}, names=["p"], node_name="sm"))
    return b.graph


def _additive_fill() -> Graph:
    """``softmax(x + (1 - mask) * f32_min)``, as PyTorch exports a BERT attention mask."""
    b = Builder()
    x = b.input("x", TensorType(F32, SHAPE))
    m = b.input("m", TensorType(F32, SHAPE))
    inv = b.add1("sub", [b.constant(np.array(1.0, np.float32)), m], names=["inv"], node_name="invert")
    bias = b.add1("mul", [inv, b.constant(np.array(F32_MIN, np.float32))], names=["bias"], node_name="to_bias")
    s = b.add1("add", [x, bias], names=["masked"], node_name="apply")
    b.output(b.add1("softmax", [s], {"axis": -1}, names=["p"], node_name="sm"))
    return b.graph


def _scaled(then: str) -> Graph:
    """``x * 1e6`` read by ``then``: a constant that scales data, no fill."""
    b = Builder()
    x = b.input("x", TensorType(F32, SHAPE))
    y = b.add1("mul", [x, b.constant(np.array(1e6, np.float32))], names=["big"], node_name="scale")
    b.output(b.add1(then, [y], {"axis": -1} if then == "softmax" else {}, names=["y"], node_name="after"))
    return b.graph


def _feeds(mask_dtype: DType) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    mask = rng.random(SHAPE) > 0.3
    mask[:, 0] = True  # every row keeps a position
    return [rng.standard_normal(SHAPE).astype(np.float32), mask if mask_dtype is DType.bool else mask.astype(np.float32)]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("make,mask", [(_where_fill, DType.bool), (_additive_fill, F32)])
def test_mask_fill_converts_and_matches_fp32(make: object, mask: DType, precision: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    graph = make()  # type: ignore[operator]
    feeds = _feeds(mask)
    (want,) = cuvil.compile(graph, "ref")(*feeds)
    with caplog.at_level(logging.INFO, logger="cuvil.passes.convert_precision"):
        (got,) = cuvil.compile(make(), "ref", precision=precision)(*feeds)  # type: ignore[operator]
    assert got.dtype == np.float32 and np.all(np.isfinite(got))
    assert max_abs_error(got, want) < 1e-2
    assert np.all(got[~feeds[1].astype(bool)] == 0)  # masked positions keep zero weight
    assert any("it is a mask fill" in r.getMessage() for r in caplog.records)


def test_mask_fills_names_the_constant_and_its_carriers() -> None:
    fills = mask_fills(_additive_fill(), DType.f16)
    assert len(fills.constants) == 1 and "to_bias" in next(iter(fills.constants.values()))
    assert fills.carriers == {"bias", "masked"}
    assert mask_fills(_where_fill(), DType.f16).carriers == {"filled"}
    assert not mask_fills(_scaled("softmax"), DType.f16).constants  # a product not then added: no fill


@pytest.mark.parametrize("then", ["tanh", "softmax"])
def test_a_constant_that_scales_data_is_still_refused(then: str) -> None:
    with pytest.raises(PrecisionOverflowError, match=r"weight '.*' \(read by node 'scale', mul\) holds 1e\+06"):
        cuvil.compile(_scaled(then), "ref", precision="fp16")


@pytest.mark.parametrize("make,mask", [(_where_fill, DType.bool), (_additive_fill, F32)])
def test_a_fully_masked_row_keeps_float32s_uniform_weights_and_the_clamp_is_noted(make: object, mask: DType) -> None:
    """The fill becomes f16's finite extreme, not -inf: a row masked everywhere gets uniform weights as in
    float32 (with -inf it would be NaN, and ``0 * -inf`` NaN at every kept position of the additive idiom)."""
    feeds = _feeds(mask)
    feeds[1][0] = False  # row 0 masked everywhere
    (want,) = cuvil.compile(make(), "ref")(*feeds)  # type: ignore[operator]
    m = cuvil.compile(make(), "ref", precision="fp16")  # type: ignore[operator]
    (got,) = m(*feeds)
    assert np.all(np.isfinite(got)) and max_abs_error(got, want) < 1e-2
    np.testing.assert_allclose(got[0], want[0], atol=1e-3)  # float32's uniform row, not NaN
    assert any(n.startswith("mask fill: constant") and "not -inf" in n for n in m.info.notes), m.info.notes


def _shared_fill(layers: int = 3) -> Graph:
    """One additive mask ``where(1 - m, f32_min, 1 - m)`` (as torch.onnx's dynamo exporter writes BERT's)
    added to the scores of several layers' softmaxes."""
    b = Builder()
    x = b.input("x", TensorType(F32, SHAPE))
    m = b.input("m", TensorType(F32, SHAPE))
    inv = b.add1("sub", [b.constant(np.array(1.0, np.float32)), m], names=["inv"], node_name="invert")
    cond = b.add1("cast", [inv], {"to": DType.bool}, names=["cond"])
    mask = b.add1("where", [cond, b.constant(np.array(F32_MIN, np.float32)), inv], names=["bias"], node_name="fill")
    h = x
    for i in range(layers):
        h = b.add1("softmax", [b.add1("add", [h, mask], names=[f"scores{i}"])], {"axis": -1}, names=[f"p{i}"])
    b.output(h)
    return b.graph


def test_a_mask_shared_by_every_layer_carries_its_fill_to_each_softmax() -> None:
    assert mask_fills(_shared_fill(), DType.f16).carriers == {"bias", "scores0", "scores1", "scores2"}
    feeds = _feeds(F32)
    (want,) = cuvil.compile(_shared_fill(), "ref")(*feeds)
    (got,) = cuvil.compile(_shared_fill(), "ref", precision="fp16")(*feeds)  # every layer's sum holds the fill
    assert max_abs_error(got, want) < 1e-2 and np.all(got[~feeds[1].astype(bool)] == 0)
