"""Failure signatures: what a failure of one compiled candidate is, and when two are the same.

A candidate is judged by compiling it for the target with the recorded options and comparing its
outputs, on the recorded inputs, with the reference interpreter's.  The outcome's ``kind`` is one
of ``pass``, ``mismatch`` (an output's relative L2 error above the threshold, or a shape that
differs), ``nan`` (a non-finite value the reference does not have), ``refusal`` (the compile or the
run raised a Cuvil error), ``crash`` (any other exception, or the process died), ``hang`` (it ran
past the timeout) or ``invalid`` (the candidate itself is not a valid graph, or the reference
cannot run it: a reduction step that went too far, never a match).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from cuvil.errors import CuvilError

KINDS = ("pass", "mismatch", "nan", "refusal", "crash", "hang", "invalid")
FAILURES = ("mismatch", "nan", "refusal", "crash", "hang")

#: The checks whose failures the reducer re-checks as "the target's outputs against the reference on
#: the recorded inputs": verify's numeric checks all come down to that comparison.
CHECKS = ("outputs", "layerwise", "cross-target", "passes", "control-flow", "precision")

DEFAULT_THRESHOLD = 1e-3


@dataclass(frozen=True)
class Outcome:
    """How one candidate fared: its kind, the output it failed on, figures and a message."""

    kind: str
    output: str | None = None
    figures: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # the exception type of a refusal or crash
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Outcome:
        return Outcome(str(d["kind"]), d.get("output"), {k: float(v) for k, v in d.get("figures", {}).items()},
                       d.get("error"), str(d.get("message", "")))

    def describe(self) -> str:
        if self.kind == "mismatch" and "rel_l2" in self.figures:
            return (f"mismatch on output {self.output!r}: relative L2 {self.figures['rel_l2']:.3g}, "
                    f"max abs {self.figures.get('max_abs', float('nan')):.3g}")
        where = f" on output {self.output!r}" if self.output else ""
        return f"{self.kind}{where}" + (f": {self.error}: {self.message}" if self.error else
                                         f": {self.message}" if self.message else "")


@dataclass(frozen=True)
class FailureSignature:
    """The failure a reduction keeps: the check and target, the kind of failure and, for a mismatch,
    the threshold the error must stay above; for a refusal or crash, the exception type."""

    check: str
    target: str
    kind: str
    threshold: float = DEFAULT_THRESHOLD
    error: str | None = None
    output: str | None = None  # the output the original model failed on (cut models have others)

    def __post_init__(self) -> None:
        if self.check not in CHECKS:
            raise CuvilError(f"cuvil reduce: check {self.check!r} cannot be reduced (reducible: {', '.join(CHECKS)})")
        if self.kind not in FAILURES:
            raise CuvilError(f"cuvil reduce: {self.kind!r} is not a failure kind ({', '.join(FAILURES)})")

    @staticmethod
    def of(check: str, target: str, outcome: Outcome, threshold: float = DEFAULT_THRESHOLD) -> FailureSignature:
        """The signature of ``outcome``, the original model's failure."""
        if outcome.kind not in FAILURES:
            raise CuvilError(f"cuvil reduce: the model does not fail the {check} check on {target} "
                             f"({outcome.describe()}): there is nothing to reduce")
        return FailureSignature(check, target, outcome.kind, threshold, outcome.error, outcome.output)

    def matches(self, outcome: Outcome) -> bool:
        """Whether ``outcome`` is this failure (on any output: a cut model has outputs of its own)."""
        if outcome.kind != self.kind:
            return False
        if self.kind in ("refusal", "crash"):
            return outcome.error == self.error
        return True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> FailureSignature:
        return FailureSignature(str(d["check"]), str(d["target"]), str(d["kind"]), float(d["threshold"]),
                                d.get("error"), d.get("output"))
