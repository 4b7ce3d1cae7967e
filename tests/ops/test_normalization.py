"""Normalization ops (batch, instance, layer, group, Lp), checked against onnxruntime and hand-computed
values across the opset forms the importer upgrades."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.errors import CuvilError, ShapeError, UnsupportedOpError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import sym
from cuvil.ir.types import TensorType
from tests.support.reduce_models import check_against_ort, run_cuvil
from tests.support.single_node import one_node

RNG = np.random.default_rng(1)


def _bn_params(c: int, shape: tuple[int, ...] | None = None) -> dict[str, np.ndarray]:
    shape = shape or (c,)
    return {
        "s": RNG.uniform(0.5, 1.5, shape).astype(np.float32),
        "b": RNG.standard_normal(shape).astype(np.float32),
        "m": RNG.standard_normal(shape).astype(np.float32),
        "v": RNG.uniform(0.5, 2.0, shape).astype(np.float32),
    }


@pytest.mark.parametrize("opset", [7, 9, 14, 15])
def test_batch_norm_inference(opset: int) -> None:
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    check_against_ort("BatchNormalization", {"x": x}, opset=opset, consts=_bn_params(3), epsilon=1e-3)


def test_batch_norm_per_activation_spatial0() -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    p = _bn_params(3, (3, 4))
    model = one_node("BatchNormalization", {"x": x}, ["y"], 7, consts=p, spatial=0)
    (y,) = run_cuvil(model, {"x": x})
    want = (x - p["m"]) / np.sqrt(p["v"] + 1e-5) * p["s"] + p["b"]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_batch_norm_refuses_training_mode() -> None:
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    model = one_node("BatchNormalization", {"x": x}, ["y", "rm", "rv"], 15, consts=_bn_params(3), training_mode=1)
    with pytest.raises(UnsupportedOpError, match="training mode"):
        run_cuvil(model, {"x": x})
    model = one_node("BatchNormalization", {"x": x}, ["y", "m2", "v2"], 9, consts=_bn_params(3))
    with pytest.raises(UnsupportedOpError, match="training mode"):
        run_cuvil(model, {"x": x})


def test_batch_norm_rejects_wrong_parameter_shape() -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    model = one_node("BatchNormalization", {"x": x}, ["y"], 15, consts=_bn_params(4))
    with pytest.raises(CuvilError, match=r"scale must have shape \[3\]"):
        run_cuvil(model, {"x": x})


def test_instance_norm() -> None:
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    consts = {"s": RNG.uniform(0.5, 1.5, 3).astype(np.float32), "b": RNG.standard_normal(3).astype(np.float32)}
    check_against_ort("InstanceNormalization", {"x": x}, opset=6, consts=consts, epsilon=1e-3)


@pytest.mark.parametrize("axis", [-1, 1, 0, -2])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm(axis: int, with_bias: bool) -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    norm_shape = x.shape[axis % 3 :]
    consts = {"w": RNG.uniform(0.5, 1.5, norm_shape).astype(np.float32)}
    if with_bias:
        consts["b"] = RNG.standard_normal(norm_shape).astype(np.float32)
    got = check_against_ort(
        "LayerNormalization", {"x": x}, ["y", "mean", "inv"], opset=17, consts=consts, axis=axis, rtol=1e-4
    )
    assert got[1].shape == x.shape[: axis % 3] + (1,) * (3 - axis % 3)


def test_layer_norm_single_output_and_rank_check() -> None:
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    check_against_ort("LayerNormalization", {"x": x}, opset=17, consts={"w": np.full(4, 2.0, np.float32)}, rtol=1e-4)
    model = one_node("LayerNormalization", {"x": x}, ["y"], 17, consts={"w": np.ones(5, np.float32)})
    with pytest.raises(CuvilError, match="does not broadcast"):
        run_cuvil(model, {"x": x})


def test_layer_norm_half_keeps_float32_statistics() -> None:
    x = RNG.standard_normal((2, 8)).astype(np.float16)
    consts = {"w": np.ones(8, np.float16)}
    model = one_node("LayerNormalization", {"x": x}, ["y", "mean", "inv"], 17, consts=consts)
    y, mean, inv = run_cuvil(model, {"x": x})
    assert y.dtype == np.float16 and mean.dtype == np.float32 and inv.dtype == np.float32
    x32 = x.astype(np.float32)
    np.testing.assert_allclose(mean[:, 0], x32.mean(axis=1), rtol=1e-6)
    np.testing.assert_allclose(y, (x32 - x32.mean(1, keepdims=True)) * inv, rtol=2e-3, atol=2e-3)


def _group_norm_ref(x: np.ndarray, groups: int, scale: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    norm = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return norm * scale.reshape(shape) + bias.reshape(shape)


def test_group_norm_opset21_per_channel() -> None:
    x = RNG.standard_normal((2, 6, 3, 2)).astype(np.float32)
    scale, bias = RNG.standard_normal(6).astype(np.float32), RNG.standard_normal(6).astype(np.float32)
    inputs = {"x": x, "scale": scale, "bias": bias}
    (y,) = run_cuvil(one_node("GroupNormalization", inputs, ["y"], 21, num_groups=3, epsilon=1e-3), inputs)
    np.testing.assert_allclose(y, _group_norm_ref(x, 3, scale, bias, 1e-3), rtol=1e-4, atol=1e-5)


def test_group_norm_opset18_per_group_parameters() -> None:
    x = RNG.standard_normal((2, 6, 5)).astype(np.float32)
    scale, bias = RNG.standard_normal(3).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
    model = one_node("GroupNormalization", {"x": x}, ["y"], 18, consts={"scale": scale, "bias": bias}, num_groups=3)
    (y,) = run_cuvil(model, {"x": x})
    want = _group_norm_ref(x, 3, np.repeat(scale, 2), np.repeat(bias, 2), 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    inputs = {"x": x, "scale": scale, "bias": bias}
    with pytest.raises(UnsupportedOpError, match="computed at run time"):
        run_cuvil(one_node("GroupNormalization", inputs, ["y"], 18, num_groups=3), inputs)


def test_group_norm_rejects_indivisible_groups() -> None:
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (sym("n"), 6, 4)))
    p = b.input("p", TensorType(DType.f32, (6,)))
    assert b.add1("group_norm", [x, p, p], {"num_groups": 2}).type.shape == (sym("n"), 6, 4)
    with pytest.raises(ShapeError, match="num_groups=4 does not divide the 6 channels"):
        b.add1("group_norm", [x, p, p], {"num_groups": 4})


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, -1])
def test_lp_normalization(p: int, axis: int) -> None:
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    check_against_ort("LpNormalization", {"x": x}, opset=1, p=p, axis=axis)


def test_lp_normalization_zero_norm_gives_zero_and_bad_p_is_rejected() -> None:
    x = np.array([[0.0, 0.0], [3.0, 4.0]], np.float32)
    (y,) = run_cuvil(one_node("LpNormalization", {"x": x}, ["y"], 22), {"x": x})
    np.testing.assert_allclose(y, [[0.0, 0.0], [0.6, 0.8]], rtol=1e-6)
    with pytest.raises(CuvilError, match="p must be 1 or 2"):
        run_cuvil(one_node("LpNormalization", {"x": x}, ["y"], 22, p=3), {"x": x})
