"""The op registry: one declaration per op, read by every stage.

An :class:`OpDef` holds everything target-independent about an op: its
inputs, outputs and attributes, its shape and dtype inference, its NumPy
reference implementation and its traits.  Shape inference, the IR verifier,
the reference interpreter and the constant folder read it; none re-derives it.

Input and output names carry a suffix: ``"B?"`` is optional, ``"inputs*"`` is
variadic (last position only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil.errors import ShapeError
from cuvil.ir.assumptions import BROADCAST, BROADCAST_TO, EQUAL, Assumption, decide, refutation
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.symbolic import Dim, is_unknown
from cuvil.ir.types import SymbolInfo, TensorType

ATTR_KINDS = ("int", "float", "str", "ints", "floats", "strs", "tensor", "graph", "dtype")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class AttrSpec:
    """An attribute's kind (one of ``ATTR_KINDS``) and default (``REQUIRED`` if none).

    A default of ``None`` makes the attribute optional with no value."""

    kind: str
    default: Any = REQUIRED

    def __post_init__(self) -> None:
        if self.kind not in ATTR_KINDS:
            raise ValueError(f"unknown attribute kind {self.kind!r}")


# Traits --------------------------------------------------------------------
ELEMENTWISE = "elementwise"  # output[i] depends on input[i] only (after broadcasting)
COMMUTATIVE = "commutative"
SHAPE_ONLY = "shape_only"  # output depends on input shapes, not values
CONTROL_FLOW = "control_flow"  # has regions; the interpreter runs it itself
NONDETERMINISTIC = "nondeterministic"  # never constant-folded
# Takes the low-bit storage types (cuvil/ir/dtypes.py LOWBIT) as inputs or outputs; inference refuses them
# for every op without this trait (cuvil/ops/common.py), so an op computes on them only when it says it does.
STORAGE_TYPES = "storage_types"
# Never constant-folded: its constant operands mean more than its result (dequantize_linear keeps
# quantized weights quantized, for the integer kernels of the fold-qdq pass).
KEEP_OPERANDS = "keep_operands"


@dataclass
class InferCtx:
    """What an op's inference sees: input types, constant input values, attributes."""

    op: str
    types: list[TensorType | None]
    consts: list[np.ndarray | None]
    attrs: dict[str, Any]
    num_outputs: int
    symbols: Mapping[str, SymbolInfo] = field(default_factory=dict)
    sym_values: list[tuple[Dim, ...] | None] = field(default_factory=list)
    # Relations between dims this node needs that only run time can settle (cuvil/ir/assumptions.py).
    assumptions: list[Assumption] = field(default_factory=list)

    def type(self, i: int) -> TensorType:
        t = self.types[i] if i < len(self.types) else None
        if t is None:
            raise ShapeError(f"{self.op}: input {i} is required")
        return t

    def has(self, i: int) -> bool:
        return i < len(self.types) and self.types[i] is not None

    def const(self, i: int) -> np.ndarray | None:
        """The value of input ``i`` when it is known at compile time."""
        return self.consts[i] if i < len(self.consts) else None

    def sym_value(self, i: int) -> tuple[Dim, ...] | None:
        """The contents of integer input ``i`` as dims (ints or symbolic), when known.

        A constant gives its ints; a size computed from shapes (``shape(x)[0] * 2``)
        gives its symbolic value. Only 0-D and 1-D integer tensors carry one."""
        c = self.const(i)
        if c is not None:
            if c.dtype.kind in "iu" and c.ndim <= 1:
                return tuple(int(x) for x in c.reshape(-1))
            return None
        return self.sym_values[i] if i < len(self.sym_values) else None

    def fail(self, message: str) -> ShapeError:
        return ShapeError(f"{self.op}: {message}")

    def require_dtype(self, i: int, allowed: frozenset[DType] | set[DType]) -> DType:
        dt = self.type(i).dtype
        if dt not in allowed:
            names = ", ".join(sorted(str(d) for d in allowed))
            raise self.fail(f"input {i} has element type {dt}, expected one of {names}")
        return dt

    def _assume(self, kind: str, a: Dim, b: Dim, what: str) -> None:
        verdict = decide(kind, a, b, self.symbols)
        if verdict is False:
            raise self.fail(refutation(kind, what, a, b, self.symbols))
        if verdict is None and not (is_unknown(a) or is_unknown(b)):  # data-dependent dims: the kernels check
            self.assumptions.append(Assumption(kind, a, b, what, self.op))

    def assume_equal(self, a: Dim, b: Dim, what: str) -> None:
        """This node needs ``a == b``: proven, refuted (a ShapeError), or recorded as a run-time check.

        ``what`` is a plural noun phrase ("inner dims"): messages read "<what> differ"."""
        self._assume(EQUAL, a, b, what)

    def assume_broadcast(self, a: Dim, b: Dim, what: str) -> None:
        """This node needs ``a`` and ``b`` to broadcast (equal, or one of them 1)."""
        self._assume(BROADCAST, a, b, what)

    def assume_broadcast_to(self, a: Dim, b: Dim, what: str) -> None:
        """This node needs ``a`` to stretch to ``b`` (equal, or ``a`` is 1)."""
        self._assume(BROADCAST_TO, a, b, what)

    def same_dtype(self, *indices: int) -> DType:
        present = [i for i in indices if self.has(i)]
        dts = {self.type(i).dtype for i in present}
        if len(dts) != 1:
            raise self.fail(f"inputs {present} must share one element type, got {sorted(map(str, dts))}")
        return dts.pop()


