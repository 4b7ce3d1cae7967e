"""The checks ``register_op`` runs on a declaration before accepting it (and ``check_op`` runs again).

1. declaration: names, ranks, dtypes, attributes; the functions accept the declared arguments;
2. samples: on each sample (given, or generated from the schema) the shape and dtype functions
   agree with what the reference returns; the shape function also works on symbolic dims;
3. backward: one gradient per forward input, of that input's shape and dtype;
4. C kernel: the kernel, built into a model through the C backend, agrees with the reference.

Each failure is a :class:`~cuvil.custom.schema.CustomOpError` whose ``kind`` names the check.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cuvil.custom.schema import (
    IDENT,
    MAX_RANK,
    CustomOpError,
    OpSchema,
    Sample,
    dtype_name,
    fmt_arg,
    fmt_dtypes,
    fmt_inputs,
    fmt_shape,
    fmt_signature,
)
from cuvil.ir.dtypes import DType, is_float_np
from cuvil.ir.symbolic import Dim, DimExpr, sym
from cuvil.ops.registry import REQUIRED

log = logging.getLogger("cuvil.custom")


# declaration ------------------------------------------------------------------------------------
class MismatchError(Exception):
    """The shape or dtype function disagrees with the declaration (``kind``: "shape" or "dtype")."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


def check_declaration(name: str, schema: OpSchema) -> dict[str, tuple[str, Any]]:
    if not schema.outputs:
        raise CustomOpError(name, "declaration", "the schema declares no outputs")
    try:
        kinds = schema.attr_kinds()
    except TypeError as exc:
        raise CustomOpError(name, "declaration", str(exc)) from None
    seen: set[str] = set()
    for what, nm in [*(("input", a.name) for a in schema.inputs), *(("output", a.name) for a in schema.outputs),
                     *(("attribute", k) for k in kinds)]:
        if not IDENT.match(nm):
            raise CustomOpError(name, "declaration", f"{what} name {nm!r} is not an identifier")
        if nm in seen:
            raise CustomOpError(name, "declaration", f"{what} name {nm!r} is used twice (inputs, outputs and attributes "
                        "share one namespace)")
        seen.add(nm)
    for what, args in (("input", schema.inputs), ("output", schema.outputs)):
        for a in args:
            if a.rank is not None and not 0 <= a.rank <= MAX_RANK:
                raise CustomOpError(name, "declaration", f"{what} {a.name!r} has rank {a.rank}; ranks are 0 to {MAX_RANK}")
            try:
                allowed = a.allowed()
            except ValueError as exc:
                raise CustomOpError(name, "declaration", f"{what} {a.name!r}: {exc}") from None
            if not allowed:
                raise CustomOpError(name, "declaration", f"{what} {a.name!r} allows no element type")
            if what == "output" and schema.dtype is None and len(allowed) != 1:
                raise CustomOpError(name, "declaration", f"output {a.name!r} allows {fmt_dtypes(allowed)}: declare one dtype, or "
                            "give the schema a dtype function that picks it from the input dtypes")
    return kinds


def check_call(op: str, what: str, fn: Callable[..., Any], positional: Sequence[str],
                kinds: Mapping[str, tuple[str, Any]]) -> inspect.Signature:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise CustomOpError(op, "declaration", f"the {what} has no signature Cuvil can read") from None
    try:
        sig.bind(*positional, **dict.fromkeys(kinds, 0))
    except TypeError as exc:
        attrs = f" and attributes ({', '.join(kinds)})" if kinds else ""
        raise CustomOpError(op, "declaration", f"the {what} {fmt_signature(fn, sig)} cannot take the declared inputs "
                    f"({', '.join(positional)}){attrs}: {exc}") from None
    return sig


def check_backward_signature(op: str, schema: OpSchema, backward: Callable[..., Any],
                              kinds: Mapping[str, tuple[str, Any]]) -> None:
    grads = schema.grad_inputs()
    known = {a.name for a in schema.inputs} | {a.name for a in schema.outputs} | {f"grad_{a.name}" for a in schema.outputs}
    for g in grads:
        if g not in known:
            raise CustomOpError(op, "backward", f"declared gradient input {g!r} is none of the forward inputs, outputs "
                        f"or output gradients ({', '.join(sorted(known))})")
    sig = check_call(op, "backward", backward, grads, kinds)
    params = [p.name for p in sig.parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in kinds]
    if params != grads:
        raise CustomOpError(op, "backward", f"its parameters ({', '.join(params)}) do not match the declared gradient "
                    f"inputs ({', '.join(grads)})")


