"""Importers of onnxruntime's ``com.microsoft`` activations, FusedMatMul, BiasSoftmax and RotaryEmbedding,
and the helpers the other contrib importers (``ops_contrib_norm.py``, ``ops_contrib_attention.py``) share.

onnxruntime's transformer optimizer and its quantization tools write these ops into the models users
keep.  Each is decomposed into Cuvil ops with the semantics onnxruntime's CPU kernels compute (the
fusion passes then recognise the GELUs, the layer norms and the matmul epilogues again):

* ``Gelu`` is ``gelu``; ``BiasGelu(A, B)`` is ``gelu(A + B)``; ``FastGelu(X, bias?)`` is the tanh
  approximation of ``gelu(X + bias)``; ``QuickGelu`` is ``X * sigmoid(alpha * X)`` (alpha 1.702).
  A bias is 1-D, as long as the input's last dim (onnxruntime refuses any other shape).
* ``FusedMatMul`` is ``alpha * (A' @ B')``: ``transBatchA`` moves A's first dim to just before its
  last (``[d0, d1 .. dn-2, dn-1]`` becomes ``[d1 .. dn-2, d0, dn-1]``; both operands then need one
  rank of at least 3, as onnxruntime requires), then ``transA`` swaps the last two dims; likewise B.
* ``BiasSoftmax(data, bias)`` is ``softmax(data + bias)`` over the dims from ``axis`` (default 1) on,
  as one row each (opset-11 Softmax); the bias broadcasts as NumPy does, and its batch dims (those
  before ``axis``) must be the leading (``is_inner_broadcast=1``) or trailing (``0``) batch dims of
  ``data`` with ones elsewhere: the only shapes the fused kernel broadcasts.  The op's first form,
  with ``broadcast_axis`` instead, keeps data's batch dims before ``broadcast_axis`` (inner broadcast).
* ``RotaryEmbedding`` rotates the first ``rotary_embedding_dim`` (default: the head size) channels of
  each head by the angles ``cos_cache`` / ``sin_cache`` hold at each token's position: positions are
  ``position_ids`` (``[batch, seq]``) or, for a 1-element ``position_ids``, that offset plus the token
  index.  ``interleaved=1`` pairs channels ``(2i, 2i + 1)``, else ``(i, i + rot / 2)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value
from cuvil.ir.symbolic import Dim

MS = "com.microsoft"


# shared helpers ---------------------------------------------------------------------------------
def required(ctx: ImportCtx, i: int, name: str) -> Value:
    v = ctx.input(i)
    if v is None:
        raise ctx.fail(f"input {i} ({name}) is required")
    return v


def int_attr(ctx: ImportCtx, name: str, default: int | None = None) -> int | None:
    v = ctx.attrs.get(name, default)
    if v is None or isinstance(v, int):
        return v
    raise ctx.fail(f"attribute {name!r} must be an integer, got {v!r}")


def float_attr(ctx: ImportCtx, name: str, default: float) -> float:
    v = ctx.attrs.get(name, default)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise ctx.fail(f"attribute {name!r} must be a float, got {v!r}")


def flag_attr(ctx: ImportCtx, name: str) -> bool:
    v = int_attr(ctx, name, 0)
    if v not in (0, 1):
        raise ctx.unsupported(f"attribute {name}={v} (it is 0 or 1)")
    return bool(v)


def scalar(ctx: ImportCtx, value: float, dtype: DType) -> Value:
    return ctx.constant(np.asarray(value, dtype=dtype.np))


def ints(ctx: ImportCtx, values: Sequence[int]) -> Value:
    return ctx.constant(np.asarray(values, dtype=np.int64))


def bias_vector(ctx: ImportCtx, i: int, name: str, x: Value) -> Value:
    """Input ``i``, a 1-D tensor as long as ``x``'s last dim (what onnxruntime's kernels accept)."""
    b = required(ctx, i, name)
    if b.type.rank != 1:
        raise ctx.fail(f"{name} must be 1-D (one value per channel), got {b.type}")
    if x.type.rank == 0:
        raise ctx.fail(f"input 0 must have rank >= 1, got {x.type}")
    last, n = x.type.shape[-1], b.type.shape[0]
    if isinstance(last, int) and isinstance(n, int) and last != n:
        raise ctx.fail(f"{name} has {n} values, the input's last dim is {last}")
    return b


def positions(ctx: ImportCtx, length: Value, dtype: DType) -> Value:
    """``[0, 1, .., n - 1]`` (``dtype``) for ``length``, a 1-element int64 tensor holding ``n``.

    Built as a cumulative sum of ones, so that a symbolic ``n`` stays the length's symbol (a ``range``
    over a run-time limit would have an unknown length)."""
    ones = ctx.emit1("constant_of_shape", [length], {"value": np.ones(1, dtype.np)})
    counted = ctx.emit1("cumsum", [ones, ctx.constant(np.int64(0))])
    return ctx.emit1("sub", [counted, scalar(ctx, 1, dtype)])


def dim_of(ctx: ImportCtx, x: Value, axis: int) -> Value:
    """``x.shape[axis]`` as a 1-element int64 tensor (its symbol known to inference)."""
    axis %= x.type.rank
    return ctx.emit1("shape", [x], {"start": axis, "end": axis + 1})


# activations --------------------------------------------------------------------------------
@importer("Gelu", domain=MS)
def _gelu(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ())
    return [ctx.emit1("gelu", [required(ctx, 0, "X")])]


@importer("BiasGelu", domain=MS)
def _bias_gelu(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ())
    a = required(ctx, 0, "A")
    return [ctx.emit1("gelu", [ctx.emit1("add", [a, bias_vector(ctx, 1, "B", a)])])]


@importer("FastGelu", domain=MS)
def _fast_gelu(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ())
    x = required(ctx, 0, "X")
    if ctx.input(1) is not None:
        x = ctx.emit1("add", [x, bias_vector(ctx, 1, "bias", x)])
    return [ctx.emit1("gelu", [x], {"approximate": "tanh"})]


@importer("QuickGelu", domain=MS)
def _quick_gelu(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("alpha",))
    x = required(ctx, 0, "X")
    alpha = float_attr(ctx, "alpha", 1.702)
    scaled = x if alpha == 1.0 else ctx.emit1("mul", [x, scalar(ctx, alpha, x.type.dtype)])
    return [ctx.emit1("mul", [x, ctx.emit1("sigmoid", [scaled])])]


# FusedMatMul --------------------------------------------------------------------------------
def _operand(ctx: ImportCtx, v: Value, name: str, trans: bool, trans_batch: bool, other_rank: int) -> Value:
    rank = v.type.rank
    perm = list(range(rank))
    if trans_batch:
        if rank < 3 or rank != other_rank:
            raise ctx.unsupported(f"transBatch{name}=1 with operands of ranks {rank} and {other_rank} "
                                  "(it needs two operands of one rank, at least 3)")
        perm = [*range(1, rank - 1), 0, rank - 1]
    if trans:
        if rank < 2:
            raise ctx.unsupported(f"trans{name}=1 on a 1-D operand")
        perm[-2], perm[-1] = perm[-1], perm[-2]
    if perm == list(range(rank)):
        return v
    return ctx.emit1("transpose", [v], {"perm": perm})


@importer("FusedMatMul", domain=MS)
def _fused_matmul(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("alpha", "transA", "transB", "transBatchA", "transBatchB"))
    a, b = required(ctx, 0, "A"), required(ctx, 1, "B")
    alpha = float_attr(ctx, "alpha", 1.0)
    ra, rb = a.type.rank, b.type.rank
    a = _operand(ctx, a, "A", flag_attr(ctx, "transA"), flag_attr(ctx, "transBatchA"), rb)
    b = _operand(ctx, b, "B", flag_attr(ctx, "transB"), flag_attr(ctx, "transBatchB"), ra)
    y = ctx.emit1("matmul", [a, b])
    if alpha != 1.0:
        y = ctx.emit1("mul", [y, scalar(ctx, alpha, y.type.dtype)])
    return [y]


# BiasSoftmax --------------------------------------------------------------------------------
@importer("BiasSoftmax", domain=MS)
def _bias_softmax(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("axis", "broadcast_axis", "is_inner_broadcast"))
    x, b = required(ctx, 0, "data"), required(ctx, 1, "bias")
    rank = x.type.rank
    axis = _axis(ctx, "axis", 1, rank)
    inner = int_attr(ctx, "is_inner_broadcast")
    if inner is None and "broadcast_axis" in ctx.attrs:  # the op's first form: inner broadcast from that axis
        prefix: int | None = _axis(ctx, "broadcast_axis", 1, rank)
        inner, what = 1, f"broadcast_axis={ctx.attrs['broadcast_axis']}"
    elif inner is None:
        raise ctx.fail("attribute 'is_inner_broadcast' is required")
    elif inner not in (0, 1):
        raise ctx.unsupported(f"attribute is_inner_broadcast={inner} (it is 0 or 1)")
    elif "broadcast_axis" in ctx.attrs:
        raise ctx.unsupported("attributes is_inner_broadcast and broadcast_axis together (the op's two forms)")
    else:
        prefix, what = None, f"is_inner_broadcast={inner}"
    xs, bs = x.type.shape, b.type.shape
    if b.type.rank > rank or b.type.rank < rank - axis or list(bs[b.type.rank - (rank - axis):]) != list(xs[axis:]):
        raise ctx.fail(f"bias {b.type} must end with the softmax dims {list(xs[axis:])} of data {x.type}")
    ones: list[Dim] = [1] * (rank - b.type.rank)
    batch = ones + list(bs[: b.type.rank - (rank - axis)])
    if not _batch_broadcast_ok(batch, list(xs[:axis]), inner=bool(inner), prefix=prefix):
        kind = "leading" if inner else "trailing"
        raise ctx.unsupported(f"bias {b.type} on data {x.type} with {what}: its batch dims must be data's "
                              f"{kind} batch dims and ones")
    added = ctx.emit1("add", [x, b])
    return [ctx.emit1("softmax", [added], {"axis": axis, "coerce_2d": 1})]


def _axis(ctx: ImportCtx, name: str, default: int, rank: int) -> int:
    axis = int_attr(ctx, name, default)
    assert axis is not None
    if not -rank <= axis < rank:
        raise ctx.fail(f"{name} {axis} is out of range for rank {rank}")
    return axis % rank


def _batch_broadcast_ok(bias: list[Dim], data: list[Dim], *, inner: bool, prefix: int | None) -> bool:
    """Whether the bias's batch dims are data's first k batch dims then ones (inner), or ones then
    data's last k batch dims (outer), for some k (``prefix``, when given, is that k)."""
    n = len(data)
    for k in range(n + 1) if prefix is None else (min(prefix, n),):
        kept, ones = (range(k), range(k, n)) if inner else (range(n - k, n), range(n - k))
        if all(bias[i] == data[i] for i in kept) and all(bias[i] == 1 for i in ones):
            return True
    return False


