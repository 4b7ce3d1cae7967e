"""C kernels of custom ops (``cuvil.register_op``): the user's ``c_source``, called through one convention.

A custom op's C source defines one function, named by ``c_function``::

    int NAME(const cuvil_tensor *inputs, int n_inputs,
             cuvil_tensor *outputs, int n_outputs,
             const cuvil_custom_attr *attrs);

``cuvil_tensor`` is the C API's tensor (``cuvil_api.h``: data, shape[8],
rank, dtype code).  ``inputs`` are read-only.  ``outputs`` arrive allocated
(zeroed, 64-byte aligned) with the shapes and element types the op's shape
function gives: the kernel fills their data and must not change their
pointers, shapes, ranks or types.  ``attrs`` holds the op's attributes in
declaration order (``.i`` for an int attribute, ``.f`` for a float one),
NULL when it has none.  The kernel returns 0, or non-zero to fail the call
(for example when its input shapes do not fit together); the model then
reports the node and the code.

The source is copied once into every generated unit that uses the op, after
the runtime headers (so ``cuvil_rt.h`` helpers such as
``cuvil_f16_to_f32`` are in scope), and compiled by the C targets and the
wasm32 target alike: it must be portable C11 (guard any intrinsics).  The
generated call checks, after the kernel returns, that the outputs are still
the buffers and shapes it allocated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.kernel import CVal, KernelCtx, kernel, unregister_kernel
from cuvil.backends.c.writer import c_comment, c_float, c_int

MAX_RANK = 8

PRELUDE_KEY = "custom:prelude"
PRELUDE = """/* Custom ops (cuvil.register_op): attribute values, in declaration order. */
typedef struct cuvil_custom_attr {
    int64_t i; /* an int attribute */
    double f;  /* a float attribute */
} cuvil_custom_attr;"""


def c_prototype(function: str) -> str:
    """The declaration every custom op's C function must match."""
    return (f"int {function}(const cuvil_tensor *inputs, int n_inputs, cuvil_tensor *outputs, int n_outputs, "
            "const cuvil_custom_attr *attrs)")


@dataclass(frozen=True)
class CustomKernel:
    """What the emitter needs of a registered custom op."""

    op: str
    function: str
    source: str
    attrs: tuple[tuple[str, str], ...]  # (name, "int" | "float") in declaration order

    @property
    def marker(self) -> str:
        """The comment line that opens the op's source in generated C (lines after it are the source's)."""
        return f"/* c_source of custom op {c_comment(self.op)} ({self.function}) */"

    @property
    def entry(self) -> str:
        """The name generated code calls: no local of generated code starts with ``cuvil_``, so none hides it."""
        return f"cuvil_custom_{self.function}"

    def unit_text(self) -> str:
        """The file-scope C the op adds: its prototype first, so a mismatched definition fails to compile."""
        return (f"{c_prototype(self.function)};\n{self.marker}\n{self.source.rstrip()}\n"
                f"static CUVIL_UNUSED {c_prototype(self.entry)} {{\n"
                f"    return {self.function}(inputs, n_inputs, outputs, n_outputs, attrs);\n}}")


def register_custom_kernel(spec: CustomKernel) -> None:
    def emit(k: KernelCtx) -> None:
        _emit(k, spec)

    kernel(spec.op)(emit)


def unregister_custom_kernel(op: str) -> None:
    unregister_kernel(op)


def _attr_literal(kind: str, value: object) -> str:
    if kind == "int":
        return f"{{{c_int(int(value))}, 0.0}}"  # type: ignore[call-overload]
    return f"{{INT64_C(0), {c_float(float(value), suffix='')}}}"  # type: ignore[arg-type]


def _emit(k: KernelCtx, spec: CustomKernel) -> None:
    k.define(PRELUDE_KEY, PRELUDE)
    k.define(f"custom:{spec.op}", spec.unit_text())
    w = k.w
    ins = [k.inp(i) for i in range(len(k.ins))]
    outs = k.outs
    for c in [*ins, *outs]:
        if c.rank > MAX_RANK:
            raise ValueError(f"{spec.op}: a custom kernel takes tensors of rank {MAX_RANK} at most, got {c.rank}")
    ti, to = k.tmp("cin"), k.tmp("cout")
    w.line(f"cuvil_tensor {ti}[{max(len(ins), 1)}]; cuvil_tensor {to}[{max(len(outs), 1)}];")
    w.line(f"memset({ti}, 0, sizeof {ti}); memset({to}, 0, sizeof {to});")
    _fill(k, ti, ins)
    _fill(k, to, outs)
    attrs = "NULL"
    if spec.attrs:
        attrs = k.tmp("cattr")
        values = ", ".join(_attr_literal(kind, k.attrs[name]) for name, kind in spec.attrs)
        w.line(f"const cuvil_custom_attr {attrs}[{len(spec.attrs)}] = {{{values}}};")
    rc = k.tmp("rc")
    w.line(f"int {rc} = {spec.entry}({ti}, {len(ins)}, {to}, {len(outs)}, {attrs});")
    k.fail_if(f"{rc} != 0", f"custom kernel {c_comment(spec.function)} returned %d", rc)
    for i, c in enumerate(outs):
        same = [f"{to}[{i}].data == (void *){c.ptr}", f"{to}[{i}].rank == {c.rank}",
                f"{to}[{i}].dtype == {ct.code(c.dtype)}"]
        same += [f"{to}[{i}].shape[{j}] == {c.shape}[{j}]" for j in range(c.rank)]
        k.fail_if(f"!({' && '.join(same)})",
                  f"custom kernel {c_comment(spec.function)} changed the buffer, shape or type of output {i}")


def _fill(k: KernelCtx, arr: str, vals: Sequence[CVal]) -> None:
    w = k.w
    for i, c in enumerate(vals):
        # cuvil_tensor's data is not const-qualified: inputs are read-only by the convention, not the type
        w.line(f"{arr}[{i}].data = (void *){c.ptr}; {arr}[{i}].rank = {c.rank}; {arr}[{i}].dtype = {ct.code(c.dtype)};")
        for j in range(c.rank):
            w.line(f"{arr}[{i}].shape[{j}] = {c.shape}[{j}];")
