"""Custom operators: ``cuvil.register_op`` and the checks it runs before accepting a declaration.

A registered op becomes an ordinary :class:`~cuvil.ops.registry.OpDef` (so
shape inference, the verifier and the reference interpreter see it like any
other op) plus, when it has ``c_source``, a C kernel
(cuvil/backends/c/kernels/custom.py) that the C and wasm32 targets compile.

Names are ``namespace::name``: torch's ``torch.library.custom_op("mylib::scale_add")``
and an ONNX node of op type ``scale_add`` in domain ``mylib`` both map to the
op registered as ``"mylib::scale_add"``.

Registration runs the declaration before trusting it, and refuses it with a
:class:`CustomOpError` naming the first mismatch (``kind`` says which check):

1. ``declaration``: names, ranks, dtypes, attributes; the reference, shape,
   dtype and backward functions accept the declared arguments;
2. ``shape`` / ``dtype``: on each sample, the shape and dtype functions agree
   with what the reference returns; the shape function also works on
   symbolic dims, so a model with dynamic shapes can use the op;
3. ``backward``: it returns one gradient per forward input, of that input's
   shape and dtype;
4. ``c_kernel``: the C source compiles, and a model built around the op
   (through the C backend, exactly as a user's model) agrees with the
   reference on every sample within ``tolerance``.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil.errors import CuvilError, ShapeError
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim, DimExpr, format_dim, sym
from cuvil.ir.types import TensorType
from cuvil.ops import registry
from cuvil.ops.registry import REQUIRED, AttrSpec, InferCtx, OpDef, RefCtx

log = logging.getLogger("cuvil.custom")

_NAMESPACE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Namespaces whose ops belong to a front end's standard op set or to Cuvil itself.
RESERVED_NAMESPACES = frozenset({"ai.onnx", "ai.onnx.ml", "aten", "prim", "prims", "cuvil"})
MAX_RANK = 8


class CustomOpError(CuvilError):
    """A custom op's declaration, reference, C kernel or backward disagree; ``kind`` names the check."""

    def __init__(self, op: str, kind: str, message: str) -> None:
        self.op, self.kind = op, kind
        super().__init__(f"register_op({op!r}): {kind} mismatch: {message}")


@dataclass(frozen=True)
class Arg:
    """One tensor input or output: its name, rank (None: any) and allowed element types."""

    name: str
    rank: int | None = None
    dtypes: Sequence[DType | str] = ("f32",)

    def allowed(self) -> tuple[DType, ...]:
        return tuple(d if isinstance(d, DType) else DType.parse(str(d)) for d in self.dtypes)


@dataclass(frozen=True)
class OpSchema:
    """What a custom op takes and gives.

    ``shape(*input_shapes, **attrs)`` returns one shape per output; shapes are tuples of
    dims (ints, or symbolic dims: use ``+ - * //``, never ``int()`` or comparisons).
    ``dtype(*input_dtypes, **attrs)`` returns one DType per output; without it each output
    must declare exactly one dtype.  ``attrs`` maps attribute names to defaults (an int
    or float), or to the type ``int`` / ``float`` for a required one."""

    inputs: Sequence[Arg]
    outputs: Sequence[Arg]
    shape: Callable[..., Sequence[Sequence[Dim]]]
    dtype: Callable[..., Sequence[DType | str]] | None = None
    attrs: Mapping[str, int | float | type] = field(default_factory=dict)
    backward_inputs: Sequence[str] | None = None  # default: the forward inputs, then grad_<output> per output

    def attr_kinds(self) -> dict[str, tuple[str, Any]]:
        """Attribute name -> (kind, default or REQUIRED)."""
        out: dict[str, tuple[str, Any]] = {}
        for k, v in self.attrs.items():
            if v is int or v is float:
                out[k] = (v.__name__, REQUIRED)
            elif isinstance(v, bool) or not isinstance(v, int | float):
                raise TypeError(f"attribute {k!r}: give an int or float default, or the type int / float, not {v!r}")
            else:
                out[k] = ("int" if isinstance(v, int) else "float", v)
        return out

    def grad_inputs(self) -> list[str]:
        if self.backward_inputs is not None:
            return list(self.backward_inputs)
        return [a.name for a in self.inputs] + [f"grad_{o.name}" for o in self.outputs]


