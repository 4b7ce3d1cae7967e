"""The search: from the original graph to the smallest cut that still fails with the signature.

Rounds, each keeping the last failing cut:

1. the tail: the shortest prefix of the schedule (its frontier becomes the outputs), by halving;
2. the head: the latest start of that range (the values entering it become inputs fed their
   recorded values), by halving;
3. the outputs: a single output of the cut, where one alone still fails;
4. side branches and single nodes: delta debugging (ddmin) over the kept nodes, removing chunks of
   half, a quarter ... down to single nodes; a removed node's values are fed to the nodes still
   kept as their recorded values (constants where the type is static, else inputs).

Halving assumes the failure is monotone in the cut; where it is not, the search still only ever
keeps a cut the oracle saw fail.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cuvil.reduce.candidate import Cut, Space
from cuvil.reduce.oracle import Oracle
from cuvil.reduce.signature import FailureSignature, Outcome

Progress = Callable[[str], None]


@dataclass
class ReduceResult:
    """The smallest failing cut found, as text with its inputs, and how the search went."""

    text: str
    inputs: dict[str, np.ndarray]
    outcome: Outcome
    original_size: int
    size: int
    tried: int
    seconds: float


class _Search:
    def __init__(self, space: Space, oracle: Oracle, signature: FailureSignature, progress: Progress | None) -> None:
        self.space, self.oracle, self.signature = space, oracle, signature
        self.progress = progress
        self.t0 = time.perf_counter()
        self.best: Cut = space.cut(space.work, list(space.graph.outputs))
        self.best_outcome: Outcome | None = None

    def fails(self, cut: Cut) -> bool:
        if not self.space.live(cut):
            return False
        text, inputs = self.space.build(cut)
        outcome = self.oracle.outcome(text, inputs, self.space.expected(cut))
        ok = self.signature.matches(outcome)
        if ok and self.space.size(cut) <= self.space.size(self.best):
            self.best, self.best_outcome = cut, outcome
        return ok

    def say(self, stage: str) -> None:
        if self.progress is not None:
            self.progress(f"[{time.perf_counter() - self.t0:6.1f} s] {stage}: {self.oracle.tried} candidates tried, "
                          f"current size {self.space.size(self.best)} nodes")

    def tail(self) -> None:
        order = self.space.live(self.best)
        lo, hi = 1, len(order)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.fails(self.space.cut(order[:mid])):
                hi = mid
            else:
                lo = mid + 1
        self.say("tail cut")

    def head(self) -> None:
        order = self.space.live(self.best)
        outs = self.best.outputs
        lo, hi = 0, len(order) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.fails(self.space.cut(order[mid:], outs)):
                lo = mid
            else:
                hi = mid - 1
        self.say("head cut")

    def outputs(self) -> None:
        outs = self.best.outputs
        if len(outs) > 1:
            for o in reversed(outs):
                if self.fails(self.space.cut(self.best.keep, [o])):
                    break
        self.say("outputs")

    def ddmin(self) -> None:
        n = 2
        while True:
            order = self.space.live(self.best)
            if len(order) <= 1:
                break
            n = min(n, len(order))
            size = -(-len(order) // n)
            chunks = [order[i:i + size] for i in range(0, len(order), size)]
            removed = False
            for chunk in chunks:
                rest = [i for i in order if i not in chunk]
                # the removed nodes' values as recorded constants first, else as inputs
                if rest and (self.fails(self.space.cut(rest, self.best.outputs, as_constants=True))
                             or self.fails(self.space.cut(rest, self.best.outputs))):
                    removed = True
                    n = max(n - 1, 2)
                    break
            if not removed:
                if size == 1:
                    break
                n = min(2 * n, len(order))
            self.say(f"deletions (chunks of {size})")


def reduce_graph(space: Space, oracle: Oracle, signature: FailureSignature, *,
                 progress: Progress | None = None) -> ReduceResult:
    """Reduce ``space``'s graph to the smallest cut the oracle still sees fail with ``signature``."""
    s = _Search(space, oracle, signature, progress)
    original = space.size(s.best)
    if not s.fails(s.best):
        from cuvil.errors import CuvilError

        raise CuvilError("cuvil reduce: the model no longer fails with the signature when judged on its own "
                         "(a flaky failure?)")
    for stage in (s.tail, s.head, s.outputs, s.ddmin):
        stage()
    text, inputs = space.build(s.best)
    assert s.best_outcome is not None
    return ReduceResult(text, inputs, s.best_outcome, original, space.size(s.best), oracle.tried,
                        time.perf_counter() - s.t0)
