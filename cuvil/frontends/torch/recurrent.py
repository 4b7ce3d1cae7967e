"""PyTorch's recurrent modules (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) through torch.export, with a
dynamic sequence length.

torch.export records such a module as ``aten.lstm.input`` (``gru.input``, ``rnn_tanh.input``,
``rnn_relu.input``), but finds its result shapes by running that op's composite implementation,
a Python loop over the time steps, which fixes the sequence length: a dynamic time dim fails
with "specialized it to be a constant".  While Cuvil exports a model, :func:`recurrent_ops`
makes each such module's forward call one of Cuvil's own ops instead (``cuvil::lstm``,
``cuvil::gru``, ``cuvil::rnn_tanh``, ``cuvil::rnn_relu``): aten's arguments, with the initial
states as a list that is empty when the module was given none; a fake implementation that gives
the result shapes from the input's, symbolic dims included; aten's op as the eager
implementation.  The converter maps them, and aten's ops in programs exported elsewhere, onto
the recurrence of cuvil/frontends/recurrent.py (cuvil/frontends/torch/aten/rnn.py).

A module whose class overrides ``forward``, a ``PackedSequence`` input and LSTM's ``proj_size``
keep torch's own forward.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# the ops, by the name of the aten op they stand for
OPS = ("lstm", "gru", "rnn_tanh", "rnn_relu")


def _schema(results: int) -> str:
    """aten's arguments (the initial states a list, empty for zeros), ``results`` tensors returned.

    Given as text: this module's annotations are strings (``from __future__ import annotations``),
    which torch's schema inference cannot read."""
    returns = ", ".join(["Tensor"] * results)
    return (f"(Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, int num_layers, float dropout, "
            f"bool train, bool bidirectional, bool batch_first) -> ({returns})")


@functools.cache
def _ops() -> Any:
    """Define Cuvil's recurrent torch ops (once per process); returns ``torch.ops.cuvil``."""
    import torch
    from torch import Tensor

    def states(input: Tensor, hx: list[Tensor], params: list[Tensor], num_layers: int, bidirectional: bool,
               batch_first: bool, n: int) -> list[Tensor]:
        if hx:
            return hx
        batch = input.shape[0 if batch_first else 1]
        shape = ((2 if bidirectional else 1) * num_layers, batch, params[1].shape[1])
        return [input.new_zeros(shape) for _ in range(n)]

    def fake(input: Tensor, params: list[Tensor], num_layers: int, bidirectional: bool, batch_first: bool,
             n: int) -> tuple[Tensor, ...]:
        hidden = params[1].shape[1]
        nd = 2 if bidirectional else 1
        seq, batch = (input.shape[1], input.shape[0]) if batch_first else (input.shape[0], input.shape[1])
        out = input.new_empty((batch, seq, nd * hidden) if batch_first else (seq, batch, nd * hidden))
        return (out, *(input.new_empty((nd * num_layers, batch, hidden)) for _ in range(n)))

    @torch.library.custom_op("cuvil::lstm", mutates_args=(), schema=_schema(3))
    def lstm(input: Tensor, hx: list[Tensor], params: list[Tensor], has_biases: bool, num_layers: int,
             dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> tuple[Tensor, Tensor, Tensor]:
        hc = states(input, hx, params, num_layers, bidirectional, batch_first, 2)
        y, h, c = torch.lstm(input, hc, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        return y.clone(), h.clone(), c.clone()

    @lstm.register_fake
    def _(input: Tensor, hx: list[Tensor], params: list[Tensor], has_biases: bool, num_layers: int, dropout: float,
          train: bool, bidirectional: bool, batch_first: bool) -> tuple[Tensor, ...]:
        return fake(input, params, num_layers, bidirectional, batch_first, 2)

    def single(name: str, fn: Any) -> None:
        @torch.library.custom_op(f"cuvil::{name}", mutates_args=(), schema=_schema(2))
        def op(input: Tensor, hx: list[Tensor], params: list[Tensor], has_biases: bool, num_layers: int,
               dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> tuple[Tensor, Tensor]:
            (h0,) = states(input, hx, params, num_layers, bidirectional, batch_first, 1)
            y, h = fn(input, h0, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
            return y.clone(), h.clone()

        @op.register_fake
        def _(input: Tensor, hx: list[Tensor], params: list[Tensor], has_biases: bool, num_layers: int,
              dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> tuple[Tensor, ...]:
            return fake(input, params, num_layers, bidirectional, batch_first, 1)

    single("gru", torch.gru)
    single("rnn_tanh", torch.rnn_tanh)
    single("rnn_relu", torch.rnn_relu)
    return torch.ops.cuvil


def _call(m: Any, name: str, x: Any, hx: Any, n: int) -> tuple[Any, Any]:
    """Torch's own argument handling (unbatched input, no initial state), then Cuvil's op."""
    batched = x.dim() == 3
    time_batch = 0 if m.batch_first else 1
    states: list[Any] = []
    if hx is not None:
        states = list(hx) if n == 2 else [hx]
    if not batched:
        x = x.unsqueeze(time_batch)
        states = [s.unsqueeze(1) for s in states]
    weights = [getattr(m, w) for w in m._flat_weights_names]
    outs = getattr(_ops(), name)(x, states, weights, m.bias, m.num_layers, float(m.dropout), m.training,
                                 m.bidirectional, m.batch_first)
    y, rest = outs[0], list(outs[1:])
    if not batched:
        y = y.squeeze(time_batch)
        rest = [s.squeeze(1) for s in rest]
    return y, (tuple(rest) if n == 2 else rest[0])


def _lstm_forward(self: Any, input: Any, hx: Any = None) -> Any:
    import torch

    if not isinstance(input, torch.Tensor) or self.proj_size > 0:
        return type(self).forward(self, input, hx)
    return _call(self, "lstm", input, hx, 2)


def _gru_forward(self: Any, input: Any, hx: Any = None) -> Any:
    import torch

    if not isinstance(input, torch.Tensor):
        return type(self).forward(self, input, hx)
    return _call(self, "gru", input, hx, 1)


def _rnn_forward(self: Any, input: Any, hx: Any = None) -> Any:
    import torch

    if not isinstance(input, torch.Tensor):
        return type(self).forward(self, input, hx)
    name = "rnn_tanh" if self.nonlinearity == "tanh" else "rnn_relu"
    return _call(self, name, input, hx, 1)


@contextmanager
def recurrent_ops(model: Any) -> Iterator[None]:
    """While the block runs, the recurrent modules of ``model`` call Cuvil's ops (restored after)."""
    import torch

    forwards = ((torch.nn.LSTM, _lstm_forward), (torch.nn.GRU, _gru_forward), (torch.nn.RNN, _rnn_forward))
    swapped: list[Any] = []
    if isinstance(model, torch.nn.Module):
        for m in model.modules():
            for base, fwd in forwards:
                if isinstance(m, base) and type(m).forward is base.forward and "forward" not in vars(m):
                    _ops()
                    m.forward = types.MethodType(fwd, m)  # type: ignore[method-assign]
                    swapped.append(m)
    try:
        yield
    finally:
        for m in swapped:
            del m.forward