Sample = Sequence[np.ndarray] | Mapping[str, Any]


@dataclass
class CustomOp:
    """A registered custom op. Use it as a context manager to unregister it on exit."""

    name: str
    schema: OpSchema
    reference: Callable[..., Any]
    c_source: str | None
    c_function: str | None
    backward: Callable[..., Any] | None
    tolerance: float
    opdef: OpDef
    samples: tuple[Sample, ...] | None = None  # as given to register_op, so check_op re-runs on the same inputs

    def unregister(self) -> None:
        unregister_op(self.name)

    def __enter__(self) -> CustomOp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unregister()


_CUSTOM: dict[str, CustomOp] = {}


def custom_op(name: str) -> CustomOp | None:
    """The registered custom op of that name, if any."""
    return _CUSTOM.get(name)


def custom_ops() -> dict[str, CustomOp]:
    return dict(_CUSTOM)


def unregister_op(name: str) -> None:
    """Remove a custom op (its OpDef and C kernel); built-in ops cannot be removed."""
    if _CUSTOM.pop(name, None) is None:
        return
    registry.unregister(name)
    from cuvil.backends.c.kernels.custom import unregister_custom_kernel

    unregister_custom_kernel(name)


def register_op(
    name: str,
    *,
    schema: OpSchema,
    reference: Callable[..., Any],
    c_source: str | None = None,
    backward: Callable[..., Any] | None = None,
    c_function: str | None = None,
    samples: Sequence[Sample] | None = None,
    tolerance: float = 1e-5,
    cc: str | None = None,
    replace: bool = False,
) -> CustomOp:
    """Declare a custom op ``namespace::name``, check the declaration, and add it to the op registry.

    ``reference(*inputs, **attrs)`` is the NumPy implementation (one array, or a tuple
    for several outputs).  ``c_source`` defines the C function ``c_function`` (default:
    the name with ``::`` and ``.`` turned into ``_``) with the calling convention of
    cuvil/backends/c/kernels/custom.py.  ``backward(*grad_inputs, **attrs)`` returns one
    gradient per forward input; its parameters are named ``schema.grad_inputs()``.
    ``samples`` are inputs (arrays in input order, or a dict of inputs and attributes)
    to check on; by default Cuvil makes random ones from the schema.  ``cc`` is the C
    compiler command for the kernel check.  Raises :class:`CustomOpError`."""
    old = _check_name(name, replace)
    kinds = _check_declaration(name, schema)
    in_names = [a.name for a in schema.inputs]
    _check_call(name, "reference", reference, in_names, kinds)
    _check_call(name, "shape function", schema.shape, in_names, kinds)
    if schema.dtype is not None:
        _check_call(name, "dtype function", schema.dtype, in_names, kinds)
    if backward is not None:
        _check_backward_signature(name, schema, backward, kinds)
    function = _check_function(name, c_function, c_source, replace)
    cases = _cases(name, schema, kinds, reference, samples)
    _check_symbolic(name, schema, kinds)
    if backward is not None:
        for arrays, attrs, outs in cases:
            _check_backward(name, schema, backward, arrays, attrs, outs)
    op = CustomOp(name, schema, reference, c_source, function if c_source is not None else None, backward, tolerance,
                  _opdef(name, schema, reference, kinds, tolerance), tuple(samples) if samples is not None else None)
    if old is not None:
        _uninstall(name)
    _install(op)
    try:
        if c_source is not None:
            _check_c_kernel(op, cases, cc)
    except BaseException:
        _uninstall(name)
        if old is not None:
            _install(old)
        raise
    log.info("registered custom op %s (%d inputs, %d outputs, C kernel: %s, backward: %s)", name,
             len(schema.inputs), len(schema.outputs), op.c_function or "none", "yes" if backward else "no")
    return op


