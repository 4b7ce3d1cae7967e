"""Kernels of the linear algebra ops: ``matmul``, ``gemm``, ``einsum`` and ``det``.

float32 products go through ``cuvil_sgemm`` (``cuvil_gemm.h``), whose
arbitrary strides make transposes free; a fused kernel's epilogue, when one
is offered (``KernelCtx.epilogue``), goes to ``cuvil_sgemm_ep``, which runs it
on each tile of the product as the tile is finished.  Other element types use a plain
row-at-a-time loop (unit-stride over the output row) that accumulates like
the reference: float32 for half floats, double for float64, and 64-bit
unsigned arithmetic for integers (whose wrap-around agrees with the
reference's wrapping once cast back to the element type).

``einsum`` is compiled from the parsed equation (the op's own parser) into
a loop nest: one loop per output label, then one per summed label; each
operand's offset is a sum of per-label strides (a label repeated in one
operand adds its strides: a diagonal; a dim of 1 standing for a larger
label gets stride 0: broadcasting).
"""

from __future__ import annotations

from collections.abc import Callable

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.kernel import CVal, KernelCtx, kernel
from cuvil.backends.c.kernels.half import HALF, half_buffers, half_product, round_out
from cuvil.backends.c.kernels.reduce import acc_ctype, prod_expr, to_acc
from cuvil.backends.c.kernels.shape import dims_of, prod
from cuvil.backends.c.writer import c_float, c_string
from cuvil.ir.dtypes import DType
from cuvil.ops.linalg import ELLIPSIS, parse_equation


def _mm_loops(k: KernelCtx, dt: DType, m: str, n: str, kd: str, a: str, rsa: str, csa: str,
              b: str, rsb: str, csb: str, acc: str, store: Callable[[str, str, str], str]) -> None:
    """Row-at-a-time product of non-float32 matrices; ``store(i, j, acc)`` writes one result.

    ``a``/``b`` are C pointer expressions with row and column strides; ``acc`` is scratch of ``n`` entries."""
    w = k.w
    acc_t = acc_ctype(dt)
    with w.block(f"for (int64_t i = 0; i < {m}; i++)"):
        w.line(f"for (int64_t j = 0; j < {n}; j++) {acc}[j] = 0;")
        with w.block(f"for (int64_t p = 0; p < {kd}; p++)"):
            w.line(f"const {acc_t} av = {to_acc(dt, ct.load(dt, a, f'i * {rsa} + p * {csa}'))};")
            w.line(f"const {ct.storage(dt)} *restrict bp = {b} + p * {rsb};")
            w.line(f"for (int64_t j = 0; j < {n}; j++) {acc}[j] += av * {to_acc(dt, ct.load(dt, 'bp', f'j * {csb}'))};")
        w.line(f"for (int64_t j = 0; j < {n}; j++) {store('i', 'j', f'{acc}[j]')}")


def _sgemm(k: KernelCtx, m: str, n: str, kd: str, alpha: str, a: str, rsa: str, csa: str,
           b: str, rsb: str, csb: str, beta: str, y: str, ldy: str, ep: str | None = None) -> None:
    """``cuvil_sgemm``, or ``cuvil_sgemm_ep`` finishing each tile with the epilogue ``ep`` (a C pointer)."""
    k.include("cuvil_gemm.h")
    call = f"cuvil_sgemm({m}, {n}, {kd}, {alpha}, {a}, {rsa}, {csa}, {b}, {rsb}, {csb}, {beta}, {y}, {ldy})"
    if ep is not None:
        call = f"cuvil_sgemm_ep({m}, {n}, {kd}, {alpha}, {a}, {rsa}, {csa}, {b}, {rsb}, {csb}, {beta}, {y}, {ldy}, {ep})"
    k.fail_if(f"{call} != 0", "out of memory")


def _take_epilogue(k: KernelCtx) -> str | None:
    """The epilogue a fused kernel offers (see ``KernelCtx.epilogue``), taken: float32 products apply it per tile."""
    if k.epilogue is None or k.out(0).dtype is not DType.f32:
        return None
    k.epilogue_applied = True
    k.note("the fused epilogue runs on each finished tile of the product (cuvil_sgemm_ep)")
    return k.epilogue


# matmul --------------------------------------------------------------------------------------