# RotaryEmbedding --------------------------------------------------------------------------------
@importer("RotaryEmbedding", domain=MS)
def _rotary_embedding(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("interleaved", "is_packed_batching", "num_heads", "rotary_embedding_dim", "scale"))
    x, pos = required(ctx, 0, "input"), required(ctx, 1, "position_ids")
    cos, sin = required(ctx, 2, "cos_cache"), required(ctx, 3, "sin_cache")
    if flag_attr(ctx, "is_packed_batching"):
        raise ctx.unsupported("is_packed_batching=1 (ragged batches)")
    if float_attr(ctx, "scale", 1.0) != 1.0:
        raise ctx.unsupported(f"scale={ctx.attrs['scale']} (onnxruntime's CPU kernel ignores it, its "
                              "documentation applies it)")
    interleaved = flag_attr(ctx, "interleaved")
    heads = int_attr(ctx, "num_heads", 0) or 0
    rot = int_attr(ctx, "rotary_embedding_dim", 0) or 0
    if pos.type.dtype is not DType.i64:
        raise ctx.fail(f"position_ids must be int64, got {pos.type}")
    for c, name in ((cos, "cos_cache"), (sin, "sin_cache")):
        if c.type.rank != 2 or c.type.dtype is not x.type.dtype:
            raise ctx.fail(f"{name} must be 2-D [max_position, rotary_dim / 2] of {x.type.dtype}, got {c.type}")
    half = cos.type.shape[1]
    if not isinstance(half, int):
        raise ctx.unsupported(f"cos_cache {cos.type} with a symbolic last dim")
    if x.type.rank == 4:
        head_size = x.type.shape[3]
        lay = x
    elif x.type.rank == 3:
        hidden = x.type.shape[2]
        if rot and not heads:
            raise ctx.fail("rotary_embedding_dim needs num_heads (to split the hidden dim into heads)")
        if not isinstance(hidden, int):
            raise ctx.unsupported(f"input {x.type} with a symbolic hidden size")
        head_size = hidden // heads if heads else 2 * half
        if head_size == 0 or hidden % head_size or (heads and hidden % heads):
            raise ctx.fail(f"cannot split input {x.type} into heads (num_heads={heads}, cos_cache {cos.type})")
        lay = ctx.emit1("reshape", [x, ints(ctx, [0, 0, hidden // head_size, head_size])])
    else:
        raise ctx.fail(f"input must be 3-D [batch, seq, hidden] or 4-D [batch, heads, seq, head], got {x.type}")
    if not isinstance(head_size, int):
        raise ctx.unsupported(f"input {x.type} with a symbolic head size")
    rot = rot or head_size
    if rot % 2 or rot > head_size or 2 * half != rot:
        raise ctx.fail(f"cos_cache {cos.type} must hold rotary_dim / 2 = {rot // 2} angles "
                       f"(rotary_dim {rot}, head size {head_size})")
    seq_axis = 2 if x.type.rank == 4 else 1
    cs = [_angles(ctx, c, pos, lay, seq_axis) for c in (cos, sin)]
    rotated = _rotate(ctx, lay, cs[0], cs[1], rot, interleaved)
    if rot < head_size:
        rest = ctx.emit1("slice", [lay, ints(ctx, [rot]), ints(ctx, [head_size]), ints(ctx, [3])])
        rotated = ctx.emit1("concat", [rotated, rest], {"axis": 3})
    if x.type.rank == 3:
        rotated = ctx.emit1("reshape", [rotated, ints(ctx, [0, 0, -1])])
    return [rotated]


def _angles(ctx: ImportCtx, cache: Value, pos: Value, x: Value, seq_axis: int) -> Value:
    """The cache rows of every token, shaped to broadcast onto ``x`` (``[b, s, 1, rot/2]`` for the
    ``[b, s, heads, head]`` layout, ``[b, 1, s, rot/2]`` for ``[b, heads, s, head]``)."""
    if pos.type.rank == 2:
        idx = pos
    elif pos.type.rank == 1 and pos.type.shape[0] == 1:  # an offset: positions offset .. offset + seq - 1
        steps = positions(ctx, dim_of(ctx, x, seq_axis), DType.i64)
        idx = ctx.emit1("unsqueeze", [ctx.emit1("add", [steps, pos]), ints(ctx, [0])])
    else:
        raise ctx.fail(f"position_ids must be [batch, seq] or a 1-element offset, got {pos.type}")
    rows = ctx.emit1("gather", [cache, idx], {"axis": 0})  # [b or 1, s, rot/2]
    return ctx.emit1("unsqueeze", [rows, ints(ctx, [2 if seq_axis == 1 else 1])])


def _rotate(ctx: ImportCtx, x: Value, cos: Value, sin: Value, rot: int, interleaved: bool) -> Value:
    def part(start: int, end: int, step: int) -> Value:
        return ctx.emit1("slice", [x, ints(ctx, [start]), ints(ctx, [end]), ints(ctx, [3]), ints(ctx, [step])])

    if interleaved:
        a, b = part(0, rot, 2), part(1, rot, 2)
    else:
        a, b = part(0, rot // 2, 1), part(rot // 2, rot, 1)
    first = ctx.emit1("sub", [ctx.emit1("mul", [a, cos]), ctx.emit1("mul", [b, sin])])
    second = ctx.emit1("add", [ctx.emit1("mul", [b, cos]), ctx.emit1("mul", [a, sin])])
    if not interleaved:
        return ctx.emit1("concat", [first, second], {"axis": 3})
    pairs = [ctx.emit1("unsqueeze", [v, ints(ctx, [4])]) for v in (first, second)]
    both = ctx.emit1("concat", pairs, {"axis": 4})  # [.., rot/2, 2]: channel 2i, then 2i + 1
    return ctx.emit1("reshape", [both, ints(ctx, [0, 0, 0, rot])])

