"""The ``attention`` op: scaled dot-product attention, with ONNX Attention's semantics (opsets 23/24).

    Y = softmax(softcap(scale(Q Kᵀ)) + bias) V

Inputs are ONNX's: ``Q``, ``K``, ``V`` in the 4-D form ``[batch, heads, seq, head_size]`` or
the 3-D form ``[batch, seq, heads * head_size]`` (then ``q_num_heads`` and ``kv_num_heads``
say how to split the last dim); an optional ``attn_mask`` (bool: True attends; or float,
added), broadcast to ``[batch, q_heads, q_seq, kv_seq]`` from the right, whose last dim may
be shorter than ``kv_seq`` (the missing keys are masked); the cache ``past_key`` /
``past_value`` (concatenated in front of ``K`` / ``V`` along the sequence, and returned as
``present_key`` / ``present_value``); ``nonpad_kv_seqlen`` (int64 ``[batch]``: keys from that
index on are padding).  Query heads share key/value heads in groups of ``q_heads /
kv_heads`` (grouped-query attention: query head ``h`` reads key/value head ``h // group``).

The bias is built as ONNX builds it: the mask; with ``is_causal``, key ``j`` of query ``i``
is masked unless ``j <= i + offset`` (``offset`` = the past length, or
``nonpad_kv_seqlen[b] - q_seq``, else 0); keys at or past ``nonpad_kv_seqlen[b]`` are masked.
``guard_masked_rows=1`` (ONNX) makes a query row whose bias masks every key give zeros;
with 0 the softmax is the plain one, so such a row gives NaN, as ``softmax`` would.

The scale has three forms, so that attention written out by exporters maps onto this op
exactly: ``scale_mode="split"`` (ONNX, and torch's decomposition of SDPA) multiplies Q and
K each by ``sqrt(scale)`` rounded to the input type (``scale`` absent: ``1/sqrt(head_size)``);
``"mul"`` multiplies the scores ``Q Kᵀ`` by ``scale``; ``"div"`` divides them by it.

``qk_matmul_output`` is the scores after the scale (mode 0), after softcap (1), after the
bias (2) or after the softmax (3).  ``softmax_precision`` computes the softmax in that type.
"""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import FLOATS, DType
from cuvil.ir.symbolic import Dim, floordiv
from cuvil.ir.types import TensorType
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register

SCALE_MODES = ("split", "mul", "div")


def _static(d: Dim) -> int | None:
    return d if isinstance(d, int) else None


def _heads_split(ctx: InferCtx, i: int, heads: int | None, what: str) -> tuple[Dim, Dim, Dim, Dim]:
    """(batch, heads, seq, head_size) of 3-D input ``i`` split into ``heads`` heads."""
    t = ctx.type(i)
    if heads is None or heads <= 0:
        raise ctx.fail(f"3-D inputs need a positive {what}, got {heads}")
    hidden = t.shape[2]
    if isinstance(hidden, int) and hidden % heads:
        raise ctx.fail(f"input {i}'s hidden size {hidden} is not a multiple of {what}={heads}")
    return t.shape[0], heads, t.shape[1], floordiv(hidden, heads)


