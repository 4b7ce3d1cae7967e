"""The model families the PyTorch front end must cover, and single-op modules for the mappings
they do not reach, each compiled with ``cuvil.compile(model, input_spec=...)`` and compared
with eager PyTorch.

Tolerance: relative L2 error <= 1e-5 for float outputs (fp32), exact equality for integer and
boolean outputs.  The "ref" target runs by default; the native C builds are marked slow.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402
from torch import nn  # noqa: E402

import cuvil  # noqa: E402
from cuvil.errors import ModelError, UnsupportedOpError  # noqa: E402
from cuvil.frontends.torch.aten.common import types_agree  # noqa: E402
from cuvil.ir.dtypes import DType  # noqa: E402
from cuvil.ir.symbolic import UNKNOWN, sym  # noqa: E402
from cuvil.ir.types import TensorType  # noqa: E402
from cuvil.metrics import relative_l2  # noqa: E402
from tests.support.zoo import families as zoo  # noqa: E402

RTOL_L2 = 1e-5

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cuvil-torch-cache"))


def assert_matches_eager(model: nn.Module, args: tuple[Any, ...], compiled: cuvil.CompiledModel) -> list[float]:
    """Run both; every output must have eager's dtype and shape, and match within the tolerance."""
    with torch.no_grad():
        want = [t.numpy() for t in pytree.tree_leaves(model(*args))]
    got = compiled(*[a.numpy() for a in args])
    assert len(got) == len(want)
    errors = []
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert (g.dtype, g.shape) == (w.dtype, w.shape), f"output {k}"
        if w.dtype.kind == "f":
            err = relative_l2(g, w)
            assert err <= RTOL_L2, f"output {k}: relative L2 error {err:.3g} > {RTOL_L2}"
            errors.append(err)
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"output {k}")
    return errors


def compile_model(model: nn.Module, args: tuple[Any, ...], target: str, cache_dir: str, **kw: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cuvil.compile(model, target, input_spec=list(args), cache_dir=cache_dir, **kw)


# the model families ------------------------------------------------------------------------------------

MODEL_NAMES = list(zoo.MODELS)


# the two convolutional families take the longest to export and run (seconds each): the slow tier
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in ("resnet18", "mobilenet_v2") else n
                                  for n in MODEL_NAMES])
def test_model_matches_eager_ref(name: str, cache_dir: str) -> None:
    model, args = zoo.MODELS[name]()
    assert_matches_eager(model, args, compile_model(model, args, "ref", cache_dir))


@pytest.mark.slow
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_matches_eager_native(name: str, cache_dir: str) -> None:
    model, args = zoo.MODELS[name]()
    assert_matches_eager(model, args, compile_model(model, args, "native", cache_dir))


def test_zoo_models_are_in_eval_mode_and_deterministic() -> None:
    for name, build in zoo.MODELS.items():
        m1, a1 = build()
        m2, a2 = build()
        assert not any(mod.training for mod in m1.modules()), name
        for x, y in zip(a1, a2):
            assert torch.equal(x, y), name
        for (k, p), (_, q) in zip(m1.state_dict().items(), m2.state_dict().items()):
            assert torch.equal(p, q), f"{name}: {k}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt", "bert"])
