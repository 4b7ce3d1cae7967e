"""Importers of onnxruntime's ``com.microsoft`` ``Attention`` and ``MultiHeadAttention`` onto Cuvil's
``attention`` op (``cuvil/ops/attention.py``), with the semantics of onnxruntime's CPU kernels:

    scores = scale * Q Kᵀ + mask bias + attention_bias;   Y = softmax(scores) V

* ``scale`` is the attribute, or ``1 / sqrt(head_size)`` when it is absent or 0.
* The mask bias is 0 where a key is attended and ``mask_filter_value`` (-10000) where it is masked.
  ``mask_index`` / ``key_padding_mask`` (int32) is one of: ``[batch]`` key lengths (keys at or past
  the length are masked); ``[2 * batch]`` end positions then start positions (keys outside
  ``[start, end)`` are masked; ``Attention`` only); ``[batch, total_seq]`` or
  ``[batch, seq, total_seq]`` raw masks (a value > 0 attends).  The 4-D Megatron mask and the
  ``[3 * batch + 2]`` form are refused, as onnxruntime's CPU kernels refuse them.
* ``unidirectional=1`` excludes the keys after ``past_seq + i`` from query ``i`` (the ``attention``
  op's causal form; onnxruntime fills them with the lowest float, which the softmax turns into the
  same zeros, and which the ``qk`` output shows: it is clamped to that value here).
* ``Attention`` packs the input projection: ``[Q | K | V] = input @ weights + bias``, split by
  ``qkv_hidden_sizes`` (default three equal parts).  Its ``past`` is ``[2, batch, heads, past_seq,
  head]`` (keys, then values) and ``present`` the same with the new keys and values appended.
* ``MultiHeadAttention`` takes Q, K, V as ``[batch, seq, hidden]`` (the bias ``[Dq + Dk + Dv]`` added
  to each), K and V as ``[batch, heads, kv_seq, head]`` (the bias applies to Q only), the packed
  ``[batch, seq, heads, 3, head]`` QKV or ``[batch, kv_seq, heads, 2, head]`` KV forms (without a
  bias), ``past_key`` / ``past_value`` ``[batch, heads, past_seq, head]`` and their ``present_*``
  outputs, and ``qk``: the scores before the softmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.frontends.onnx.ops_contrib import (
    MS,
    dim_of,
    flag_attr,
    float_attr,
    int_attr,
    ints,
    positions,
    required,
    scalar,
)
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.ir.dtypes import FLOATS, DType
from cuvil.ir.graph import Value
from cuvil.ir.symbolic import Dim

_MASK_FILTER = -10000.0


def _heads(ctx: ImportCtx) -> int:
    n = int_attr(ctx, "num_heads")
    if n is None or n <= 0:
        raise ctx.fail(f"attribute 'num_heads' must be a positive integer, got {ctx.attrs.get('num_heads')!r}")
    return n


def _scale(ctx: ImportCtx, head_size: int) -> float:
    s = float_attr(ctx, "scale", 0.0)
    return s if s != 0.0 else float(np.float32(1.0) / np.sqrt(np.float32(head_size)))


def _static(ctx: ImportCtx, d: Dim, what: str) -> int:
    if not isinstance(d, int):
        raise ctx.unsupported(f"{what} {d} is symbolic (the importer splits it by a static size)")
    return d


def _differ(a: Dim, b: Dim) -> bool:
    """Whether two dims are known to differ (both static and unequal)."""
    return isinstance(a, int) and isinstance(b, int) and a != b


def _mask_bias(ctx: ImportCtx, mask: Value | None, extra: Value | None, *, name: str, batch: Dim, q_len: Dim,
               total: Value, total_dim: Dim, dtype: DType, start_end: bool) -> Value | None:
    """The float bias ``[batch or 1, heads or 1, seq, total_seq]`` the mask and attention_bias add."""
    fv = float_attr(ctx, "mask_filter_value", _MASK_FILTER)
    bias: Value | None = None
    if mask is not None:
        if mask.type.dtype is not DType.i32:
            raise ctx.fail(f"{name} must be int32, got {mask.type}")
        r, shape = mask.type.rank, mask.type.shape
        if r == 1:
            keys = ctx.emit1("unsqueeze", [positions(ctx, total, DType.i32), ints(ctx, [0])])  # [1, T]
            if shape[0] == batch:
                keep = ctx.emit1("less", [keys, ctx.emit1("unsqueeze", [mask, ints(ctx, [1])])])
            elif start_end and shape[0] == 2 * batch:
                end, start = (ctx.emit1("unsqueeze", [h, ints(ctx, [1])])
                              for h in ctx.emit("split", [mask], {"axis": 0, "num_outputs": 2}, num_outputs=2))
                keep = ctx.emit1("and", [ctx.emit1("less", [keys, end]),
                                         ctx.emit1("greater_or_equal", [keys, start])])
            else:
                forms = "[batch] or [2 * batch]" if start_end else "[batch]"
                raise ctx.unsupported(f"{name} of shape {mask.type} with batch {batch} (the 1-D forms taken are "
                                      f"{forms})")
            axes = [1, 2]
        elif r in (2, 3):
            if _differ(shape[0], batch) or _differ(shape[-1], total_dim) or (r == 3 and _differ(shape[1], q_len)):
                want = "[batch, total_seq]" if r == 2 else "[batch, seq, total_seq]"
                raise ctx.fail(f"{name} {mask.type} must be {want} = "
                               f"{[batch, total_dim] if r == 2 else [batch, q_len, total_dim]}")
            keep = ctx.emit1("greater", [mask, ctx.constant(0, DType.i32)])
            axes = [1, 2] if r == 2 else [1]
        else:
            raise ctx.unsupported(f"a {r}-D {name} (onnxruntime's CPU kernels take 1-D, 2-D and 3-D masks)")
        filled = ctx.emit1("where", [keep, scalar(ctx, 0.0, dtype), scalar(ctx, fv, dtype)])
        bias = ctx.emit1("unsqueeze", [filled, ints(ctx, axes)])
    if extra is not None:
        if extra.type.rank != 4 or extra.type.dtype is not dtype:
            raise ctx.fail(f"attention_bias must be {dtype} [batch or 1, heads or 1, seq, total_seq], got {extra.type}")
        bias = extra if bias is None else ctx.emit1("add", [bias, extra])
    return bias


def _total(ctx: ImportCtx, kv: Value, seq_axis: int, past: Value | None) -> tuple[Value, Dim]:
    """The total key count (past + new) as a 1-element int64 tensor and as a dim."""
    total, dim = dim_of(ctx, kv, seq_axis), kv.type.shape[seq_axis]
    if past is not None:
        total = ctx.emit1("add", [dim_of(ctx, past, 2), total])
        dim = past.type.shape[2] + dim
    return total, dim


def _core(ctx: ImportCtx, q: Value, k: Value, v: Value, bias: Value | None, past_k: Value | None,
          past_v: Value | None, *, heads: int, head_size: int, outputs: int, qk: bool) -> list[Value]:
    causal = flag_attr(ctx, "unidirectional")
    attrs: dict[str, object] = {"q_num_heads": heads, "kv_num_heads": heads, "scale": _scale(ctx, head_size),
                                "scale_mode": "mul", "is_causal": int(causal), "guard_masked_rows": 0}
    if qk:
        attrs["qk_matmul_output_mode"] = 2
    outs = ctx.emit("attention", [q, k, v, bias, past_k, past_v], attrs, num_outputs=outputs)
    if qk and causal:  # onnxruntime writes the lowest float where -inf excludes a key
        lowest = scalar(ctx, float(np.finfo(outs[3].type.dtype.np).min), outs[3].type.dtype)
        outs[3] = ctx.emit1("max", [outs[3], lowest])
    return outs


def _check_float(ctx: ImportCtx, x: Value, name: str) -> None:
    if x.type.dtype not in FLOATS or x.type.dtype is DType.f64:
        raise ctx.fail(f"{name} must be float32, float16 or bfloat16, got {x.type}")


@importer("Attention", domain=MS)
def _attention(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("do_rotary", "mask_filter_value", "num_heads", "past_present_share_buffer",
                      "qkv_hidden_sizes", "rotary_embedding_dim", "scale", "unidirectional"))
    if flag_attr(ctx, "do_rotary"):
        raise ctx.unsupported("do_rotary=1 (onnxruntime's CPU kernel refuses it too; a RotaryEmbedding and "
                              "MultiHeadAttention pair expresses it)")
    if flag_attr(ctx, "past_present_share_buffer"):
        raise ctx.unsupported("past_present_share_buffer=1 (a preallocated key/value buffer)")
    if ctx.input(6) is not None:
        raise ctx.unsupported("input past_sequence_length (it goes with past_present_share_buffer)")
    heads = _heads(ctx)
    x, w, b = required(ctx, 0, "input"), required(ctx, 1, "weights"), ctx.input(2)
    _check_float(ctx, x, "input")
    if x.type.rank != 3 or w.type.rank != 2:
        raise ctx.fail(f"input must be 3-D [batch, seq, hidden] and weights 2-D, got {x.type} and {w.type}")
    width = _static(ctx, w.type.shape[1], "the weights' second dim")
    sizes = ctx.attrs.get("qkv_hidden_sizes")
    if sizes is None:
        if width % 3:
            raise ctx.fail(f"weights {w.type}: without qkv_hidden_sizes the second dim must be divisible by 3")
        sizes = [width // 3] * 3
    if (not isinstance(sizes, list) or len(sizes) != 3 or sum(sizes) != width
            or any(not isinstance(s, int) or s <= 0 or s % heads for s in sizes)):
        raise ctx.fail(f"qkv_hidden_sizes {sizes} must be three positive multiples of num_heads={heads} "
                       f"adding up to the weights' second dim {width}")
    if sizes[0] != sizes[1]:
        raise ctx.fail(f"qkv_hidden_sizes {sizes}: Q and K must have one hidden size")
    qkv = ctx.emit1("matmul", [x, w])
    if b is not None:
        if b.type.rank != 1 or _differ(b.type.shape[0], width):
            raise ctx.fail(f"bias must be 1-D [{width}], got {b.type}")
        qkv = ctx.emit1("add", [qkv, b])
    q, k, v = ctx.emit("split", [qkv, ints(ctx, sizes)], {"axis": 2}, num_outputs=3)
    past = ctx.input(4)
    past_k = past_v = None
    if past is not None:
        if past.type.rank != 5 or _differ(past.type.shape[0], 2) or len(set(sizes)) != 1:
            raise ctx.fail(f"past must be [2, batch, heads, past_seq, head] with equal Q, K and V hidden sizes, "
                           f"got {past.type} and qkv_hidden_sizes {sizes}")
        past_k, past_v = (ctx.emit1("gather", [past, ctx.constant(i, DType.i64)], {"axis": 0}) for i in (0, 1))
    total, total_dim = _total(ctx, x, 1, past_k)
    bias = _mask_bias(ctx, ctx.input(3), ctx.input(5), name="mask_index", batch=x.type.shape[0],
                      q_len=x.type.shape[1], total=total, total_dim=total_dim, dtype=x.type.dtype, start_end=True)
    want_present = ctx.num_outputs > 1
    if want_present and sizes[1] != sizes[2]:
        raise ctx.fail(f"output present stacks keys and values, which qkv_hidden_sizes {sizes} make of different sizes")
    outs = _core(ctx, q, k, v, bias, past_k, past_v, heads=heads, head_size=sizes[0] // heads,
                 outputs=3 if want_present else 1, qk=False)
    if not want_present:
        return outs[:1]
    stacked = [ctx.emit1("unsqueeze", [o, ints(ctx, [0])]) for o in outs[1:3]]
    return [outs[0], ctx.emit1("concat", stacked, {"axis": 0})]


def _unpack(ctx: ImportCtx, packed: Value, parts: int, heads: int, name: str) -> list[Value]:
    """The ``parts`` tensors ``[batch, seq, heads * head]`` of a packed ``[batch, seq, heads, parts, head]``."""
    shape = packed.type.shape
    if _differ(shape[2], heads) or _differ(shape[3], parts):
        raise ctx.fail(f"packed {name} must be [batch, seq, {heads}, {parts}, head], got {packed.type}")
    return [ctx.emit1("reshape", [ctx.emit1("gather", [packed, ctx.constant(i, DType.i64)], {"axis": 3}),
                                  ints(ctx, [0, 0, -1])]) for i in range(parts)]


def _to_bnsh(ctx: ImportCtx, x: Value, heads: int) -> Value:
    split = ctx.emit1("reshape", [x, ints(ctx, [0, 0, heads, -1])])
    return ctx.emit1("transpose", [split], {"perm": [0, 2, 1, 3]})


@importer("MultiHeadAttention", domain=MS)
def _multi_head_attention(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("mask_filter_value", "num_heads", "scale", "unidirectional"))
    for i, name in ((8, "past_sequence_length"), (9, "cache_indirection")):
        if ctx.input(i) is not None:
            raise ctx.unsupported(f"input {name} (a shared key/value buffer or beam search)")
    heads = _heads(ctx)
    q, k, v, b = required(ctx, 0, "query"), ctx.input(1), ctx.input(2), ctx.input(3)
    past_k, past_v = ctx.input(6), ctx.input(7)
    _check_float(ctx, q, "query")
    if (past_k is None) != (past_v is None):
        raise ctx.fail("past_key and past_value must be given together")
    packed = q.type.rank == 5 or (k is not None and k.type.rank == 5)
    if packed and b is not None:
        raise ctx.unsupported("a bias with packed QKV or KV inputs")
    if q.type.rank == 5:
        if k is not None or v is not None:
            raise ctx.fail("packed QKV query takes no key or value input")
        q, k, v = _unpack(ctx, q, 3, heads, "QKV")
    elif k is not None and k.type.rank == 5:
        if v is not None:
            raise ctx.fail("packed KV key takes no value input")
        k, v = _unpack(ctx, k, 2, heads, "KV")
    if q.type.rank != 3 or k is None or v is None or k.type.rank not in (3, 4) or v.type.rank != k.type.rank:
        raise ctx.fail(f"query must be 3-D and key and value both 3-D or both 4-D, got {q.type}, "
                       f"{None if k is None else k.type}, {None if v is None else v.type}")
    hidden = _static(ctx, q.type.shape[2], "the query's hidden size")
    if hidden % heads:
        raise ctx.fail(f"query hidden size {hidden} is not a multiple of num_heads={heads}")
    bnsh = k.type.rank == 4
    if bnsh and _differ(k.type.shape[1], heads):
        raise ctx.fail(f"4-D key {k.type} must have num_heads={heads} heads")
    if b is not None:
        if b.type.rank != 1:
            raise ctx.fail(f"bias must be 1-D [Dq + Dk + Dv], got {b.type}")
        if bnsh:
            q = ctx.emit1("add", [q, ctx.emit1("slice", [b, ints(ctx, [0]), ints(ctx, [hidden]), ints(ctx, [0])])])
        else:
            dk = _static(ctx, k.type.shape[2], "the key's hidden size")
            dv = _static(ctx, v.type.shape[2], "the value's hidden size")
            if _differ(b.type.shape[0], hidden + dk + dv):
                raise ctx.fail(f"bias {b.type} must hold {hidden} + {dk} + {dv} values")
            bq, bk, bv = ctx.emit("split", [b, ints(ctx, [hidden, dk, dv])], {"axis": 0}, num_outputs=3)
            q, k, v = (ctx.emit1("add", [t, bt]) for t, bt in ((q, bq), (k, bk), (v, bv)))
    kv_axis = 2 if bnsh else 1
    if flag_attr(ctx, "unidirectional") and k.type.shape[kv_axis] != q.type.shape[1]:
        raise ctx.unsupported(f"unidirectional=1 with {k.type.shape[kv_axis]} keys for {q.type.shape[1]} queries "
                              "(onnxruntime's CPU kernel aligns the causal mask only for equal lengths)")
    total, total_dim = _total(ctx, k, kv_axis, past_k)
    bias = _mask_bias(ctx, ctx.input(4), ctx.input(5), name="key_padding_mask", batch=q.type.shape[0],
                      q_len=q.type.shape[1], total=total, total_dim=total_dim, dtype=q.type.dtype, start_end=False)
    want_qk = ctx.num_outputs > 3
    n_out = 4 if want_qk else 3 if ctx.num_outputs > 1 else 1
    query = _to_bnsh(ctx, q, heads) if bnsh else q
    outs = _core(ctx, query, k, v, bias, past_k, past_v, heads=heads, head_size=hidden // heads,
                 outputs=n_out, qk=want_qk)
    if bnsh:
        outs[0] = ctx.emit1("reshape", [ctx.emit1("transpose", [outs[0]], {"perm": [0, 2, 1, 3]}),
                                        ints(ctx, [0, 0, -1])])
    return outs