def check_op(name: str, *, cc: str | None = None) -> None:
    """Run registration checks 2 to 4 again on the registered op ``name`` as it is installed now.

    Uses the samples it was registered with (or the same generated ones) and the C kernel the C
    backend's kernel table holds for it now; raises :class:`CustomOpError` as ``register_op`` does.
    The verification suite's ``custom-ops`` check calls it, so a kernel replaced or broken after
    registration is caught before deployment."""
    op = _CUSTOM.get(name)
    if op is None:
        raise _fail(name, "declaration", "not a registered custom op")
    kinds = op.schema.attr_kinds()
    cases = _cases(name, op.schema, kinds, op.reference, op.samples)
    _check_symbolic(name, op.schema, kinds)
    if op.backward is not None:
        _check_backward_signature(name, op.schema, op.backward, kinds)
        for arrays, attrs, outs in cases:
            _check_backward(name, op.schema, op.backward, arrays, attrs, outs)
    if op.c_source is not None:
        _check_c_kernel(op, cases, cc)


def _install(op: CustomOp) -> None:
    registry.register(op.opdef)
    _CUSTOM[op.name] = op
    if op.c_source is not None and op.c_function is not None:
        from cuvil.backends.c.kernels.custom import CustomKernel, register_custom_kernel

        kinds = op.schema.attr_kinds()
        register_custom_kernel(CustomKernel(op.name, op.c_function, op.c_source, tuple((k, v[0]) for k, v in kinds.items())))


def _uninstall(name: str) -> None:
    _CUSTOM.pop(name, None)
    registry.unregister(name)
    from cuvil.backends.c.kernels.custom import unregister_custom_kernel

    unregister_custom_kernel(name)


# declaration ------------------------------------------------------------------------------------
def _fail(op: str, kind: str, message: str) -> CustomOpError:
    return CustomOpError(op, kind, message)


