"""Generating one CUDA translation unit for a whole graph.

The unit holds the device kernels of every node and a host-side ``cuvil_run_graph`` with the C
target's API (``cuvil_api.h``; ``cuvil_cuda_model_api.inc``), so the C backend's ctypes loader runs
it unchanged.  The host function is the C backend's (:class:`~cuvil.backends.c.codegen.
FunctionEmitter`: input checks, symbol binding, the shape relations the ops need, the memory
plan's arena arithmetic, the same writer and line map); what differs is where memory lives:

- a call creates its own stream; inputs (host memory) are copied to the device after they are
  checked, outputs copied back into ``malloc``'d host buffers at the end, and the stream is
  synchronised before the call returns;
- constants point into the weights uploaded to the device once, when the model is loaded;
- intermediates live in one device arena per call sized by the memory plan (``memplan.py``),
  or in device allocations of their own where the graph carries no plan.

Kernels come from the CUDA kernel table (``cuvil/backends/cuda/kernel.py``); an op with none is an
``UnsupportedOpError`` naming every such op and the target, before anything is generated.
The source includes ``cuvil_cuda.h`` first: CUDA under nvcc, HIP under hipcc, and the CPU
execution harness under ``-DCUVIL_CUDA_SIM``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuvil._version import __version__
from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.codegen import (
    CodegenError,
    FunctionEmitter,
    GeneratedModule,
    _layout_weights,
    library_signature,
)
from cuvil.backends.c.kernel import Kernel
from cuvil.backends.c.writer import CWriter, c_comment, c_string
from cuvil.backends.cuda.kernel import CudaKernelCtx, find_cuda_kernel
from cuvil.errors import UnsupportedOpError, UnsupportedUse
from cuvil.faults import active
from cuvil.ir.graph import Graph, Node, Value

# The runtime headers every unit includes, in order (cuvil/backends/cuda/runtime/).
HEADERS = ("cuvil_cuda.h", "cuvil_cuda_host.h", "cuvil_cuda_kernels.h")


@dataclass(frozen=True)
class CudaCodegenOptions:
    target: str = "cuda"
    model_name: str = "model"
    # The planted faults of this compile (cuvil/faults.py): the kernels at a fault's place read them.
    faults: frozenset[str] = frozenset()
    profile: bool = False  # per-node timestamps (the C backend's profiling build): not yet on CUDA


def missing_kernels(graph: Graph, target: str) -> list[UnsupportedUse]:
    """The ops of ``graph`` without a CUDA kernel or host implementation, each with its nodes."""
    found: dict[str, list[str]] = {}
    for n in graph.walk():
        if n.op != "constant" and find_cuda_kernel(n.op) is None:
            found.setdefault(n.op, []).append(n.name)
    return [UnsupportedUse(op, "cuvil", None, tuple(names), f"no CUDA kernel (target {target})")
            for op, names in sorted(found.items())]


class CudaFunctionEmitter(FunctionEmitter):
    """Emits the host body of ``cuvil_run_graph`` for the CUDA targets."""

    weights_base = "m->dweights"
    kernel_ctx = CudaKernelCtx
    kernel_kind = "CUDA kernel"

    def __init__(self, graph: Graph, options: CudaCodegenOptions, weight_offsets: dict[Value, int]) -> None:
        super().__init__(graph, options, weight_offsets)  # type: ignore[arg-type]
        # each kernel's text (its name a placeholder) -> its name: nodes with the same text share it
        self.kernel_names: dict[str, str] = {}
        # the index checks of the kernels that read at indices held in tensors, numbered from 1:
        # (node name, op, message), the call failing with the first one a kernel records
        self.index_checks: list[tuple[str, str, str]] = []

    def find_kernel(self, op: str) -> Kernel | None:
        return find_cuda_kernel(op)

    def fill_bytes(self, ptr: str, size: str) -> str:
        return f"(void)cudaMemsetAsync({ptr}, 0xFF, (size_t)({size}), call->stream);"

    def declare_all(self) -> None:
        """The top-level values (no CUDA kernel runs a region: a fused op's body is its expression)."""
        for v in self.graph.inputs:
            self.cval(v)
        for n in self.graph.nodes:
            for o in n.outputs:
                self.cval(o)
        for c in self.vals.values():  # a constant a kernel reads as a literal is set and never read
            self.w.line(f"{c.ctype} *{c.ptr} CUVIL_UNUSED = NULL; int64_t {c.shape}[{max(c.rank, 1)}] CUVIL_UNUSED = {{0}};")

    def upload_inputs(self) -> None:
        """Copy each checked input from host memory to the device (its pointer then names the copy)."""
        for v in self.graph.inputs:
            c = self.cval(v)
            size = f"cuvil_nbytes((int64_t)sizeof({c.ctype}), {c.shape}, {c.rank})"
            self.w.line(f"{c.ptr} = ({c.ctype} *)cuvil_upload(call, {c.ptr}, {size}, {c_string(v.name)});")
            self.w.line(f"if (!{c.ptr}) goto fail;")

    def emit_outputs(self) -> None:
        """Copy each output to a new host buffer (the caller's, freed with ``cuvil_free``), then wait."""
        w = self.w
        for i, v in enumerate(self.graph.outputs):
            c = self.cval(v)
            size = f"cuvil_nbytes((int64_t)sizeof({c.ctype}), {c.shape}, {c.rank})"
            w.line(f"outputs[{i}].data = cuvil_download(call, {c.ptr}, {size});")
            w.line(f"if (!outputs[{i}].data) goto fail_outputs;")
            w.line(f"outputs[{i}].rank = {c.rank}; outputs[{i}].dtype = {ct.code(v.type.dtype)};")
            for j in range(c.rank):
                w.line(f"outputs[{i}].shape[{j}] = {c.shape}[{j}];")
        if self.index_checks:
            w.line("if (cuvil_status_download(call)) goto fail_outputs;")
        w.line('if (cuvil_cuda_failed(call, cudaStreamSynchronize(call->stream), "running the model")) '
               "goto fail_outputs;")
        if self.index_checks:
            self.emit_index_checks()

    def emit_index_checks(self) -> None:
        """Fail the call with the index out of range a kernel recorded, naming its node (as the C
        target does when it checks the index itself)."""
        w = self.w
        with w.block(""):
            w.line("long long index_ = 0, size_ = 0;")
            w.line("const unsigned long long check_ = cuvil_status_check(call, &index_, &size_);")
            for i, (node, op, message) in enumerate(self.index_checks, start=1):
                fmt = c_string(f"node %s ({op}): {message}")
                w.line(f"if (check_ == {i}ull) {{ cuvil_fail(call, {fmt}, {c_string(node)}, index_, size_); "
                       "goto fail_outputs; }")
            w.line('if (check_ != 0) { cuvil_fail(call, "an index out of range (unknown check %llu)", check_); '
                   "goto fail_outputs; }")


def _check_node(node: Node) -> None:
    for v in [*node.inputs, *node.outputs]:
        if v is not None and v.type.rank > 8:
            raise CodegenError(f"node {node.name!r} ({node.op}): rank {v.type.rank}; the CUDA kernels take rank 8 at most")


def generate(graph: Graph, options: CudaCodegenOptions) -> GeneratedModule:
    """The CUDA source, weights blob and line map for ``graph``."""
    missing = missing_kernels(graph, options.target)
    if missing:
        raise UnsupportedOpError(missing)
    for n in graph.walk():
        _check_node(n)
    for v in list(graph.inputs) + list(graph.outputs):
        if v.type.rank > 8:
            raise CodegenError(f"{v.name!r} has rank {v.type.rank}; the C API supports rank 8 at most")
    offsets, weights = _layout_weights(graph)
    fn = CudaFunctionEmitter(graph, options, offsets)
    body = fn.w
    n_out = len(graph.outputs)
    with body.indented():
        body.line("cuvil_call call_ = {0}; cuvil_call *call = &call_;")
        body.line("call->err = err; call->errlen = errlen;")
        body.line("if (err && errlen) err[0] = 0;")
        for name, cs in fn.sym_c.items():
            body.line(f"int64_t {cs} = 0; (void){cs}; /* {c_comment(name)} */")
        fn.declare_all()
        body.line("if (!m || !inputs || !outputs) return cuvil_fail(call, \"null argument\");")
        body.line(f"for (int i_ = 0; i_ < {max(n_out, 1)} && i_ < cuvil_n_outputs; i_++) outputs[i_].data = NULL;")
        body.line("if (cuvil_call_begin(call) != 0) goto fail;")
        # One block, so that no goto to the labels below crosses a declaration (C++).
        with body.block(""):
            fn.bind_inputs()
            fn.upload_inputs()
            fn.emit_arena()
            fn.emit_graph(graph, keep=set(graph.outputs))
            fn.emit_outputs()
        body.line("cuvil_call_end(call);")
        body.line("return 0;")
    w = CWriter()
    w.line(f"/* Generated by Cuvil {__version__} for target {options.target}. */")
    w.line(f"/* Model: {c_comment(options.model_name)} */")
    if active("cuda-shuffle-lane", options.faults):  # a planted fault (cuvil/faults.py)
        w.line("#define CUVIL_SHFL_LANE(off) ((off) == 1 ? 2 : (off))")
    for header in HEADERS:
        w.line(f'#include "{header}"')
    for text in fn.definitions.values():
        w.line("")
        w.lines.extend(text.rstrip("\n").split("\n"))
    w.line("")
    w.line(f"#define CUVIL_WEIGHTS_SIZE ((size_t){len(weights)})")
    w.line(f"static const int cuvil_n_inputs = {len(graph.inputs)};")
    w.line(f"static const int cuvil_n_outputs = {len(graph.outputs)};")
    w.line(f"static const char cuvil_signature_text[] = {c_string(library_signature(graph, options.target))};")
    w.line('#include "cuvil_cuda_model_api.inc"')
    w.line("")
    w.line("static int cuvil_run_graph(const cuvil_model *m, const cuvil_tensor *inputs, cuvil_tensor *outputs, "
           "char *err, size_t errlen) {")
    tail = ["fail_outputs:",
            f"    for (int i_ = 0; i_ < {max(n_out, 1)} && i_ < cuvil_n_outputs; i_++) {{ free(outputs[i_].data); "
            "outputs[i_].data = NULL; }",
            "fail:",
            "    cuvil_call_end(call);",
            "    return -1;",
            "}"]
    lines = w.lines + body.lines + tail
    origins = [None] * len(w.lines) + body.origins + [None] * len(tail)
    source = "\n".join(lines) + "\n"
    return GeneratedModule(source, weights, origins, {"weights_size": len(weights)})