def _infer(ctx: InferCtx) -> list[TensorType]:
    dt = ctx.require_dtype(0, FLOATS)
    if ctx.same_dtype(0, 1, 2) != dt:
        raise ctx.fail("Q, K and V must share one element type")
    rank = ctx.type(0).rank
    if rank not in (3, 4) or ctx.type(1).rank != rank or ctx.type(2).rank != rank:
        raise ctx.fail(f"Q, K and V must all be 3-D or all 4-D, got {ctx.type(0)}, {ctx.type(1)}, {ctx.type(2)}")
    a = ctx.attrs
    if a["scale_mode"] not in SCALE_MODES:
        raise ctx.fail(f"scale_mode must be one of {', '.join(SCALE_MODES)}, got {a['scale_mode']!r}")
    if a["scale_mode"] != "split" and a["scale"] is None:
        raise ctx.fail(f"scale_mode={a['scale_mode']!r} needs a scale")
    if a["qk_matmul_output_mode"] not in (0, 1, 2, 3):
        raise ctx.fail(f"qk_matmul_output_mode must be 0, 1, 2 or 3, got {a['qk_matmul_output_mode']}")
    if a["is_causal"] not in (0, 1) or a["guard_masked_rows"] not in (0, 1):
        raise ctx.fail("is_causal and guard_masked_rows must be 0 or 1")
    if a["softcap"] < 0:
        raise ctx.fail(f"softcap must not be negative, got {a['softcap']}")
    sp = a["softmax_precision"]
    if sp is not None and sp not in FLOATS:
        raise ctx.fail(f"softmax_precision must be a float element type, got {sp}")
    if rank == 4:
        (b, hq, sq, dk), (_, hkv, skv, dk2), (_, hv, skv2, dv) = (ctx.type(i).shape for i in range(3))
        for name, want, got in (("q_num_heads", hq, a["q_num_heads"]), ("kv_num_heads", hkv, a["kv_num_heads"])):
            if got is not None and isinstance(want, int) and got != want:
                raise ctx.fail(f"{name}={got} does not match the 4-D inputs' {want} heads")
    else:
        b, hq, sq, dk = _heads_split(ctx, 0, a["q_num_heads"], "q_num_heads")
        _, hkv, skv, dk2 = _heads_split(ctx, 1, a["kv_num_heads"], "kv_num_heads")
        _, hv, skv2, dv = _heads_split(ctx, 2, a["kv_num_heads"], "kv_num_heads")
    for i in (1, 2):
        ctx.assume_equal(ctx.type(i).shape[0], b, f"batch sizes of Q and input {i}")
    ctx.assume_equal(dk2, dk, "head sizes of Q and K")
    ctx.assume_equal(hv, hkv, "head counts of K and V")
    ctx.assume_equal(skv2, skv, "sequence lengths of K and V")
    shq, shkv = _static(hq), _static(hkv)
    if shq is not None and shkv is not None and (shkv == 0 or shq % shkv):
        raise ctx.fail(f"{shq} query heads are not a multiple of {shkv} key/value heads")
    total: Dim = skv
    if ctx.has(4) != ctx.has(5):
        raise ctx.fail("past_key and past_value must be given together")
    if ctx.has(4):
        if ctx.has(6):
            raise ctx.fail("nonpad_kv_seqlen cannot be combined with past_key/past_value")
        for i, hs in ((4, dk), (5, dv)):
            if ctx.type(i).dtype != dt or ctx.type(i).rank != 4:
                raise ctx.fail(f"input {i} must be {dt} [batch, kv_heads, past_seq, head_size], got {ctx.type(i)}")
            pb, ph, _, pd = ctx.type(i).shape
            ctx.assume_equal(pb, b, f"batch sizes of Q and input {i}")
            ctx.assume_equal(ph, hkv, f"key/value head counts of K and input {i}")
            ctx.assume_equal(pd, hs, f"head sizes of input {i} and its new entries")
        ctx.assume_equal(ctx.type(5).shape[2], ctx.type(4).shape[2], "past sequence lengths of past_key and past_value")
        total = ctx.type(4).shape[2] + skv
    if ctx.has(6):
        ctx.require_dtype(6, {DType.i64})
        if ctx.type(6).rank != 1:
            raise ctx.fail(f"nonpad_kv_seqlen must be 1-D [batch], got {ctx.type(6)}")
        ctx.assume_equal(ctx.type(6).shape[0], b, "batch sizes of Q and nonpad_kv_seqlen")
    if ctx.has(3):
        m = ctx.type(3)
        if m.dtype not in (DType.bool, dt):
            raise ctx.fail(f"attn_mask must be bool or {dt}, got {m}")
        if m.rank < 1 or m.rank > 4:
            raise ctx.fail(f"attn_mask must have rank 1 to 4, got {m}")
        scores: tuple[Dim, ...] = (b, hq, sq, total)
        for j, (d, e) in enumerate(zip(m.shape[:-1], scores[4 - m.rank : 3])):
            ctx.assume_broadcast_to(d, e, f"attn_mask's dim {j} and the scores' dim {j + 4 - m.rank}")
        last, tot = _static(m.shape[-1]), _static(total)
        if last is not None and tot is not None and last > tot:
            raise ctx.fail(f"attn_mask's last dim {last} exceeds the {tot} keys")
    y = TensorType(dt, (b, hq, sq, dv) if rank == 4 else (b, sq, hq * dv))
    return [y, TensorType(dt, (b, hkv, total, dk)), TensorType(dt, (b, hkv, total, dv)),
            TensorType(dt, (b, hq, sq, total))]


