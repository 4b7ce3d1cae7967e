"""Importers of ONNX RNN, GRU and LSTM: each direction one :class:`~cuvil.frontends.recurrent.Recurrence`.

This module reads the ONNX node (its operands per direction, directions, ``layout``, the
activation list with ``activation_alpha`` / ``activation_beta``, consumed in order by the
activations that take them, as onnxruntime does) and assembles ``Y``, ``Y_h`` and ``Y_c``;
the cells, and the choice between unrolling the steps (a static length of at most
``UNROLL_MAX_STEPS``) and a loop over the run-time length, are cuvil/frontends/recurrent.py's.

Directions ``forward``, ``reverse`` and ``bidirectional``, ``layout`` 0 and 1, peepholes,
``clip`` and ``sequence_lens`` are supported, with a static or a symbolic sequence length.  A
sequence of length 0 gives zero final states (onnxruntime's choice: ONNX leaves it open).

What is refused, by name: LSTM's ``input_forget``, and activation names outside the ONNX list.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.frontends.recurrent import ACTIVATIONS, CELLS, Activation, Recurrence, Weights, started
from cuvil.ir.graph import Value

_COMMON = ("activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "layout")

# name -> (ONNX default alpha, default beta); None where the activation takes no such parameter
_PARAMS: dict[str, tuple[float | None, float | None]] = {
    "affine": (1.0, 0.0), "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None), "scaledtanh": (1.0, 1.0),
    "hardsigmoid": (0.2, 0.5), "elu": (1.0, None),
}
_DEFAULTS = {"rnn": ("Tanh",), "gru": ("Sigmoid", "Tanh"), "lstm": ("Sigmoid", "Tanh", "Tanh")}
_EXTRA = {"rnn": (), "gru": ("linear_before_reset",), "lstm": ("input_forget",)}


class _Node:
    """One ONNX recurrent node: its operands per direction, and its outputs from the directions' results."""

    def __init__(self, ctx: ImportCtx, cell: str) -> None:
        known_attrs(ctx, (*_COMMON, *_EXTRA[cell]))
        self.ctx = ctx
        self.cell = cell
        gates = CELLS[cell]
        x, w, r = ctx.input(0), ctx.input(1), ctx.input(2)
        if x is None or w is None or r is None:
            raise ctx.fail("inputs X, W and R are required")
        if x.type.rank != 3 or w.type.rank != 3 or r.type.rank != 3:
            raise ctx.fail(f"X, W and R must be 3-D, got {x.type}, {w.type}, {r.type}")
        self.dt = x.type.dtype
        self.layout = int(ctx.attr("layout", 0))
        if self.layout not in (0, 1):
            raise ctx.fail(f"layout must be 0 or 1, got {self.layout}")
        direction = ctx.attr("direction", "forward")
        direction = direction.decode() if isinstance(direction, bytes) else str(direction)
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ctx.fail(f"direction must be forward, reverse or bidirectional, got {direction!r}")
        self.directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
        nd = len(self.directions)
        if w.type.shape[0] != nd or r.type.shape[0] != nd:
            raise ctx.fail(f"W and R must have {nd} direction(s) in dim 0 for direction={direction!r}, "
                           f"got {w.type} and {r.type}")
        hidden = r.type.shape[2]
        if not isinstance(hidden, int):
            raise ctx.fail(f"R's hidden size must be static, got {r.type}")
        if "hidden_size" in ctx.attrs and int(ctx.attrs["hidden_size"]) != hidden:
            raise ctx.fail(f"hidden_size={ctx.attrs['hidden_size']} does not match R {r.type}")
        if w.type.shape[1] != gates * hidden or r.type.shape[1] != gates * hidden:
            raise ctx.fail(f"W and R must have {gates} x hidden_size = {gates * hidden} rows, got {w.type}, {r.type}")
        self.hidden = hidden
        # time-major: [seq, batch, input] (layout 1 gives [batch, seq, input])
        xt = ctx.emit1("transpose", [x], {"perm": [1, 0, 2]}) if self.layout == 1 else x
        steps = xt.type.shape[0]
        if isinstance(steps, int) and steps < 1:
            raise ctx.unsupported(f"sequence length {steps}: a recurrence needs at least one step")
        lens = self._sequence_lens(ctx.input(4), steps)
        clip = ctx.attr("clip")
        lbr = cell == "gru" and bool(int(ctx.attr("linear_before_reset", 0)))
        self.rec = Recurrence(ctx, cell, xt, hidden, lens=lens, clip=None if clip is None else float(clip),
                              linear_before_reset=lbr, name=ctx.name)
        self.acts = self._activations(_DEFAULTS[cell], nd)

    def _sequence_lens(self, lens: Value | None, steps: object) -> Value | None:
        """The per-sequence lengths, or None when every sequence runs all the steps."""
        if lens is None:
            return None
        c = self.ctx.const_input(4)
        if c is not None and isinstance(steps, int) and np.all(c == steps):
            return None
        if lens.type.rank != 1 or lens.type.dtype.np != np.int32:
            raise self.ctx.fail(f"sequence_lens must be int32 [batch], got {lens.type}")
        return lens

    def _activations(self, defaults: Sequence[str], nd: int) -> list[tuple[Activation, ...]]:
        """Per direction, the activations in the op's order (f; f, g; f, g, h)."""
        names = self.ctx.attr("activations")
        if names is None:
            names = list(defaults) * nd
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        if len(names) != len(defaults) * nd:
            raise self.ctx.fail(f"activations must name {len(defaults) * nd} functions ({len(defaults)} per "
                                f"direction), got {names}")
        alphas = [float(a) for a in self.ctx.attr("activation_alpha", []) or []]
        betas = [float(b) for b in self.ctx.attr("activation_beta", []) or []]
        acts: list[Activation] = []
        for name in names:
            key = name.lower()
            if key not in ACTIVATIONS:
                raise self.ctx.unsupported(f"activation {name!r} (ONNX defines {', '.join(sorted(ACTIVATIONS))})")
            da, db = _PARAMS.get(key, (None, None))
            alpha = (alphas.pop(0) if alphas else da) if da is not None else None
            beta = (betas.pop(0) if betas else db) if db is not None else None
            acts.append(Activation(key, alpha, beta))
        per = len(defaults)
        return [tuple(acts[i * per:(i + 1) * per]) for i in range(nd)]

    # operands ---------------------------------------------------------------
    def _per_direction(self, i: int, d: int) -> Value | np.ndarray | None:
        """Input ``i``'s slice for direction ``d`` (dim 0 dropped): an array when the input is a constant."""
        v = self.ctx.input(i)
        if v is None:
            return None
        c = self.ctx.const_input(i)
        if c is not None:
            return np.ascontiguousarray(c[d])
        return self.ctx.emit1("gather", [v, self.ctx.constant(np.array(d, np.int64))], {"axis": 0})

    def _initial(self, i: int, d: int) -> Value | None:
        """initial_h / initial_c of direction ``d`` as [batch, hidden] (None: zeros)."""
        v = self.ctx.input(i)
        if v is None:
            return None
        if v.type.rank != 3:
            raise self.ctx.fail(f"input {i} must be 3-D, got {v.type}")
        axis = 1 if self.layout == 1 else 0
        return self.ctx.emit1("gather", [v, self.ctx.constant(np.array(d, np.int64))], {"axis": axis})

    def _biases(self, d: int) -> tuple[Value | np.ndarray | None, Value | np.ndarray | None]:
        """(Wb, Rb) of direction ``d``."""
        b = self._per_direction(3, d)
        if b is None:
            return None, None
        size = CELLS[self.cell] * self.hidden
        if isinstance(b, np.ndarray):
            return b[:size], b[size:]
        wb, rb = self.ctx.emit("split", [b], {"axis": 0, "num_outputs": 2}, num_outputs=2)
        return wb, rb

    def weights(self, d: int) -> Weights:
        w, r = self._per_direction(1, d), self._per_direction(2, d)
        assert w is not None and r is not None
        wb, rb = self._biases(d)
        return Weights(w, r, self.acts[d], wb=wb, rb=rb,
                       peepholes=self._per_direction(7, d) if self.cell == "lstm" else None,
                       h0=self._initial(5, d), c0=self._initial(6, d) if self.cell == "lstm" else None,
                       reverse=self.directions[d] == "reverse")

    # outputs ----------------------------------------------------------------
    def convert(self) -> list[Value | None]:
        """Y, Y_h (and Y_c) from each direction's recurrence."""
        ctx = self.ctx
        ys, last, cells = [], [], []
        for d in range(len(self.directions)):
            y, h, c = self.rec.run(self.weights(d))
            ys.append(y)
            last.append(h)
            if c is not None:
                cells.append(c)
        zero, one = ctx.constant(np.array([0], np.int64)), ctx.constant(np.array([1], np.int64))
        want = max(ctx.num_outputs, 1)
        out: list[Value | None] = []
        if ctx.node.output[0]:
            y = ctx.emit1("concat", [ctx.emit1("unsqueeze", [v, one]) for v in ys], {"axis": 1})
            out.append(ctx.emit1("transpose", [y], {"perm": [2, 0, 1, 3]}) if self.layout == 1 else y)
        else:
            out.append(None)
        for states in (last, cells if self.cell == "lstm" else None):
            if states is None or len(out) >= want:
                break
            if self.rec.lens is not None:
                states = [started(ctx, self.rec.lens, v, self.dt) for v in states]
            s = ctx.emit1("concat", [ctx.emit1("unsqueeze", [v, zero]) for v in states], {"axis": 0})
            out.append(ctx.emit1("transpose", [s], {"perm": [1, 0, 2]}) if self.layout == 1 else s)
        return out[:want]


@importer("RNN")
def _rnn(ctx: ImportCtx) -> Sequence[Value | None]:
    return _Node(ctx, "rnn").convert()


@importer("GRU")
def _gru(ctx: ImportCtx) -> Sequence[Value | None]:
    return _Node(ctx, "gru").convert()


@importer("LSTM")
def _lstm(ctx: ImportCtx) -> Sequence[Value | None]:
    if int(ctx.attr("input_forget", 0)):
        raise ctx.unsupported("input_forget=1 (coupled input and forget gates)")
    return _Node(ctx, "lstm").convert()