@kernel("matmul")
def _matmul(k: KernelCtx) -> None:
    a, b, y, w = k.inp(0), k.inp(1), k.out(0), k.w
    dt = y.dtype
    ra, rb = a.rank, b.rank
    m = a.dim(ra - 2) if ra > 1 else "1"
    ka = a.dim(ra - 1)
    kb = b.dim(rb - 2) if rb > 1 else b.dim(0)
    n = b.dim(rb - 1) if rb > 1 else "1"
    k.require(ka, kb, "matmul: the inner dims differ")
    ba, bb = max(ra - 2, 0), max(rb - 2, 0)
    nb = max(ba, bb)
    rows_max = m if bb else (prod_expr(a, 0, ra - 1) if ra > 1 else "INT64_C(1)")
    half = half_buffers(k, rows_max, n, ka) if dt in HALF else None
    acc = None if dt is DType.f32 or half else k.scratch(acc_ctype(dt), f"(int64_t){n} > 0 ? {n} : 1", "acc")
    ep = _take_epilogue(k)

    def product(rows: str, ap: str, bp: str, yp: str) -> None:
        if dt is DType.f32:
            _sgemm(k, rows, n, ka, "1.0f", ap, ka, "1", bp, n, "1", "0.0f", yp, n, ep)
        elif half:
            half_product(k, dt, half, rows, n, ka, "1.0f", ap, ka, "1", bp, n, "1", "0.0f")
            round_out(k, dt, half.y, yp, f"(int64_t){rows} * (int64_t){n}")
        else:
            assert acc is not None
            _mm_loops(k, dt, rows, n, ka, ap, ka, "1", bp, n, "1", acc,
                      lambda i, j, v: ct.store(dt, yp, f"{i} * {n} + {j}", v))

    how = ("cuvil_sgemm" if dt is DType.f32 else f"{dt} operands widened to float32 for cuvil_sgemm (bf16: "
           "cuvil_bf16_gemm where the CPU has AVX512_BF16), rounded once" if half else
           f"row-at-a-time loops accumulating in {acc_ctype(dt)}")
    if bb == 0:
        k.note(f"{how}: one product, A's batch and row dims folded into its rows (B is one matrix)")
        # B is one matrix: A's batch and row dims fold into the rows of one product.
        rows = prod_expr(a, 0, ra - 1) if ra > 1 else "INT64_C(1)"
        product(rows, a.ptr, b.ptr, y.ptr)
    else:
        k.note(f"{how}: one product per broadcast batch index ({nb} batch dims)")
        for v, r in ((a, ba), (b, bb)):
            k.fail_if(f"!cuvil_bcast_ok({v.shape}, {r}, {y.shape}, {nb})", "matmul: the batch dims do not broadcast")
        sta, stb = k.tmp("sta"), k.tmp("stb")
        w.line(f"int64_t {sta}[{nb}], {stb}[{nb}];")
        w.line(f"cuvil_bcast_strides({a.shape}, {ba}, {y.shape}, {nb}, {sta});")
        w.line(f"cuvil_bcast_strides({b.shape}, {bb}, {y.shape}, {nb}, {stb});")
        with w.block(f"for (int64_t bi = 0; bi < {prod_expr(y, 0, nb)}; bi++)"):
            w.line("int64_t rem = bi, oa = 0, ob = 0;")
            with w.block(f"for (int d = {nb - 1}; d >= 0; d--)"):
                w.line(f"const int64_t t = rem % {y.shape}[d]; rem /= {y.shape}[d];")
                w.line(f"oa += t * {sta}[d]; ob += t * {stb}[d];")
            product(m, f"({a.ptr} + oa * {m} * {ka})", f"({b.ptr} + ob * {ka} * {n})", f"({y.ptr} + bi * {m} * {n})")
    if acc:
        k.release(acc)
    if half:
        half.release(k)


# gemm ----------------------------------------------------------------------------------------


def _c_strides(k: KernelCtx, c: CVal, m: str, n: str) -> tuple[str, str]:
    """Row and column strides that read ``C`` broadcast to ``[M, N]`` (checked at run time)."""
    if c.rank == 0:
        return "0", "0"
    cn = c.dim(c.rank - 1)
    k.fail_if(f"{cn} != 1 && {cn} != {n}", "gemm: C does not broadcast to [M, N]")
    if c.rank == 1:
        return "0", f"({cn} == 1 ? 0 : 1)"
    cm = c.dim(0)
    k.fail_if(f"{cm} != 1 && {cm} != {m}", "gemm: C does not broadcast to [M, N]")
    return f"({cm} == 1 ? 0 : {cn})", f"({cn} == 1 ? 0 : 1)"


