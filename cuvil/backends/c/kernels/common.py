"""Building blocks for C kernels: broadcasting loops, copies, index helpers."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import replace

from cuvil.backends.c.kernel import CVal, KernelCtx
from cuvil.backends.c.toolchain import RUNTIME_DIR
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import is_unknown


def statically_same_shape(a: CVal, b: CVal) -> bool:
    return a.rank == b.rank and all(
        isinstance(x, int) and x == y for x, y in zip(a.value.type.shape, b.value.type.shape)
    )


def provably_same_shape(a: CVal, b: CVal) -> bool:
    """Whether ``a`` and ``b`` have the same shape for every run (equal static or symbolic dims)."""
    return a.rank == b.rank and all(
        x == y and not is_unknown(x) for x, y in zip(a.value.type.shape, b.value.type.shape)
    )


def statically_one(a: CVal) -> bool:
    """Whether ``a`` holds exactly one element whatever the run-time shapes."""
    return all(d == 1 for d in a.value.type.shape)


def elementwise(
    k: KernelCtx,
    expr: Callable[[Sequence[str]], str],
    ins: Sequence[CVal] | None = None,
    out: CVal | None = None,
) -> None:
    """``out = expr(ins...)`` elementwise with NumPy broadcasting.

    ``expr`` receives each input's element as a C expression in its compute
    type (a local variable: it may be used more than once) and returns the
    result in the output's compute type.  ``out`` may be an input's memory
    only when the memory plan computes the node in place (``k.in_place``):
    the loops then drop their ``restrict`` pointers; each reads element i of
    an operand of the output's shape before it writes element i.

    Loops: inputs holding one element are read once before the loop; when
    every other input has the output's shape the loop is flat; otherwise an
    odometer walks the outer dims and the innermost dim is a unit-stride (or,
    where only known at run time, strided) loop.
    """
    ins = list(ins) if ins is not None else [k.inp(i) for i in range(len(k.ins)) if k.has(i)]
    out = out or k.out(0)
    w = k.w
    probe = expr([f"cuvil_operand_{j}_" for j in range(len(ins))])
    used = [f"cuvil_operand_{j}_" in probe for j in range(len(ins))]  # an operand the op ignores is not read
    restrict = "" if k.in_place else "restrict "
    with w.block(""):
        po = k.tmp("po")
        w.line(f"{out.ctype} *{restrict}{po} = {out.ptr};")
        # the locals the loops read, as (field type, declaration prefix, name): a flat loop runs in
        # a function of its own (parallel_flat), which takes them from a context
        local: list[tuple[str, str, str]] = [(f"{out.ctype} *", f"{out.ctype} *{restrict}", po)]
        o = replace(out, ptr=po)
        args: list[str] = ["0"] * len(ins)
        vec: list[tuple[int, CVal]] = []
        unread: list[CVal] = []  # shapes still checked
        for j, a in enumerate(ins):
            if statically_one(a):  # read once
                if used[j]:
                    args[j] = k.tmp("s")
                    w.line(f"const {a.ctype_compute} {args[j]} = {a.load('0')};")
                    local.append((a.ctype_compute, f"const {a.ctype_compute} ", args[j]))
            elif used[j]:
                p = k.tmp("pi")
                w.line(f"const {a.ctype} *{restrict}{p} = {a.ptr};")
                local.append((f"const {a.ctype} *", f"const {a.ctype} *{restrict}", p))
                vec.append((j, replace(a, ptr=p)))
            else:
                unread.append(a)

        def body(index: Callable[[int], str], o_index: str) -> None:
            """Load the vector operands into locals, then store the result."""
            vals = list(args)
            for n, (j, a) in enumerate(vec):
                vals[j] = k.tmp("x")
                w.line(f"const {a.ctype_compute} {vals[j]} = {a.load(index(n))};")
            w.line(o.store(o_index, expr(vals)))

        def flat_loop() -> None:
            n = k.tmp("n")
            w.line(f"const int64_t {n} = {out.numel()};")
            streamed = " + ".join(f"sizeof({a.ctype})" for a in (o, *(a for _, a in vec)))

            def loop(lo: str, hi: str) -> None:
                if any(a.dtype is DType.f16 for a in (o, *(a for _, a in vec))):
                    _f16_chunks(k, lo, hi, o, vec, vals=list(args), expr=expr)
                    return
                i = k.tmp("i")
                with w.block(f"for (int64_t {i} = {lo}; {i} < {hi}; {i}++)"):
                    body(lambda _n: i, i)

            parallel_flat(k, n, f"(double){n} * (double)({streamed})", local, loop)

        for a in unread:
            if not provably_same_shape(a, out):
                k.fail_if(f"!cuvil_bcast_ok({a.shape}, {a.rank}, {out.shape}, {out.rank})", "input shapes do not broadcast")
        if all(provably_same_shape(a, out) for _, a in vec):
            k.note("elementwise: one flat loop (every operand has the output's shape)")
            flat_loop()
            return
        if any(a.rank != out.rank for _, a in vec):  # never the output's shape: always broadcast
            k.note("elementwise: broadcasting loop nest (an operand has a lower rank)")
            _broadcast_loops(k, out, vec, body)
            return
        k.note("elementwise: a flat loop when the shapes agree at run time, else the broadcasting loop nest")
        same = " && ".join(
            f"cuvil_same_shape({a.shape}, {a.rank}, {out.shape}, {out.rank})"
            for _, a in vec if not provably_same_shape(a, out)
        )
        with w.block(f"if ({same})"):
            flat_loop()
        with w.block("else"):
            _broadcast_loops(k, out, vec, body)


# What a call of one of the runtime's vectorised math functions costs an element on one thread
# (0.4 to 0.9 ns for exp, sigmoid, tanh, GELU, erf on AVX-512; the rest of a loop streams): what
# tells cuvil_parallel_range that a loop computes for longer than it reads and writes.
_VMATH_NS = 0.5


@functools.cache
def _vmath_call() -> re.Pattern[str]:
    """A call of one of the vectorised math functions: those the runtime headers define as
    CUVIL_VM_INLINE (cuvil_vmath.h's, and cuvil_math.h's built on them), the cuvil_vm_ helpers aside."""
    names: set[str] = set()
    for header in ("cuvil_vmath.h", "cuvil_math.h"):
        text = (RUNTIME_DIR / header).read_text(encoding="utf-8")
        names.update(re.findall(r"CUVIL_VM_INLINE float (cuvil_(?!vm_)\w+)\(", text))
    return re.compile(r"\b(?:" + "|".join(sorted(names)) + r")\(")


def parallel_flat(k: KernelCtx, n: str, streamed: str, local: Sequence[tuple[str, str, str]],
                   loop: Callable[[str, str], None]) -> None:
    """A loop of ``n`` independent iterations (elements of a flat loop, rows of an epilogue pass),
    split over the call's threads when that pays for the
    ``streamed`` bytes (``cuvil_parallel_range``): ``loop(lo, hi)`` writes the loop over [lo, hi)
    into a function of its own, which reads the ``local`` variables the loop uses (field type,
    declaration prefix, name) from a context the node fills.  Each element is computed alone, so
    results do not depend on the thread count."""
    k.include("cuvil_threads.h")
    w = k.w
    with w.capture() as lines:
        loop("lo", "hi")
    fields = [f"    {ftype} {name};" for ftype, _, name in local]
    unpack = [f"    {decl}{name} = x->{name};" for _, decl, name in local]
    text = "\n".join([
        "typedef struct NAME_ctx {", *fields, "} NAME_ctx;",
        "static void NAME(const void *vctx, int64_t lo, int64_t hi) {",
        "    const NAME_ctx *x = (const NAME_ctx *)vctx;", *unpack, *lines, "}", ""])
    # named by its text: nodes whose loops read the same way share one function
    name = "cuvil_flat_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    k.define(name, text.replace("NAME", name))
    ctx = k.tmp("flat")
    item_ns = _VMATH_NS * sum(len(_vmath_call().findall(line)) for line in lines)
    w.line(f"const {name}_ctx {ctx} = {{{', '.join(f'.{nm} = {nm}' for _, _, nm in local)}}};")
    w.line(f"cuvil_parallel_range({n}, {streamed}, {item_ns!r}, {name}, &{ctx});")


F16_CHUNK = 256  # float32 values per operand on the stack


def _f16_chunks(k: KernelCtx, lo: str, hi: str, out: CVal, vec: Sequence[tuple[int, CVal]], vals: list[str],
                expr: Callable[[Sequence[str]], str]) -> None:
    """The flat loop over [lo, hi) when an operand is float16: one conversion per element (F16C's
    scalar form) keeps the loop from vectorising, so it runs over chunks, each f16 operand widened
    by the vectorised ``cuvil_f16_to_f32_n`` into a float32 chunk, the result rounded back by
    ``cuvil_f32_to_f16_n``.  A chunk is read whole before it is written (in-place safe)."""
    k.include("cuvil_half.h")
    w = k.w
    i0, m, i = k.tmp("i0"), k.tmp("m"), k.tmp("i")
    with w.block(f"for (int64_t {i0} = {lo}; {i0} < {hi}; {i0} += {F16_CHUNK})"):
        w.line(f"const int64_t {m} = {hi} - {i0} < {F16_CHUNK} ? {hi} - {i0} : {F16_CHUNK};")
        loads: list[tuple[int, CVal, str]] = []
        for j, a in vec:
            if a.dtype is DType.f16:
                buf = k.tmp("c")
                w.line(f"float {buf}[{F16_CHUNK}];")
                w.line(f"cuvil_f16_to_f32_n({a.ptr} + {i0}, {buf}, {m});")
                loads.append((j, a, f"{buf}[{i}]"))
            else:
                loads.append((j, a, a.load(f"{i0} + {i}")))
        res = k.tmp("r") if out.dtype is DType.f16 else ""
        if res:
            w.line(f"float {res}[{F16_CHUNK}];")
        with w.block(f"for (int64_t {i} = 0; {i} < {m}; {i}++)"):
            for j, a, load in loads:
                vals[j] = k.tmp("x")
                w.line(f"const {a.ctype_compute} {vals[j]} = {load};")
            w.line(f"{res}[{i}] = {expr(vals)};" if res else out.store(f"{i0} + {i}", expr(vals)))
        if res:
            w.line(f"cuvil_f32_to_f16_n({res}, {out.ptr} + {i0}, {m});")


def _broadcast_loops(
    k: KernelCtx,
    out: CVal,
    vec: Sequence[tuple[int, CVal]],
    body: Callable[[Callable[[int], str], str], None],
) -> None:
    """The general broadcasting loop nest (output rank >= 1)."""
    w = k.w
    rank = out.rank
    for _, a in vec:
        k.fail_if(f"!cuvil_bcast_ok({a.shape}, {a.rank}, {out.shape}, {out.rank})", "input shapes do not broadcast")
    strides = []
    for _, a in vec:
        st = k.tmp("st")
        w.line(f"int64_t {st}[{rank}];")
        w.line(f"cuvil_bcast_strides({a.shape}, {a.rank}, {out.shape}, {rank}, {st});")
        strides.append(st)
    # The innermost stride, statically when the dims tell: an input whose last dim is the
    # output's (the same expression) is read with stride 1 (when that dim is 1 the loop has
    # one step, so the stride does not matter); one whose last dim is 1 is read with stride 0.
    inner: list[str] = []
    out_last = out.value.type.shape[-1]
    for (_, a), st in zip(vec, strides):
        d = a.value.type.shape[-1]  # vector operands have rank >= 1
        if d == out_last and not is_unknown(d):
            inner.append("1")
        elif d == 1:
            inner.append("0")
        else:
            inner.append(f"{st}[{rank - 1}]")
    idx = [k.tmp("d") for _ in range(rank - 1)]
    offs = [k.tmp("p") for _ in vec]
    oo = k.tmp("o")
    w.line(f"int64_t {oo} = 0;")
    for j in range(rank - 1):
        w.line(f"for (int64_t {idx[j]} = 0; {idx[j]} < {out.shape}[{j}]; {idx[j]}++) {{")
    for st, p in zip(strides, offs):
        terms = " + ".join(f"{idx[j]} * {st}[{j}]" for j in range(rank - 1)) or "0"
        w.line(f"    const int64_t {p} = {terms};")
    with w.indented():
        i = k.tmp("i")
        last = out.dim(rank - 1)
        with w.block(f"for (int64_t {i} = 0; {i} < {last}; {i}++)"):

            def index(n: int) -> str:
                s = inner[n]
                return offs[n] if s == "0" else f"{offs[n]} + {i}" if s == "1" else f"{offs[n]} + {i} * {s}"

            body(index, f"{oo} + {i}")
        w.line(f"{oo} += {last};")
    for _ in range(rank - 1):
        w.line("}")


def copy(k: KernelCtx, src: CVal, dst: CVal) -> None:
    """Copy ``src`` into ``dst`` (same dtype, same element count)."""
    k.w.line(f"memcpy({dst.ptr}, {src.ptr}, sizeof({dst.ctype}) * (size_t){dst.numel()});")
