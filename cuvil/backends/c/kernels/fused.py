"""Kernels of the fused ops (``cuvil/ops/fused.py``): elementwise chains as one loop, and
Conv/Gemm/MatMul with an elementwise epilogue.

A fused region is a tree of elementwise ops (the fusion passes never put a value read twice
inside one), so it composes into one C expression from the ops' scalar expressions
(:data:`~cuvil.backends.c.kernels.elementwise.SCALAR`): the region's inputs are the loop's
local variables, each intermediate is substituted where it is read.  An f32 or f64 value's
compute type is its storage type, so an intermediate kept in a register rounds exactly as the
unfused kernel storing it does; an f16 or bf16 intermediate is computed in float32 and rounded to
its type where it is defined (but for ops whose result is an operand's value), so fused and unfused
kernels give bitwise the same result, the reference's (each op rounds its own result).

The epilogue of ``fused_conv`` / ``fused_gemm`` / ``fused_matmul`` reads each extra operand
as one element, a full tensor (a residual) or a vector along the last axis (a bias).  For a
float32 ``gemm`` / ``matmul`` it becomes a tile function (``cuvil_sgemm_epilogue``,
``cuvil_gemm.h``) that the base kernel hands to the GEMM, which runs it on each tile of the
product as soon as the tile is finished (in L1, right after the micro-kernel's last store): no
second pass over the output.  Elsewhere (other element types; ``conv`` unless its kernel takes
the epilogue itself) it runs right after the base kernel, in place over the result, as a row
loop (for a float16 result, over chunks widened to float32 and rounded back by the vectorised
bulk conversions of ``cuvil_half.h``).  Both evaluate the same composed scalar expression on the
same float32 result, so they give bitwise the same output.  An f16/bf16 convolution whose epilogue
is only a clamp (relu, or clip by constant bounds) applies it before rounding its result
(``KernelCtx.clamp``): the same bits, since the bounds are values of the result's type.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.codegen import CodegenError
from cuvil.backends.c.kernel import CVal, KernelCtx, find_kernel, kernel
from cuvil.backends.c.kernels.common import F16_CHUNK, elementwise, parallel_flat
from cuvil.backends.c.kernels.elementwise import MATH_HEADER, SCALAR, Scalar, constant_not_nan, nan_max, nan_min
from cuvil.backends.c.kernels.half import HALF
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ops.fused import EPILOGUE_BASES, extra_kind
from cuvil.ops.registry import get


def _clip(s: Scalar, node: Node, args: dict[Value, str], not_nan: frozenset[str]) -> str:
    y = args[node.inputs[0]]  # type: ignore[index]
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        lo = args[node.inputs[1]]
        y = nan_max(s, y, lo, lo in not_nan)
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        hi = args[node.inputs[2]]
        y = nan_min(s, y, hi, hi in not_nan)
    return y


def describe(k: KernelCtx, region: Graph) -> None:
    """One comment per node of ``region``, as the generator writes for every node it emits."""
    for n in region.nodes:
        args = ", ".join("_" if v is None else f"%{v.name}" for v in n.inputs)
        k.w.comment(f"  fused node '{n.name}': {', '.join(f'%{o.name}' for o in n.outputs)} = {n.op}({args})")


# Ops whose result is one of their operands' values, or its negation: an f16/bf16 result of f16/bf16
# operands is representable as it is, and rounding it would change nothing.
_EXACT = frozenset({"relu", "max", "min", "clip", "neg", "abs", "sign"})


def _rounded(dt: DType, expr: str) -> str:
    """``expr`` (float32) rounded to the f16/bf16 ``dt`` and read back, as storing and loading it would.

    float16 by ``cuvil_f16_round_f`` (``cuvil_half.h``: the same bits, in operations that vectorise;
    a kernel composing one includes the header, see :func:`_include_half`)."""
    if dt is DType.f16:
        return f"cuvil_f16_round_f({expr})"
    return f"cuvil_bf16_to_f32({ct.convert(dt, expr)})"


def _include_half(k: KernelCtx, region: Graph) -> None:
    """Include ``cuvil_half.h`` when ``region`` has a float16 value (its rounding is defined there)."""
    if any(v.type.dtype is DType.f16 for n in region.nodes for v in n.outputs):
        k.include("cuvil_half.h")


def compose(body: Graph, leaves: Sequence[str], not_nan: frozenset[str] = frozenset()) -> str:
    """The C expression of ``body``'s output with its inputs named ``leaves`` (compute-type locals).

    The output's expression is in its compute type (its store rounds it); an f16/bf16 intermediate
    is rounded to its type where it is defined, as the unfused kernel storing it does.  ``not_nan``:
    the leaves known not to be NaN (read from constants without NaN), whose clips take the shorter
    NaN test."""
    names: dict[Value, str] = dict(zip(body.inputs, leaves))
    for n in body.nodes:
        present = [v for v in n.inputs if v is not None]
        out = n.outputs[0]
        s = Scalar(tuple(v.type.dtype for v in present), out.type.dtype, get(n.op).fill_attrs(n.attrs))
        if n.op == "clip":
            expr = _clip(s, n, names, not_nan)
        elif n.op in SCALAR:
            expr = SCALAR[n.op](s, [names[v] for v in present])
        else:
            raise CodegenError(f"{n.op} in a fused region has no scalar expression")
        exact = n.op in _EXACT and all(v.type.dtype is out.type.dtype for v in present)
        if out.type.dtype in HALF and out is not body.outputs[0] and not exact:
            expr = _rounded(out.type.dtype, expr)
        names[out] = f"({expr})"
    return names[body.outputs[0]]


@kernel("fused_elementwise", in_place=True)
def _fused_elementwise(k: KernelCtx) -> None:
    k.include(MATH_HEADER)
    body = k.attrs["body"]
    _include_half(k, body)
    k.note(f"fused elementwise loop: {', '.join(n.op for n in body.nodes)}")
    describe(k, body)
    operands = [k.inp(i).value for i in range(len(k.ins)) if k.has(i)]  # as elementwise() reads them
    constant = frozenset(i for i, v in enumerate(operands) if constant_not_nan(v))
    elementwise(k, lambda args: compose(body, args, frozenset(args[i] for i in constant)))


@kernel(*EPILOGUE_BASES)
def _fused_linear(k: KernelCtx) -> None:
    """The base op's kernel, then the epilogue in place over its result."""
    k.include(MATH_HEADER)
    _include_half(k, k.attrs["epilogue"])
    base = EPILOGUE_BASES[k.node.op]
    n_base = len(get(base).inputs)
    attrs = {key: v for key, v in k.attrs.items() if key != "epilogue"}
    node = Node(base, k.node.inputs[:n_base], [], attrs, k.node.name)
    node.outputs = list(k.node.outputs)  # shared, not re-pointed: the graph's values keep their producer
    sub = k.derive(node, k.ins[:n_base], k.outs, k.allocated)
    if base == "conv":  # by Winograd, the epilogue runs inside the output transform
        from cuvil.backends.c.kernels.conv import conv_with_epilogue

        extras = [v for v in k.ins[n_base:] if v is not None]
        if conv_with_epilogue(sub, k.attrs["epilogue"], extras):
            describe(k, k.attrs["epilogue"])
            return
    emitter = find_kernel(base)
    if emitter is None:
        raise CodegenError(f"{base} has no C kernel")
    epilogue: Graph = k.attrs["epilogue"]
    extras = [v for v in k.ins[n_base:] if v is not None]
    if base in _TILE_EPILOGUE_BASES and k.out(0).dtype is DType.f32:
        sub.epilogue = _tile_epilogue(k, epilogue, k.out(0), extras)
    elif base in _CLAMP_BASES and k.out(0).dtype in HALF:
        sub.clamp = _clamp(k, epilogue, extras)
    emitter.emit(sub)
    describe(k, epilogue)
    if sub.epilogue_applied:
        k.note(f"epilogue on each finished tile of the {base} product: {', '.join(n.op for n in epilogue.nodes)}")
        return
    k.note(f"epilogue after the {base} kernel, one pass over its result: {', '.join(n.op for n in epilogue.nodes)}")
    _apply_epilogue(k, epilogue, k.out(0), extras)


