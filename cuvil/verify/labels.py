"""Exact agreement of integer, boolean and label outputs, and the near-ties that excuse a label.

An integer or boolean output is compared element by element: a relative error means nothing for a
class index. Where the output is an ``arg_max``/``arg_min`` or ``top_k``'s indices over float
scores (seen through casts, reshapes, squeezes and unsqueezes, which keep element order), two
correct builds can pick different labels when the top scores are within rounding of each other:
such a disagreement is a *near-tie*, reported and not counted as a mismatch.  A label that
differs is a near-tie when, in the reference interpreter's float32 scores of its slice, the
label the build chose scores within ``tolerance * max |scores|`` of the reference's label
(the tolerance being the relative error the check accepts from that build: float32 rounding,
or a reduced precision's bound).  Every other differing element is a mismatch and fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil.ir.graph import Graph, Node, Value

#: Ops through which an output keeps the element order of the label node's output.
ORDER_KEEPING = frozenset({"cast", "reshape", "squeeze", "unsqueeze", "flatten", "identity"})
LABEL_OPS = frozenset({"arg_max", "arg_min", "top_k"})
#: The smallest tie tolerance, in units of float32 rounding of the slice's largest score.
TIE_ULPS = 16
FLOAT32_EPS = float(np.finfo(np.float32).eps)
#: How many near-ties and mismatches a result lists.
SHOWN = 5


def is_exact(a: np.ndarray) -> bool:
    """Whether an output is compared by exact agreement: integers and booleans."""
    return np.asarray(a).dtype.kind in "iub"


@dataclass(frozen=True)
class LabelSource:
    """The node a label output comes from, and its scores."""

    node: Node
    scores: Value

    @property
    def axis(self) -> int:
        rank = self.scores.type.rank
        axis = int(self.node.attrs.get("axis", 0 if self.node.op != "top_k" else -1))
        return axis + rank if axis < 0 else axis


def label_source(graph: Graph, index: int) -> LabelSource | None:
    """The arg_max/arg_min/top_k node whose indices graph output ``index`` holds, in order, over float scores."""
    v: Value | None = graph.outputs[index]
    while v is not None and v.producer is not None:
        node = v.producer
        if node.op in LABEL_OPS and node.inputs and node.inputs[0] is not None:
            if node.op == "top_k" and v is not node.outputs[1]:
                return None
            scores = node.inputs[0]
            return LabelSource(node, scores) if scores.type.dtype.holds_floats else None
        if node.op not in ORDER_KEEPING or not node.inputs:
            return None
        v = node.inputs[0]
    return None


@dataclass
class Agreement:
    """How a build's integer output agrees with the reference's: elements, mismatches, near-ties."""

    output: str
    elements: int = 0
    mismatches: int = 0
    near_ties: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)  # the first mismatches and near-ties
    source: str = ""  # the label node, when there is one

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def describe(self) -> str:
        """In words: "3 of 8 elements differ", with the near-ties said apart."""
        ties = f"; {self.near_ties} near-ties (the top scores within rounding of each other) excused" \
            if self.near_ties else ""
        if self.mismatches:
            first = next((e for e in self.examples if e["kind"] == "mismatch"), None)
            at = f"; first at {first['index']}: {first['got']} against {first['want']}" if first else ""
            return f"{self.mismatches} of {self.elements} elements differ{at}{ties}"
        return f"all {self.elements} elements agree exactly{ties}" if not self.near_ties else \
            f"{self.elements - self.near_ties} of {self.elements} elements agree exactly{ties}"

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output, "elements": self.elements, "mismatches": self.mismatches,
                "near_ties": self.near_ties, "examples": list(self.examples), "label_node": self.source}


class LabelJudge:
    """Judges a graph's integer outputs against the reference's, running the reference interpreter
    for the scores only when a label differs (the last inputs' scores are kept)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.sources = {i: label_source(graph, i) for i in range(len(graph.outputs))}
        self._key: tuple[int, ...] | None = None
        self._scores: dict[int, np.ndarray] = {}

    def _scores_for(self, inputs: Sequence[np.ndarray]) -> dict[int, np.ndarray]:
        key = tuple(id(a) for a in inputs)
        if key != self._key:
            from cuvil.backends.ref.interpreter import run_graph

            wanted = {s.scores: i for i, s in self.sources.items() if s is not None}
            found: dict[int, np.ndarray] = {}
            for v, a in zip(self.graph.inputs, inputs):
                if v in wanted:
                    found[wanted[v]] = np.asarray(a)

            def keep(node: Node, outs: Sequence[np.ndarray]) -> None:
                for v, a in zip(node.outputs, outs):
                    if v in wanted:
                        found[wanted[v]] = np.asarray(a)

            run_graph(self.graph, list(inputs), on_node=keep)
            self._key, self._scores = key, found
        return self._scores

    def judge(self, index: int, name: str, got: Any, want: Any, inputs: Sequence[np.ndarray],
              tolerance: float) -> Agreement:
        """Output ``index`` (``name``) of a build, ``got``, against the reference's ``want`` on ``inputs``."""
        got, want = np.asarray(got), np.asarray(want)
        src = self.sources.get(index)
        out = Agreement(name, int(want.size), source=(src.node.name or src.node.op) if src is not None else "")
        if got.shape != want.shape:
            out.mismatches = int(max(got.size, want.size))
            out.examples.append({"kind": "mismatch", "index": "shape", "got": list(got.shape), "want": list(want.shape)})
            return out
        bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
        if not bad.size:
            return out
        scores = self._scores_for(inputs).get(index) if src is not None else None
        for flat in bad:
            where = [int(i) for i in np.unravel_index(int(flat), want.shape)] if want.ndim else []
            g, w = got.reshape(-1)[flat].item(), want.reshape(-1)[flat].item()
            tie = (None if scores is None or src is None else
                   _tie(src, scores, int(flat), int(want.size), int(g), int(w), tolerance))
            kind = "near-tie" if tie is not None else "mismatch"
            if kind == "near-tie":
                out.near_ties += 1
            else:
                out.mismatches += 1
            if sum(e["kind"] == kind for e in out.examples) < SHOWN:
                out.examples.append({"kind": kind, "index": where, "got": g, "want": w, **(tie or {})})
        return out


def _tie(src: LabelSource, scores: np.ndarray, flat: int, size: int, got: int, want: int,
         tolerance: float) -> dict[str, float] | None:
    """The scores of the two labels when they are within ``tolerance`` of each other (relative to the slice's
    largest score), else None. ``flat`` indexes the label node's output (``size`` elements) in order."""
    axis = src.axis
    if not 0 <= axis < scores.ndim:
        return None
    rest = int(np.prod([n for i, n in enumerate(scores.shape) if i != axis], dtype=np.int64))
    if not rest or size % rest:
        return None
    out_shape = list(scores.shape)
    out_shape[axis] = size // rest  # 1 for arg_max / arg_min, k for top_k
    index: list[Any] = [int(i) for i in np.unravel_index(flat, tuple(out_shape))]
    index[axis] = slice(None)
    row = np.asarray(scores[tuple(index)], dtype=np.float64).reshape(-1)
    if not (0 <= got < row.size and 0 <= want < row.size):
        return None
    finite = row[np.isfinite(row)]
    scale = float(np.max(np.abs(finite))) if finite.size else 0.0
    bound = max(tolerance, TIE_ULPS * FLOAT32_EPS) * scale
    gap = abs(float(row[got]) - float(row[want]))
    return {"score_got": float(row[got]), "score_want": float(row[want]), "gap": gap, "within": bound} \
        if gap <= bound else None
