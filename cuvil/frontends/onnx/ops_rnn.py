"""Importers of ONNX RNN, GRU and LSTM: the recurrence unrolled over its time steps.

Each step is written out in Cuvil ops, as the ONNX operator definitions give it:

* RNN: ``H = f(X_t W^T + H R^T + Wb + Rb)`` (f defaults to Tanh);
* GRU (gates z, r, h): ``z = f(..)``, ``r = f(..)``, ``h = g(X_t Wh^T + (r * H) Rh^T + Rbh + Wbh)``
  or, with ``linear_before_reset``, ``g(X_t Wh^T + r * (H Rh^T + Rbh) + Wbh)``; then
  ``H = (1 - z) * h + z * H`` (f, g default to Sigmoid, Tanh);
* LSTM (gates i, o, f, c): ``i = f(.. + Pi * C)``, ``f = f(.. + Pf * C)``, ``c = g(..)``,
  ``C = f * C + i * c``, ``o = f(.. + Po * C)``, ``H = o * h(C)`` (f, g, h default to Sigmoid,
  Tanh, Tanh).

The input products of every step are one matmul over the whole sequence (``X W^T`` plus the
biases), so each step adds one ``H R^T`` product and its elementwise gates, which the fusion
passes turn into a product with an epilogue.  Directions ``forward``, ``reverse`` and
``bidirectional``, ``layout`` 0 and 1, peepholes, ``clip`` (applied to the gates'
pre-activations, as onnxruntime does: LSTM's cell state is not clipped) and the activation list with its ``activation_alpha`` / ``activation_beta`` (consumed
in order by the activations that take them, as onnxruntime does) are supported.

``sequence_lens`` masks each step: past the end of a sequence its state is held and its output
is zero, so a reverse pass starts at each sequence's own last step; a sequence of length 0 gives
zero final states (onnxruntime's choice: ONNX leaves it open).

What is refused, by name: a sequence length that is not a static number of steps (the
recurrence is unrolled), LSTM's ``input_forget``, and activation names outside the ONNX list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.ir.graph import Value

_COMMON = ("activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "layout")

# name -> (ONNX default alpha, default beta); None where the activation takes no such parameter
_ACTIVATIONS: dict[str, tuple[float | None, float | None]] = {
    "relu": (None, None), "tanh": (None, None), "sigmoid": (None, None), "softsign": (None, None),
    "softplus": (None, None), "affine": (1.0, 0.0), "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None),
    "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, None),
}

Act = Callable[[Value], Value]


class _Rnn:
    """The parts all three ops share: operands per direction, activations, the unrolled loop."""

    def __init__(self, ctx: ImportCtx, gates: int, default_acts: Sequence[str], extra_attrs: Sequence[str]) -> None:
        known_attrs(ctx, (*_COMMON, *extra_attrs))
        self.ctx = ctx
        self.gates = gates
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
        self.x = self._time_major(x)
        steps = self.x.type.shape[0]
        if not isinstance(steps, int) or steps < 1:
            raise ctx.unsupported(f"sequence length {steps}: the recurrence is unrolled over a static, positive "
                                  "number of steps")
        self.steps = steps
        self.lens = self._sequence_lens(ctx.input(4))
        self._valid_at: dict[int, Value] = {}
        clip = ctx.attr("clip")
        self.clip = None if clip is None else float(clip)
        self.acts = self._activations(default_acts, nd)

    # operands ---------------------------------------------------------------
    def _time_major(self, v: Value) -> Value:
        """X as [seq, batch, input] (layout 1 gives [batch, seq, input])."""
        return self.ctx.emit1("transpose", [v], {"perm": [1, 0, 2]}) if self.layout == 1 else v

    def _sequence_lens(self, lens: Value | None) -> Value | None:
        """The per-sequence lengths, or None when every sequence runs all the steps."""
        if lens is None:
            return None
        c = self.ctx.const_input(4)
        if c is not None and np.all(c == self.steps):
            return None
        if lens.type.rank != 1 or lens.type.dtype.np != np.int32:
            raise self.ctx.fail(f"sequence_lens must be int32 [batch], got {lens.type}")
        return lens

    def _valid(self, t: int) -> Value:
        """[batch, 1]: whether step ``t`` lies inside each sequence."""
        assert self.lens is not None
        if t not in self._valid_at:
            inside = self.ctx.emit1("less", [self.ctx.constant(np.array(t, np.int32)), self.lens])
            self._valid_at[t] = self.ctx.emit1("unsqueeze", [inside, self.ctx.constant(np.array([1], np.int64))])
        return self._valid_at[t]

    def held(self, t: int, new: Value, prev: Value | None) -> Value:
        """The state after step ``t``: ``new`` inside a sequence, the previous state past its end (a
        reverse pass thus starts at each sequence's own last step)."""
        if self.lens is None:
            return new
        return self.ctx.emit1("where", [self._valid(t), new, prev if prev is not None else self.const(0.0)])

    def output(self, t: int, new: Value) -> Value:
        """Y at step ``t``: the new state inside a sequence, zeros past its end."""
        if self.lens is None:
            return new
        return self.ctx.emit1("where", [self._valid(t), new, self.const(0.0)])

    def per_direction(self, i: int, d: int, transposed: bool = False) -> Value | None:
        """Input ``i``'s slice for direction ``d`` (dim 0 dropped), transposed when asked."""
        v = self.ctx.input(i)
        if v is None:
            return None
        c = self.ctx.const_input(i)
        if c is not None:
            part = c[d].T if transposed else c[d]
            return self.ctx.constant(np.ascontiguousarray(part))
        part = self.ctx.emit1("gather", [v, self.ctx.constant(np.array(d, np.int64))], {"axis": 0})
        return self.ctx.emit1("transpose", [part], {"perm": [1, 0]}) if transposed else part

    def initial(self, i: int, d: int) -> Value | None:
        """initial_h / initial_c of direction ``d`` as [batch, hidden] (None: zeros)."""
        v = self.ctx.input(i)
        if v is None:
            return None
        if v.type.rank != 3:
            raise self.ctx.fail(f"input {i} must be 3-D, got {v.type}")
        axis = 1 if self.layout == 1 else 0
        return self.ctx.emit1("gather", [v, self.ctx.constant(np.array(d, np.int64))], {"axis": axis})

    def biases(self, d: int) -> tuple[np.ndarray | Value | None, np.ndarray | Value | None]:
        """(Wb, Rb) of direction ``d``: arrays when B is a constant, values otherwise, None without B."""
        b = self.ctx.input(3)
        if b is None:
            return None, None
        size = self.gates * self.hidden
        c = self.ctx.const_input(3)
        if c is not None:
            return c[d, :size], c[d, size:]
        row = self.ctx.emit1("gather", [b, self.ctx.constant(np.array(d, np.int64))], {"axis": 0})
        wb, rb = self.ctx.emit("split", [row], {"axis": 0, "num_outputs": 2}, num_outputs=2)
        return wb, rb

    def const(self, value: float | np.ndarray) -> Value:
        return self.ctx.constant(np.asarray(value, dtype=self.dt.np))

    def add(self, a: Value | None, b: Value | np.ndarray | None) -> Value | None:
        if b is None:
            return a
        bv = self.const(b) if isinstance(b, np.ndarray) else b
        return bv if a is None else self.ctx.emit1("add", [a, bv])

    def mul(self, a: Value, b: Value) -> Value:
        return self.ctx.emit1("mul", [a, b])

    def split(self, v: Value, parts: int) -> list[Value]:
        return self.ctx.emit("split", [v], {"axis": -1, "num_outputs": parts}, num_outputs=parts)

    # activations ------------------------------------------------------------
    def _activations(self, defaults: Sequence[str], nd: int) -> list[list[Act]]:
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
        acts: list[Act] = []
        for n, name in enumerate(names):
            key = name.lower()
            if key not in _ACTIVATIONS:
                raise self.ctx.unsupported(f"activation {name!r} (ONNX defines {', '.join(sorted(_ACTIVATIONS))})")
            da, db = _ACTIVATIONS[key]
            alpha = (alphas.pop(0) if alphas else da) if da is not None else None
            beta = (betas.pop(0) if betas else db) if db is not None else None
            # clip bounds the gates' inputs; LSTM's h reads the cell state, which is not clipped
            acts.append(self._activation(key, alpha, beta, clip=n % len(defaults) < 2))
        per = len(defaults)
        return [acts[i * per:(i + 1) * per] for i in range(nd)]

    def _activation(self, key: str, alpha: float | None, beta: float | None, clip: bool = True) -> Act:
        ctx = self.ctx

        def clipped(v: Value) -> Value:
            if self.clip is None or not clip:
                return v
            return ctx.emit1("clip", [v, self.const(-self.clip), self.const(self.clip)])

        def fn(v: Value) -> Value:
            v = clipped(v)
            if key in ("relu", "tanh", "sigmoid", "softsign", "softplus"):
                return ctx.emit1(key, [v])
            if key == "affine":
                return ctx.emit1("add", [self.mul(v, self.const(alpha)), self.const(beta)])  # type: ignore[arg-type]
            if key == "scaledtanh":
                inner = ctx.emit1("tanh", [self.mul(v, self.const(beta))])  # type: ignore[arg-type]
                return self.mul(inner, self.const(alpha))  # type: ignore[arg-type]
            op = {"leakyrelu": "leaky_relu", "thresholdedrelu": "thresholded_relu", "hardsigmoid": "hard_sigmoid",
                  "elu": "elu"}[key]
            attrs = {"alpha": alpha} if beta is None else {"alpha": alpha, "beta": beta}
            return ctx.emit1(op, [v], attrs)

        return fn

    # the loop ---------------------------------------------------------------
    def input_products(self, d: int, bias: np.ndarray | Value | None) -> Value:
        """``X W^T (+ bias)`` of direction ``d`` over every step: [seq, batch, gates * hidden]."""
        wt = self.per_direction(1, d, transposed=True)
        assert wt is not None
        xw = self.ctx.emit1("matmul", [self.x, wt])
        out = self.add(xw, bias)
        assert out is not None
        return out

    def step_input(self, xw: Value, t: int) -> Value:
        return self.ctx.emit1("gather", [xw, self.ctx.constant(np.array(t, np.int64))], {"axis": 0})

    def order(self, d: int) -> list[int]:
        return list(range(self.steps)) if self.directions[d] == "forward" else list(range(self.steps - 1, -1, -1))

    def outputs(self, ys: list[list[Value]], last: list[Value], cells: list[Value] | None = None) -> list[Value | None]:
        """Y, Y_h (and Y_c) from each direction's per-step states (in time order) and final states."""
        ctx = self.ctx
        zero, one = ctx.constant(np.array([0], np.int64)), ctx.constant(np.array([1], np.int64))
        want = ctx.num_outputs
        out: list[Value | None] = []
        if want >= 1 and ctx.node.output[0]:
            per_dir = [ctx.emit1("concat", [ctx.emit1("unsqueeze", [h, zero]) for h in seq], {"axis": 0}) for seq in ys]
            y = ctx.emit1("concat", [ctx.emit1("unsqueeze", [v, one]) for v in per_dir], {"axis": 1})
            out.append(ctx.emit1("transpose", [y], {"perm": [2, 0, 1, 3]}) if self.layout == 1 else y)
        else:
            out.append(None)
        for states in (last, cells):
            if states is None or len(out) >= max(want, 1):
                break
            if self.lens is not None:  # a sequence of no steps ends in zeros, its initial state not kept
                started = ctx.emit1("unsqueeze", [ctx.emit1("greater", [self.lens, ctx.constant(np.array(0, np.int32))]),
                                                  one])
                states = [ctx.emit1("where", [started, v, self.const(0.0)]) for v in states]
            s = ctx.emit1("concat", [ctx.emit1("unsqueeze", [v, zero]) for v in states], {"axis": 0})
            out.append(ctx.emit1("transpose", [s], {"perm": [1, 0, 2]}) if self.layout == 1 else s)
        return out[:max(want, 1)]


@importer("RNN")
def _rnn(ctx: ImportCtx) -> Sequence[Value | None]:
    rnn = _Rnn(ctx, 1, ("Tanh",), ())
    ys, last = [], []
    for d in range(len(rnn.directions)):
        (f,) = rnn.acts[d]
        wb, rb = rnn.biases(d)
        bias = wb + rb if isinstance(wb, np.ndarray) and isinstance(rb, np.ndarray) else rnn.add(wb, rb)  # type: ignore[arg-type]
        xw = rnn.input_products(d, bias)
        rt = rnn.per_direction(2, d, transposed=True)
        h = rnn.initial(5, d)
        states: dict[int, Value] = {}
        for t in rnn.order(d):
            pre = rnn.step_input(xw, t)
            if h is not None:
                pre = ctx.emit1("add", [pre, ctx.emit1("matmul", [h, rt])])
            new = f(pre)
            states[t], h = rnn.output(t, new), rnn.held(t, new, h)
        ys.append([states[t] for t in range(rnn.steps)])
        assert h is not None
        last.append(h)
    return rnn.outputs(ys, last)


@importer("GRU")
def _gru(ctx: ImportCtx) -> Sequence[Value | None]:
    rnn = _Rnn(ctx, 3, ("Sigmoid", "Tanh"), ("linear_before_reset",))
    lbr = int(ctx.attr("linear_before_reset", 0))
    hs = rnn.hidden
    ys, last = [], []
    for d in range(len(rnn.directions)):
        f, g = rnn.acts[d]
        wb, rb = rnn.biases(d)
        rb_h: np.ndarray | Value | None = None
        if isinstance(wb, np.ndarray) and isinstance(rb, np.ndarray):
            # Rb of the z and r gates joins Wb; so does Rbh unless it is applied before the reset
            bias = wb + (np.concatenate([rb[:2 * hs], np.zeros_like(rb[2 * hs:])]) if lbr else rb)
            rb_h = rb[2 * hs:] if lbr else None
        elif lbr and rb is not None:
            rz, rr, rb_h = ctx.emit("split", [_as_value(rnn, rb)], {"axis": 0, "num_outputs": 3}, num_outputs=3)
            wbv = None if wb is None else _as_value(rnn, wb)
            bias = rnn.add(wbv, ctx.emit1("concat", [rz, rr, rnn.const(np.zeros(hs))], {"axis": 0}))
        else:
            bias = rnn.add(wb, rb)  # type: ignore[arg-type]
        xw = rnn.input_products(d, bias)
        r_zr, r_h = _columns(rnn, d)
        h = rnn.initial(5, d)
        states: dict[int, Value] = {}
        one = rnn.const(1.0)
        for t in rnn.order(d):
            xz, xr, xh = rnn.split(rnn.step_input(xw, t), 3)
            if h is None:
                z, r = f(xz), f(xr)
                hh = g(xh if rb_h is None or not lbr else rnn.add(xh, rnn.mul(r, _as_value(rnn, rb_h))))  # type: ignore[arg-type]
                new = rnn.mul(ctx.emit1("sub", [one, z]), hh)
                states[t], h = rnn.output(t, new), rnn.held(t, new, h)
                continue
            hz, hr = rnn.split(ctx.emit1("matmul", [h, r_zr]), 2)
            z, r = f(ctx.emit1("add", [xz, hz])), f(ctx.emit1("add", [xr, hr]))
            if lbr:
                hr_h = rnn.add(ctx.emit1("matmul", [h, r_h]), rb_h)
                assert hr_h is not None
                hh = g(ctx.emit1("add", [xh, rnn.mul(r, hr_h)]))
            else:
                hh = g(ctx.emit1("add", [xh, ctx.emit1("matmul", [rnn.mul(r, h), r_h])]))
            new = ctx.emit1("add", [rnn.mul(ctx.emit1("sub", [one, z]), hh), rnn.mul(z, h)])
            states[t], h = rnn.output(t, new), rnn.held(t, new, h)
        ys.append([states[t] for t in range(rnn.steps)])
        assert h is not None
        last.append(h)
    return rnn.outputs(ys, last)


def _as_value(rnn: _Rnn, v: np.ndarray | Value) -> Value:
    return rnn.const(v) if isinstance(v, np.ndarray) else v


def _columns(rnn: _Rnn, d: int) -> tuple[Value, Value]:
    """R^T of a GRU direction as its z-and-r columns [hidden, 2 * hidden] and its h columns."""
    hs = rnn.hidden
    c = rnn.ctx.const_input(2)
    if c is not None:
        full = c[d].T
        return rnn.const(np.ascontiguousarray(full[:, :2 * hs])), rnn.const(np.ascontiguousarray(full[:, 2 * hs:]))
    rt = rnn.per_direction(2, d, transposed=True)
    assert rt is not None
    zr, h = rnn.ctx.emit("split", [rt, rnn.ctx.constant(np.array([2 * hs, hs], np.int64))], {"axis": 1},
                         num_outputs=2)
    return zr, h


@importer("LSTM")
def _lstm(ctx: ImportCtx) -> Sequence[Value | None]:
    rnn = _Rnn(ctx, 4, ("Sigmoid", "Tanh", "Tanh"), ("input_forget",))
    if int(ctx.attr("input_forget", 0)):
        raise ctx.unsupported("input_forget=1 (coupled input and forget gates)")
    ys, last, cells = [], [], []
    for d in range(len(rnn.directions)):
        f, g, hact = rnn.acts[d]
        wb, rb = rnn.biases(d)
        bias = wb + rb if isinstance(wb, np.ndarray) and isinstance(rb, np.ndarray) else rnn.add(wb, rb)  # type: ignore[arg-type]
        xw = rnn.input_products(d, bias)
        rt = rnn.per_direction(2, d, transposed=True)
        p = rnn.per_direction(7, d)
        pi = po = pf = None
        if p is not None:
            pi, po, pf = rnn.split(p, 3)
        h, c = rnn.initial(5, d), rnn.initial(6, d)
        states: dict[int, Value] = {}
        for t in rnn.order(d):
            pre = rnn.step_input(xw, t)
            if h is not None:
                pre = ctx.emit1("add", [pre, ctx.emit1("matmul", [h, rt])])
            gi, go, gf, gc = rnn.split(pre, 4)
            if c is not None and pi is not None and pf is not None:
                gi = ctx.emit1("add", [gi, rnn.mul(pi, c)])
                gf = ctx.emit1("add", [gf, rnn.mul(pf, c)])
            i, cc = f(gi), g(gc)
            new_c = rnn.mul(i, cc)
            if c is not None:
                new_c = ctx.emit1("add", [rnn.mul(f(gf), c), new_c])
            if po is not None:
                go = ctx.emit1("add", [go, rnn.mul(po, new_c)])
            new = rnn.mul(f(go), hact(new_c))
            states[t], h, c = rnn.output(t, new), rnn.held(t, new, h), rnn.held(t, new_c, c)
        ys.append([states[t] for t in range(rnn.steps)])
        assert h is not None and c is not None
        last.append(h)
        cells.append(c)
    return rnn.outputs(ys, last, cells)
