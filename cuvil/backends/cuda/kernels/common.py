"""What the CUDA kernels share: element types, device kernels defined once per text, and the
broadcasting elementwise kernel every elementwise op and fused chain runs through."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.codegen import CodegenError
from cuvil.backends.c.kernel import CVal
from cuvil.backends.cuda.kernel import CudaKernelCtx

# Threads per block of the one-dimensional kernels.
BLOCK = 256


def check_dtypes(k: CudaKernelCtx, vals: Sequence[CVal]) -> None:
    """Refuse element types the CUDA kernels do not handle yet (the low-bit storage types)."""
    for v in vals:
        if v.dtype.is_lowbit:
            raise CodegenError(f"node {k.node.name!r} ({k.node.op}): element type {v.dtype} has no CUDA kernels yet")


def define_kernel(k: CudaKernelCtx, hint: str, template: str) -> str:
    """Define the device code ``template`` (``{name}`` standing for the kernel's name) once per text:
    nodes whose kernels are the same text share one kernel.  Returns its name."""
    return k.define_kernel(hint, template)


def grid_stride(index: str = "i", count: str = "n") -> str:
    """The head of a grid-stride loop over ``count`` elements."""
    return (f"for (int64_t {index} = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; {index} < {count}; "
            f"{index} += (int64_t)gridDim.x * blockDim.x)")


def same_shape(a: CVal, out: CVal) -> bool:
    """Whether ``a`` has ``out``'s shape whatever the run-time dims (its elements read at ``i``)."""
    return tuple(a.value.type.shape) == tuple(out.value.type.shape)


def one_element(a: CVal) -> bool:
    return all(d == 1 for d in a.value.type.shape)


def elementwise(k: CudaKernelCtx, expr: Callable[[Sequence[str]], str], ins: Sequence[CVal] | None = None,
                out: CVal | None = None) -> None:
    """``out = expr(ins...)`` elementwise with NumPy broadcasting, one thread per output element.

    An operand of the output's shape is read at the output's index, one of one element at 0, any
    other through broadcast strides computed on the host from its run-time shape.  Each thread reads
    its elements before it writes its own, so the memory plan may put the output over a dying input."""
    ins = list(ins) if ins is not None else [k.inp(i) for i in range(len(k.ins)) if k.has(i)]
    out = out or k.out(0)
    check_dtypes(k, [*ins, out])
    probe = expr([f"cuvil_operand_{j}_" for j in range(len(ins))])
    used = [f"cuvil_operand_{j}_" in probe for j in range(len(ins))]
    rank = out.rank
    params = ["int64_t n", "cuvil_dims od"]
    args = [k.tmp("n"), k.tmp("od")]
    host_args = [args[0], args[1]]
    ptr_params: list[str] = [f"{out.ctype} *out"]
    ptr_args = [out.ptr]
    body: list[str] = []
    leaves: list[str] = []
    strided: list[int] = []
    setup: list[str] = [f"const int64_t {args[0]} = {out.numel()};",
                        f"const cuvil_dims {args[1]} = cuvil_dims_of({out.shape}, {rank});"]
    for j, a in enumerate(ins):
        leaf = f"x{j}"
        leaves.append(leaf)
        if not used[j]:
            continue
        ptr_params.append(f"const {a.ctype} *in{j}")
        ptr_args.append(a.ptr)
        if same_shape(a, out):
            index = "i"
        elif one_element(a):
            index = "0"
        else:
            st = k.tmp("st")
            setup.append(f"const cuvil_dims {st} = cuvil_bcast_strides({a.shape}, {a.rank}, {rank});")
            params.append(f"cuvil_dims s{j}")
            host_args.append(st)
            strided.append(j)
            index = f"o{j}"
        body.append(f"        const {a.ctype_compute} {leaf} = {ct.load(a.dtype, f'in{j}', index)};")
    head: list[str] = []
    if strided:
        head.append("        int64_t " + ", ".join(f"o{j} = 0" for j in strided) + ";")
        head.append("        {")
        head.append("            int64_t r = i;")
        head.append(f"            for (int j = {rank - 1}; j >= 0; j--) {{")
        head.append("                const int64_t c = r % od.d[j];")
        head.append("                r /= od.d[j];")
        for j in strided:
            head.append(f"                o{j} += c * s{j}.d[j];")
        head.append("            }")
        head.append("        }")
    else:
        head.append("        (void)od;")
    text = "\n".join([
        f"__global__ void {{name}}({', '.join(params + ptr_params)}) {{",
        f"    {grid_stride()} {{",
        *head,
        *body,
        f"        {ct.store(out.dtype, 'out', 'i', expr(leaves))}",
        "    }",
        "}",
    ])
    name = define_kernel(k, k.node.op, text)
    with k.w.block(""):
        for line in setup:
            k.w.line(line)
        with k.w.block(f"if ({args[0]} > 0)"):
            k.launch(name, f"dim3(cuvil_blocks({args[0]}, {BLOCK}))", f"dim3({BLOCK})", host_args + ptr_args)


def copy(k: CudaKernelCtx, src: CVal, dst: CVal) -> None:
    """``dst`` = ``src``, same element type and element count: one device-to-device copy on the stream."""
    size = f"(size_t)sizeof({dst.ctype}) * (size_t){dst.numel()}"
    k.w.line(f"if ({dst.ptr} != {src.ptr} && ({size}) > 0 && cuvil_cuda_failed(call, cudaMemcpyAsync({dst.ptr}, "
             f"{src.ptr}, {size}, cudaMemcpyDeviceToDevice, call->stream), \"copying a tensor\")) goto fail;")
