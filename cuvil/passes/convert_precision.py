"""Reduced precision: ``convert-precision`` turns a float32 graph into one that stores and computes in
float16 or bfloat16, keeping float32 where precision matters.

Overrides (``precision_overrides=`` of ``cuvil.compile``, the ``overrides`` option in pipeline text)
map an op name or ``node:NAME`` to ``f32`` (keep that op or node in float32) or to the pass's own
reduced type (run it reduced although it is sensitive by default).  A node's own entry wins over
its op's.  In pipeline text the entries are joined with ``;``:
``convert-precision{dtype=f16,overrides="softmax=f16;node:encoder.0.attn=f32"}``.

Mask fills: PyTorch-exported transformers fill masked positions with the float32 minimum
(``where(mask, scores, -3.4e38)``, ``scores + (1 - mask) * -3.4e38`` before a softmax).  Such a
constant (:func:`mask_fills`) becomes the reduced type's extreme of the same sign (-65504 in f16), as
onnxruntime's float16 converter clamps: the softmax that reads it, in float32, gives the masked
positions the same zero weight.  The clamp is logged (and noted in the compiled model's
``info.notes``); every other constant or computed value beyond the reduced type's range is refused
(:class:`PrecisionOverflowError`).

Why the finite extreme and never -inf.  -inf would be exact only where no softmax row is masked
everywhere, and neither idiom allows it in general: ``scores + (1 - mask) * fill`` multiplies the
fill by 0 at every kept position, and ``0 * -inf`` is NaN; ``where(mask, scores, fill)`` and
``scores + fill`` give NaN in a row whose every position is masked (``-inf - (-inf)`` in the
softmax), where the float32 model gives that row uniform weights.  Whether a row is fully masked
depends on the mask's values at run time, which the graph cannot prove, so the finite extreme,
which matches float32 in both cases (``exp(-65504 - max)`` is 0 in float32), is used everywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cuvil.errors import CuvilError, ShapeError
from cuvil.ir.dtypes import DType, max_finite
from cuvil.ir.graph import Graph, Node, Value, captures
from cuvil.ir.types import TensorType
from cuvil.ops.common import const_of, infer_types
from cuvil.ops.registry import SHAPE_ONLY, lookup
from cuvil.options import PRECISION_ALIASES as ALIASES
from cuvil.passes.base import Pass, PassError, PassResult, register_pass
from cuvil.passes.rewrite import resolve_inputs, resolve_outputs

REDUCED = (DType.f16, DType.bf16)
_log = logging.getLogger(__name__)

# Ops that run in float32 by default: a softmax, a normalisation's statistics, a sum over many terms, or
# an op whose result leaves float16's range for ordinary inputs (exp(12) > 65504, 1/x near 0, log near 0).
SENSITIVE = frozenset({
    "softmax", "log_softmax",
    "layer_norm", "batch_norm", "instance_norm", "group_norm", "lp_normalization",
    "reduce_sum", "reduce_mean", "reduce_prod", "reduce_l1", "reduce_l2", "reduce_sum_square",
    "reduce_log_sum", "reduce_log_sum_exp", "cumsum", "global_average_pool", "average_pool",
    "exp", "log", "pow", "softplus", "reciprocal",
    "range",  # a generated sequence of positions: rounding it would shift them
})
# Inputs that are parameters of the op in float32 whatever the data's type (resize's roi and scales).
_FIXED_INPUTS: Mapping[str, frozenset[int]] = {"resize": frozenset({1, 2})}


class PrecisionOverflowError(CuvilError):
    """A value (a weight, or an activation on sample inputs) does not fit the reduced type."""


# ---- the mask-fill idiom -------------------------------------------------------------------------------------
# Ops a fill value passes through unchanged on its way to the softmax (layout and type only).
_CARRY = frozenset({"reshape", "unsqueeze", "squeeze", "expand", "transpose", "flatten", "identity", "cast"})
_SOFTMAX = frozenset({"softmax", "log_softmax"})


@dataclass(frozen=True)
class MaskFills:
    """The mask-fill constants of a float32 graph for one reduced type (value name -> how it is used), and
    the values they make hold the fill (from the constant's reader up to the softmax): those hold the
    reduced type's extreme in the converted graph where the float32 graph holds the float32 one."""

    constants: Mapping[str, str]
    carriers: frozenset[str]


def _beyond(a: np.ndarray, low: DType) -> bool:
    """Whether ``a`` holds a finite value the reduced type cannot hold, every such value a fill at or beyond
    its extreme (``|v| >= max_finite``)."""
    if not np.issubdtype(a.dtype, np.floating) or a.size == 0:
        return False
    with np.errstate(over="ignore"):
        r = a.astype(low.np)
    return bool(np.any(np.isinf(r) & np.isfinite(a)))


def _fill_use(c: Value, u: Node, to_softmax: Callable[[Value, bool, list[str]], list[str] | None],
              ) -> tuple[str, list[str]] | None:
    """How ``u`` uses the constant ``c`` as a mask fill and the values that carry it, or None."""
    if not u.outputs:
        return None
    out = u.outputs[0]
    if u.op == "where" and c in u.inputs[1:] and u.inputs[0] is not c:
        return f"the fill of where {u.name!r}", to_softmax(out, False, [out.name]) or [out.name]
    if u.op in ("add", "sub"):
        path = to_softmax(out, False, [out.name])
        return None if path is None else (f"added by {u.name!r} ({u.op}) to a softmax's scores", path)
    if u.op == "mul":
        path = to_softmax(out, True, [out.name])
        return None if path is None else (f"multiplied with a mask by {u.name!r}, then added before a softmax", path)
    return None


def mask_fills(graph: Graph, low: DType) -> MaskFills:
    """The float32 constants of ``graph``'s top level beyond ``low``'s range that are mask fills: a branch of
    ``where``, or an operand of ``add``/``sub`` whose result reaches a softmax (through layout ops), or an
    operand of ``mul`` whose product is then added (``add``/``sub``) and reaches a softmax.  A constant that
    scales data (a ``mul`` not followed by the add, a result that no softmax reads) is no fill."""
    users = graph.users()

    def to_softmax(v: Value, need_add: bool, path: list[str], depth: int = 0) -> list[str] | None:
        """The values from ``v`` to a softmax's input along carries and adds (every such path: a mask
        shared by the layers of a transformer reaches each layer's softmax), or None."""
        if depth > 8:
            return None
        found: list[str] | None = None
        for u in users.get(v, []):
            if u.op in _SOFTMAX and not need_add and u.inputs and u.inputs[0] is v:
                found = [*(found or []), *path]
                continue
            step_add = u.op in ("add", "sub")
            if u.op in _CARRY or step_add or (u.op == "where" and v in u.inputs[1:]):
                if need_add and not step_add and u.op not in _CARRY:
                    continue
                for o in u.outputs[:1]:
                    got = to_softmax(o, need_add and not step_add, [*path, o.name], depth + 1)
                    if got is not None:
                        found = [*(found or []), *got]
        return None if found is None else list(dict.fromkeys(found))

    constants: dict[str, str] = {}
    carriers: set[str] = set()
    for node in graph.nodes:
        if node.op != "constant" or not node.outputs:
            continue
        c = node.outputs[0]
        value = const_of(c)
        if value is None or c.type.dtype is not DType.f32 or not _beyond(np.asarray(value), low):
            continue
        uses = [_fill_use(c, u, to_softmax) for u in users.get(c, [])]
        if uses and all(use is not None for use in uses):  # one use that is no fill: the constant is data
            constants[c.name] = "; ".join(how for how, _ in filter(None, uses))
            for _, path in filter(None, uses):
                carriers.update(path)
    return MaskFills(constants, frozenset(carriers))


def parse_overrides(text: str | Mapping[str, str]) -> dict[str, str]:
    """``{"softmax": "f16", "node:attn": "f32"}`` from a mapping or ``"softmax=f16;node:attn=f32"``,
    precisions normalised to f32/f16/bf16."""
    items: list[tuple[str, str]]
    if isinstance(text, str):
        items = []
        for part in (p.strip() for p in text.split(";")):
            if not part:
                continue
            key, eq, value = part.rpartition("=")
            if not eq or not key.strip():
                raise PassError(f"convert-precision: override {part!r} is not KEY=PRECISION")
            items.append((key.strip(), value.strip()))
    else:
        items = [(str(k), str(v)) for k, v in text.items()]
    out: dict[str, str] = {}
    for key, value in items:
        p = ALIASES.get(value.lower())
        if p is None:
            raise PassError(f"convert-precision: override {key!r} asks for precision {value!r}; "
                            "write fp32, fp16 or bf16")
        if not key.startswith("node:") and lookup(key) is None:
            raise PassError(f"convert-precision: override {key!r} names no op (a node is written node:NAME)")
        out[key] = p
    return out


def format_overrides(overrides: Mapping[str, str]) -> str:
    return ";".join(f"{k}={v}" for k, v in overrides.items())


@register_pass
@dataclass(frozen=True)
class ConvertPrecision(Pass):
    """Converts float32 computation to ``dtype`` (f16 or bf16), keeping float32 where it matters.

    1. Each node of the top graph runs either reduced or in float32.  Float32 are: the ops of
       ``SENSITIVE`` (softmax, log_softmax, normalisations, summing reductions, average pools,
       exp/log/pow/softplus/reciprocal, range), nodes with regions (if, loop, fused ops), and what
       the overrides say; a node's override wins over its op's.  Every other node runs reduced.
    2. A reduced node reads the reduced version of each float32 value it takes, and its outputs
       are re-inferred from the op's declaration (gemm, matmul and conv then take reduced inputs;
       their kernels and references accumulate in float32).  A float32 node reads float32
       versions.  Shape-only ops and ``cast`` read a value as it is, and resize's roi and scales
       stay float32.
    3. A version of a value in another type is a ``cast`` node placed before its first reader and
       shared by every reader.  A cast back to the type a value was cast from gives the original
       (casts cancel between adjacent converted ops).  A float32 weight read reduced becomes a
       new constant holding the rounded values; a weight whose finite values leave the reduced
       type's range is an error naming it.
    4. Values keep their names (a reduced node's output keeps the float32 value's name), so the
       float32 graph and the converted one can be compared value by value.  Graph inputs keep
       their types; an output computed reduced is cast back to its declared type, the cast
       taking the output's name and the reduced value ``NAME.<dtype>``.
    5. float64 and non-float values are left as they are; regions are not entered.
    6. A mask fill (:func:`mask_fills`) beyond the reduced type's range becomes that type's finite extreme
       of the same sign, never an infinity (the module docstring says why).
    """

    name: ClassVar[str] = "convert-precision"
    dtype: str = "f16"
    overrides: str = ""

    def __post_init__(self) -> None:
        if ALIASES.get(self.dtype.lower()) not in ("f16", "bf16"):
            raise ValueError(f"dtype must be f16 or bf16, got {self.dtype!r}")
        parse_overrides(self.overrides)

    @property
    def low(self) -> DType:
        return DType(ALIASES[self.dtype.lower()])

    def run(self, graph: Graph) -> PassResult:
        low = self.low
        overrides = parse_overrides(self.overrides)
        for key, p in overrides.items():
            if p not in ("f32", low.value):
                raise PassError(f"convert-precision: override {key!r} asks for {p}, but the graph is converted "
                                f"to {low}; an override is f32 or {low}")
        names = {n.name for n in graph.nodes}
        missing = [k for k in overrides if k.startswith("node:") and k[5:] not in names]
        if missing:
            raise PassError(f"convert-precision: overrides name nodes the graph does not have: {', '.join(missing)}")
        return PassResult(graph, _Converter(graph, low, overrides).run())


class _Converter:
    def __init__(self, graph: Graph, low: DType, overrides: Mapping[str, str]) -> None:
        self.g, self.low, self.overrides = graph, low, overrides
        self.nodes: list[Node] = []
        self.versions: dict[tuple[Value, DType], Value] = {}
        self.cast_from: dict[Value, Value] = {}  # a cast's output -> the value it was cast from
        self.lowered: set[Value] = set()  # float32 values of the model this pass made reduced
        self.taken = {v.name for v in graph.inputs} | {o.name for n in graph.walk() for o in n.outputs}
        self.changed = False
        self.fills = mask_fills(graph, low)

    def reduced(self, node: Node) -> bool:
        if any(True for _ in node.regions()):
            return False
        choice = self.overrides.get(f"node:{node.name}") or self.overrides.get(node.op)
        if choice is not None:
            return choice != "f32"
        return node.op not in SENSITIVE

    def fresh(self, hint: str) -> str:
        name, i = hint, 1
        while name in self.taken:
            name, i = f"{hint}.{i}", i + 1
        self.taken.add(name)
        return name

    def version(self, v: Value, dt: DType, reader: Node) -> Value:
        """``v`` in type ``dt``: ``v`` itself, the value a cast made it from, or a new cast or constant."""
        if v.type.dtype is dt:
            return v
        src = self.cast_from.get(v)
        if src is not None and src.type.dtype is dt:
            return src
        key = (v, dt)
        if key in self.versions:
            return self.versions[key]
        const = const_of(v)
        if const is not None and dt is self.low:
            out = Value(self.fresh(f"{v.name}.{dt}"), TensorType(dt, v.type.shape))
            self.nodes.append(Node("constant", [], [out], {"value": self._round(const, v, reader)}, out.name))
        else:
            out = Value(self.fresh(f"{v.name}.{dt}"), TensorType(dt, v.type.shape))
            self.nodes.append(Node("cast", [v], [out], {"to": dt}, out.name))
            self.cast_from[out] = v
        self.versions[key] = out
        self.changed = True
        return out

    def _round(self, a: np.ndarray, v: Value, reader: Node) -> np.ndarray:
        with np.errstate(over="ignore"):
            r = a.astype(self.low.np)
        bad = np.isinf(r) & np.isfinite(a)
        fill = self.fills.constants.get(v.name)
        if np.any(bad) and fill is not None:  # the mask idiom: the reduced type's extreme masks as well
            top = max_finite(self.low)
            r = np.where(bad, np.copysign(top, a), r).astype(self.low.np)
            _log.info("convert-precision: constant %r (%s) holds %.6g, beyond %s's range; it is a mask fill, "
                      "set to %s's finite extreme %.6g of the same sign (not -inf: 0 * -inf and a fully masked "
                      "row would give NaN)", v.name, fill, float(np.max(np.abs(a[bad]))), self.low, self.low, top)
            return r
        if np.any(bad):
            raise PrecisionOverflowError(
                f"weight {v.name!r} (read by node {reader.name!r}, {reader.op}) holds {float(np.max(np.abs(a[bad]))):.6g}, "
                f"beyond {self.low}'s largest finite value {max_finite(self.low):.6g}; keep that node in float32 with "
                f"precision_overrides={{'node:{reader.name}': 'fp32'}}")
        return r

    def run(self) -> bool:
        for node in self.g.nodes:
            if node.op == "constant":
                self.nodes.append(node)
                continue
            if self.reduced(node):
                self._convert(node)
            else:
                self._keep_f32(node)
            self.nodes.append(node)
        self._outputs()
        self.g.nodes = self.nodes
        return self.changed

    def _convert(self, node: Node) -> None:
        opdef = lookup(node.op)
        as_is = node.op == "cast" or (opdef is not None and SHAPE_ONLY in opdef.traits)
        fixed = _FIXED_INPUTS.get(node.op, frozenset())
        touched = False
        for i, v in enumerate(node.inputs):
            if v is None or as_is or i in fixed:
                continue
            if v.type.dtype is DType.f32:
                node.inputs[i] = self.version(v, self.low, node)
                touched = True
            touched |= self._was_f32(v)
        if not touched:
            return
        try:
            types, _ = infer_types(node.op, node.inputs, node.attrs, len(node.outputs), self.g.symbols)
        except ShapeError as exc:
            raise PassError(f"convert-precision: node {node.name!r} ({node.op}) cannot run in {self.low}: {exc}; "
                            f"keep it in float32 with an override ({node.op}=fp32 or node:{node.name}=fp32)") from None
        for o, t in zip(node.outputs, types):
            if o.type.dtype is DType.f32 and t.dtype is self.low:
                self.lowered.add(o)
            o.type = t
        self.changed = True

    def _keep_f32(self, node: Node) -> None:
        for i, v in enumerate(node.inputs):
            if v is not None and v.type.dtype is self.low and self._was_f32(v):
                node.inputs[i] = self.version(v, DType.f32, node)
        subst = {c: self.version(c, DType.f32, node) for c in captures(node)
                 if c.type.dtype is self.low and self._was_f32(c)}
        if subst:
            for _, region in node.regions():
                for inner in region.walk():
                    resolve_inputs(inner, subst)
                resolve_outputs(region, subst)
                for inner in region.walk():
                    for _, r in inner.regions():
                        resolve_outputs(r, subst)

    def _was_f32(self, v: Value) -> bool:
        """Whether ``v`` became reduced here (a value of the reduced type in the model itself stays)."""
        return v in self.lowered or (v in self.cast_from and v.type.dtype is self.low)

    def _outputs(self) -> None:
        for i, o in enumerate(self.g.outputs):
            if o.type.dtype is self.low and self._was_f32(o):
                name = o.name
                self.taken.discard(name)
                o.name = self.fresh(f"{name}.{self.low}")
                up = Value(name, TensorType(DType.f32, o.type.shape))
                self.nodes.append(Node("cast", [o], [up], {"to": DType.f32}, name))
                self.g.outputs[i] = up
                self.taken.add(name)