def _to_4d(x: np.ndarray, heads: int) -> np.ndarray:
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _causal_allowed(sq: int, skv: int, offset: np.ndarray) -> np.ndarray:
    """Where key j of query i is allowed: j <= i + offset (offset broadcast as [batch or 1, 1, 1])."""
    i = np.arange(sq).reshape(sq, 1)
    j = np.arange(skv).reshape(1, skv)
    allowed: np.ndarray = j <= i + offset.reshape(-1, 1, 1)
    return allowed[:, None]  # [batch or 1, 1, sq, skv]


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                        past_k: np.ndarray | None, past_v: np.ndarray | None, nonpad: np.ndarray | None,
                        attrs: dict[str, object]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(Y, present_key, present_value, qk_matmul_output) as the module docstring defines them."""
    dt = q.dtype
    three_d = q.ndim == 3
    if three_d:
        q = _to_4d(q, int(attrs["q_num_heads"]))  # type: ignore[call-overload]
        k = _to_4d(k, int(attrs["kv_num_heads"]))  # type: ignore[call-overload]
        v = _to_4d(v, int(attrs["kv_num_heads"]))  # type: ignore[call-overload]
    if past_k is not None and past_v is not None:
        k = np.concatenate([past_k, k], axis=2)
        v = np.concatenate([past_v, v], axis=2)
    present_k, present_v = k, v
    batch, hq, sq, dk = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    # The bias: the mask (padded to skv with masked keys), causal and padding masks, as -inf/0.
    bias = np.zeros((sq, skv), dtype=dt)
    if mask is not None:
        if mask.shape[-1] < skv:
            pad = [(0, 0)] * (mask.ndim - 1) + [(0, skv - mask.shape[-1])]
            mask = np.pad(mask, pad, constant_values=False if mask.dtype == np.bool_ else -np.inf)
        if mask.dtype == np.bool_:
            mask = np.where(mask, dt.type(0), dt.type(-np.inf))
        bias = bias + mask.astype(dt)
    if attrs["is_causal"]:
        if nonpad is not None:
            offset = nonpad.astype(np.int64) - sq
        else:
            offset = np.array([past_k.shape[2] if past_k is not None else 0])
        bias = bias + np.where(_causal_allowed(sq, skv, offset), dt.type(0), dt.type(-np.inf))
    if nonpad is not None:
        pad_mask = np.arange(skv)[None, :] < nonpad.astype(np.int64)[:, None]
        bias = bias + np.where(pad_mask, dt.type(0), dt.type(-np.inf)).reshape(batch, 1, 1, skv)
    group = hq // hkv
    if group != 1:
        k = np.repeat(k, group, axis=1)
        v = np.repeat(v, group, axis=1)
    mode = attrs["scale_mode"]
    scale = attrs["scale"]
    kt = np.swapaxes(k, -1, -2)
    if mode == "split":
        s = 1 / np.sqrt(dk) if scale is None else float(scale)  # type: ignore[arg-type]
        f = dt.type(np.sqrt(s))
        scores = np.matmul(q * f, kt * f)
    elif mode == "mul":
        scores = np.matmul(q, kt) * dt.type(scale)
    else:
        scores = np.matmul(q, kt) / dt.type(scale)
    qk = scores
    softcap = float(attrs["softcap"])  # type: ignore[arg-type]
    if softcap > 0:
        scores = np.tanh(scores / dt.type(softcap)) * dt.type(softcap)
        if attrs["qk_matmul_output_mode"] == 1:
            qk = scores
    biased = scores + bias
    if attrs["qk_matmul_output_mode"] == 2:
        qk = biased
    sp = attrs["softmax_precision"]
    x = biased.astype(sp.np) if isinstance(sp, DType) else biased
    if attrs["guard_masked_rows"]:
        row_max = np.max(x, axis=-1, keepdims=True)
        safe = np.where(np.isneginf(row_max), x.dtype.type(0), row_max)
        e = np.exp(x - safe)
        total = np.sum(e, axis=-1, keepdims=True)
        p = e / np.where(total == 0, x.dtype.type(1), total)
        all_masked = np.isneginf(np.max(np.broadcast_to(bias, biased.shape), axis=-1, keepdims=True))
        p = np.where(all_masked, x.dtype.type(0), p)
    else:
        e = np.exp(x - np.max(x, axis=-1, keepdims=True))
        p = e / np.sum(e, axis=-1, keepdims=True)
    if attrs["qk_matmul_output_mode"] == 3:
        qk = p
    y = np.matmul(p.astype(dt), v)
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(batch, sq, -1)
    return y.astype(dt), present_k, present_v, np.asarray(qk).astype(dt)


def _reference(ctx: RefCtx) -> list[np.ndarray]:
    mask, past_k, past_v, nonpad = (ctx.input(i) if ctx.has(i) else None for i in range(3, 7))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        outs = attention_reference(ctx.input(0), ctx.input(1), ctx.input(2), mask, past_k, past_v, nonpad, ctx.attrs)
    return list(outs)


register(
    OpDef(
        name="attention",
        inputs=("Q", "K", "V", "attn_mask?", "past_key?", "past_value?", "nonpad_kv_seqlen?"),
        outputs=("Y", "present_key?", "present_value?", "qk_matmul_output?"),
        attrs={
            "is_causal": AttrSpec("int", 0),
            "q_num_heads": AttrSpec("int", None),
            "kv_num_heads": AttrSpec("int", None),
            "qk_matmul_output_mode": AttrSpec("int", 0),
            "scale": AttrSpec("float", None),
            "scale_mode": AttrSpec("str", "split"),
            "softcap": AttrSpec("float", 0.0),
            "softmax_precision": AttrSpec("dtype", None),
            "guard_masked_rows": AttrSpec("int", 1),
        },
        infer=_infer,
        reference=_reference,
        doc="Scaled dot-product attention softmax(softcap(scale(Q Kᵀ)) + bias) V with ONNX Attention's "
        "semantics (3-D/4-D, grouped-query heads, masks, causal, KV cache, padding); scale_mode says where "
        "the scale applies (split over Q and K, or on the scores).",
    )
)
