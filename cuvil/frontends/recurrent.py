"""Recurrent layers (RNN, GRU, LSTM) written in Cuvil ops: the one construction the ONNX and the
PyTorch front ends map their recurrent ops onto.

One direction of one layer is a :class:`Recurrence` over a time-major input ``X`` [seq, batch,
input], with that direction's operands (:class:`Weights`) in ONNX's gate order.  Each step is
the ONNX operator definitions' cell:

* RNN: ``H = f(X_t W^T + H R^T + Wb + Rb)``;
* GRU (gates z, r, h): ``z = f(..)``, ``r = f(..)``, ``h = g(X_t Wh^T + (r * H) Rh^T + Rbh + Wbh)``
  or, with ``linear_before_reset``, ``g(X_t Wh^T + r * (H Rh^T + Rbh) + Wbh)``; then
  ``H = (1 - z) * h + z * H``;
* LSTM (gates i, o, f, c): ``i = f(.. + Pi * C)``, ``f = f(.. + Pf * C)``, ``c = g(..)``,
  ``C = f * C + i * c``, ``o = f(.. + Po * C)``, ``H = o * h(C)``.

``clip`` bounds the inputs of the first two activations (the gates' pre-activations), as
onnxruntime does: LSTM's third activation reads the cell state, which is not clipped.

The input products of every step are one matmul over the whole sequence (``X W^T`` plus the
biases), before the recurrence; each step adds one ``H R^T`` product and its elementwise gates.
How the steps are written is decided by the sequence length:

* a static length of at most :data:`UNROLL_MAX_STEPS` steps is unrolled: each step has its own
  nodes, which the fusion passes turn into products with epilogues, and no loop bookkeeping
  runs (the common short sequences of exported models);
* a longer static length, or one known only at run time (a symbol: speech, OCR over an image
  width), becomes one ``loop`` per direction whose trip count is the sequence length read from
  ``X``'s shape.  Its body is the same cell: it takes row ``t`` of the input products (``t`` is
  the iteration number, or ``seq - 1 -`` it for a reverse pass), carries H (and C) and gives
  that step's output as the loop's scan output, so ``Y`` is stacked in iteration order (and
  reversed after the loop of a reverse pass).  The generated code's size does not grow with
  the length.

``sequence_lens`` masks each step: past the end of a sequence its state is held and its output
is zero, so a reverse pass starts at each sequence's own last step, in either form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from cuvil.errors import ModelError, ShapeError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Value
from cuvil.ir.types import TensorType
from cuvil.ops.common import const_of

# The longest static sequence that is unrolled; longer ones, and run-time lengths, loop.
UNROLL_MAX_STEPS = 16

CELLS = {"rnn": 1, "gru": 3, "lstm": 4}  # cell -> gates

# the activations of the ONNX operator definitions, by lower-case name
ACTIVATIONS = frozenset({"relu", "tanh", "sigmoid", "softsign", "softplus", "affine", "leakyrelu",
                         "thresholdedrelu", "scaledtanh", "hardsigmoid", "elu"})

_INT64_MIN = np.iinfo(np.int64).min


class Emitter(Protocol):
    """Where nodes go: a front end's per-node context (ONNX ``ImportCtx``, PyTorch ``TorchCtx``)."""

    builder: Builder

    def emit(self, op: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None, *,
             num_outputs: int = 1) -> list[Value]: ...


@dataclass(frozen=True)
class Activation:
    """One activation of a cell: an ONNX name (lower case) and its parameters (None: it takes none)."""

    name: str
    alpha: float | None = None
    beta: float | None = None


Operand = Value | np.ndarray


@dataclass
class Weights:
    """The operands of one direction, in ONNX's gate order (GRU: z, r, h; LSTM: i, o, f, c).

    ``w`` is W [gates * hidden, input] and ``r`` is R [gates * hidden, hidden]; ``wb`` and ``rb``
    the input-side and recurrent biases [gates * hidden]; ``peepholes`` LSTM's P [3 * hidden]
    (i, o, f); ``h0`` and ``c0`` the initial states [batch, hidden] (None: zeros).  Arrays are
    constants of the model; values are computed in the graph."""

    w: Operand
    r: Operand
    acts: tuple[Activation, ...]
    wb: Operand | None = None
    rb: Operand | None = None
    peepholes: Operand | None = None
    h0: Value | None = None
    c0: Value | None = None
    reverse: bool = False


