"""Which algorithm each convolution node runs: the GEMM-based kernels or Winograd F(m x m, 3 x 3).

The user's choice (``cuvil.compile(..., conv_algorithm=...)``) is one of :data:`ALGORITHMS`,
for every convolution or per node name:

* ``"auto"`` (the default): the cost model below picks per node;
* ``"im2col"``: the GEMM-based kernels of ``cuvil_conv.h`` (im2col + GEMM, the image itself
  as the GEMM operand for 1x1 unit-stride convolutions, the direct depthwise kernel);
* ``"winograd"``: Winograd, with the tile size the cost model prefers;
* ``"winograd-f2"``, ``"winograd-f4"``, ``"winograd-f6"``: Winograd F(2x2,3x3), F(4x4,3x3),
  F(6x6,3x3).

Rules:

1. Winograd applies to f32 2-D convolutions with a static 3x3 kernel, unit strides and
   dilations and one group (any padding, batch and channel counts).
2. A choice for the whole model applies to every node it can; the others keep ``auto``'s pick.
3. A choice for a named node must name a convolution of the compiled graph that it applies
   to; anything else is a :class:`ConvAlgorithmError`.
4. The cost model estimates im2col + GEMM, F(2x2,3x3) and F(4x4,3x3) and picks the cheaper
   Winograd variant when its estimate is at most ``WINOGRAD_MARGIN`` times the GEMM's (the
   estimates' error on the layers they were fitted to is up to about 20%, and Winograd costs
   some accuracy, so a near tie goes to the GEMM); otherwise im2col + GEMM.  Between the two
   Winograd variants, F(4x4,3x3) is picked only when its estimate is at most ``F4_MARGIN``
   times F(2x2,3x3)'s: its float32 error is about five times F(2x2,3x3)'s (1-2e-6 against
   2-4e-7 relative per layer), worth paying for a clear saving, not for a tie.
   F(6x6,3x3) is never picked by ``auto``: its float32 error (about 1e-5 relative per layer,
   growing with depth) breaks the 1e-5 end-to-end tolerance Cuvil keeps; it is there for
   users who ask for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from cuvil.errors import CuvilError
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node
from cuvil.ir.types import TensorType

ALGORITHMS = ("auto", "im2col", "winograd", "winograd-f2", "winograd-f4", "winograd-f6")
WINOGRAD_TILES = {"winograd-f2": 2, "winograd-f4": 4, "winograd-f6": 6}
CONV_OPS = ("conv", "fused_conv")

ConvAlgorithmOption = str | tuple[tuple[str, str], ...]
"""The normalised option: one algorithm for every node, or (node name, algorithm) pairs."""


class ConvAlgorithmError(CuvilError):
    """A ``conv_algorithm`` choice that names an unknown algorithm or node, or does not apply."""


@dataclass(frozen=True)
class Winograd:
    m: int
    why: str


@dataclass(frozen=True)
class Gemm:
    why: str


Choice = Winograd | Gemm


@dataclass(frozen=True)
class ConvShape:
    """What the choice needs to know of one convolution node (None: a dim known only at run time)."""

    problem: str | None  # why Winograd does not apply, or None
    batch: int | None = None
    cin: int | None = None
    cout: int | None = None
    out_h: int | None = None
    out_w: int | None = None


def normalize(option: str | Mapping[str, str] | None) -> ConvAlgorithmOption:
    """``conv_algorithm`` as given to ``cuvil.compile``, checked and made hashable."""
    if option is None:
        return "auto"
    if isinstance(option, str):
        _check_name(option, "conv_algorithm")
        return option
    if not isinstance(option, Mapping):
        raise ConvAlgorithmError(f"conv_algorithm must be one of {', '.join(ALGORITHMS)} or a mapping from node "
                                 f"name to one of them, not {type(option).__name__}")
    pairs = []
    for name, alg in option.items():
        if not isinstance(name, str) or not isinstance(alg, str):
            raise ConvAlgorithmError(f"conv_algorithm maps node names to algorithm names; got {name!r}: {alg!r}")
        _check_name(alg, f"conv_algorithm[{name!r}]")
        pairs.append((name, alg))
    return tuple(sorted(pairs))


def _check_name(alg: str, where: str) -> None:
    if alg not in ALGORITHMS:
        raise ConvAlgorithmError(f"{where}: unknown convolution algorithm {alg!r}; choose one of {', '.join(ALGORITHMS)}")


def conv_shape(node: Node, x: TensorType, w: TensorType, has_bias: bool) -> ConvShape:
    """The node's shape facts, and why Winograd does not apply to it (rule 1)."""
    a = node.attrs
    if x.rank != 4:
        return ConvShape(f"{x.rank - 2}-D convolution (Winograd: 2-D only)")
    if x.dtype is not DType.f32 or w.dtype is not DType.f32:
        return ConvShape(f"element type {x.dtype} (Winograd: f32 only)")
    if int(a.get("group", 1)) != 1:
        return ConvShape(f"{int(a['group'])} groups (Winograd: one group only)")
    if tuple(w.shape[2:]) != (3, 3):
        return ConvShape(f"kernel {'x'.join(str(d) for d in w.shape[2:])} (Winograd: static 3x3 only)")
    if any(int(s) != 1 for s in a.get("strides") or (1, 1)):
        return ConvShape(f"strides {list(a['strides'])} (Winograd: unit strides only)")
    if any(int(d) != 1 for d in a.get("dilations") or (1, 1)):
        return ConvShape(f"dilations {list(a['dilations'])} (Winograd: unit dilations only)")
    y = node.outputs[0].type if node.outputs else None

    def static(d: object) -> int | None:
        return d if isinstance(d, int) else None

    return ConvShape(None, static(x.shape[0]), static(x.shape[1]), static(w.shape[0]),
                     static(y.shape[2]) if y is not None else None, static(y.shape[3]) if y is not None else None)


