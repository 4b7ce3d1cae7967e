"""The oracle: whether a candidate graph still fails with the signature, judged in a fresh process.

Each candidate is written to a folder of its own (``model.cir``, ``inputs.npz``, ``job.json``) and
judged by :func:`cuvil.reduce.worker.main` in a child of the fork server (``forkserver``: a process of
its own, forked from one that has Cuvil imported) under a timeout: a child that dies by a signal is a
``crash``, one that runs past the timeout a ``hang``, so neither ends the search.  Outcomes are
cached by the candidate's text and inputs, so a candidate two reductions reach is judged once.
"""

from __future__ import annotations

import hashlib
import json
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.reduce.forkserver import run_forked
from cuvil.reduce.signature import DEFAULT_THRESHOLD, Outcome


@dataclass(frozen=True)
class Job:
    """What every candidate is judged with: the target, the planted faults, the threshold; with
    ``subject="onnxruntime"``, an onnxruntime session on the cut of the ``source`` ONNX model instead
    of a Cuvil build (the target is then ``onnxruntime``)."""

    target: str
    faults: tuple[str, ...] = ()
    threshold: float = DEFAULT_THRESHOLD
    timeout: float = 120.0
    cache_dir: str | None = None
    subject: str | None = None
    source: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"target": self.target, "faults": list(self.faults), "threshold": self.threshold,
                "timeout": self.timeout, "cache_dir": self.cache_dir, "subject": self.subject,
                "source": self.source}

    @staticmethod
    def from_json(j: Mapping[str, Any]) -> Job:
        return Job(str(j["target"]), tuple(j.get("faults", ())), float(j["threshold"]), float(j.get("timeout", 120.0)),
                   j.get("cache_dir"), j.get("subject"), j.get("source"))


def write_case(d: Path, text: str, inputs: Mapping[str, np.ndarray], job: Job, write_expected: bool = False,
               reference: Mapping[str, np.ndarray] | None = None) -> None:
    """The folder the worker reads: the candidate, its inputs and the job; ``reference``: the reference's
    outputs where they are known already (the recorded run), so the worker does not run it again."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.cir").write_text(text)
    arrays: dict[str, Any] = dict(inputs)
    np.savez(d / "inputs.npz", **arrays)
    (d / "job.json").write_text(json.dumps({**job.to_json(), "write_expected": write_expected}, indent=1))
    ref = d / "reference.npz"
    ref.unlink(missing_ok=True)
    if reference is not None:
        known: dict[str, Any] = dict(reference)
        np.savez(ref, **known)


def judge(d: Path, timeout: float) -> Outcome:
    """Judge folder ``d`` in a child of the fork server (a process of its own) and read its outcome."""
    (d / "outcome.json").unlink(missing_ok=True)
    status, stderr = run_forked(d, timeout)
    if status is None:
        return Outcome("hang", message=f"ran past the {timeout:g} s timeout")
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return Outcome("crash", error=name, message=f"the process died by {name}")
    out = d / "outcome.json"
    if status != 0 or not out.exists():
        tail = stderr.strip().splitlines()
        last = tail[-1] if tail else f"exit status {status}"
        return Outcome("crash", error=last.split(":")[0][:80], message=last[:300])
    return Outcome.from_json(json.loads(out.read_text()))


@dataclass
class Oracle:
    """Judges candidates under one job in folders below ``work``, counting and caching them."""

    job: Job
    work: Path
    tried: int = 0
    seconds: float = 0.0
    _seen: dict[str, Outcome] = field(default_factory=dict)

    def outcome(self, text: str, inputs: Mapping[str, np.ndarray],
                reference: Mapping[str, np.ndarray] | None = None) -> Outcome:
        """The candidate's outcome (``reference``: its outputs as recorded, see :func:`write_case`)."""
        h = hashlib.sha256(text.encode())
        for k in sorted(inputs):
            h.update(k.encode())
            h.update(np.ascontiguousarray(inputs[k]).tobytes())
        key = h.hexdigest()
        if key in self._seen:
            return self._seen[key]
        t0 = time.perf_counter()
        d = self.work / f"c{self.tried:04d}"
        write_case(d, text, inputs, self.job, reference=reference)
        result = judge(d, self.job.timeout)
        self.tried += 1
        self.seconds += time.perf_counter() - t0
        self._seen[key] = result
        return result

