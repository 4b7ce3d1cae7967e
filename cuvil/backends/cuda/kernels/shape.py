"""The shape-only ops on the host: Reshape, Flatten, Squeeze, Unsqueeze, Identity-like views and
Shape.  Their output dims are the code generator's (the op's inference, re-run on run-time dims);
the data is a view of the input's where that input is a constant (weights are never freed), else
one device-to-device copy on the call's stream (a view of a value the memory plan may reuse needs
the planner to know of views: not yet)."""

from __future__ import annotations

from cuvil.backends.cuda.kernel import CudaKernelCtx, cuda_kernel
from cuvil.backends.cuda.kernels.common import copy


@cuda_kernel("reshape", "flatten", "squeeze", "unsqueeze", host=True)
def _view(k: CudaKernelCtx) -> None:
    x, out = k.inp(0), k.out(0)
    k.require(x.numel(), out.numel(), "element count")
    if x.const is not None:
        k.w.line("/* a view of a constant: no copy */")
        k.alias(x.ptr)
        return
    copy(k, x, out)


@cuda_kernel("shape", host=True)
def _shape(k: CudaKernelCtx) -> None:
    x, out = k.inp(0), k.out(0)
    rank = x.rank
    start = int(k.attrs.get("start") or 0)
    end = k.attrs.get("end")
    end = rank if end is None else int(end)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(start, min(rank, end + rank if end < 0 else end))
    dims = ", ".join(f"{x.shape}[{j}]" for j in range(start, end)) or "0"
    tmp = k.tmp("dims")
    k.w.line(f"const int64_t {tmp}[{max(end - start, 1)}] = {{{dims}}};")
    if end > start:
        k.w.line(f"if (cuvil_cuda_failed(call, cudaMemcpyAsync({out.ptr}, {tmp}, sizeof {tmp}, cudaMemcpyHostToDevice, "
                 f"call->stream), \"writing a shape\")) goto fail;")
        k.w.line('if (cuvil_cuda_failed(call, cudaStreamSynchronize(call->stream), "writing a shape")) goto fail;')