def test_transformer_dynamic_batch_and_sequence(name: str, cache_dir: str) -> None:
    """One compile serves batch 1..64 and sequences that are multiples of 8; the mask, position ids and
    the causal mask are built from the run-time sizes."""
    model, args = zoo.MODELS[name]()
    batch = torch.export.Dim("batch", min=1, max=64)
    seq = 8 * torch.export.Dim("s8", min=1, max=8)
    dyn = tuple({0: batch, 1: seq} for _ in args)
    compiled = compile_model(model, args, "ref", cache_dir, dynamic_shapes=dyn)
    assert [str(s.type) for s in compiled.input_specs] == ["i64[batch, 8*s8]"] * len(args)
    g = torch.Generator().manual_seed(11)
    for b, t in [(1, 8), (7, 64), (3, 24)]:
        ids = torch.randint(0, 100, (b, t), generator=g)
        call: tuple[Any, ...] = (ids,)
        if name == "bert":
            mask = torch.ones(b, t, dtype=torch.int64)
            mask[0, t // 2:] = 0
            call = (ids, mask)
        assert_matches_eager(model, call, compiled)


# single-op modules: mappings the model families do not reach --------------------------------------------


class Fn(nn.Module):
    def __init__(self, fn: Callable[..., Any], **params: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            self.register_buffer(k, v)

    def forward(self, *xs: Any) -> Any:
        return self.fn(self, *xs)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _op_cases() -> dict[str, tuple[Fn, tuple[Any, ...]]]:
    g = _gen()

    def r(*s: int) -> Any:
        return torch.randn(*s, generator=g)

    def ri(lo: int, hi: int, *s: int) -> Any:
        return torch.randint(lo, hi, s, generator=g)

    def slice_writes(m: Any, x: Any, v: Any) -> Any:
        # in-place writes, functionalized by torch.export into slice_scatter, select_scatter and copy
        y = x.clone()
        y[:, 1:3] = v
        z = x.clone()
        z[:, -1] = 2.0
        z[:, :, -3] = x[:, 0, :1]
        w = x.clone()
        w[..., ::2] = x[..., 1::2] * 3
        u = torch.zeros(2, 5, 4)
        u[:, 2:] = x[:, :3]
        u[:, :, 0] = x[:, :, 1]
        windows = torch.zeros(1, 6, 6, 1)  # Swin's shifted-window mask
        count = 0
        for h in (slice(0, -4), slice(-4, -2), slice(-2, None)):
            for c in (slice(0, -4), slice(-4, -2), slice(-2, None)):
                windows[:, h, c, :] = count
                count += 1
        return y, z, w, u, windows * x[0, 0, 0]

    return {
        "slice_writes": (Fn(slice_writes), (r(2, 5, 4), r(2, 2, 4))),
        "scalar_promotion": (Fn(lambda m, x, i: (
            x + 2, i + 2, i * 0.5, i / 3, 2 - x, x.pow(3), x * x.pow(2), 1.5 - x, x.add(x, alpha=0.5),
            i.sub(i, alpha=3), x.abs().sqrt())), (r(3, 4), ri(-5, 5, 3, 4))),
        "int_division": (Fn(lambda m, a, b: (
            torch.div(a, b, rounding_mode="floor"), torch.div(a, b, rounding_mode="trunc"), a % b, torch.fmod(a, b),
            a // 3)), (ri(-20, 20, 4, 5), ri(1, 6, 4, 5) * (1 - 2 * ri(0, 2, 4, 5)))),
        "float_division": (Fn(lambda m, a, b: (
            torch.div(a, b, rounding_mode="floor"), torch.div(a, b, rounding_mode="trunc"), a / b,
            torch.remainder(a, b))), (r(4, 5) * 10, r(4, 5) + 3)),
        "compare_logic": (Fn(lambda m, x, i: (
            (x > 0) & (i != 2), (x <= 0.5) | (i == 1), torch.where(x > 0, x, 0.0), torch.where(i > 0, i, -i),
            x >= i, ~(x < 0), torch.logical_xor(x > 0, i > 0), torch.maximum(x, i), torch.minimum(i, i.flip(0)))),
            (r(3, 4), ri(-3, 3, 3, 4))),
        "activations": (Fn(lambda m, x: (
            F.relu6(x), F.hardsigmoid(x), F.hardswish(x), F.silu(x), F.elu(x, 0.7), F.leaky_relu(x, 0.2),
            F.softplus(x * 10, beta=2, threshold=5), F.gelu(x, approximate="tanh"), F.gelu(x),
            torch.clamp(x, -0.5, 0.3), torch.clamp(x, min=0.1), torch.sigmoid(x), torch.rsqrt(x.abs() + 1),
            torch.log1p(x.abs()), torch.expm1(x), torch.erf(x), torch.trunc(x * 3), torch.round(x * 3), torch.exp(x),
            torch.log2(x.abs() + 1), torch.isnan(x.log()), torch.isinf(1 / (x > 0).float()), torch.tanh(x),
            F.mish(x), x.sign(), x.floor(), x.ceil())), (r(4, 6),)),
        # torch.export keeps linear and matmul whole (cuvil/frontends/torch/export.py): every rank
        "linear_matmul": (Fn(lambda m, x, v, i: (
            F.linear(x, m.lw, m.lb), F.linear(x, m.lw), F.linear(x[0], m.lw, m.lb), F.linear(x[0, 0], m.lw, m.lb),
            torch.matmul(x, m.lw.T), torch.matmul(v, m.lw.T), torch.matmul(m.lw, v), torch.matmul(v, v),
            torch.matmul(x.unsqueeze(1), x.transpose(1, 2)), torch.matmul(i, i.T))),
            (r(2, 3, 4), r(4), ri(-5, 5, 3, 4))),
        # kept whole and converted to the attention op: masks, causal, scales, one head, grouped heads
        "sdpa": (Fn(lambda m, q, k, v, bm, fm: (
            F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, attn_mask=bm),
            F.scaled_dot_product_attention(q, k, v, attn_mask=fm), F.scaled_dot_product_attention(q, k, v, is_causal=True),
            F.scaled_dot_product_attention(q, k, v, scale=0.3), F.scaled_dot_product_attention(q, k, v, scale=-0.2),
            F.scaled_dot_product_attention(q[0], k[0], v[0], attn_mask=bm[0]),
            F.scaled_dot_product_attention(q, k[:, :1], v[:, :1], enable_gqa=True))),
            (r(2, 2, 5, 4), r(2, 2, 7, 4), r(2, 2, 7, 3),
             # query i of batch i attends to no key: its row is zeros, as torch gives
             (torch.rand(2, 1, 5, 7, generator=g) > 0.3) & ~torch.eye(2, 5, dtype=torch.bool)[:, None, :, None],
             r(5, 7))),
        "clamp_tensor": (Fn(lambda m, x, lo, hi: torch.clamp(x, lo, hi)), (r(3, 4), r(1, 4) - 0.5, r(3, 1) + 0.5)),
        "reductions": (Fn(lambda m, x: (
            x.mean((1, 2), keepdim=True), x.sum(), x.sum(-1), x.amax(1), x.amin((0, 2)), x.max(1), x.min(-1, True),
            x.argmax(), x.argmax(1, keepdim=True), x.argmin(0), x.var(1), x.var((0, 2), unbiased=False, keepdim=True),
            torch.var_mean(x, 2, correction=0), x.std(1), x.prod(1), torch.cumsum(x, 1), (x > 0).any(1),
            (x > -2).all(), (x > 0).sum(1), torch.log_softmax(x, 0), torch.softmax(x, 1), x.max(), x.norm(dim=-1),
            torch.logsumexp(x, 1), x.norm(p=1, dim=1), x.norm(p=3), torch.linalg.vector_norm(x, float("inf"), 0))), (r(2, 5, 3),)),
        "shapes": (Fn(lambda m, x: (
            x.transpose(0, 2), x.flip(1), x.repeat(2, 1, 1, 2), x[:, 1:-1:2], x[..., -2], x.unsqueeze(-1).squeeze(),
            x[:, :1].squeeze(1), x.reshape(-1, 4), F.pad(x, (1, 2, 0, 1), value=0.5), F.pad(x, (-1, 0)),
            torch.tril(x[0]), torch.triu(x[0], 1), torch.stack([x, x], 1), x.chunk(2, -1), x.split(2, 1), x.unbind(0),
            torch.flatten(x, 1), torch.cat([x, x[:, :2]], 1), torch.roll(x, 1, 1), x.expand(3, -1, -1, -1),
            x.narrow(1, 1, 3))), (r(2, 5, 4),)),
        "indexing": (Fn(lambda m, x, i, j: (
            x[i], x[:, i], x[i, j], x[:, i, j], x[i, :, j], x.index_select(1, i[0] % 5),
            torch.gather(x, 2, (j.reshape(-1)[:2] % 4).expand(3, 5, 2)), x[-1], x[1:, 2])),
            (r(3, 5, 4), ri(-3, 3, 2, 2), ri(0, 4, 2, 2))),
        "creation": (Fn(lambda m, x: (
            torch.arange(5.0) * x[0, 0], torch.arange(1, 10, 3), torch.arange(0.0, 1.0, 0.1), torch.zeros_like(x),
            torch.ones(2, 3, dtype=torch.int32), torch.full((2,), 7), x.new_full((2, 2), 3.0),
            torch.tensor(2.5) * x, torch.ones_like(x, dtype=torch.bool), torch.eye(3))), (r(2, 3),)),
        "casts": (Fn(lambda m, x, i: (
            x.to(torch.int32), i.to(torch.float32), (x > 0).to(torch.float32), x.double() * 2, i.to(torch.bool),
            x.half().float())), (r(3, 4) * 5, ri(-2, 3, 3, 4))),
        "conv_pool_norm": (Fn(lambda m, x: (
            F.conv2d(x, m.w, m.b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
            F.conv_transpose2d(x, m.tw, stride=2, padding=1, output_padding=1),
            F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), F.avg_pool2d(x, 2, count_include_pad=False, padding=1),
            F.max_pool2d(x, 3, 2, 1, ceil_mode=True), F.adaptive_avg_pool2d(x, (2, 3)), F.adaptive_avg_pool2d(x, (7, 3)),
            F.max_pool2d(x, 2, return_indices=True), F.conv1d(x.flatten(2), torch.ones(4, 1, 3) / 3, groups=4,
                                                             dilation=2),
            F.group_norm(x, 2, m.gw, m.gb), F.layer_norm(x, (7, 6)), F.max_pool1d(x.flatten(2), 4),
            F.batch_norm(x, m.gb, m.gw.abs(), None, None), F.instance_norm(x, weight=m.gw, bias=m.gb),
            F.batch_norm(x, None, None, m.gw, m.gb, training=True), F.conv3d(x[:, None], m.w3),
            F.max_pool3d(x[:, None], 2), F.avg_pool3d(x[:, None], 2), F.interpolate(x, scale_factor=2), F.interpolate(x, size=(10, 4)),
            F.interpolate(x, scale_factor=1.5, mode="bilinear"),
            F.interpolate(x, size=(5, 9), mode="bilinear", align_corners=True))),
            (r(2, 4, 7, 6),)),
        "attention_masks": (Fn(lambda m, q, k, v, mask: (
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask.float() * -3.0, scale=0.3),
            F.scaled_dot_product_attention(q, k, v, is_causal=True))),
            (r(2, 3, 5, 8), r(2, 3, 5, 8), r(2, 3, 5, 8), ri(0, 2, 5, 5).bool() | torch.eye(5, dtype=torch.bool))),
    }


def _op_case_params(g: torch.Generator) -> dict[str, torch.Tensor]:
    return {"w": torch.randn(6, 2, 3, 3, generator=g), "b": torch.randn(6, generator=g),
            "tw": torch.randn(4, 3, 3, 3, generator=g), "gw": torch.randn(4, generator=g),
            "gb": torch.randn(4, generator=g), "w3": torch.randn(2, 1, 2, 3, 3, generator=g),
            "lw": torch.randn(5, 4, generator=g), "lb": torch.randn(5, generator=g)}


OP_CASES = list(_op_cases())


def _op_case(name: str) -> tuple[Fn, tuple[Any, ...]]:
    fn, args = _op_cases()[name]
    for k, v in _op_case_params(torch.Generator().manual_seed(1)).items():
        fn.register_buffer(k, v)
    return fn.eval(), args


@pytest.mark.parametrize("name", OP_CASES)
def test_op_case_matches_eager_ref(name: str, cache_dir: str) -> None:
    model, args = _op_case(name)
    assert_matches_eager(model, args, compile_model(model, args, "ref", cache_dir))


@pytest.mark.slow
@pytest.mark.parametrize("name", OP_CASES)
def test_op_case_matches_eager_native(name: str, cache_dir: str) -> None:
    model, args = _op_case(name)
    assert_matches_eager(model, args, compile_model(model, args, "native", cache_dir))


# refusals and the type check -----------------------------------------------------------------------------


def test_boolean_mask_indexing_is_refused_with_its_location(cache_dir: str) -> None:
    model = Fn(lambda m, x: x[x > 0]).eval()
    with pytest.raises((UnsupportedOpError, ModelError)) as info:
        compile_model(model, (torch.randn(3, 4),), "ref", cache_dir)
    msg = str(info.value)
    assert "test_models.py:" in msg


def _shift_right(m: Any, x: Any) -> Any:
    # the decoder-input shift of T5 and BART: a write of symbolic length into a slice of symbolic size
    y = torch.zeros_like(x)
    y[:, 1:] = x[:, :-1]
    y[:, 0] = -1.0
    return y


def test_slice_writes_with_symbolic_lengths_match_eager(cache_dir: str) -> None:
    from torch.export import Dim

    model = Fn(_shift_right).eval()
    m = compile_model(model, (torch.randn(2, 5, 3),), "ref", cache_dir,
                      dynamic_shapes=(({0: Dim("batch"), 1: Dim("seq", min=3)},),))  # Fn.forward(*xs)
    for shape in ((2, 5, 3), (3, 9, 3), (1, 3, 3)):
        x = torch.randn(*shape, generator=_gen())
        assert_matches_eager(model, (x,), m)


@pytest.mark.parametrize(("fn", "shape", "message"), [
    (lambda m, x: F.scaled_dot_product_attention(x, x, x, dropout_p=0.1), (1, 2, 3, 4), "dropout_p=0.1"),
    (lambda m, x: F.scaled_dot_product_attention(x, x, x), (1, 1, 2, 3, 4), "must all be 3-D"),
    (lambda m, x: F.scaled_dot_product_attention(x, x[:, :1], x[:, :1]), (1, 2, 3, 4), "enable_gqa=True"),
])
def test_attention_it_cannot_run_is_refused_by_name(fn: Any, shape: tuple[int, ...], message: str,
                                                    cache_dir: str) -> None:
    with pytest.raises((ModelError, RuntimeError)) as info:
        compile_model(Fn(fn).eval(), (torch.randn(*shape),), "ref", cache_dir)
    assert "scaled_dot_product_attention" in str(info.value) and message in str(info.value), str(info.value)


def test_batch_norm_in_training_mode_is_refused(cache_dir: str) -> None:
    model = nn.Sequential(nn.BatchNorm2d(3)).train()
    with pytest.raises(cuvil.CuvilError, match=r"model\.eval\(\)"):
        compile_model(model, (torch.randn(2, 3, 4, 4),), "ref", cache_dir)


def test_types_agree_skips_only_unknown_dims() -> None:
    f32 = DType.f32
    assert types_agree(TensorType(f32, (sym("b"), 3)), TensorType(f32, (sym("b"), 3)))
    assert types_agree(TensorType(f32, (UNKNOWN, 3)), TensorType(f32, (sym("b"), 3)))
    assert not types_agree(TensorType(f32, (sym("b"), 4)), TensorType(f32, (sym("b"), 3)))
    assert not types_agree(TensorType(DType.f64, (3,)), TensorType(f32, (3,)))
    assert not types_agree(TensorType(f32, (3, 1)), TensorType(f32, (3,)))
