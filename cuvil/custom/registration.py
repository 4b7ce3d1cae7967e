"""Registering custom ops: the table of registered ops, ``register_op``, ``check_op`` and
``unregister_op``, and the :class:`~cuvil.ops.registry.OpDef` a registered op becomes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil.custom.checks import (
    MismatchError,
    as_outputs,
    check_backward,
    check_backward_signature,
    check_c_kernel,
    check_call,
    check_declaration,
    check_symbolic,
    output_dtypes,
    output_shapes,
    sample_cases,
)
from cuvil.custom.schema import IDENT, NAMESPACE, RESERVED_NAMESPACES, CustomOpError, OpSchema, Sample, fmt_dtypes
from cuvil.errors import ShapeError
from cuvil.ir.types import TensorType
from cuvil.ops import registry
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx

log = logging.getLogger("cuvil.custom")


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
    kinds = check_declaration(name, schema)
    in_names = [a.name for a in schema.inputs]
    check_call(name, "reference", reference, in_names, kinds)
    check_call(name, "shape function", schema.shape, in_names, kinds)
    if schema.dtype is not None:
        check_call(name, "dtype function", schema.dtype, in_names, kinds)
    if backward is not None:
        check_backward_signature(name, schema, backward, kinds)
    function = _check_function(name, c_function, c_source, replace)
    cases = sample_cases(name, schema, kinds, reference, samples)
    check_symbolic(name, schema, kinds)
    if backward is not None:
        for arrays, attrs, outs in cases:
            check_backward(name, schema, backward, arrays, attrs, outs)
    op = CustomOp(name, schema, reference, c_source, function if c_source is not None else None, backward, tolerance,
                  _opdef(name, schema, reference, kinds, tolerance), tuple(samples) if samples is not None else None)
    if old is not None:
        _uninstall(name)
    _install(op)
    try:
        if c_source is not None:
            check_c_kernel(op.name, op.schema, op.tolerance, cases, cc)
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
        raise CustomOpError(name, "declaration", "not a registered custom op")
    kinds = op.schema.attr_kinds()
    cases = sample_cases(name, op.schema, kinds, op.reference, op.samples)
    check_symbolic(name, op.schema, kinds)
    if op.backward is not None:
        check_backward_signature(name, op.schema, op.backward, kinds)
        for arrays, attrs, outs in cases:
            check_backward(name, op.schema, op.backward, arrays, attrs, outs)
    if op.c_source is not None:
        check_c_kernel(op.name, op.schema, op.tolerance, cases, cc)


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


def _check_name(name: str, replace: bool) -> CustomOp | None:
    ns, sep, short = name.partition("::")
    if not sep or not NAMESPACE.match(ns) or not IDENT.match(short):
        raise CustomOpError(name, "declaration", "a custom op is named 'namespace::name' (e.g. 'mylib::scale_add'): the "
                    "namespace is a dotted identifier (an ONNX domain or a torch namespace), the name an identifier")
    if ns in RESERVED_NAMESPACES:
        raise CustomOpError(name, "declaration", f"namespace {ns!r} is reserved ({', '.join(sorted(RESERVED_NAMESPACES))})")
    old = _CUSTOM.get(name)
    if registry.lookup(name) is not None and old is None:
        raise CustomOpError(name, "declaration", "a built-in op has this name")
    if old is not None and not replace:
        raise CustomOpError(name, "declaration", "already registered (unregister it first, or pass replace=True)")
    return old


def _check_function(op: str, c_function: str | None, c_source: str | None, replace: bool) -> str:
    function = c_function or op.replace("::", "_").replace(".", "_")
    if c_source is None:
        if c_function is not None:
            raise CustomOpError(op, "declaration", "c_function is given without c_source")
        return function
    if not IDENT.match(function) or function.startswith("cuvil_"):
        raise CustomOpError(op, "declaration", f"c_function {function!r} must be a C identifier not starting with 'cuvil_'")
    for other in _CUSTOM.values():
        if other.c_function == function and not (replace and other.name == op):
            raise CustomOpError(op, "declaration", f"c_function {function!r} is already the kernel of {other.name}")
    return function


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
                raise ctx.fail(f"input {a.name!r} has element type {t.dtype}, expected {fmt_dtypes(a.allowed())}")
        attrs = attrs_of(ctx.attrs)
        try:
            shapes = output_shapes(schema, [t.shape for t in types], attrs)
            dtypes = output_dtypes(schema, [t.dtype for t in types], attrs)
        except MismatchError as exc:
            raise ctx.fail(str(exc)) from None
        return [TensorType(dt, s) for dt, s in zip(dtypes, shapes)]

    def ref(ctx: RefCtx) -> list[np.ndarray]:
        arrays = [ctx.input(i) for i in range(len(schema.inputs))]
        return as_outputs(reference(*arrays, **attrs_of(ctx.attrs)))

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