class _MismatchError(Exception):
    """The shape or dtype function disagrees with the declaration (``kind``: "shape" or "dtype")."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


def _check_name(name: str, replace: bool) -> CustomOp | None:
    ns, sep, short = name.partition("::")
    if not sep or not _NAMESPACE.match(ns) or not _IDENT.match(short):
        raise _fail(name, "declaration", "a custom op is named 'namespace::name' (e.g. 'mylib::scale_add'): the "
                    "namespace is a dotted identifier (an ONNX domain or a torch namespace), the name an identifier")
    if ns in RESERVED_NAMESPACES:
        raise _fail(name, "declaration", f"namespace {ns!r} is reserved ({', '.join(sorted(RESERVED_NAMESPACES))})")
    old = _CUSTOM.get(name)
    if registry.lookup(name) is not None and old is None:
        raise _fail(name, "declaration", "a built-in op has this name")
    if old is not None and not replace:
        raise _fail(name, "declaration", "already registered (unregister it first, or pass replace=True)")
    return old


def _check_declaration(name: str, schema: OpSchema) -> dict[str, tuple[str, Any]]:
    if not schema.outputs:
        raise _fail(name, "declaration", "the schema declares no outputs")
    try:
        kinds = schema.attr_kinds()
    except TypeError as exc:
        raise _fail(name, "declaration", str(exc)) from None
    seen: set[str] = set()
    for what, nm in [*(("input", a.name) for a in schema.inputs), *(("output", a.name) for a in schema.outputs),
                     *(("attribute", k) for k in kinds)]:
        if not _IDENT.match(nm):
            raise _fail(name, "declaration", f"{what} name {nm!r} is not an identifier")
        if nm in seen:
            raise _fail(name, "declaration", f"{what} name {nm!r} is used twice (inputs, outputs and attributes "
                        "share one namespace)")
        seen.add(nm)
    for what, args in (("input", schema.inputs), ("output", schema.outputs)):
        for a in args:
            if a.rank is not None and not 0 <= a.rank <= MAX_RANK:
                raise _fail(name, "declaration", f"{what} {a.name!r} has rank {a.rank}; ranks are 0 to {MAX_RANK}")
            try:
                allowed = a.allowed()
            except ValueError as exc:
                raise _fail(name, "declaration", f"{what} {a.name!r}: {exc}") from None
            if not allowed:
                raise _fail(name, "declaration", f"{what} {a.name!r} allows no element type")
            if what == "output" and schema.dtype is None and len(allowed) != 1:
                raise _fail(name, "declaration", f"output {a.name!r} allows {_dts(allowed)}: declare one dtype, or "
                            "give the schema a dtype function that picks it from the input dtypes")
    return kinds


def _check_call(op: str, what: str, fn: Callable[..., Any], positional: Sequence[str],
                kinds: Mapping[str, tuple[str, Any]]) -> inspect.Signature:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise _fail(op, "declaration", f"the {what} has no signature Cuvil can read") from None
    try:
        sig.bind(*positional, **dict.fromkeys(kinds, 0))
    except TypeError as exc:
        attrs = f" and attributes ({', '.join(kinds)})" if kinds else ""
        raise _fail(op, "declaration", f"the {what} {_sig(fn, sig)} cannot take the declared inputs "
                    f"({', '.join(positional)}){attrs}: {exc}") from None
    return sig


def _check_backward_signature(op: str, schema: OpSchema, backward: Callable[..., Any],
                              kinds: Mapping[str, tuple[str, Any]]) -> None:
    grads = schema.grad_inputs()
    known = {a.name for a in schema.inputs} | {a.name for a in schema.outputs} | {f"grad_{a.name}" for a in schema.outputs}
    for g in grads:
        if g not in known:
            raise _fail(op, "backward", f"declared gradient input {g!r} is none of the forward inputs, outputs "
                        f"or output gradients ({', '.join(sorted(known))})")
    sig = _check_call(op, "backward", backward, grads, kinds)
    params = [p.name for p in sig.parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in kinds]
    if params != grads:
        raise _fail(op, "backward", f"its parameters ({', '.join(params)}) do not match the declared gradient "
                    f"inputs ({', '.join(grads)})")


def _check_function(op: str, c_function: str | None, c_source: str | None, replace: bool) -> str:
    function = c_function or op.replace("::", "_").replace(".", "_")
    if c_source is None:
        if c_function is not None:
            raise _fail(op, "declaration", "c_function is given without c_source")
        return function
    if not _IDENT.match(function) or function.startswith("cuvil_"):
        raise _fail(op, "declaration", f"c_function {function!r} must be a C identifier not starting with 'cuvil_'")
    for other in _CUSTOM.values():
        if other.c_function == function and not (replace and other.name == op):
            raise _fail(op, "declaration", f"c_function {function!r} is already the kernel of {other.name}")
    return function


# samples: the reference against the shape and dtype functions -----------------------------------
Case = tuple[list[np.ndarray], dict[str, Any], list[np.ndarray]]  # inputs, attributes, reference outputs


def _cases(op: str, schema: OpSchema, kinds: Mapping[str, tuple[str, Any]], reference: Callable[..., Any],
           samples: Sequence[Sample] | None) -> list[Case]:
    defaults = {k: (d if d is not REQUIRED else (2 if kind == "int" else 0.5)) for k, (kind, d) in kinds.items()}
    cases: list[Case] = []
    if samples is not None:
        if not samples:
            raise _fail(op, "declaration", "samples is empty")
        for i, s in enumerate(samples):
            arrays, attrs = _sample(op, schema, kinds, defaults, s, i)
            cases.append((arrays, attrs, _check_case(op, schema, reference, arrays, attrs)))
        return cases
    rng = np.random.default_rng(0)
    n_sets = max((len(a.allowed()) for a in schema.inputs), default=1)
    for t in range(n_sets):
        dts = [a.allowed()[min(t, len(a.allowed()) - 1)] for a in schema.inputs]
        ranks = [a.rank if a.rank is not None else 2 for a in schema.inputs]
        uniform = [tuple([3] * r) for r in ranks]
        # distinct sizes per axis (counted from the last, as broadcasting aligns them) catch a shape
        # function that mixes up axes; a reference that needs equal dims rejects them, and they are skipped
        distinct = [tuple(2 + (r - 1 - j) for j in range(r)) for r in ranks]
        for k, shapes in enumerate((uniform, distinct)):
            arrays = [_random(rng, dt, s) for dt, s in zip(dts, shapes)]
            if k == 1 and not _accepts(reference, arrays, defaults):
                log.debug("%s: the reference rejects generated inputs %s; not checked on them", op, _where(schema, arrays))
                continue
            cases.append((arrays, dict(defaults), _check_case(op, schema, reference, arrays, dict(defaults))))
    return cases


def _accepts(reference: Callable[..., Any], arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> bool:
    try:
        reference(*arrays, **attrs)
    except Exception:
        return False
    return True


def _random(rng: np.random.Generator, dt: DType, shape: tuple[int, ...]) -> np.ndarray:
    if dt.is_float:
        return rng.standard_normal(shape).astype(dt.np)
    if dt is DType.bool:
        return rng.random(shape) < 0.5
    lo = -5 if dt.is_signed else 0
    return rng.integers(lo, 10, size=shape).astype(dt.np)


def _sample(op: str, schema: OpSchema, kinds: Mapping[str, tuple[str, Any]], defaults: Mapping[str, Any],
            s: Sample, i: int) -> tuple[list[np.ndarray], dict[str, Any]]:
    attrs = dict(defaults)
    if isinstance(s, Mapping):
        unknown = sorted(set(s) - {a.name for a in schema.inputs} - set(kinds))
        if unknown:
            raise _fail(op, "declaration", f"sample {i} names {', '.join(unknown)}, which are not inputs or attributes")
        missing = [a.name for a in schema.inputs if a.name not in s]
        if missing:
            raise _fail(op, "declaration", f"sample {i} lacks input(s) {', '.join(missing)}")
        raw = [s[a.name] for a in schema.inputs]
        attrs.update({k: v for k, v in s.items() if k in kinds})
    else:
        raw = list(s)
        if len(raw) != len(schema.inputs):
            raise _fail(op, "declaration", f"sample {i} has {len(raw)} inputs, the schema declares {len(schema.inputs)}")
    arrays = [np.asarray(a) for a in raw]
    for a, arr in zip(schema.inputs, arrays):
        try:
            dt = DType.from_np(arr.dtype)
        except TypeError as exc:
            raise _fail(op, "declaration", f"sample {i}, input {a.name!r}: {exc}") from None
        if dt not in a.allowed() or (a.rank is not None and arr.ndim != a.rank):
            raise _fail(op, "declaration", f"sample {i}, input {a.name!r} is {dt}{list(arr.shape)}; the schema "
                        f"takes {_arg(a)}")
    return arrays, attrs


def _check_case(op: str, schema: OpSchema, reference: Callable[..., Any], arrays: Sequence[np.ndarray],
                attrs: Mapping[str, Any]) -> list[np.ndarray]:
    where = _where(schema, arrays)
    try:
        raw = reference(*arrays, **attrs)
    except Exception as exc:
        raise _fail(op, "reference", f"the reference fails on {where}: {type(exc).__name__}: {exc}; pass samples= "
                    "with inputs it accepts") from None
    outs = _as_outputs(raw)
    if len(outs) != len(schema.outputs):
        raise _fail(op, "reference", f"on {where} the reference returns {len(outs)} outputs, the schema declares "
                    f"{len(schema.outputs)}")
    try:
        shapes = _shapes(schema, [tuple(a.shape) for a in arrays], attrs)
        dtypes = _dtypes(schema, [DType.from_np(a.dtype) for a in arrays], attrs)
    except _MismatchError as exc:
        raise _fail(op, exc.kind, f"on {where} {exc}") from None
    for o, got, shape, dt in zip(schema.outputs, outs, shapes, dtypes):
        if got.dtype != dt.np:
            raise _fail(op, "dtype", f"on {where} the reference returns output {o.name!r} as {_dtname(got.dtype)}, "
                        f"the schema says {dt}")
        if tuple(got.shape) != tuple(shape):
            raise _fail(op, "shape", f"on {where} the shape function gives output {o.name!r} shape {_fmt(shape)}, "
                        f"the reference returns {list(got.shape)}")
    return outs


def _as_outputs(raw: Any) -> list[np.ndarray]:
    return [np.asarray(o) for o in raw] if isinstance(raw, tuple | list) else [np.asarray(raw)]


def _shapes(schema: OpSchema, shapes: Sequence[Sequence[Dim]], attrs: Mapping[str, Any]) -> list[tuple[Dim, ...]]:
    """The shape function's result, checked against the declaration."""
    try:
        raw = schema.shape(*[tuple(s) for s in shapes], **attrs)
    except Exception as exc:
        raise _MismatchError("shape", f"the shape function fails: {type(exc).__name__}: {exc}") from None
    if not isinstance(raw, Sequence) or len(raw) != len(schema.outputs) or not all(isinstance(s, Sequence) for s in raw):
        raise _MismatchError("shape", f"the shape function returns {raw!r}; it must return a list of {len(schema.outputs)} "
                         "shape(s), one per output")
    out: list[tuple[Dim, ...]] = []
    for o, s in zip(schema.outputs, raw):
        dims: list[Dim] = []
        for d in s:
            if isinstance(d, DimExpr):
                dims.append(d)
            elif isinstance(d, int | np.integer) and not isinstance(d, bool) and int(d) >= 0:
                dims.append(int(d))
            else:
                raise _MismatchError("shape", f"the shape function gives output {o.name!r} a dim {d!r}; dims are ints >= 0 "
                                 "or symbolic dims")
        if o.rank is not None and len(dims) != o.rank:
            raise _MismatchError("shape", f"the shape function gives output {o.name!r} rank {len(dims)} ({_fmt(dims)}), the schema "
                             f"declares rank {o.rank}")
        out.append(tuple(dims))
    return out


