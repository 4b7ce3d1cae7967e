"""The CUDA backend's kernel table, what a CUDA kernel emitter sees, and which ops run where.

An emitter writes two things for one node: file-scope device code (``__global__`` kernels, once
per key: :meth:`CudaKernelCtx.device`) and the host code of ``cuvil_run_graph`` that launches
them (:meth:`CudaKernelCtx.launch`) with the node's run-time dims as arguments, so one build serves
every valid shape.  Pointers of :class:`~cuvil.backends.c.kernel.CVal` are device pointers; shape
arrays are host arrays, as in the C backend, whose :class:`~cuvil.backends.c.kernel.KernelCtx`
(checks, names, definitions) this context extends.

Every op the IR declares is in exactly one of three places: :data:`DEVICE_OPS` (a kernel here),
:data:`HOST_OPS` (shape-only ops computed on the host as aliases of their input's memory, and the
constants), or :data:`NOT_YET_SUPPORTED`, the explicit list of ops the target refuses with an
``UnsupportedOpError`` naming each; tests/cuda/test_completeness.py keeps the three in step.
"""

from __future__ import annotations

from collections.abc import Callable

from cuvil.backends.c.kernel import Kernel, KernelCtx
from cuvil.backends.c.writer import c_string

KernelFn = Callable[["CudaKernelCtx"], None]

_KERNELS: dict[str, Kernel] = {}
_HOST: set[str] = set()


def cuda_kernel(*ops: str, host: bool = False) -> Callable[[KernelFn], KernelFn]:
    """Register the CUDA emitter of one or more ops (``host``: it runs on the host, an alias or a
    computation on shapes, with no device kernel)."""

    def wrap(fn: KernelFn) -> KernelFn:
        for op in ops:
            _KERNELS[op] = Kernel(fn)  # type: ignore[arg-type]
            if host:
                _HOST.add(op)
        return fn

    return wrap


def find_cuda_kernel(op: str) -> Kernel | None:
    _load()
    return _KERNELS.get(op)


def _load() -> None:
    import cuvil.backends.cuda.kernels  # noqa: F401  (fills the table)


def device_ops() -> frozenset[str]:
    """The ops with a device kernel."""
    _load()
    return frozenset(set(_KERNELS) - _HOST)


def host_ops() -> frozenset[str]:
    """The ops run on the host (shape-only aliases), and ``constant`` (a pointer into the weights)."""
    _load()
    return frozenset(_HOST | {"constant"})


#: Declared ops the CUDA targets have no kernel for yet: a graph using one fails to compile with an
#: ``UnsupportedOpError`` naming it.  Only ever shrinks (the completeness test requires each op
#: here to have neither a device kernel nor a host implementation).
NOT_YET_SUPPORTED = frozenset({
    # control flow: If and Loop run on the host with device predicates read back (not yet written)
    "if", "loop",
    # outputs whose shape depends on the data
    "non_zero", "unique", "non_max_suppression", "top_k",
    # integer and quantized arithmetic
    "conv_integer", "matmul_integer", "qlinear_add", "qlinear_conv", "qlinear_matmul", "qlinear_matmul_float",
    "quantize_linear", "dequantize_linear", "dynamic_quantize_linear",
    # layouts and convolutions other than NCHW conv
    "conv_nhwc", "fused_conv_nhwc", "conv_transpose", "deform_conv", "col2im",
    # the rest, one by one
    "arg_max", "arg_min", "attention", "constant_of_shape", "cumprod", "cumsum", "depth_to_space",
    "det", "dft", "einsum", "eye_like", "full_like", "gather_elements", "gather_nd", "grid_sample", "group_norm",
    "hardmax", "instance_norm", "lp_normalization", "max_roi_pool", "one_hot", "range", "resize",
    "roi_align", "scatter_elements", "scatter_nd", "space_to_depth", "split", "stft", "tile", "trilu", "size",
    "batch_norm", "reduce_l1", "reduce_l2", "reduce_log_sum", "reduce_log_sum_exp", "reduce_sum_square",
})


class CudaKernelCtx(KernelCtx):
    """What a CUDA kernel emitter sees for one node: the C backend's context, plus device code and launches."""

    def device(self, key: str, text: str) -> None:
        """File-scope device code (a ``__global__`` kernel and its helpers), once per ``key``."""
        self.define(key, text)

    def kernel_name(self, hint: str) -> str:
        """A fresh name for a kernel of this node (from ``hint``, never from the model's names)."""
        return self.tmp(f"k_{hint}")

    def define_kernel(self, hint: str, template: str) -> str:
        """Define the device code ``template`` (``{name}`` standing for the kernel's name) once per
        text, so nodes whose kernels are the same text share one kernel; returns its name."""
        names: dict[str, str] = self._fn.kernel_names  # type: ignore[attr-defined]
        if template not in names:
            names[template] = self.kernel_name(hint)
            self.device(f"cuda-kernel:{names[template]}", template.replace("{name}", names[template]))
        return names[template]

    def launch(self, kernel: str, grid: str, block: str, args: list[str], shmem: str = "0") -> None:
        """Launch ``kernel`` on the call's stream; a launch error fails the call naming the node."""
        self.w.line(f"CUVIL_LAUNCH({kernel}, {grid}, {block}, {shmem}, call->stream, {', '.join(args)});")
        self.w.line(f"if (cuvil_launched(call, {c_string(self.node.name)}, {c_string(self.node.op)})) goto fail;")

    def index_check(self, message: str) -> tuple[str, str]:
        """The two kernel arguments (the call's status words, this check's number) with which a
        kernel that reads at an index held in a tensor reports the first one out of range
        (``cuvil_index_fault``); the call then fails with ``message`` (a printf format written by
        Cuvil taking the index and the size as ``long long``), named by the node, after the kernels.
        The status words are allocated at the first check a call reaches."""
        checks: list[tuple[str, str, str]] = self._fn.index_checks  # type: ignore[attr-defined]
        checks.append((self.node.name, self.node.op, message))
        self.w.line("if (!call->status && cuvil_status_begin(call) != 0) goto fail;")
        return "call->status", f"{len(checks)}ull"

    def alias(self, src: str) -> None:
        """Output 0 is a view of ``src``'s memory (a shape-only op): no copy, no allocation."""
        out = self.out(0)
        self.w.line(f"{out.ptr} = ({out.ctype} *){src};")