@dataclass
class _Operands:
    """A direction's operands as the steps read them."""

    xw: Value  # X W^T + the biases folded into it: [seq, batch, gates * hidden]
    rt: Value  # R^T [hidden, gates * hidden] (GRU: its z and r columns)
    rt_h: Value | None  # GRU: R^T's h columns
    rb_h: Value | None  # GRU with linear_before_reset: Rbh
    peep: tuple[Value, Value, Value] | None  # LSTM: Pi, Po, Pf


class _RegionEmitter:
    """Emits into a loop's body: names under the layer's node, and shape errors reported against it."""

    def __init__(self, builder: Builder, prefix: str, node_name: str) -> None:
        self.builder = builder
        self.prefix = prefix
        self.node_name = node_name

    def emit(self, op: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None, *,
             num_outputs: int = 1) -> list[Value]:
        names = [self.builder.fresh_name(self.prefix) for _ in range(num_outputs)]
        try:
            return self.builder.add(op, inputs, attrs or {}, num_outputs=num_outputs, names=names,
                                    node_name=self.node_name)
        except ShapeError as exc:
            raise ModelError(f"node {self.node_name!r}: the recurrence's step: {exc}") from None


class Recurrence:
    """One recurrent layer over a time-major input: :meth:`run` builds one direction.

    ``x`` is [seq, batch, input]; ``lens`` (int32 [batch], or None when every sequence runs all
    the steps) the per-sequence lengths; ``name`` the node the layer's nodes are named after."""

    def __init__(self, em: Emitter, cell: str, x: Value, hidden: int, *, lens: Value | None = None,
                 clip: float | None = None, linear_before_reset: bool = False, name: str = "rnn") -> None:
        if cell not in CELLS:
            raise ValueError(f"unknown cell {cell!r}")
        self.em = em
        self.cell = cell
        self.gates = CELLS[cell]
        self.x = x
        self.hidden = hidden
        self.lens = lens
        self.clip = clip
        self.lbr = linear_before_reset
        self.name = name
        self.dt: DType = x.type.dtype
        self._valid_at: dict[int, Value] = {}

    @property
    def steps(self) -> Any:
        """The sequence length: an int, or a symbolic dim."""
        return self.x.type.shape[0]

    @property
    def unrolled(self) -> bool:
        return isinstance(self.steps, int) and self.steps <= UNROLL_MAX_STEPS

    # building blocks ---------------------------------------------------------
    def _e1(self, em: Emitter, op: str, inputs: Sequence[Value | None], attrs: dict[str, Any] | None = None) -> Value:
        return em.emit(op, inputs, attrs)[0]

    def _const(self, em: Emitter, value: Any, dtype: Any = None) -> Value:
        arr = np.asarray(value, dtype=self.dt.np if dtype is None else dtype)
        return self._e1(em, "constant", [], {"value": arr})

    def _value(self, v: Operand) -> Value:
        return self._const(self.em, v) if isinstance(v, np.ndarray) else v

    def _split(self, em: Emitter, v: Value, parts: int, axis: int = -1) -> list[Value]:
        return em.emit("split", [v], {"axis": axis, "num_outputs": parts}, num_outputs=parts)

    def _transposed(self, v: Operand) -> Value:
        if isinstance(v, np.ndarray):
            return self._const(self.em, np.ascontiguousarray(v.T))
        c = const_of(v)
        if c is not None:
            return self._const(self.em, np.ascontiguousarray(c.T))
        return self._e1(self.em, "transpose", [v], {"perm": [1, 0]})

    def _activation(self, em: Emitter, a: Activation, v: Value, clipped: bool) -> Value:
        if self.clip is not None and clipped:
            v = self._e1(em, "clip", [v, self._const(em, -self.clip), self._const(em, self.clip)])
        key = a.name
        if key in ("relu", "tanh", "sigmoid", "softsign", "softplus"):
            return self._e1(em, key, [v])
        if key == "affine":
            return self._e1(em, "add", [self._e1(em, "mul", [v, self._const(em, a.alpha)]), self._const(em, a.beta)])
        if key == "scaledtanh":
            inner = self._e1(em, "tanh", [self._e1(em, "mul", [v, self._const(em, a.beta)])])
            return self._e1(em, "mul", [inner, self._const(em, a.alpha)])
        op = {"leakyrelu": "leaky_relu", "thresholdedrelu": "thresholded_relu", "hardsigmoid": "hard_sigmoid",
              "elu": "elu"}.get(key)
        if op is None:
            raise ValueError(f"unknown activation {key!r}")
        attrs = {"alpha": a.alpha} if a.beta is None else {"alpha": a.alpha, "beta": a.beta}
        return self._e1(em, op, [v], attrs)

    # operands ------------------------------------------------------------------
    def _operands(self, w: Weights) -> _Operands:
        em, hs = self.em, self.hidden
        wb, rb = _known(w.wb), _known(w.rb)  # constants as arrays: the biases add up now
        rb_h: Operand | None = None
        if self.cell == "gru" and self.lbr and rb is not None:
            # Rb of the z and r gates joins Wb; Rbh is applied inside the reset
            if isinstance(rb, np.ndarray):
                rb_h, rb = rb[2 * hs:], np.concatenate([rb[:2 * hs], np.zeros_like(rb[2 * hs:])])
            else:
                rz, rr, rb_h = self._split(em, rb, 3, axis=0)
                rb = self._e1(em, "concat", [rz, rr, self._const(em, np.zeros(hs))], {"axis": 0})
        bias: Operand | None
        if isinstance(wb, np.ndarray) and isinstance(rb, np.ndarray):
            bias = wb + rb
        elif wb is None or rb is None:
            bias = wb if rb is None else rb
        else:
            bias = self._e1(em, "add", [self._value(wb), self._value(rb)])
        xw = self._e1(em, "matmul", [self.x, self._transposed(w.w)])
        if bias is not None:
            xw = self._e1(em, "add", [xw, self._value(bias)])
        rt_h = None
        r = _array(w.r)
        if self.cell == "gru":
            if r is not None:
                full = r.T
                rt = self._const(em, np.ascontiguousarray(full[:, :2 * hs]))
                rt_h = self._const(em, np.ascontiguousarray(full[:, 2 * hs:]))
            else:
                rt, rt_h = em.emit("split", [self._transposed(w.r), self._const(em, [2 * hs, hs], np.int64)],
                                   {"axis": 1}, num_outputs=2)
        else:
            rt = self._transposed(w.r)
        peep = None
        if w.peepholes is not None:
            p = _array(w.peepholes)
            if p is not None:
                pi, po, pf = (self._const(em, np.ascontiguousarray(q)) for q in np.split(p, 3))
            else:
                pi, po, pf = self._split(em, self._value(w.peepholes), 3)
            peep = (pi, po, pf)
        return _Operands(xw, rt, rt_h, None if rb_h is None else self._value(rb_h), peep)

    # one step --------------------------------------------------------------------
    def _held(self, em: Emitter, valid: Value | None, new: Value, prev: Value | None) -> Value:
        """The state after a step: ``new`` inside a sequence, the previous state past its end."""
        if valid is None:
            return new
        return self._e1(em, "where", [valid, new, prev if prev is not None else self._const(em, 0.0)])

    def _output(self, em: Emitter, valid: Value | None, new: Value) -> Value:
        """Y at a step: the new state inside a sequence, zeros past its end."""
        if valid is None:
            return new
        return self._e1(em, "where", [valid, new, self._const(em, 0.0)])

    def _step(self, em: Emitter, ops: _Operands, acts: tuple[Activation, ...], xt: Value, valid: Value | None,
              h: Value | None, c: Value | None) -> tuple[Value, Value, Value | None]:
        """One step of the cell from its input products ``xt`` [batch, gates * hidden]: (Y_t, H, C)."""
        def e1(op: str, *inputs: Value) -> Value:
            return self._e1(em, op, list(inputs))

        def act(k: int, v: Value) -> Value:
            return self._activation(em, acts[k], v, clipped=k < 2)

        if self.cell == "rnn":
            pre = xt if h is None else e1("add", xt, e1("matmul", h, ops.rt))
            new = act(0, pre)
            return self._output(em, valid, new), self._held(em, valid, new, h), None
        if self.cell == "gru":
            xz, xr, xh = self._split(em, xt, 3)
            one = self._const(em, 1.0)
            if h is None:
                z, r = act(0, xz), act(0, xr)
                hh = act(1, xh if ops.rb_h is None else e1("add", xh, e1("mul", r, ops.rb_h)))
                new = e1("mul", e1("sub", one, z), hh)
                return self._output(em, valid, new), self._held(em, valid, new, h), None
            assert ops.rt_h is not None
            hz, hr = self._split(em, e1("matmul", h, ops.rt), 2)
            z, r = act(0, e1("add", xz, hz)), act(0, e1("add", xr, hr))
            if self.lbr:
                hr_h = e1("matmul", h, ops.rt_h)
                if ops.rb_h is not None:
                    hr_h = e1("add", hr_h, ops.rb_h)
                hh = act(1, e1("add", xh, e1("mul", r, hr_h)))
            else:
                hh = act(1, e1("add", xh, e1("matmul", e1("mul", r, h), ops.rt_h)))
            new = e1("add", e1("mul", e1("sub", one, z), hh), e1("mul", z, h))
            return self._output(em, valid, new), self._held(em, valid, new, h), None
        pre = xt if h is None else e1("add", xt, e1("matmul", h, ops.rt))
        gi, go, gf, gc = self._split(em, pre, 4)
        if c is not None and ops.peep is not None:
            gi = e1("add", gi, e1("mul", ops.peep[0], c))
            gf = e1("add", gf, e1("mul", ops.peep[2], c))
        new_c = e1("mul", act(0, gi), act(1, gc))
        if c is not None:
            new_c = e1("add", e1("mul", act(0, gf), c), new_c)
        if ops.peep is not None:
            go = e1("add", go, e1("mul", ops.peep[1], new_c))
        new = e1("mul", act(0, go), act(2, new_c))
        return self._output(em, valid, new), self._held(em, valid, new, h), self._held(em, valid, new_c, c)

    # the recurrence ----------------------------------------------------------------
    def run(self, w: Weights) -> tuple[Value, Value, Value | None]:
        """One direction: Y [seq, batch, hidden] and the states after each sequence's last step (H, and
        C for LSTM)."""
        if len(w.acts) != {"rnn": 1, "gru": 2, "lstm": 3}[self.cell]:
            raise ValueError(f"{self.cell} takes {len(w.acts)} activations")
        ops = self._operands(w)
        if self.unrolled:
            return self._unrolled(ops, w)
        return self._looped(ops, w)

    def _valid(self, t: int) -> Value | None:
        """[batch, 1]: whether static step ``t`` lies inside each sequence (None without lengths)."""
        if self.lens is None:
            return None
        if t not in self._valid_at:
            inside = self._e1(self.em, "less", [self._const(self.em, t, np.int32), self.lens])
            self._valid_at[t] = self._e1(self.em, "unsqueeze", [inside, self._const(self.em, [1], np.int64)])
        return self._valid_at[t]

    def _unrolled(self, ops: _Operands, w: Weights) -> tuple[Value, Value, Value | None]:
        em, steps = self.em, int(self.steps)
        if steps < 1:
            raise ValueError(f"a sequence of {steps} steps")
        h, c = w.h0, w.c0
        ys: dict[int, Value] = {}
        for t in (range(steps - 1, -1, -1) if w.reverse else range(steps)):
            xt = self._e1(em, "gather", [ops.xw, self._const(em, t, np.int64)], {"axis": 0})
            ys[t], h, c = self._step(em, ops, w.acts, xt, self._valid(t), h, c)
        zero = self._const(em, [0], np.int64)
        y = self._e1(em, "concat", [self._e1(em, "unsqueeze", [ys[t], zero]) for t in range(steps)], {"axis": 0})
        assert h is not None
        return y, h, c

    def _zeros(self) -> Value:
        """[batch, hidden] zeros: the initial state a loop starts from when none is given."""
        em = self.em
        batch = self._e1(em, "shape", [self.x], {"start": 1, "end": 2})
        shape = self._e1(em, "concat", [batch, self._const(em, [self.hidden], np.int64)], {"axis": 0})
        return self._e1(em, "constant_of_shape", [shape], {"value": np.zeros(1, self.dt.np)})

    def _looped(self, ops: _Operands, w: Weights) -> tuple[Value, Value, Value | None]:
        em = self.em
        lstm = self.cell == "lstm"
        steps = self._e1(em, "shape", [self.x], {"start": 0, "end": 1})  # i64[1]: the trip count
        h0 = w.h0 if w.h0 is not None else self._zeros()
        c0 = (w.c0 if w.c0 is not None else self._zeros()) if lstm else None
        last = None
        if w.reverse:
            last = self._e1(em, "sub", [self._e1(em, "squeeze", [steps, self._const(em, [0], np.int64)]),
                                        self._const(em, 1, np.int64)])
        prefix = em.builder.fresh_name(f"{self.name}/loop") + "/"
        body = Graph(name="body")
        bb = em.builder.nested(body)
        be = _RegionEmitter(bb, prefix, self.name)
        it = bb.input(f"{prefix}iteration", TensorType(DType.i64, ()))
        cond = bb.input(f"{prefix}cond", TensorType(DType.bool, ()))
        h_in = bb.input(f"{prefix}h", h0.type)
        c_in = bb.input(f"{prefix}c", c0.type) if c0 is not None else None
        t = it if last is None else self._e1(be, "sub", [last, it])
        xt = self._e1(be, "gather", [ops.xw, t], {"axis": 0})
        valid = None
        if self.lens is not None:
            inside = self._e1(be, "less", [self._e1(be, "cast", [t], {"to": DType.i32}), self.lens])
            valid = self._e1(be, "unsqueeze", [inside, self._const(be, [1], np.int64)])
        y, h, c = self._step(be, ops, w.acts, xt, valid, h_in, c_in)
        body.outputs = [self._e1(be, "identity", [cond]), h, *([c] if c is not None else []), y]
        carried = [h0, *([c0] if c0 is not None else [])]
        outs = em.emit("loop", [steps, None, *carried], {"body": body}, num_outputs=len(carried) + 1)
        ys = outs[-1]
        if w.reverse:  # stacked in iteration order: the last step first
            ys = self._e1(em, "slice", [ys, self._const(em, [-1], np.int64), self._const(em, [_INT64_MIN], np.int64),
                                        self._const(em, [0], np.int64), self._const(em, [-1], np.int64)])
        return ys, outs[0], outs[1] if lstm else None


def _array(v: Operand | None) -> np.ndarray | None:
    """``v``'s value when it is known now (an array, or a constant of the graph)."""
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        return v
    return const_of(v)


def _known(v: Operand | None) -> Operand | None:
    """``v`` as an array when it is a constant of the graph, else ``v``."""
    a = _array(v)
    return a if a is not None else v


def started(em: Emitter, lens: Value, state: Value, dt: DType) -> Value:
    """``state`` [batch, hidden] with the rows of sequences of no steps zeroed: such a sequence ends
    in zeros, its initial state not kept (onnxruntime's choice: ONNX leaves it open)."""
    one = em.emit("constant", [], {"value": np.array([1], np.int64)})[0]
    zero_len = em.emit("constant", [], {"value": np.array(0, lens.type.dtype.np)})[0]
    ran = em.emit("unsqueeze", [em.emit("greater", [lens, zero_len])[0], one])[0]
    return em.emit("where", [ran, state, em.emit("constant", [], {"value": np.array(0.0, dt.np)})[0]])[0]
