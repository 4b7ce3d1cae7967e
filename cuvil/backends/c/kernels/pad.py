"""Kernel of ``pad``: constant, reflect, edge and wrap padding, negative pads cropping first.

The pads (and axes) are read at run time even when they are constants, and checked exactly as
the reference checks them.  Each axis gets a map from output position to source position
(``-1``: the constant), built once per call; the copy then walks the output in order, so the
work per element is one table read.  Elements are copied as stored, whatever their type.
"""

from __future__ import annotations

from contextlib import ExitStack

from cuvil.backends.c.kernel import KernelCtx, kernel


@kernel("pad", computes_shape=True)
def _pad(k: KernelCtx) -> None:
    x, pads, y = k.inp(0), k.inp(1), k.out(0)
    w = k.w
    mode = str(k.attrs.get("mode", "constant"))
    rank = x.rank
    pb, pe = k.tmp("pad_b"), k.tmp("pad_e")
    w.line(f"int64_t {pb}[{max(rank, 1)}] = {{0}}, {pe}[{max(rank, 1)}] = {{0}};")
    i, a = k.tmp("i"), k.tmp("axis")
    if k.has(3):
        axes = k.inp(3)
        naxes = axes.dim(0)
        k.require(pads.dim(0), f"2 * (int64_t){naxes}", "pads length vs 2 x number of axes")
        seen = k.tmp("seen")
        w.line(f"int {seen}[{max(rank, 1)}] = {{0}};")
        with w.block(f"for (int64_t {i} = 0; {i} < (int64_t){naxes}; {i}++)"):
            w.line(f"int64_t {a} = (int64_t){axes.ptr}[{i}];")
            k.fail_if(f"{a} < -{rank} || {a} >= {rank}", f"axis %lld is out of range for rank {rank}", f"(long long){a}")
            w.line(f"if ({a} < 0) {a} += {rank};")
            k.fail_if(f"{seen}[{a}]", "axis %lld is repeated", f"(long long){a}")
            w.line(f"{seen}[{a}] = 1;")
            w.line(f"{pb}[{a}] = (int64_t){pads.ptr}[{i}]; {pe}[{a}] = (int64_t){pads.ptr}[(int64_t){naxes} + {i}];")
    else:
        k.require(pads.dim(0), str(2 * rank), "pads length vs 2 x rank")
        with w.block(f"for (int64_t {i} = 0; {i} < {rank}; {i}++)"):
            w.line(f"{pb}[{i}] = (int64_t){pads.ptr}[{i}]; {pe}[{i}] = (int64_t){pads.ptr}[{rank} + {i}];")
    cval = k.tmp("cval")
    if mode == "constant" and k.has(2):
        cv = k.inp(2)
        k.require(cv.numel(), "1", "constant_value element count")
        w.line(f"const {x.ctype} {cval} = {cv.ptr}[0];")
    else:
        w.line(f"const {x.ctype} {cval} = 0;")
    kept = k.tmp("kept")
    w.line(f"int64_t {kept}[{max(rank, 1)}] = {{0}};")
    for j in range(rank):
        w.line(f"{kept}[{j}] = (int64_t){x.dim(j)} + ({pb}[{j}] < 0 ? {pb}[{j}] : 0) + ({pe}[{j}] < 0 ? {pe}[{j}] : 0);")
        k.fail_if(f"{kept}[{j}] < 0", f"pads crop more than the %lld elements of axis {j}", f"(long long){x.dim(j)}")
        if mode != "constant":
            padded = f"({pb}[{j}] > 0 || {pe}[{j}] > 0)"
            k.fail_if(f"{padded} && {kept}[{j}] < 1", f"{mode} padding of axis {j} needs a non-empty axis")
            if mode == "reflect":
                k.fail_if(f"{padded} && ({pb}[{j}] > {kept}[{j}] - 1 || {pe}[{j}] > {kept}[{j}] - 1)",
                          f"reflect padding of axis {j} exceeds its size %lld minus 1", f"(long long){kept}[{j}]")
    static_pads = k.const(1) is not None and (not k.has(3) or k.const(3) is not None)
    if not static_pads:  # the code generator could not size the output: do it here
        for j in range(rank):
            w.line(f"{y.shape}[{j}] = (int64_t){x.dim(j)} + {pb}[{j}] + {pe}[{j}];")
        k.alloc(0)
    if rank == 0:
        w.line(f"{y.ptr}[0] = {x.ptr}[0];")
        return
    # Per axis: output position -> source position in x (-1 for the constant).
    total = " + ".join(f"{y.shape}[{j}]" for j in range(rank))
    maps = k.scratch("int64_t", total, "pad_map")
    off = "0"
    mp: list[str] = []
    for j in range(rank):
        m, o, q = k.tmp("map"), k.tmp("o"), k.tmp("q")
        w.line(f"int64_t *{m} = {maps} + {off};")
        mp.append(m)
        off = f"{off} + {y.shape}[{j}]"
        with w.block(f"for (int64_t {o} = 0; {o} < {y.shape}[{j}]; {o}++)"):
            w.line(f"int64_t {q} = {o} - ({pb}[{j}] > 0 ? {pb}[{j}] : 0);")
            w.line(f"const int64_t crop{j} = {pb}[{j}] < 0 ? -{pb}[{j}] : 0;")
            inside = f"{q} >= 0 && {q} < {kept}[{j}]"
            if mode == "constant":
                w.line(f"{m}[{o}] = ({inside}) ? crop{j} + {q} : -1;")
                continue
            with w.block(f"if (!({inside}))"):
                if mode == "edge":
                    w.line(f"{q} = {q} < 0 ? 0 : {kept}[{j}] - 1;")
                elif mode == "wrap":
                    w.line(f"{q} = cuvil_floormod({q}, {kept}[{j}]);")
                else:  # reflect: period 2 (kept - 1), the edge element not repeated
                    per = k.tmp("period")
                    w.line(f"const int64_t {per} = 2 * ({kept}[{j}] - 1);")
                    w.line(f"{q} = {per} > 0 ? cuvil_floormod({q}, {per}) : 0;")
                    w.line(f"if ({q} > {kept}[{j}] - 1) {q} = {per} - {q};")
            w.line(f"{m}[{o}] = crop{j} + {q};")
    # The copy, in output order; `ok` tracks whether all outer positions are inside x.
    yi = k.tmp("yi")
    w.line(f"int64_t {yi} = 0;")
    with ExitStack() as loops:
        src = "0"
        ok = "1"
        for j in range(rank - 1):
            o, s, v = k.tmp("o"), k.tmp("src"), k.tmp("ok")
            loops.enter_context(w.block(f"for (int64_t {o} = 0; {o} < {y.shape}[{j}]; {o}++)"))
            w.line(f"const int {v} = {ok} && {mp[j]}[{o}] >= 0;")
            w.line(f"const int64_t {s} = ({src}) * (int64_t){x.dim(j)} + ({v} ? {mp[j]}[{o}] : 0);")
            src, ok = s, v
        last = rank - 1
        base, o = k.tmp("base"), k.tmp("o")
        w.line(f"const int64_t {base} = ({src}) * (int64_t){x.dim(last)};")
        with w.block(f"if ({ok})"), w.block(f"for (int64_t {o} = 0; {o} < {y.shape}[{last}]; {o}++)"):
            w.line(f"{y.ptr}[{yi} + {o}] = {mp[last]}[{o}] >= 0 ? {x.ptr}[{base} + {mp[last]}[{o}]] : {cval};")
        with w.block("else"), w.block(f"for (int64_t {o} = 0; {o} < {y.shape}[{last}]; {o}++)"):
            w.line(f"{y.ptr}[{yi} + {o}] = {cval};")
        w.line(f"{yi} += {y.shape}[{last}];")
