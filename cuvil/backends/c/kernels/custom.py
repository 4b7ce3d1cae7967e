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

import logging
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.kernel import CVal, KernelCtx, kernel, unregister_kernel
from cuvil.backends.c.writer import c_comment, c_float, c_int
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.symbolic import sym
from cuvil.ir.types import SymbolInfo, TensorType

log = logging.getLogger("cuvil.custom")

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


_SPECS: dict[str, CustomKernel] = {}


def _spec(op: str) -> CustomKernel:
    return _SPECS[op]


def register_custom_kernel(spec: CustomKernel) -> None:
    def emit(k: KernelCtx) -> None:
        _emit(k, spec)

    kernel(spec.op)(emit)
    _SPECS[spec.op] = spec


def unregister_custom_kernel(op: str) -> None:
    unregister_kernel(op)
    _SPECS.pop(op, None)


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


# checking a kernel against its reference (cuvil.register_op) ------------------------------------------
class KernelMismatchError(Exception):
    """The kernel does not compile, load or run, or disagrees with the reference (cuvil/custom.py reports it)."""


Case = tuple[Sequence[np.ndarray], Mapping[str, Any], Sequence[np.ndarray]]  # inputs, attributes, reference outputs


def check_kernel(op: str, cases: Sequence[Case], where: Callable[[Sequence[np.ndarray]], str], *, tolerance: float,
                 cc: str | None) -> None:
    """Build a one-node model of ``op`` per input signature, as the C backend builds any model, and run each case.

    Builds go to a private temporary cache: nothing of a rejected kernel stays behind."""
    from cuvil.backends.c import BuildOptions, CExecutor, build
    from cuvil.backends.c.codegen import CodegenOptions, generate
    from cuvil.backends.c.library import RunError
    from cuvil.backends.c.toolchain import BuildError, Compiler

    groups: dict[tuple[Any, ...], list[Case]] = {}
    for case in cases:
        key = (tuple((str(a.dtype), a.ndim) for a in case[0]), tuple(sorted(case[1].items())))
        groups.setdefault(key, []).append(case)
    with tempfile.TemporaryDirectory(prefix="cuvil-custom-") as tmp:
        for group in groups.values():
            graph = _probe_graph(op, group[0][0], group[0][1])
            options = BuildOptions(target="generic", compiler=Compiler.from_string(cc), cache_dir=Path(tmp))
            try:
                b = build(graph, options)
            except BuildError as exc:
                source = generate(graph, CodegenOptions(target="generic", model_name=graph.name)).source
                raise KernelMismatchError(f"the C source does not compile:\n{_relocate(str(exc), source, op)}") from None
            if b.warnings.strip():
                log.warning("%s: the C compiler warns about the kernel:\n%s", op,
                            _relocate(b.warnings, b.source.read_text(encoding="utf-8"), op))
            try:
                executor = CExecutor(b)
            except OSError as exc:
                function = _spec(op).function
                raise KernelMismatchError(f"the kernel library does not load ({exc}); does c_source define "
                                          f"{function}?") from None
            try:
                for arrays, _, want in group:
                    try:
                        got = executor.run(list(arrays), {})
                    except RunError as exc:
                        raise KernelMismatchError(f"the C kernel fails on {where(arrays)}: {exc}") from None
                    for name, g, w in zip(graph.outputs, got, want):
                        _compare(where(arrays), name.name, g, w, tolerance)
            finally:
                if executor.native is not None:
                    executor.native.close()


def _probe_graph(op: str, arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> Graph:
    from cuvil.ir.builder import Builder
    from cuvil.ops.registry import get

    opdef = get(op)
    graph = Graph(name=f"check of {op}")
    b = Builder(graph)
    ins = []
    for name, x in zip(opdef.inputs, arrays):
        dims = tuple(sym(f"{name}_{j}") for j in range(x.ndim))
        for d in dims:
            graph.symbols[str(d)] = SymbolInfo(str(d))
        ins.append(b.input(name, TensorType(DType.from_np(x.dtype), dims)))
    graph.outputs.extend(b.add(op, ins, dict(attrs), num_outputs=len(opdef.outputs), names=list(opdef.outputs),
                               node_name=op))
    return graph


def _compare(where: str, name: str, got: np.ndarray, want: np.ndarray, tolerance: float) -> None:
    if got.shape != want.shape or got.dtype != want.dtype:
        raise KernelMismatchError(f"on {where} output {name!r} comes back {got.dtype}{list(got.shape)}, the reference "
                                  f"gives {want.dtype}{list(want.shape)}")
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    if DType.from_np(want.dtype).is_float:
        bad = ~np.isclose(g64, w64, rtol=tolerance, atol=tolerance, equal_nan=True)
    else:
        bad = got != want
    if bad.any():
        err = float(np.nanmax(np.abs(g64 - w64)))
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
        raise KernelMismatchError(
            f"on {where} the C kernel's output {name!r} differs from the reference in {int(bad.sum())} of {bad.size} "
            f"elements (tolerance {tolerance:g}, max abs error {err:.3g}); first at index {list(idx)}: C gives "
            f"{got[idx].item()!r}, the reference {want[idx].item()!r}")


def _relocate(text: str, source: str, op: str) -> str:
    """Compiler messages with the lines of the op's c_source numbered as in c_source (``c_source:LINE:``)."""
    spec = _spec(op)
    lines = source.split("\n")
    if spec.marker not in lines:
        return text[-4000:]
    start = lines.index(spec.marker) + 1  # the 1-based number of the line before the source's first
    n = len(spec.source.rstrip().split("\n"))

    def sub(m: re.Match[str]) -> str:
        line = int(m.group(1))
        return f"c_source:{line - start}:" if start < line <= start + n else m.group(0)

    text = re.sub(r"\S*model\.c:(\d+):", sub, text)
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("compiling the generated C failed"))[-4000:]
