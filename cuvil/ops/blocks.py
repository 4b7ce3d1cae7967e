"""``col2im`` (ONNX Col2Im-18): sliding blocks added back into an image.

Input ``[N, C * prod(block_shape), L]`` holds, for each channel and block offset, one value per
block position (``L`` positions, row-major over the blocks' grid); ``image_shape`` and
``block_shape`` (1-D int64, possibly computed at run time) give the image's and a block's
spatial dims; ``dilations``, ``pads`` (begin values then end values) and ``strides`` place the
blocks as a convolution's windows.  Each output pixel is the sum of the values whose block
covers it; values over the padding are dropped.  Floating-point elements, summed in float64.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from cuvil.ir.dtypes import FLOATS, INTS
from cuvil.ir.symbolic import UNKNOWN, Dim, floordiv
from cuvil.ir.types import TensorType
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register


def geometry(attrs: dict[str, object], r: int) -> tuple[list[int], list[int], list[int]]:
    """(dilations, pads, strides) with their defaults, each checked for length."""
    def get(name: str, default: int, n: int) -> list[int]:
        v = attrs.get(name)
        values = [default] * n if v is None else [int(x) for x in v]  # type: ignore[attr-defined]
        if len(values) != n:
            raise ValueError(f"col2im: {name} must have {n} values, got {values}")
        return values

    dil, pads, strides = get("dilations", 1, r), get("pads", 0, 2 * r), get("strides", 1, r)
    if min(dil, default=1) < 1 or min(strides, default=1) < 1 or min(pads, default=0) < 0:
        raise ValueError(f"col2im: dilations {dil} and strides {strides} must be positive, pads {pads} not negative")
    return dil, pads, strides


def block_counts(image: list[int], block: list[int], dil: list[int], pads: list[int], strides: list[int]) -> list[int]:
    r = len(image)
    return [(image[d] + pads[d] + pads[d + r] - dil[d] * (block[d] - 1) - 1) // strides[d] + 1 for d in range(r)]


def _infer(ctx: InferCtx) -> list[TensorType]:
    x, img_t, blk_t = ctx.type(0), ctx.type(1), ctx.type(2)
    ctx.require_dtype(0, FLOATS)
    ctx.require_dtype(1, INTS)
    ctx.require_dtype(2, INTS)
    if x.rank != 3:
        raise ctx.fail(f"input must be [N, C * prod(block_shape), L], got {x}")
    if img_t.rank != 1 or blk_t.rank != 1 or not isinstance(img_t.shape[0], int):
        raise ctx.fail(f"image_shape and block_shape must be 1-D of a known length, got {img_t} and {blk_t}")
    r = img_t.shape[0]
    ctx.assume_equal(blk_t.shape[0], r, "lengths of image_shape and block_shape")
    try:
        dil, pads, strides = geometry(ctx.attrs, r)
    except ValueError as exc:
        raise ctx.fail(str(exc).removeprefix("col2im: ")) from None
    image = ctx.sym_value(1)
    block = ctx.const(2)
    channels: Dim = UNKNOWN
    if block is not None:
        blk = [int(v) for v in block.reshape(-1)]
        if min(blk, default=1) < 1:
            raise ctx.fail(f"block_shape {blk} must be positive")
        k = math.prod(blk)
        c_in = x.shape[1]
        if isinstance(c_in, int) and c_in % k:
            raise ctx.fail(f"input dim 1 ({c_in}) must be a multiple of prod(block_shape) = {k}")
        channels = floordiv(c_in, k)
        img_c = ctx.const(1)
        if img_c is not None:
            img = [int(v) for v in img_c.reshape(-1)]
            counts = block_counts(img, blk, dil, pads, strides)
            if min(img, default=1) < 1 or min(counts, default=1) < 1:
                raise ctx.fail(f"no block fits: image_shape {img}, block_shape {blk} give {counts} blocks per axis")
            ctx.assume_equal(x.shape[2], math.prod(counts), "input dim 2 and the number of blocks")
    dims: tuple[Dim, ...] = tuple(image) if image is not None else (UNKNOWN,) * r
    return [TensorType(x.dtype, (x.shape[0], channels, *dims))]


def _reference(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    image = [int(v) for v in ctx.input(1).reshape(-1)]
    block = [int(v) for v in ctx.input(2).reshape(-1)]
    r = len(image)
    if len(block) != r or min(image, default=1) < 1 or min(block, default=1) < 1:
        raise ValueError(f"col2im: image_shape {image} and block_shape {block} must be positive, one per axis")
    dil, pads, strides = geometry(ctx.attrs, r)
    counts = block_counts(image, block, dil, pads, strides)
    k = math.prod(block)
    n, ck, length = x.shape
    if min(counts, default=1) < 1 or ck % k or length != math.prod(counts):
        raise ValueError(f"col2im: input {list(x.shape)} does not hold blocks {block} for image {image}")
    cols = x.reshape(n, ck // k, k, length).astype(np.float64)
    out = np.zeros((math.prod(image) + 1, n, ck // k))  # the last pixel collects what falls into the padding
    where = np.full((k, length), math.prod(image), dtype=np.int64)
    for kk, offset in enumerate(itertools.product(*(range(b) for b in block))):
        at = np.indices(counts).reshape(r, -1)
        pos = [at[d] * strides[d] - pads[d] + offset[d] * dil[d] for d in range(r)]
        inside = np.logical_and.reduce([(p >= 0) & (p < image[d]) for d, p in enumerate(pos)])
        flat = np.ravel_multi_index(tuple(np.where(inside, p, 0) for p in pos), image)
        where[kk] = np.where(inside, flat, math.prod(image))
    np.add.at(out, where.reshape(-1), np.moveaxis(cols.reshape(n, ck // k, -1), -1, 0))
    return [np.moveaxis(out[:-1], 0, -1).reshape(n, ck // k, *image).astype(ctx.out_dtype())]


register(
    OpDef(
        name="col2im",
        inputs=("input", "image_shape", "block_shape"),
        attrs={"dilations": AttrSpec("ints", None), "pads": AttrSpec("ints", None), "strides": AttrSpec("ints", None)},
        infer=_infer,
        reference=_reference,
        doc="Sums sliding blocks [N, C * prod(block), L] back into images [N, C, *image_shape] (ONNX Col2Im).",
    )
)
