"""The repro folder: the reduced model, its recorded inputs, the reference's outputs, and its replay.

A folder holds ``model.cir`` (the reduced graph), ``inputs.npz`` (the values the original run had
at the cut, keyed by input name), ``expected.npz`` (the reference interpreter's outputs on them),
``repro.json`` (the signature, target, planted faults, threshold, sizes and the outcome seen) and a
``README.md`` saying what fails, by how much, and the command that replays it.  :func:`replay`
judges the folder again in a fresh process: the failure is still there when the outcome matches
the recorded signature.
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cuvil.errors import CuvilError
from cuvil.reduce.oracle import Job, judge, write_case
from cuvil.reduce.search import ReduceResult
from cuvil.reduce.signature import FailureSignature, Outcome


def replay_command(d: Path) -> str:
    return f"cuvil reduce --replay {shlex.quote(str(d))}"


def write_repro(d: Path, result: ReduceResult, signature: FailureSignature, job: Job, source: str,
                extra: Sequence[str] = ()) -> None:
    """Write the repro folder ``d`` for ``result`` (``extra``: more files already written there, to list)."""
    # the expected outputs come from the reference run in a worker of its own, as every judgement does
    write_case(d, result.text, result.inputs, job, write_expected=True)
    onnx_note = _write_onnx(d, result, job)
    seen = judge(d, job.timeout)
    (d / "outcome.json").unlink(missing_ok=True)
    meta: dict[str, Any] = {
        "signature": signature.to_json(), "job": job.to_json(), "source": source,
        "original_size": result.original_size, "reduced_size": result.size,
        "candidates_tried": result.tried, "seconds": round(result.seconds, 2),
        "outcome": result.outcome.to_json(), "replayed": seen.to_json(),
        "replay": replay_command(d),
    }
    (d / "repro.json").write_text(json.dumps(meta, indent=1) + "\n")
    (d / "README.md").write_text(_readme(d, result, signature, job, source, [onnx_note, *extra]))


def _write_onnx(d: Path, result: ReduceResult, job: Job) -> str:
    """Write ``model.onnx``, the source ONNX model cut as the reduced graph is; the README's line on it."""
    if job.source is None or not job.source.endswith(".onnx"):
        return "model.onnx: not written: the source is not an ONNX model (the reduced graph is model.cir)"
    from cuvil.frontends.onnx.cut import OnnxCutError, load_source, save_cut
    from cuvil.ir.parser import parse_graph

    try:
        save_cut(load_source(job.source), parse_graph(result.text), d / "model.onnx")
    except OnnxCutError as exc:
        return f"model.onnx: not written: {exc} (the reduced graph is model.cir)"
    return "model.onnx: the source ONNX model cut the same way (inputs.npz feeds it too)"


def _readme(d: Path, result: ReduceResult, signature: FailureSignature, job: Job, source: str,
            extra: Sequence[str]) -> str:
    faults = f" with planted faults {', '.join(job.faults)}" if job.faults else ""
    files = ["model.cir: the reduced graph (Cuvil IR text form)",
             "inputs.npz: its inputs, the original run's values at the cut (keyed by input name)",
             "expected.npz: the reference interpreter's outputs on those inputs",
             "repro.json: signature, target, faults, threshold, sizes, outcome",
             "job.json: what the judging worker reads (python -m cuvil.reduce.worker DIR)", *extra]
    return "\n".join([
        f"# Reduced repro: {signature.check} check, target {job.target}",
        "",
        f"Source: `{source}`, reduced from {result.original_size} to {result.size} node(s) "
        f"({result.tried} candidates, {result.seconds:.1f} s).",
        "",
        f"What fails: {_subject(job)}{faults}, the model's outputs on `inputs.npz` "
        f"disagree with the reference interpreter: {result.outcome.describe()} "
        f"(signature: {signature.kind}" + (f", threshold relative L2 {signature.threshold:g}"
                                            if signature.kind == "mismatch" else "") + ").",
        "",
        "Replay (exit status 1 while the failure is there, 0 once it is fixed):",
        "",
        "    " + replay_command(d),
        "",
        "Files:",
        "",
        *[f"- {f}" for f in files],
        "",
    ])


def _subject(job: Job) -> str:
    if job.subject == "onnxruntime":
        return "run by onnxruntime (model.onnx, CPU execution provider, every graph optimisation on)"
    return f"compiled for `{job.target}`"


def replay(d: Path, faults: Sequence[str] | None = None) -> tuple[bool, Outcome, FailureSignature]:
    """Judge repro folder ``d`` again: (whether it still fails with its signature, the outcome,
    the signature).  ``faults`` replaces the recorded planted faults."""
    meta_path = d / "repro.json"
    if not meta_path.is_file():
        raise CuvilError(f"{d}: not a repro folder (no repro.json)")
    meta = json.loads(meta_path.read_text())
    sig = FailureSignature.from_json(meta["signature"])
    job = Job.from_json(meta["job"])
    if faults is not None:
        job = replace(job, faults=tuple(faults))
    if job.subject is not None:  # the session runs the repro's own cut of the source
        job = replace(job, source=str(d / "model.onnx"))
    with tempfile.TemporaryDirectory(prefix="cuvil-replay-") as tmp:
        case = Path(tmp)
        write_case(case, (d / "model.cir").read_text(), {}, job)
        shutil.copyfile(d / "inputs.npz", case / "inputs.npz")
        outcome = judge(case, job.timeout)
    return sig.matches(outcome), outcome, sig