@kernel("gemm")
def _gemm(k: KernelCtx) -> None:
    a, b, y, w = k.inp(0), k.inp(1), k.out(0), k.w
    dt = y.dtype
    ta, tb = bool(k.attrs["transA"]), bool(k.attrs["transB"])
    alpha, beta = float(k.attrs["alpha"]), float(k.attrs["beta"])
    m, ka = (a.dim(1), a.dim(0)) if ta else (a.dim(0), a.dim(1))
    kb, n = (b.dim(1), b.dim(0)) if tb else (b.dim(0), b.dim(1))
    k.require(ka, kb, "gemm: the inner dims differ")
    rsa, csa = ("1", a.dim(1)) if ta else (a.dim(1), "1")
    rsb, csb = ("1", b.dim(1)) if tb else (b.dim(1), "1")
    c = k.inp(2) if k.has(2) else None
    crs, ccs = _c_strides(k, c, m, n) if c else ("0", "0")

    def c_at(i: str, j: str) -> str:
        assert c is not None
        return c.load(f"{i} * {crs} + {j} * {ccs}")

    k.note(("cuvil_sgemm" if dt is DType.f32 else f"row-at-a-time loops accumulating in {acc_ctype(dt)}")
           + (", transposes read through strides" if ta or tb else "") + (", C broadcast by strides" if c else ""))
    if dt is DType.f32:
        if c:
            scaled = c_at("i", "j") if beta == 1.0 else f"{c_float(beta)} * {c_at('i', 'j')}"
            w.line(f"for (int64_t i = 0; i < {m}; i++) for (int64_t j = 0; j < {n}; j++) {y.ptr}[i * {n} + j] = {scaled};")
        _sgemm(k, m, n, ka, c_float(alpha), a.ptr, rsa, csa, b.ptr, rsb, csb, "1.0f" if c else "0.0f", y.ptr, n,
               _take_epilogue(k))
        return
    if dt in HALF:
        k.note(f"{dt} operands widened to float32 for cuvil_sgemm (bf16: cuvil_bf16_gemm where the CPU has "
               "AVX512_BF16); alpha, beta * C and one rounding applied to the float32 product")
        bufs = half_buffers(k, m, n, ka)
        half_product(k, dt, bufs, m, n, ka, "1.0f", a.ptr, rsa, csa, b.ptr, rsb, csb, "0.0f")
        e = f"{bufs.y}[i * {n} + j]" + ("" if alpha == 1.0 else f" * {c_float(alpha)}")
        if c:
            e += f" + {c_at('i', 'j')}" + ("" if beta == 1.0 else f" * {c_float(beta)}")
        w.line(f"for (int64_t i = 0; i < {m}; i++) for (int64_t j = 0; j < {n}; j++) "
               f"{ct.store(dt, y.ptr, f'i * {n} + j', e)}")
        bufs.release(k)
        return
    acc = k.scratch(acc_ctype(dt), f"(int64_t){n} > 0 ? {n} : 1", "acc")

    def store(i: str, j: str, v: str) -> str:
        if dt.is_float:
            cc = ct.compute(dt)
            lit = c_float(alpha, "f" if cc == "float" else "")
            e = v if alpha == 1.0 else f"{v} * {lit}"
            if c:
                blit = c_float(beta, "f" if cc == "float" else "")
                e += f" + {c_at(i, j)}" if beta == 1.0 else f" + {c_at(i, j)} * {blit}"
        elif alpha == 1.0 and (c is None or beta == 1.0):
            e = v if c is None else f"{v} + {to_acc(dt, c_at(i, j))}"  # exact, wrapping integer arithmetic
        else:  # the reference scales in float64, then casts back
            e = f"(double)({ct.storage(dt)})({v})"
            if alpha != 1.0:
                e = f"{e} * {c_float(alpha, '')}"
            if c:
                e += f" + (double){c_at(i, j)}" + ("" if beta == 1.0 else f" * {c_float(beta, '')}")
        return ct.store(dt, y.ptr, f"{i} * {n} + {j}", e)

    _mm_loops(k, dt, m, n, ka, a.ptr, rsa, csa, b.ptr, rsb, csb, acc, store)
    k.release(acc)


# einsum --------------------------------------------------------------------------------------