def _dtypes(schema: OpSchema, dtypes: Sequence[DType], attrs: Mapping[str, Any]) -> list[DType]:
    if schema.dtype is None:
        return [o.allowed()[0] for o in schema.outputs]
    try:
        raw = list(schema.dtype(*dtypes, **attrs))
        got = [d if isinstance(d, DType) else DType.parse(str(d)) for d in raw]
    except Exception as exc:
        raise _MismatchError("dtype", f"the dtype function fails on {_dts(dtypes)}: {type(exc).__name__}: {exc}") from None
    if len(got) != len(schema.outputs):
        raise _MismatchError("dtype", f"the dtype function returns {len(got)} dtypes for {len(schema.outputs)} outputs")
    for o, d in zip(schema.outputs, got):
        if d not in o.allowed():
            raise _MismatchError("dtype", f"the dtype function gives output {o.name!r} {d}, which is not among its declared "
                             f"dtypes ({_dts(o.allowed())})")
    return got


def _check_symbolic(op: str, schema: OpSchema, kinds: Mapping[str, tuple[str, Any]]) -> None:
    """The shape function must also take symbolic dims: models with dynamic shapes call it so."""
    attrs = {k: (d if d is not REQUIRED else (2 if kind == "int" else 0.5)) for k, (kind, d) in kinds.items()}
    shapes = [tuple(sym(f"{a.name}_{j}") for j in range(a.rank if a.rank is not None else 2)) for a in schema.inputs]
    try:
        _shapes(schema, shapes, attrs)
    except _MismatchError as exc:
        shown = ", ".join(f"{a.name}: {_fmt(s)}" for a, s in zip(schema.inputs, shapes))
        raise _fail(op, "shape", f"on symbolic dims ({shown}) {exc}; a shape function must compute with "
                    "+ - * // only (no int(), no comparisons), so models with dynamic shapes can use the op") from None


