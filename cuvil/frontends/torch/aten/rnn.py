"""ATen's recurrent layers (``lstm.input``, ``gru.input``, ``rnn_tanh.input``, ``rnn_relu.input``) and
Cuvil's torch ops that stand for them during export (``cuvil::lstm`` ...: cuvil/frontends/torch/recurrent.py),
as Cuvil's recurrence (cuvil/frontends/recurrent.py): every layer, each direction.

PyTorch's weights are reordered to ONNX's gate order (LSTM's i, f, g, o to i, o, f, c; GRU's r,
z, n to z, r, h), and PyTorch's GRU is ONNX's with ``linear_before_reset``.  Layer ``l + 1``
reads layer ``l``'s output (both directions, concatenated); the results are the last layer's
output and each layer's and direction's final states.  Dropout between layers runs only in
training, which is refused, as is a parameter list of another length (LSTM's ``proj_size``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil.frontends.recurrent import Activation, Recurrence, Weights
from cuvil.frontends.torch.aten.common import ints_const, is_node, mapping
from cuvil.frontends.torch.converter import TorchCtx
from cuvil.ir.graph import Value
from cuvil.ops.common import const_of

# cell -> (the ONNX gate each ONNX gate position takes from PyTorch's order, activations)
_CELLS: dict[str, tuple[list[int], tuple[Activation, ...]]] = {
    "lstm": ([0, 3, 1, 2], (Activation("sigmoid"), Activation("tanh"), Activation("tanh"))),
    "gru": ([1, 0, 2], (Activation("sigmoid"), Activation("tanh"))),
    "rnn_tanh": ([0], (Activation("tanh"),)),
    "rnn_relu": ([0], (Activation("relu"),)),
}


def _gates(ctx: TorchCtx, v: Value, order: list[int]) -> Value | np.ndarray:
    """A weight or bias with its gate blocks (along dim 0) in ONNX's order."""
    c = const_of(v)
    if len(order) == 1:
        return c if c is not None else v
    if c is not None:
        return np.ascontiguousarray(np.concatenate([np.split(c, len(order))[k] for k in order]))
    parts = ctx.emit("split", [v], {"axis": 0, "num_outputs": len(order)}, num_outputs=len(order))
    return ctx.emit1("concat", [parts[k] for k in order], {"axis": 0})


def _initial(ctx: TorchCtx, state: Value | None, k: int) -> Value | None:
    """Row ``k`` (layer and direction) of an initial state [layers * directions, batch, hidden]; None for zeros."""
    if state is None:
        return None
    c = const_of(state)
    if c is not None and not np.any(c):
        return None
    return ctx.emit1("gather", [state, ctx.constant(np.array(k, np.int64))], {"axis": 0})


def _convert(ctx: TorchCtx, cell: str) -> list[Value]:
    x = ctx.value(ctx.arg(0))
    hx_arg = ctx.arg(1)
    hx = [ctx.value(a) for a in hx_arg] if isinstance(hx_arg, (list, tuple)) else [ctx.value(hx_arg)]
    params = [ctx.value(p) for p in ctx.arg(2)]
    has_biases, num_layers, _dropout, train, bidirectional, batch_first = (ctx.arg(i) for i in range(3, 9))
    if any(is_node(a) for a in (has_biases, num_layers, train, bidirectional, batch_first)):
        raise ctx.fail("the layer's configuration must be constants of the export")
    if train:
        raise ctx.unsupported("train=True (dropout between layers in training mode): call model.eval()")
    n_states = 2 if cell == "lstm" else 1
    if hx and len(hx) != n_states:
        raise ctx.fail(f"{cell} takes {n_states} initial state(s), got {len(hx)}")
    nd = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    if len(params) != per * num_layers * nd:
        raise ctx.unsupported(f"{len(params)} parameters for {num_layers} layer(s) of {nd} direction(s) "
                              f"(expected {per} each; LSTM's proj_size is not supported)")
    if x.type.rank != 3:
        raise ctx.fail(f"the input must be 3-D, got {x.type}")
    hidden = params[1].type.shape[1]
    if not isinstance(hidden, int):
        raise ctx.fail(f"the hidden size must be static, got {params[1].type}")
    order, acts = _CELLS[cell]
    h0 = hx[0] if hx else None
    c0 = hx[1] if len(hx) > 1 else None
    inp = ctx.emit1("transpose", [x], {"perm": [1, 0, 2]}) if batch_first else x
    finals: list[list[Value]] = [[] for _ in range(n_states)]
    for layer in range(num_layers):
        rec = Recurrence(ctx, "rnn" if cell.startswith("rnn") else cell, inp, hidden,
                         linear_before_reset=cell == "gru", name=ctx.name)
        ys = []
        for d in range(nd):
            k = layer * nd + d
            w_ih, w_hh, *biases = params[k * per:(k + 1) * per]
            wb, rb = (_gates(ctx, b, order) for b in biases) if biases else (None, None)
            y, h, c = rec.run(Weights(_gates(ctx, w_ih, order), _gates(ctx, w_hh, order), acts, wb=wb, rb=rb,
                                      h0=_initial(ctx, h0, k), c0=_initial(ctx, c0, k), reverse=d == 1))
            ys.append(y)
            finals[0].append(h)
            if c is not None:
                finals[1].append(c)
        inp = ys[0] if nd == 1 else ctx.emit1("concat", ys, {"axis": -1})
    out = ctx.emit1("transpose", [inp], {"perm": [1, 0, 2]}) if batch_first else inp
    zero = ints_const(ctx, [0])
    states = [ctx.emit1("concat", [ctx.emit1("unsqueeze", [s, zero]) for s in f], {"axis": 0}) for f in finals]
    return [out, *states]


@mapping("aten.lstm.input", "cuvil.lstm.default")
def _lstm(ctx: TorchCtx) -> Any:
    return _convert(ctx, "lstm")


@mapping("aten.gru.input", "cuvil.gru.default")
def _gru(ctx: TorchCtx) -> Any:
    return _convert(ctx, "gru")


@mapping("aten.rnn_tanh.input", "cuvil.rnn_tanh.default")
def _rnn_tanh(ctx: TorchCtx) -> Any:
    return _convert(ctx, "rnn_tanh")


@mapping("aten.rnn_relu.input", "cuvil.rnn_relu.default")
def _rnn_relu(ctx: TorchCtx) -> Any:
    return _convert(ctx, "rnn_relu")