@kernel("einsum")
def _einsum(k: KernelCtx) -> None:
    ops = [k.inp(i) for i in range(len(k.ins))]
    y, w = k.out(0), k.w
    dt = y.dtype
    eq = parse_equation(k.attrs["equation"], len(ops))
    # Each operand's axes as labels, the ellipsis expanded to right-aligned labels "...0", "...1", ...
    n_ell = max((v.rank - (len(t) - 1) for v, t in zip(ops, eq.inputs) if ELLIPSIS in t), default=0)
    ell = [f"...{i}" for i in range(n_ell)]
    axes: list[list[str]] = []
    for v, term in zip(ops, eq.inputs):
        labels: list[str] = []
        for t in term:
            labels.extend(ell[n_ell - (v.rank - (len(term) - 1)):] if t == ELLIPSIS else [t])
        axes.append(labels)
    out = [lab for t in eq.output for lab in (ell if t == ELLIPSIS else [t])]
    loops = list(dict.fromkeys(out + [lab for labels in axes for lab in labels]))
    size = {lab: k.tmp("sz") for lab in loops}
    for lab in loops:
        w.line(f"int64_t {size[lab]} = 1;")
    for i, (v, labels) in enumerate(zip(ops, axes)):
        for j, lab in enumerate(labels):
            first = labels.index(lab)
            d = v.dim(j)
            name = c_string(lab)  # the label is model text: an argument, never part of the format
            if first != j:
                k.fail_if(f"{d} != {v.dim(first)}", f"einsum: input {i} repeats label %s over dims %lld and %lld",
                          name, f"(long long){v.dim(first)}", f"(long long){d}")
            k.fail_if(f"{d} != 1 && {size[lab]} != 1 && {size[lab]} != {d}",
                      f"einsum: input {i} gives label %s size %lld, an earlier input %lld",
                      name, f"(long long){d}", f"(long long){size[lab]}")
            w.line(f"if ({d} != 1) {size[lab]} = {d};")
    for j, lab in enumerate(out):
        k.require(y.dim(j), size[lab], f"einsum: output dim {j}")
    # Per operand and loop label: the stride (sum over the axes carrying the label; 0 where broadcast).
    strides: list[dict[str, str]] = []
    for v, labels in zip(ops, axes):
        st: dict[str, str] = {}
        for j, lab in enumerate(labels):
            add = f"({v.dim(j)} == 1 ? 0 : {prod_expr(v, j + 1, v.rank)})"
            st[lab] = f"{st[lab]} + {add}" if lab in st else add
        names: dict[str, str] = {}
        for lab, e in st.items():
            names[lab] = k.tmp("es")
            w.line(f"const int64_t {names[lab]} = {e};")
        strides.append(names)
    acc_t = acc_ctype(dt)
    idx = {lab: k.tmp("e") for lab in loops}
    with w.block(""):
        w.line("int64_t o = 0;")
        for lab in out:
            w.line(f"for (int64_t {idx[lab]} = 0; {idx[lab]} < {size[lab]}; {idx[lab]}++) {{")
        w.line(f"{acc_t} acc = 0;")
        for lab in loops[len(out):]:
            w.line(f"for (int64_t {idx[lab]} = 0; {idx[lab]} < {size[lab]}; {idx[lab]}++) {{")
        terms = []
        for v, st in zip(ops, strides):
            off = " + ".join(f"{idx[lab]} * {s}" for lab, s in st.items()) or "0"
            terms.append(to_acc(dt, v.load(off)))
        w.line(f"acc += {' * '.join(terms)};")
        for _ in loops[len(out):]:
            w.line("}")
        w.line(y.store("o", "acc"))
        w.line("o++;")
        for _ in out:
            w.line("}")


# det ---------------------------------------------------------------------------------------


@kernel("det")
def _det(k: KernelCtx) -> None:
    """Each matrix copied to float64, then Gaussian elimination with partial pivoting: the determinant
    is the pivots' product, its sign flipped per row swap (LAPACK's getrf, as NumPy's det uses)."""
    x, y, w = k.inp(0), k.out(0), k.w
    r = x.rank
    n = x.dim(r - 1)
    k.require(x.dim(r - 2), n, "matrix dims")
    batch, b, a, det = k.tmp("batch"), k.tmp("b"), k.tmp("a"), k.tmp("det")
    w.line(f"const int64_t {batch} = {prod(dims_of(x, 0, r - 2))};")
    w.line(f"const int64_t nn = {n};")
    a_buf = k.scratch("double", "nn * nn > 0 ? nn * nn : 1", "lu")
    with w.block(f"for (int64_t {b} = 0; {b} < {batch}; {b}++)"):
        w.line(f"double *{a} = {a_buf};")
        w.line(f"for (int64_t i = 0; i < nn * nn; i++) {a}[i] = (double){x.load(f'{b} * nn * nn + i')};")
        w.line(f"double {det} = 1.0;")
        with w.block("for (int64_t c = 0; c < nn; c++)"):
            w.line("int64_t p = c;")
            w.line(f"for (int64_t i = c + 1; i < nn; i++) if (fabs({a}[i * nn + c]) > fabs({a}[p * nn + c])) p = i;")
            w.line(f"if ({a}[p * nn + c] == 0.0) {{ {det} = 0.0; break; }}")
            with w.block("if (p != c)"):
                w.line(f"for (int64_t j = 0; j < nn; j++) {{ double t = {a}[c * nn + j]; "
                       f"{a}[c * nn + j] = {a}[p * nn + j]; {a}[p * nn + j] = t; }}")
                w.line(f"{det} = -{det};")
            w.line(f"{det} *= {a}[c * nn + c];")
            with w.block("for (int64_t i = c + 1; i < nn; i++)"):
                w.line(f"const double f = {a}[i * nn + c] / {a}[c * nn + c];")
                w.line(f"for (int64_t j = c + 1; j < nn; j++) {a}[i * nn + j] -= f * {a}[c * nn + j];")
        w.line(y.store(b, f"({y.ctype_compute}){det}"))
    k.release(a_buf)