# backward ---------------------------------------------------------------------------------------
def _check_backward(op: str, schema: OpSchema, backward: Callable[..., Any], arrays: Sequence[np.ndarray],
                    attrs: Mapping[str, Any], outs: Sequence[np.ndarray]) -> None:
    rng = np.random.default_rng(1)
    env: dict[str, np.ndarray] = {a.name: x for a, x in zip(schema.inputs, arrays)}
    for o, y in zip(schema.outputs, outs):
        env[o.name] = y
        env[f"grad_{o.name}"] = rng.standard_normal(y.shape).astype(y.dtype) if y.dtype.kind == "f" else np.zeros_like(y)
    where = _where(schema, arrays)
    try:
        grads = _as_outputs(backward(*[env[g] for g in schema.grad_inputs()], **attrs))
    except Exception as exc:
        raise _fail(op, "backward", f"it fails on {where}: {type(exc).__name__}: {exc}") from None
    if len(grads) != len(schema.inputs):
        raise _fail(op, "backward", f"on {where} it returns {len(grads)} gradients; it must return one per forward "
                    f"input ({', '.join(a.name for a in schema.inputs)})")
    for a, x, g in zip(schema.inputs, arrays, grads):
        if g.shape != x.shape or g.dtype != x.dtype:
            raise _fail(op, "backward", f"on {where} the gradient for input {a.name!r} is {_dtname(g.dtype)}"
                        f"{list(g.shape)}, the input is {_dtname(x.dtype)}{list(x.shape)}")


