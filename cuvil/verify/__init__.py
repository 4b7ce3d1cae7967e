"""Pre-deployment verification: run named checks on one model against targets, and report.

    import cuvil

    report = cuvil.verify("model.onnx", targets=["ref", "native"], checks=["compatibility", "layerwise"],
                          report_dir="verify-out")
    print(report.verdict)          # "PASS: 9 pass, 1 warn, 0 fail, 0 skip"
    raise SystemExit(report.exit_status)

``cuvil.verify`` is this package, and the package is callable: ``cuvil.verify(model, ...)`` is
:func:`verify` (bound to ``__call__`` below), and ``cuvil.verify.runner`` and the other modules stay
importable by their dotted names (a function bound to the name would hide them). The package
module is created callable by its loader, as cuvil/_callable.py describes.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cuvil.verify.base import Check, CheckResult, Status, VerifyError, all_checks, get_check, register_check
from cuvil.verify.config import VerifyConfig, find_config, load_config
from cuvil.verify.context import ModelSource, VerifyContext
from cuvil.verify.report import Report
from cuvil.verify.runner import Progress, Subject, available_targets


def verify(
    model: Any,
    *,
    targets: Sequence[str] | None = None,
    checks: Sequence[str] | str | None = None,
    config: VerifyConfig | Mapping[str, Any] | str | Path | None = None,
    report_dir: str | Path | None = None,
    strict: bool | None = None,
    baseline: str | Path | None = None,
    save_baseline: str | Path | None = None,
    subject: str | Subject = "cuvil",
    input_spec: Any = None,
    dynamic_shapes: Any = None,
    cache_dir: str | Path | None = None,
    work_dir: str | Path | None = None,
    progress: Progress | bool = False,
    trace: str | Path | None = None,
    memory_limit: int | str | None = None,
    inputs: str | Path | None = None,
) -> Report:
    """Run the verification suite on ``model`` and return the Report.

    ``model``: an ONNX path or ModelProto, ``"path/to/file.py:factory"``, a Cuvil Graph, or a
    PyTorch module with ``input_spec`` (and ``dynamic_shapes``). ``targets``: target names,
    ``["all"]`` for every one available here (default: ref and native). ``checks``: check or
    group names (a string may list them with commas; default: every check). ``config``: a
    ``cuvil.toml`` / ``pyproject.toml`` path, a mapping of the same keys, or a VerifyConfig;
    None searches the current folder and those above it. Explicit arguments override it.
    ``report_dir``: write report.json (+ tensors), junit.xml, summary.md and report.html there.
    ``baseline``: compare figures with a stored run (adds ``baseline`` results);
    ``save_baseline``: store this run's figures. ``progress``: True for progress on stderr.
    ``trace``: write the latency check's Chrome trace (Perfetto) to this file. ``memory_limit``:
    the batch-scaling check's memory limit (bytes, or a size such as ``"512M"`` or ``"2GiB"``).
    ``inputs``: a folder of real input samples (``.npz`` files, the format of ``--calibration``),
    the checks' first source of inputs (over the configuration's ``[inputs] data``).
    ``work_dir``: where checks write their builds and files, kept after the run (default:
    ``report_dir/work``, or else a temporary folder that is removed when the run ends).

    Usage and input errors raise :class:`VerifyError`; a check that fails or crashes does not
    raise, it is a failed result (``report.exit_status`` is 1)."""
    from cuvil.verify.baseline import compare, load_baseline
    from cuvil.verify.baseline import save_baseline as write_baseline
    from cuvil.verify.config import parse_size, resolve_config, with_options
    from cuvil.verify.loader import load_model
    from cuvil.verify.runner import plan

    cfg = resolve_config(config)
    overrides: dict[str, dict[str, Any]] = {}
    if trace is not None:
        overrides["latency"] = {"trace": str(trace)}
    if memory_limit is not None:
        overrides["batch-scaling"] = {"memory_limit": parse_size(memory_limit, "memory_limit")}
    cfg = with_options(cfg, overrides)
    if inputs is not None:
        cfg = dataclasses.replace(cfg, input_data=str(inputs))
    names = [c.strip() for c in checks.split(",")] if isinstance(checks, str) else checks
    source = load_model(model, input_spec=input_spec, dynamic_shapes=dynamic_shapes)
    stored = load_baseline(baseline) if baseline is not None else None  # a bad file fails before the long run
    own_work = work_dir is None and report_dir is None  # a scratch folder of its own, removed after the run
    if work_dir is not None:
        work = Path(work_dir)
    elif report_dir is not None:
        work = Path(report_dir) / "work"
    else:
        work = Path(tempfile.mkdtemp(prefix="cuvil-verify-"))
    try:
        suite = plan(source, config=cfg, checks=names, targets=targets, strict=strict, subject=subject,
                     work_dir=work, cache_dir=str(cache_dir) if cache_dir is not None else None)
        shown: Progress | None = progress if isinstance(progress, Progress) else (Progress() if progress else None)
        report = suite.run(shown)
    finally:
        if own_work:
            shutil.rmtree(work, ignore_errors=True)
    if stored is not None:
        compared = compare(report, stored, cfg.baseline)
        report.results.extend(compared)
        for r in compared:
            if shown is not None:
                shown.result(r)
    if save_baseline is not None:
        write_baseline(report, save_baseline)
    if report_dir is not None:
        from cuvil.verify.render import write_reports

        write_reports(report, report_dir)
    return report


__call__ = verify  # cuvil.verify(model, ...): the package module calls it (cuvil/_callable.py)

__all__ = [
    "Check",
    "CheckResult",
    "ModelSource",
    "Progress",
    "Report",
    "Status",
    "Subject",
    "VerifyConfig",
    "VerifyContext",
    "VerifyError",
    "all_checks",
    "available_targets",
    "find_config",
    "get_check",
    "load_config",
    "register_check",
    "verify",
]