# Base ops whose float32 kernels take a tile epilogue (linalg.py, conv.py, conv_nhwc.py: cuvil_sgemm_ep).
_TILE_EPILOGUE_BASES = frozenset({"gemm", "matmul", "conv", "conv_nhwc"})


# Base ops whose f16/bf16 kernels take a clamp epilogue (conv_nhwc.py: cuvil_conv_nhwc_half; conv.py:
# half.half_conv).
_CLAMP_BASES = frozenset({"conv_nhwc", "conv"})


def _clamp(k: KernelCtx, epilogue: Graph, extras: Sequence[CVal]) -> tuple[str, str] | None:
    """``epilogue`` as a clamp of the product (``KernelCtx.clamp``), or None when it is anything else:
    one ``relu``, or one ``clip`` of the product by bounds that are scalar operands known not to be
    NaN (constants), of the result's own type, or absent.  The bounds are read once, here."""
    if len(epilogue.nodes) != 1 or epilogue.outputs[0] is not epilogue.nodes[0].outputs[0]:
        return None
    n = epilogue.nodes[0]
    if not n.inputs or n.inputs[0] is not epilogue.inputs[0]:
        return None
    if n.op == "relu":
        return "0.0f", "INFINITY"
    if n.op != "clip":
        return None
    operands = dict(zip(epilogue.inputs[1:], zip(extras, _extra_kinds(k, k.out(0), extras))))
    found: list[CVal | None] = []
    for i in (1, 2):
        v = n.inputs[i] if len(n.inputs) > i else None
        if v is None:
            found.append(None)
            continue
        e, kind = operands.get(v, (None, ""))
        if e is None or kind != "scalar" or e.dtype is not k.out(0).dtype or not constant_not_nan(e.value):
            return None
        found.append(e)
    # C is emitted only once every bound is known to fit
    lo, hi = (_scalar_leaf(k, e, set()) if e is not None else none
              for e, none in zip(found, ("-INFINITY", "INFINITY")))
    return lo, hi


