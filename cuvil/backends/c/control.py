"""C for structured control flow: ``if`` and ``loop`` regions emitted inline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from cuvil import faults
from cuvil.backends.c.kernel import CVal
from cuvil.backends.c.writer import c_string
from cuvil.ir.graph import Graph, Node

if TYPE_CHECKING:
    from cuvil.backends.c.codegen import FunctionEmitter


def _copy_into(fn: FunctionEmitter, dst: CVal, src: CVal, node: Node) -> None:
    """Give ``dst`` its own copy of ``src`` (data and shape)."""
    w = fn.w
    for j in range(dst.rank):
        w.line(f"{dst.shape}[{j}] = {src.shape}[{j}];")
    fn.alloc_value(dst, node)
    w.line(f"memcpy({dst.ptr}, {src.ptr}, sizeof({dst.ctype}) * (size_t)cuvil_numel({dst.shape}, {dst.rank}));")


def _check_extent(fn: FunctionEmitter, shape: str, dims: Sequence[int | None], node: Node, what: str) -> None:
    """Fail the call unless the run-time ``shape`` has every static dim of ``dims``.

    Code inside a region (and after it) is generated for the static dims its values'
    types carry; a value that crosses the boundary with other extents would be read out
    of bounds, so each one is checked where it crosses."""
    for j, d in enumerate(dims):
        if d is None:
            continue
        w = fn.w
        w.line(f'if ({shape}[{j}] != {d}) {{ cuvil_fail(call, "node %s ({node.op}): {what} has %lld on axis {j} where '
               f'{d} is expected", {c_string(node.name)}, (long long){shape}[{j}]); goto fail; }}')


def _static_dims(c: CVal) -> list[int | None]:
    return [c.static_dim(j) for j in range(c.rank)]


def _limit_bytes(fn: FunctionEmitter, nbytes: str, node: Node) -> None:
    """Fail the call when a value the loop builds would hold more than the caller's max_output_bytes."""
    fn.w.line(f'if (cuvil_max_output_bytes && (int64_t)({nbytes}) > cuvil_max_output_bytes) {{ cuvil_fail(call, '
              f'"node %s (loop): a value it builds would hold %lld bytes, more than max_output_bytes (%lld)", '
              f'{c_string(node.name)}, (long long)({nbytes}), (long long)cuvil_max_output_bytes); goto fail; }}')


def _region(fn: FunctionEmitter, g: Graph) -> None:
    fn.emit_graph(g, keep=set(g.outputs))


def _release_region_outputs(fn: FunctionEmitter, g: Graph) -> None:
    """Free region outputs the region itself allocated (each once)."""
    done: set[str] = set()
    inside = {o for n in g.nodes for o in n.outputs}
    for v in g.outputs:
        if v in inside and v.producer is not None and v.producer.op != "constant":
            c = fn.cval(v)
            if c.ptr not in done:
                fn.w.line(f"cuvil_release(call, {c.ptr}); {c.ptr} = NULL;")
                done.add(c.ptr)


def emit(fn: FunctionEmitter, node: Node, ins: Sequence[CVal | None], outs: Sequence[CVal]) -> None:
    if node.op == "if":
        _emit_if(fn, node, ins, outs)
    else:
        _emit_loop(fn, node, ins, outs)


def _emit_if(fn: FunctionEmitter, node: Node, ins: Sequence[CVal | None], outs: Sequence[CVal]) -> None:
    w = fn.w
    cond = ins[0]
    assert cond is not None
    w.line(f'if (cuvil_numel({cond.shape}, {cond.rank}) != 1) {{ cuvil_fail(call, "node %s (if): the condition '
           f'must hold one element", {c_string(node.name)}); goto fail; }}')
    # The planted bug tests the condition as a count (> 1), so a true condition (1) runs the else branch.
    test = f"{cond.ptr}[0] > 1" if faults.active("if-branch", fn.options.faults) else f"{cond.ptr}[0]"
    for label, key in ((f"if ({test})", "then_branch"), ("else", "else_branch")):
        g: Graph = node.attrs[key]
        with w.block(label):
            _region(fn, g)
            for k, (dst, v) in enumerate(zip(outs, g.outputs)):
                src = fn.cval(v)
                _check_extent(fn, src.shape, _static_dims(dst), node, f"{key} output {k}")
                _copy_into(fn, dst, src, node)
            _release_region_outputs(fn, g)


