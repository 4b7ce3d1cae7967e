"""Building blocks for C kernels: broadcasting loops, copies, index helpers."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cuvil.backends.c.kernel import CVal, KernelCtx


def statically_same_shape(a: CVal, b: CVal) -> bool:
    return a.rank == b.rank and all(
        isinstance(x, int) and x == y for x, y in zip(a.value.type.shape, b.value.type.shape)
    )


def elementwise(
    k: KernelCtx,
    expr: Callable[[Sequence[str]], str],
    ins: Sequence[CVal] | None = None,
    out: CVal | None = None,
) -> None:
    """``out = expr(ins...)`` elementwise with NumPy broadcasting.

    ``expr`` receives each input's element as a C expression in its compute
    type and returns the result in the output's compute type."""
    ins = list(ins) if ins is not None else [k.inp(i) for i in range(len(k.ins)) if k.has(i)]
    out = out or k.out(0)
    w = k.w
    i = k.tmp("i")
    n = k.tmp("n")
    w.line(f"int64_t {n} = {out.numel()};")
    flat = " && ".join(f"cuvil_same_shape({a.shape}, {a.rank}, {out.shape}, {out.rank})" for a in ins) or "1"
    if all(statically_same_shape(a, out) for a in ins):
        flat = "1"
    with w.block(f"if ({flat})"):
        with w.block(f"for (int64_t {i} = 0; {i} < {n}; {i}++)"):
            w.line(out.store(i, expr([a.load(i) for a in ins])))
    if flat == "1":
        return
    with w.block("else"):
        for a in ins:
            k.fail_if(f"!cuvil_bcast_ok({a.shape}, {a.rank}, {out.shape}, {out.rank})",
                      "input shapes do not broadcast")
        R = out.rank
        strides = []
        for a in ins:
            st = k.tmp("st")
            w.line(f"int64_t {st}[{max(R, 1)}];")
            w.line(f"cuvil_bcast_strides({a.shape}, {a.rank}, {out.shape}, {R}, {st});")
            strides.append(st)
        idx = [k.tmp("d") for _ in range(R)]
        o = k.tmp("o")
        w.line(f"int64_t {o} = 0;")
        offs = [k.tmp("p") for _ in ins]
        for j in range(R):
            w.line(f"for (int64_t {idx[j]} = 0; {idx[j]} < {out.shape}[{j}]; {idx[j]}++) {{")
        for a, st, p in zip(ins, strides, offs):
            terms = " + ".join(f"{idx[j]} * {st}[{j}]" for j in range(R)) or "0"
            w.line(f"    int64_t {p} = {terms};")
        w.line("    " + out.store(o, expr([a.load(p) for a, p in zip(ins, offs)])))
        w.line(f"    {o}++;")
        for _ in range(R):
            w.line("}")


def copy(k: KernelCtx, src: CVal, dst: CVal) -> None:
    """Copy ``src`` into ``dst`` (same dtype, same element count)."""
    k.w.line(f"memcpy({dst.ptr}, {src.ptr}, sizeof({dst.ctype}) * (size_t){dst.numel()});")