def _extra_kinds(k: KernelCtx, y: CVal, extras: Sequence[CVal]) -> list[str]:
    """How each epilogue operand is read against the result ``y`` (``extra_kind``): scalar, full or row."""
    kinds: list[str] = []
    for e in extras:
        kind = extra_kind(y.value.type.shape, e.value.type.shape)
        if kind not in ("scalar", "full", "row"):
            raise CodegenError(f"node {k.node.name!r}: epilogue operand {e.value} does not fit {y.value}")
        kinds.append(kind)
    return kinds


def _scalar_leaf(k: KernelCtx, e: CVal, not_nan: set[str]) -> str:
    """Read a scalar epilogue operand once, before the loops: the name of the C value, which joins
    ``not_nan`` when the operand is a constant without NaN."""
    name = k.tmp("s")
    k.w.line(f"const {e.ctype_compute} {name} = {e.load('0')};")
    if constant_not_nan(e.value):
        not_nan.add(name)
    return name


def _tile_epilogue(k: KernelCtx, epilogue: Graph, y: CVal, extras: Sequence[CVal]) -> str:
    """Define the tile function of ``epilogue`` over the float32 result ``y`` and declare its context;
    returns the C address of the ``cuvil_sgemm_epilogue`` describing it.

    The GEMM calls the function with a tile of its C inside ``y`` (any layout: the tile's rows are
    located by their offset from ``y``): a full extra is read at the same offset, a row extra at
    the offset modulo the last dim (per row of the tile, one division; per element only where a
    tile row wraps past the end of the last axis), a scalar from the context."""
    k.include("cuvil_gemm.h")
    fields = ["    const float *y;", "    int64_t nl; /* y's last dim */"]
    inits = [f".y = {y.ptr}", f".nl = {y.dim(y.rank - 1) if y.rank else '1'}"]
    per_row: list[str] = []
    fast, slow = ["acc"], ["acc"]
    not_nan: set[str] = set()
    wraps = False
    for i, (e, kind) in enumerate(zip(extras, _extra_kinds(k, y, extras))):
        if kind == "scalar":
            fields.append(f"    {e.ctype_compute} s{i};")
            inits.append(f".s{i} = {e.load('0')}")
            fast.append(f"x->s{i}")
            slow.append(f"x->s{i}")
            if constant_not_nan(e.value):
                not_nan.add(f"x->s{i}")
        elif kind == "full":
            fields.append(f"    const {e.ctype} *e{i};")
            inits.append(f".e{i} = {e.ptr}")
            per_row.append(f"        const {e.ctype} *pe{i} = x->e{i} + o;")
            fast.append(ct.load(e.dtype, f"pe{i}", "j"))
            slow.append(ct.load(e.dtype, f"pe{i}", "j"))
        else:  # row
            fields.append(f"    const {e.ctype} *e{i};")
            inits.append(f".e{i} = {e.ptr}")
            per_row.append(f"        const {e.ctype} *pe{i} = x->e{i} + col;")
            fast.append(ct.load(e.dtype, f"pe{i}", "j"))
            slow.append(ct.load(e.dtype, f"x->e{i}", "(o + j) % x->nl"))
            wraps = True

    def loop(leaves: list[str], indent: str) -> list[str]:
        return [f"{indent}for (int64_t j = 0; j < cols; j++) {{",
                f"{indent}    const float acc = py[j];",
                f"{indent}    py[j] = {compose(epilogue, leaves, frozenset(not_nan))};",
                f"{indent}}}"]

    located = bool(per_row)  # some extra is read at the tile's offset in y
    body = ["        float *py = c + i * ldc;"] + (["        const int64_t o = off + i * ldc;"] if located else [])
    body += per_row
    if wraps:
        body += ["        if (col + cols <= x->nl) {", *loop(fast, "            "), "        } else {",
                 *loop(slow, "            "), "        }",
                 "        col += step;  /* the next row's column: two divisions a tile, not one a row */",
                 "        if (col >= x->nl) col -= x->nl;"]
    else:
        body += loop(fast, "        ")
    text = "\n".join([
        "typedef struct NAME_ctx {", *fields, "} NAME_ctx;",
        "static void NAME(const void *vctx, float *c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols) {",
        "    const NAME_ctx *x = (const NAME_ctx *)vctx;",
        "    (void)x, (void)i0, (void)j0;",
        *(["    const int64_t off = (int64_t)(c - x->y);"] if located else []),
        *(["    const int64_t step = ldc % x->nl;", "    int64_t col = off % x->nl;"] if wraps else []),
        "    for (int64_t i = 0; i < rows; i++) {", *body, "    }", "}", ""])
    # Named by its text: nodes with the same epilogue share one function, and no two differ by name only.
    name = "cuvil_epi_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    k.define(name, text.replace("NAME", name))
    ctx, desc = k.tmp("epi_ctx"), k.tmp("epi")
    k.w.line(f"const {name}_ctx {ctx} = {{{', '.join(inits)}}};")
    k.w.line(f"const cuvil_sgemm_epilogue {desc} = {{{name}, &{ctx}}};")
    return f"&{desc}"