def _emit_loop(fn: FunctionEmitter, node: Node, ins: Sequence[CVal | None], outs: Sequence[CVal]) -> None:
    w = fn.w
    body: Graph = node.attrs["body"]
    name = c_string(node.name)
    carried_in = list(ins[2:])
    n_carried = len(carried_in)
    n_scan = len(outs) - n_carried
    trips, cond, it = fn.names.fresh("trips"), fn.names.fresh("cond"), fn.names.fresh("it")
    m_in, c_in = ins[0] if ins else None, ins[1] if len(ins) > 1 else None
    w.line(f"int64_t {trips} = {m_in.ptr + '[0]' if m_in is not None else 'INT64_MAX'};")
    w.line(f"int {cond} = {'(int)' + c_in.ptr + '[0]' if c_in is not None else '1'};")
    # the carried state lives in the node's carried outputs: start from copies of the initial values
    for dst, src in zip(outs[:n_carried], carried_in):
        assert src is not None
        _copy_into(fn, dst, src, node)
    caps = [fn.names.fresh("cap") for _ in range(n_scan)]
    inner = [fn.names.fresh("inner") for _ in range(n_scan)]
    for k in range(n_scan):
        dst = outs[n_carried + k]
        w.line(f"int64_t {caps[k]} = 0, {inner[k]} = -1;")
        for j in range(dst.rank):  # a loop that never runs gives [0, static inner dims]
            d = dst.static_dim(j)
            w.line(f"{dst.shape}[{j}] = {d if j > 0 and d is not None else 0};")
    b_iter, b_cond = fn.cval(body.inputs[0]), fn.cval(body.inputs[1])
    with w.block(f"for (int64_t {it} = 0; {it} < {trips} && {cond}; {it}++)"):
        w.line(f'if (cuvil_max_loop_iterations && {it} >= cuvil_max_loop_iterations) {{ cuvil_fail(call, "node %s '
               f'(loop): runs more than %lld iterations (max_loop_iterations)", {name}, '
               f'(long long)cuvil_max_loop_iterations); goto fail; }}')
        fn.alloc_value(b_iter, node)
        w.line(f"{b_iter.ptr}[0] = {it};")
        fn.alloc_value(b_cond, node)
        w.line(f"{b_cond.ptr}[0] = (cuvil_bool){cond};")
        for k, (v, cur) in enumerate(zip(body.inputs[2:], outs[:n_carried])):  # the body reads the state in place
            c = fn.cval(v)
            _check_extent(fn, cur.shape, _static_dims(c), node, f"carried value {k}")
            w.line(f"{c.ptr} = {cur.ptr};")
            for j in range(c.rank):
                w.line(f"{c.shape}[{j}] = {cur.shape}[{j}];")
        _region(fn, body)
        res = [fn.cval(v) for v in body.outputs]
        if c_in is not None:
            w.line(f"{cond} = (int){res[0].ptr}[0];")
        for k, (dst, src) in enumerate(zip(outs[:n_carried], res[1 : 1 + n_carried])):
            _check_extent(fn, src.shape, _static_dims(dst), node, f"body output {1 + k} (carried value {k})")
            old = fn.names.fresh("old")
            w.line(f"void *{old} = {dst.ptr};")
            _limit_bytes(fn, f"sizeof({dst.ctype}) * cuvil_numel({src.shape}, {src.rank})", node)
            _copy_into(fn, dst, src, node)
            w.line(f"cuvil_release(call, {old});")
        for k in range(n_scan):
            dst, src = outs[n_carried + k], res[1 + n_carried + k]
            _check_extent(fn, src.shape, _static_dims(dst)[1:], node, f"scan output {k}")
            per = fn.names.fresh("per")
            w.line(f"int64_t {per} = cuvil_numel({src.shape}, {src.rank});")
            w.line(f"if ({inner[k]} < 0) {{ {inner[k]} = {per};")
            for j in range(src.rank):
                w.line(f"    {dst.shape}[{j + 1}] = {src.shape}[{j}];")
            w.line("}")
            checks = " || ".join([f"{dst.shape}[{j + 1}] != {src.shape}[{j}]" for j in range(src.rank)] or ["0"])
            w.line(f'if ({checks}) {{ cuvil_fail(call, "node %s (loop): scan output {k} changes shape between '
                   f'iterations", {name}); goto fail; }}')
            _limit_bytes(fn, f"sizeof({dst.ctype}) * ({dst.shape}[0] + 1) * {per}", node)
            with w.block(f"if ({dst.shape}[0] == {caps[k]})"):
                grown = fn.names.fresh("grown")
                w.line(f"{caps[k]} = {caps[k]} ? 2 * {caps[k]} : 4;")
                w.line(f"{dst.ctype} *{grown} = ({dst.ctype} *)cuvil_alloc(call, (int64_t)sizeof({dst.ctype}) * "
                       f"{caps[k]} * ({per} ? {per} : 1));")
                w.line(f'if (!{grown}) {{ cuvil_fail(call, "out of memory"); goto fail; }}')
                w.line(f"if ({dst.ptr}) memcpy({grown}, {dst.ptr}, sizeof({dst.ctype}) * (size_t)({dst.shape}[0] * {per}));")
                w.line(f"cuvil_release(call, {dst.ptr});")
                w.line(f"{dst.ptr} = {grown};")
            w.line(f"memcpy({dst.ptr} + {dst.shape}[0] * {per}, {src.ptr}, sizeof({dst.ctype}) * (size_t){per});")
            w.line(f"{dst.shape}[0] += 1;")
        w.line(f"cuvil_release(call, {b_iter.ptr}); cuvil_release(call, {b_cond.ptr});")
        _release_region_outputs(fn, body)
    for k in range(n_scan):
        dst = outs[n_carried + k]
        with w.block(f"if (!{dst.ptr})"):
            fn.alloc_value(dst, node)