# the op's declaration in the registry -------------------------------------------------------------
def _opdef(name: str, schema: OpSchema, reference: Callable[..., Any], kinds: Mapping[str, tuple[str, Any]],
           tolerance: float) -> OpDef:
    def attrs_of(values: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, (kind, _) in kinds.items():
            v = values[k]
            if kind == "int":
                if isinstance(v, bool) or not isinstance(v, int | np.integer):
                    raise ShapeError(f"{name}: attribute {k!r} must be an int, got {v!r}")
                out[k] = int(v)
            else:
                if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
                    raise ShapeError(f"{name}: attribute {k!r} must be a float, got {v!r}")
                out[k] = float(v)
        return out

    def infer(ctx: InferCtx) -> list[TensorType]:
        types = [ctx.type(i) for i in range(len(schema.inputs))]
        for a, t in zip(schema.inputs, types):
            if a.rank is not None and t.rank != a.rank:
                raise ctx.fail(f"input {a.name!r} must have rank {a.rank}, got {t}")
            if t.dtype not in a.allowed():
                raise ctx.fail(f"input {a.name!r} has element type {t.dtype}, expected {_dts(a.allowed())}")
        attrs = attrs_of(ctx.attrs)
        try:
            shapes = _shapes(schema, [t.shape for t in types], attrs)
            dtypes = _dtypes(schema, [t.dtype for t in types], attrs)
        except _MismatchError as exc:
            raise ctx.fail(str(exc)) from None
        return [TensorType(dt, s) for dt, s in zip(dtypes, shapes)]

    def ref(ctx: RefCtx) -> list[np.ndarray]:
        arrays = [ctx.input(i) for i in range(len(schema.inputs))]
        return _as_outputs(reference(*arrays, **attrs_of(ctx.attrs)))

    return OpDef(
        name=name,
        inputs=tuple(a.name for a in schema.inputs),
        outputs=tuple(o.name for o in schema.outputs),
        attrs={k: AttrSpec(kind, default) for k, (kind, default) in kinds.items()},
        infer=infer,
        reference=ref,
        tolerance=tolerance,
        doc=f"custom op registered with cuvil.register_op ({getattr(reference, '__qualname__', 'reference')})",
    )


# the C kernel against the reference ---------------------------------------------------------------
def _check_c_kernel(op: CustomOp, cases: Sequence[Case], cc: str | None) -> None:
    from cuvil.backends.c.kernels.custom import KernelMismatchError, check_kernel

    try:
        check_kernel(op.name, [(arrays, attrs, want) for arrays, attrs, want in cases],
                     lambda arrays: _where(op.schema, arrays), tolerance=op.tolerance, cc=cc)
    except KernelMismatchError as exc:
        raise _fail(op.name, "c_kernel", str(exc)) from None


# formatting ---------------------------------------------------------------------------------------
def _fmt(shape: Sequence[Dim]) -> str:
    return f"[{', '.join(format_dim(d) for d in shape)}]"


def _dts(dts: Sequence[DType]) -> str:
    return ", ".join(str(d) for d in dts)


def _dtname(dt: np.dtype) -> str:
    try:
        return str(DType.from_np(dt))
    except TypeError:
        return str(dt)


def _arg(a: Arg) -> str:
    rank = "any rank" if a.rank is None else f"rank {a.rank}"
    return f"{rank}, {_dts(a.allowed())}"


def _where(schema: OpSchema, arrays: Sequence[np.ndarray]) -> str:
    return ", ".join(f"{a.name}: {_dtname(x.dtype)}{list(x.shape)}" for a, x in zip(schema.inputs, arrays))


def _sig(fn: Callable[..., Any], sig: inspect.Signature) -> str:
    return f"{getattr(fn, '__name__', 'function')}{sig}"


__all__ = ["Arg", "CustomOp", "CustomOpError", "OpSchema", "check_op", "custom_op", "custom_ops", "register_op", "unregister_op"]