def _apply_epilogue(k: KernelCtx, epilogue: Graph, y: CVal, extras: Sequence[CVal]) -> None:
    """``y = epilogue(y, extras...)`` in place, row by row (rows along ``y``'s last axis), ranges of rows
    split over the call's threads when the bytes streamed pay for it; every element is computed
    alone, so the result does not depend on the thread count."""
    if y.dtype is DType.f16:
        _apply_epilogue_f16(k, epilogue, y, extras)
        return
    w = k.w
    with w.block(""):
        last = y.dim(y.rank - 1) if y.rank else "1"
        n_last, rows, base = k.tmp("nl"), k.tmp("rows"), k.tmp("py0")
        w.line(f"const int64_t {n_last} = {last};")
        w.line(f"const int64_t {rows} = {n_last} > 0 ? {y.numel()} / {n_last} : 0;")
        w.line(f"{y.ctype} *{base} = {y.ptr};")
        # the locals the row loop reads (field type, declaration prefix, name): it runs in a function
        # of its own over ranges of rows, on the call's threads when that pays (parallel_flat)
        local: list[tuple[str, str, str]] = [("int64_t", "const int64_t ", n_last), (f"{y.ctype} *", f"{y.ctype} *", base)]
        streamed = [f"2 * sizeof({y.ctype})"]
        acc, py, j = k.tmp("acc"), k.tmp("py"), k.tmp("j")
        leaves = [acc]
        not_nan: set[str] = set()
        row_ptrs: list[tuple[str, str, CVal, str]] = []
        for e, kind in zip(extras, _extra_kinds(k, y, extras)):
            if kind == "scalar":
                leaf = _scalar_leaf(k, e, not_nan)
                leaves.append(leaf)
                local.append((e.ctype_compute, f"const {e.ctype_compute} ", leaf))
            else:
                eb, p = k.tmp("pe0"), k.tmp("pe")
                w.line(f"const {e.ctype} *{eb} = {e.ptr};")
                local.append((f"const {e.ctype} *", f"const {e.ctype} *", eb))
                row_ptrs.append((p, eb, e, kind))
                leaves.append(ct.load(e.dtype, p, j))
                if kind == "full":
                    streamed.append(f"sizeof({e.ctype})")

        def loop(lo: str, hi: str) -> None:
            r = k.tmp("r")
            with w.block(f"for (int64_t {r} = {lo}; {r} < {hi}; {r}++)"):
                w.line(f"{y.ctype} *{py} = {base} + {r} * {n_last};")
                for p, eb, e, kind in row_ptrs:
                    offset = f" + {r} * {n_last}" if kind == "full" else ""
                    w.line(f"const {e.ctype} *{p} = {eb}{offset};")
                with w.block(f"for (int64_t {j} = 0; {j} < {n_last}; {j}++)"):
                    w.line(f"const {y.ctype_compute} {acc} = {ct.load(y.dtype, py, j)};")
                    w.line(ct.store(y.dtype, py, j, compose(epilogue, leaves, frozenset(not_nan))))

        parallel_flat(k, rows, f"(double)({y.numel()}) * (double)({' + '.join(streamed)})", local, loop)


