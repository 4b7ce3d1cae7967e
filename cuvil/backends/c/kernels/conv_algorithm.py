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
4. The cost model picks the cheapest estimate of: im2col + GEMM, F(2x2,3x3) and F(4x4,3x3).
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
    best = min(costs, key=lambda c: costs[c])
    detail = ", ".join(f"{c} {t:.3g}" for c, t in costs.items())
    if alg == "winograd":
        m = min((2, 4), key=lambda t: costs[f"F{t}"])
        return Winograd(m, f"{asked}; cost model: {detail}")
    if best == "im2col":
        return Gemm(f"cost model: {detail}")
    return Winograd(int(best[1:]), f"cost model: {detail}")


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
# Seconds per unit, fitted to single-layer timings on one AVX-512 core (docs/conv-algorithms.md): a
# multiply-add in the packed GEMM and in the Winograd products, one element of the input / output
# transforms per transform point, a byte of weights streamed from beyond L2, one im2col element.
_GEMM_MADD = 1.0 / 90e9
_WINO_MADD = 1.0 / 60e9
_TRANSFORM = 1.0 / 1e9
_WEIGHT_BYTE = 1.0 / 12e9
_IM2COL = 1.0 / 4e9
_L2_BYTES = 1 << 20
_NR = 32


def estimate(shape: ConvShape) -> dict[str, float]:
    """Estimated seconds of im2col + GEMM, F(2x2,3x3) and F(4x4,3x3) for one eligible node.

    Dims known only at run time count as typical: batch 1, 64 channels, 56x56 outputs."""
    n = shape.batch or 1
    cin, cout = shape.cin or 64, shape.cout or 64
    oh, ow = shape.out_h or 56, shape.out_w or 56
    pixels = n * oh * ow
    wbytes = 4 * cout * cin * 9
    out = {"im2col": pixels * cout * cin * 9 * _GEMM_MADD + pixels * cin * 9 * _IM2COL
           + (wbytes * _WEIGHT_BYTE if wbytes > _L2_BYTES else 0.0)}
    for m in (2, 4):
        p = (m + 2) ** 2
        tiles = n * math.ceil(oh / m) * math.ceil(ow / m)
        nb = min(max(_NR, (128 << 10) // (4 * cin) // _NR * _NR), 4 * _NR)
        nb = min(nb, math.ceil(tiles / _NR) * _NR)
        blocks = math.ceil(tiles / nb)
        madds = p * math.ceil(cout / 8) * 8 * cin * blocks * nb
        ubytes = 4 * p * cout * cin
        stream = ubytes * blocks if ubytes > _L2_BYTES else ubytes
        transforms = (cin + cout) * blocks * nb * p
        out[f"F{m}"] = madds * _WINO_MADD + stream * _WEIGHT_BYTE + transforms * _TRANSFORM
    return out