# samples: the reference against the shape and dtype functions -----------------------------------
Case = tuple[list[np.ndarray], dict[str, Any], list[np.ndarray]]  # inputs, attributes, reference outputs


def sample_cases(op: str, schema: OpSchema, kinds: Mapping[str, tuple[str, Any]], reference: Callable[..., Any],
           samples: Sequence[Sample] | None) -> list[Case]:
    defaults = {k: (d if d is not REQUIRED else (2 if kind == "int" else 0.5)) for k, (kind, d) in kinds.items()}
    cases: list[Case] = []
    if samples is not None:
        if not samples:
            raise CustomOpError(op, "declaration", "samples is empty")
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
                log.debug("%s: the reference rejects generated inputs %s; not checked on them", op, fmt_inputs(schema, arrays))
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
            raise CustomOpError(op, "declaration", f"sample {i} names {', '.join(unknown)}, which are not inputs or attributes")
        missing = [a.name for a in schema.inputs if a.name not in s]
        if missing:
            raise CustomOpError(op, "declaration", f"sample {i} lacks input(s) {', '.join(missing)}")
        raw = [s[a.name] for a in schema.inputs]
        attrs.update({k: v for k, v in s.items() if k in kinds})
    else:
        raw = list(s)
        if len(raw) != len(schema.inputs):
            raise CustomOpError(op, "declaration", f"sample {i} has {len(raw)} inputs, the schema declares {len(schema.inputs)}")
    arrays = [np.asarray(a) for a in raw]
    for a, arr in zip(schema.inputs, arrays):
        try:
            dt = DType.from_np(arr.dtype)
        except TypeError as exc:
            raise CustomOpError(op, "declaration", f"sample {i}, input {a.name!r}: {exc}") from None
        if dt not in a.allowed() or (a.rank is not None and arr.ndim != a.rank):
            raise CustomOpError(op, "declaration", f"sample {i}, input {a.name!r} is {dt}{list(arr.shape)}; the schema "
                        f"takes {fmt_arg(a)}")
    return arrays, attrs


def _check_case(op: str, schema: OpSchema, reference: Callable[..., Any], arrays: Sequence[np.ndarray],
                attrs: Mapping[str, Any]) -> list[np.ndarray]:
    where = fmt_inputs(schema, arrays)
    try:
        raw = reference(*arrays, **attrs)
    except Exception as exc:
        raise CustomOpError(op, "reference", f"the reference fails on {where}: {type(exc).__name__}: {exc}; pass samples= "
                    "with inputs it accepts") from None
    outs = as_outputs(raw)
    if len(outs) != len(schema.outputs):
        raise CustomOpError(op, "reference", f"on {where} the reference returns {len(outs)} outputs, the schema declares "
                    f"{len(schema.outputs)}")
    try:
        shapes = output_shapes(schema, [tuple(a.shape) for a in arrays], attrs)
        dtypes = output_dtypes(schema, [DType.from_np(a.dtype) for a in arrays], attrs)
    except MismatchError as exc:
        raise CustomOpError(op, exc.kind, f"on {where} {exc}") from None
    for o, got, shape, dt in zip(schema.outputs, outs, shapes, dtypes):
        if got.dtype != dt.np:
            raise CustomOpError(op, "dtype", f"on {where} the reference returns output {o.name!r} as {dtype_name(got.dtype)}, "
                        f"the schema says {dt}")
        if tuple(got.shape) != tuple(shape):
            raise CustomOpError(op, "shape", f"on {where} the shape function gives output {o.name!r} shape {fmt_shape(shape)}, "
                        f"the reference returns {list(got.shape)}")
    return outs


def as_outputs(raw: Any) -> list[np.ndarray]:
    return [np.asarray(o) for o in raw] if isinstance(raw, tuple | list) else [np.asarray(raw)]