def _requested(name: str, option: ConvAlgorithmOption) -> str:
    if isinstance(option, str):
        return option
    return dict(option).get(name, "auto")


def choose(name: str, shape: ConvShape, option: ConvAlgorithmOption) -> Choice:
    """The algorithm node ``name`` runs (rules 2 and 4; rule 3 is :func:`check`'s)."""
    alg = _requested(name, option)
    asked = f"conv_algorithm={alg!r}"
    if shape.problem is not None:
        if alg in ("im2col", "auto") or isinstance(option, str):
            return Gemm(shape.problem if alg == "auto" else f"{asked}; {shape.problem}")
        raise ConvAlgorithmError(f"conv_algorithm[{name!r}]={alg!r} does not apply: {shape.problem}")
    if alg == "im2col":
        return Gemm(asked)
    if alg in WINOGRAD_TILES:
        return Winograd(WINOGRAD_TILES[alg], asked)
    costs = estimate(shape)
    detail = ", ".join(f"{c} {t:.3g}" for c, t in costs.items())
    m = 4 if costs["F4"] <= F4_MARGIN * costs["F2"] else 2
    if alg == "winograd":
        return Winograd(m, f"{asked}; cost model: {detail}")
    if costs[f"F{m}"] > WINOGRAD_MARGIN * costs["im2col"]:
        return Gemm(f"cost model: {detail}")
    return Winograd(m, f"cost model: {detail}")


def check(graph: Graph, option: ConvAlgorithmOption) -> None:
    """Every node a per-node ``option`` names is a convolution of ``graph`` it applies to (rule 3)."""
    if isinstance(option, str):
        return
    convs = {n.name: n for n in graph.walk() if n.op in CONV_OPS}
    for name, _ in option:
        node = convs.get(name)
        if node is None:
            near = ", ".join(sorted(convs)[:8]) or "none"
            raise ConvAlgorithmError(f"conv_algorithm names {name!r}, which is not a convolution node of the compiled "
                                     f"graph (convolutions: {near}{', ...' if len(convs) > 8 else ''})")
        x, w = node.inputs[0], node.inputs[1]
        if x is None or w is None:
            continue
        choose(name, conv_shape(node, x.type, w.type, len(node.inputs) > 2), option)