def _apply_epilogue_f16(k: KernelCtx, epilogue: Graph, y: CVal, extras: Sequence[CVal]) -> None:
    """``_apply_epilogue`` for a float16 result, in chunks that vectorise.

    A float16 value loaded or stored one at a time (F16C's scalar conversions, or the portable bit
    manipulation) keeps the loop from vectorising, so the result and each float16 full extra are
    widened a chunk at a time by the vectorised ``cuvil_f16_to_f32_n`` into float32 buffers, the
    composed expression runs over the buffers, and the chunk is rounded back by
    ``cuvil_f32_to_f16_n``: the same conversions (round to nearest even) as the scalar loop, so
    bitwise the same result.  A row extra (a bias along the last axis) is widened once into float32
    scratch, and without one the tensor runs as rows of one chunk (long chunks whatever the last
    dim).  Ranges of rows run on the call's threads when that pays.  A chunk is read whole before
    it is written, so an extra may share ``y``'s memory."""
    k.include("cuvil_half.h")
    w = k.w
    with w.block(""):
        kinds = _extra_kinds(k, y, extras)
        has_row = "row" in kinds
        n_last, rows, total, base = k.tmp("nl"), k.tmp("rows"), k.tmp("total"), k.tmp("py0")
        w.line(f"const int64_t {total} = {y.numel()};")
        if has_row:
            w.line(f"const int64_t {n_last} = {y.dim(y.rank - 1) if y.rank else '1'};")
            w.line(f"const int64_t {rows} = {n_last} > 0 ? {total} / {n_last} : 0;")
        else:  # rows of one chunk each, the last one short
            w.line(f"const int64_t {n_last} = {F16_CHUNK};")
            w.line(f"const int64_t {rows} = ({total} + {F16_CHUNK} - 1) / {F16_CHUNK};")
        w.line(f"{y.ctype} *{base} = {y.ptr};")
        # the locals the row loop reads: it runs in a function of its own over ranges of rows, on the
        # call's threads when that pays (parallel_flat)
        local: list[tuple[str, str, str]] = [("int64_t", "const int64_t ", n_last), ("int64_t", "const int64_t ", total),
                                             (f"{y.ctype} *", f"{y.ctype} *", base)]
        streamed = [f"2 * sizeof({y.ctype})"]
        acc, j, j0, m, cy = k.tmp("acc"), k.tmp("j"), k.tmp("j0"), k.tmp("m"), k.tmp("cy")
        leaves = [acc]
        not_nan: set[str] = set()
        fulls: list[tuple[str, str, str, CVal]] = []  # (row pointer, chunk buffer, base pointer, extra)
        row_ptrs: list[tuple[str, str, CVal]] = []
        owned: list[str] = []
        for e, kind in zip(extras, kinds):
            if kind == "scalar":
                leaf = _scalar_leaf(k, e, not_nan)
                leaves.append(leaf)
                local.append((e.ctype_compute, f"const {e.ctype_compute} ", leaf))
            elif kind == "row":  # the same last-axis vector for every row: widened once
                vec = k.scratch("float", f"{n_last} > 0 ? {n_last} : 1", "rw")
                owned.append(vec)
                iv = k.tmp("i")
                with w.block(f"for (int64_t {iv} = 0; {iv} < {n_last}; {iv}++)"):
                    w.line(f"{vec}[{iv}] = {e.load(iv)};")
                local.append(("const float *", "const float *", vec))
                leaves.append(f"{vec}[{j0} + {j}]")
            else:
                p, eb = k.tmp("pe"), k.tmp("pe0")
                w.line(f"const {e.ctype} *{eb} = {e.ptr};")
                local.append((f"const {e.ctype} *", f"const {e.ctype} *", eb))
                streamed.append(f"sizeof({e.ctype})")
                if e.dtype is DType.f16:
                    buf = k.tmp("ce")
                    fulls.append((p, buf, eb, e))
                    leaves.append(f"{buf}[{j}]")
                else:
                    row_ptrs.append((p, eb, e))
                    leaves.append(ct.load(e.dtype, p, f"{j0} + {j}"))

        def loop(lo: str, hi: str) -> None:
            r, py, length = k.tmp("r"), k.tmp("py"), k.tmp("len")
            with w.block(f"for (int64_t {r} = {lo}; {r} < {hi}; {r}++)"):
                w.line(f"{y.ctype} *{py} = {base} + {r} * {n_last};")
                w.line(f"const int64_t {length} = {total} - {r} * {n_last} < {n_last} ? {total} - {r} * {n_last} : "
                       f"{n_last};")
                for p, _, eb, e in fulls:
                    w.line(f"const {e.ctype} *{p} = {eb} + {r} * {n_last};")
                for p, eb, e in row_ptrs:
                    w.line(f"const {e.ctype} *{p} = {eb} + {r} * {n_last};")
                with w.block(f"for (int64_t {j0} = 0; {j0} < {length}; {j0} += {F16_CHUNK})"):
                    w.line(f"const int64_t {m} = {length} - {j0} < {F16_CHUNK} ? {length} - {j0} : {F16_CHUNK};")
                    w.line(f"float {cy}[{F16_CHUNK}];")
                    w.line(f"cuvil_f16_to_f32_n({py} + {j0}, {cy}, {m});")
                    for p, buf, _, _ in fulls:
                        w.line(f"float {buf}[{F16_CHUNK}];")
                        w.line(f"cuvil_f16_to_f32_n({p} + {j0}, {buf}, {m});")
                    with w.block(f"for (int64_t {j} = 0; {j} < {m}; {j}++)"):
                        w.line(f"const float {acc} = {cy}[{j}];")
                        w.line(f"{cy}[{j}] = {compose(epilogue, leaves, frozenset(not_nan))};")
                    w.line(f"cuvil_f32_to_f16_n({cy}, {py} + {j0}, {m});")

        parallel_flat(k, rows, f"(double){total} * (double)({' + '.join(streamed)})", local, loop)
        for buf in owned:
            k.release(buf)