def output_shapes(schema: OpSchema, shapes: Sequence[Sequence[Dim]], attrs: Mapping[str, Any]) -> list[tuple[Dim, ...]]:
    """The shape function's result, checked against the declaration."""
    try:
        raw = schema.shape(*[tuple(s) for s in shapes], **attrs)
    except Exception as exc:
        raise MismatchError("shape", f"the shape function fails: {type(exc).__name__}: {exc}") from None
    if not isinstance(raw, Sequence) or len(raw) != len(schema.outputs) or not all(isinstance(s, Sequence) for s in raw):
        raise MismatchError("shape", f"the shape function returns {raw!r}; it must return a list of {len(schema.outputs)} "
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
                raise MismatchError("shape", f"the shape function gives output {o.name!r} a dim {d!r}; dims are ints >= 0 "
                                 "or symbolic dims")
        if o.rank is not None and len(dims) != o.rank:
            raise MismatchError("shape", f"the shape function gives output {o.name!r} rank {len(dims)} ({fmt_shape(dims)}), the schema "
                             f"declares rank {o.rank}")
        out.append(tuple(dims))
    return out


def output_dtypes(schema: OpSchema, dtypes: Sequence[DType], attrs: Mapping[str, Any]) -> list[DType]:
    if schema.dtype is None:
        return [o.allowed()[0] for o in schema.outputs]
    try:
        raw = list(schema.dtype(*dtypes, **attrs))
        got = [d if isinstance(d, DType) else DType.parse(str(d)) for d in raw]
    except Exception as exc:
        raise MismatchError("dtype", f"the dtype function fails on {fmt_dtypes(dtypes)}: {type(exc).__name__}: {exc}") from None
    if len(got) != len(schema.outputs):
        raise MismatchError("dtype", f"the dtype function returns {len(got)} dtypes for {len(schema.outputs)} outputs")
    for o, d in zip(schema.outputs, got):
        if d not in o.allowed():
            raise MismatchError("dtype", f"the dtype function gives output {o.name!r} {d}, which is not among its declared "
                             f"dtypes ({fmt_dtypes(o.allowed())})")
    return got


def check_symbolic(op: str, schema: OpSchema, kinds: Mapping[str, tuple[str, Any]]) -> None:
    """The shape function must also take symbolic dims: models with dynamic shapes call it so."""
    attrs = {k: (d if d is not REQUIRED else (2 if kind == "int" else 0.5)) for k, (kind, d) in kinds.items()}
    shapes = [tuple(sym(f"{a.name}_{j}") for j in range(a.rank if a.rank is not None else 2)) for a in schema.inputs]
    try:
        output_shapes(schema, shapes, attrs)
    except MismatchError as exc:
        shown = ", ".join(f"{a.name}: {fmt_shape(s)}" for a, s in zip(schema.inputs, shapes))
        raise CustomOpError(op, "shape", f"on symbolic dims ({shown}) {exc}; a shape function must compute with "
                    "+ - * // only (no int(), no comparisons), so models with dynamic shapes can use the op") from None


# backward ---------------------------------------------------------------------------------------
def check_backward(op: str, schema: OpSchema, backward: Callable[..., Any], arrays: Sequence[np.ndarray],
                    attrs: Mapping[str, Any], outs: Sequence[np.ndarray]) -> None:
    rng = np.random.default_rng(1)
    env: dict[str, np.ndarray] = {a.name: x for a, x in zip(schema.inputs, arrays)}
    for o, y in zip(schema.outputs, outs):
        env[o.name] = y
        env[f"grad_{o.name}"] = rng.standard_normal(y.shape).astype(y.dtype) if is_float_np(y.dtype) else np.zeros_like(y)
    where = fmt_inputs(schema, arrays)
    try:
        grads = as_outputs(backward(*[env[g] for g in schema.grad_inputs()], **attrs))
    except Exception as exc:
        raise CustomOpError(op, "backward", f"it fails on {where}: {type(exc).__name__}: {exc}") from None
    if len(grads) != len(schema.inputs):
        raise CustomOpError(op, "backward", f"on {where} it returns {len(grads)} gradients; it must return one per forward "
                    f"input ({', '.join(a.name for a in schema.inputs)})")
    for a, x, g in zip(schema.inputs, arrays, grads):
        if g.shape != x.shape or g.dtype != x.dtype:
            raise CustomOpError(op, "backward", f"on {where} the gradient for input {a.name!r} is {dtype_name(g.dtype)}"
                        f"{list(g.shape)}, the input is {dtype_name(x.dtype)}{list(x.shape)}")


# the C kernel against the reference ---------------------------------------------------------------
def check_c_kernel(name: str, schema: OpSchema, tolerance: float, cases: Sequence[Case], cc: str | None) -> None:
    """The C kernel registered for ``name`` agrees with the reference outputs of ``cases``."""
    from cuvil.backends.c.kernels.custom import KernelMismatchError, check_kernel

    try:
        check_kernel(name, [(arrays, attrs, want) for arrays, attrs, want in cases],
                     lambda arrays: fmt_inputs(schema, arrays), tolerance=tolerance, cc=cc)
    except KernelMismatchError as exc:
        raise CustomOpError(name, "c_kernel", str(exc)) from None