# ---- the cost model ------------------------------------------------------------------------
# Seconds per unit, fitted (non-negative least squares on relative error) to the minimum of
# interleaved single-layer timings, batch 1, one thread, on one AVX-512 core (Zen 5; the layers
# and times are in docs/conv-algorithms.md).  im2col + GEMM: a multiply-add, an im2col element,
# a weight byte (read from memory once per call), a fixed cost per call.  Winograd: a
# multiply-add of the products with the channels padded as the kernel pads them (held at the
# measured FMA peak, 100e9 per second, rather than fitted), an element of the input and output
# transforms (the copy into channels-innermost rows included), a byte of transformed weights
# read from memory (first block) and re-read (each later block), a fixed cost per call.  The
# re-read rate is the last-level cache's; transformed weights larger than that cache
# (_LLC_BYTES: the L3 of a typical server core complex) cannot stay there between blocks, so
# each re-read streams them from memory again, at the first read's rate.  (Such layers are the
# deep ones at large batch: ResNet-18's 512-channel 3x3 at batch 16 holds 37.7 MB of F(4x4)
# weights, 4x its own; re-read from memory, F(4x4) is no longer clearly faster than F(2x2), whose
# 16.8 MB stay in L3.)
_GEMM_MADD = 1.0 / 72e9
_IM2COL = 1.0 / 9.6e9
_GEMM_WEIGHT_BYTE = 1.0 / 14e9
_GEMM_CALL = 27e-6
_WINO_MADD = 1.0 / 100e9
_TRANSFORM = 1.0 / 5.2e9
_U_BYTE = 1.0 / 34e9
_U_REREAD_BYTE = 1.0 / 46e9
_LLC_BYTES = 32 << 20
_WINO_CALL = 13e-6
WINOGRAD_MARGIN = 0.8
F4_MARGIN = 0.85

# Mirrors of cuvil_winograd.h's blocking (AVX-512: W = 16 channels a vector, NW = 32 output
# channels a panel, tile slots in quanta of R / 3 = 4; block budgets in bytes).
_W, _NW, _SLOT_QUANTUM = 16, 32, 4
_VBYTES, _VBYTES_BIG, _BIG_U = 384 << 10, 1 << 20, 4 << 20


def _round_up(x: int, q: int) -> int:
    return -(-x // q) * q


def estimate(shape: ConvShape) -> dict[str, float]:
    """Estimated seconds of im2col + GEMM, F(2x2,3x3) and F(4x4,3x3) for one eligible node, one thread.

    Dims known only at run time count as typical: batch 1, 64 channels, 56x56 outputs."""
    n = shape.batch or 1
    cin, cout = shape.cin or 64, shape.cout or 64
    oh, ow = shape.out_h or 56, shape.out_w or 56
    pixels = n * oh * ow
    out = {"im2col": pixels * cout * cin * 9 * _GEMM_MADD + pixels * cin * 9 * _IM2COL
           + 4 * cout * cin * 9 * _GEMM_WEIGHT_BYTE + _GEMM_CALL}
    cin_p, cout_p = _round_up(cin, _W), _round_up(cout, _NW)
    for m in (2, 4):
        p = (m + 2) ** 2
        tw, trows = math.ceil(ow / m), n * math.ceil(oh / m)
        ubytes = 4 * p * cin_p * cout_p
        budget = _VBYTES_BIG if ubytes > _BIG_U else _VBYTES
        rows_per_block = min(trows, max(1, budget // (4 * p * tw * cin_p)))
        blocks = math.ceil(trows / rows_per_block)
        slots = _round_up(rows_per_block * tw, _SLOT_QUANTUM)
        out[f"F{m}"] = (p * blocks * slots * cin_p * cout_p * _WINO_MADD
                        + trows * tw * p * (cin_p + cout_p) * _TRANSFORM
                        + ubytes * _U_BYTE + ubytes * (blocks - 1) * (_U_REREAD_BYTE if ubytes <= _LLC_BYTES else _U_BYTE)
                        + _WINO_CALL)
    return out