@dataclass
class RefCtx:
    """What an op's reference implementation sees."""

    op: str
    inputs: list[np.ndarray | None]
    attrs: dict[str, Any]
    out_types: list[TensorType]
    run_region: Callable[[Graph, Sequence[np.ndarray | None]], list[np.ndarray]] | None = None

    def input(self, i: int) -> np.ndarray:
        v = self.inputs[i] if i < len(self.inputs) else None
        if v is None:
            raise ShapeError(f"{self.op}: input {i} is required")
        return v

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def out_dtype(self, i: int = 0) -> np.dtype:
        return self.out_types[i].dtype.np


InferFn = Callable[[InferCtx], Sequence[TensorType]]
RefFn = Callable[[RefCtx], Sequence[np.ndarray]]


@dataclass(frozen=True, kw_only=True)
class OpDef:
    """Everything target-independent that Cuvil knows about one operator."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...] = ("Y",)
    attrs: Mapping[str, AttrSpec] = field(default_factory=dict)
    infer: InferFn
    reference: RefFn | None
    scalar: Callable[..., Any] | None = None
    # For ops that compute sizes: the output contents as dims from the inputs' (``ctx.sym_value``)
    sym_eval: Callable[[InferCtx], Sequence[tuple[Dim, ...] | None]] | None = None
    traits: frozenset[str] = frozenset()
    tolerance: float = 1e-5
    doc: str = ""

    @property
    def variadic_inputs(self) -> bool:
        return bool(self.inputs) and self.inputs[-1].endswith("*")

    @property
    def variadic_outputs(self) -> bool:
        return bool(self.outputs) and self.outputs[-1].endswith("*")

    def input_arity(self) -> tuple[int, int | None]:
        """Smallest and largest number of inputs (``None`` for no limit)."""
        required = sum(1 for n in self.inputs if not n.endswith(("?", "*")))
        return required, None if self.variadic_inputs else len(self.inputs)

    def output_arity(self) -> tuple[int, int | None]:
        required = sum(1 for n in self.outputs if not n.endswith(("?", "*")))
        return required, None if self.variadic_outputs else len(self.outputs)

    def fill_attrs(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        """The attributes with defaults filled in; unknown or missing ones raise."""
        unknown = sorted(set(attrs) - set(self.attrs))
        if unknown:
            raise ShapeError(f"{self.name}: unknown attribute(s) {', '.join(unknown)}")
        out: dict[str, Any] = {}
        for k, spec in self.attrs.items():
            if k in attrs:
                out[k] = attrs[k]
            elif spec.default is REQUIRED:
                raise ShapeError(f"{self.name}: attribute {k!r} is required")
            else:
                out[k] = spec.default
        return out


_REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef, *, replace: bool = False) -> OpDef:
    """Add an op to the registry."""
    if opdef.name in _REGISTRY and not replace:
        raise ValueError(f"op {opdef.name!r} is already registered")
    _REGISTRY[opdef.name] = opdef
    return opdef


def op(name: str, **kwargs: Any) -> Callable[[InferFn], InferFn]:
    """Decorator form: ``@op("relu", inputs=("X",), reference=...)`` on the infer function."""

    def wrap(infer: InferFn) -> InferFn:
        register(OpDef(name=name, infer=infer, **kwargs))
        return infer

    return wrap


def get(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no op named {name!r} is registered") from None


def lookup(name: str) -> OpDef | None:
    return _REGISTRY.get(name)


def all_ops() -> dict[str, OpDef]:
    return dict(_REGISTRY)


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)
