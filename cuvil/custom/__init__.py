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

The package: ``schema`` (what a declaration is), ``checks`` (the checks
above), ``registration`` (the table of registered ops and what a registered
op becomes in the op registry).
"""

from __future__ import annotations

from cuvil.custom.registration import CustomOp, check_op, custom_op, custom_ops, register_op, unregister_op
from cuvil.custom.schema import MAX_RANK, RESERVED_NAMESPACES, Arg, CustomOpError, OpSchema, Sample

__all__ = ["MAX_RANK", "RESERVED_NAMESPACES", "Arg", "CustomOp", "CustomOpError", "OpSchema", "Sample", "check_op",
           "custom_op", "custom_ops", "register_op", "unregister_op"]
