"""Running a suite: which checks, on which targets, against which subject; crashes and progress.

The runner owns everything between "the user named a model" and "here is the report":

- selection: check names or group names (a group may be abbreviated to a unique prefix:
  ``compat`` is ``compatibility``), in the order given, each once; ``all`` (the default) runs
  the groups in the order of :data:`GROUP_ORDER` (the checks that time builds last);
- builds: before the first check, the builds the checks will ask for are started in the
  background (a check says which with an optional ``builds(ctx)`` method returning
  ``(target, options)`` pairs; one without it may use every target's default build), so
  the compilers run while the static checks work; they are all finished before a check of
  the ``runtime`` group starts, so that no build shares the CPU with what it measures;
- targets: the ones asked for that are available here run; the ones that are not are
  reported as skipped results (one per check and target) with the reason, never dropped;
- the subject: what is being verified on each target (a :class:`Subject`): Cuvil's own builds
  by default, or an onnxruntime session (``onnxruntime``, cuvil/verify/onnxruntime_subject.py),
  which names its own targets and declines the checks that look at Cuvil's compiler;
- isolation: a check that raises is recorded as a failed result carrying the exception
  (``details["error"]``), and the suite goes on; only :class:`VerifyError` (a usage or input
  error) stops the run;
- progress, on stderr: a redrawn progress bar on a terminal, plain lines otherwise (CI logs).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from cuvil.backends.registry import Backend
from cuvil.verify.base import Check, CheckResult, Status, VerifyError, all_checks
from cuvil.verify.config import VerifyConfig
from cuvil.verify.context import ModelSource, VerifyContext
from cuvil.verify.report import Report, environment

DEFAULT_TARGETS = ("ref", "native")
#: The order ``all`` runs the groups in (others after them): the checks that measure time come last.
GROUP_ORDER = ("compatibility", "ir-stability", "runtime")
#: The group whose checks time the builds: background builds are finished before one of them starts.
TIMED_GROUP = "runtime"


# ---- targets ----------------------------------------------------------------------------------------------------


def target_unavailable(target: str) -> str | None:
    """None when ``target`` can be built and run here, else why not (its backend says:
    ``cuvil.backends.registry.Backend.unavailable``)."""
    from cuvil.backends.registry import backend_names, find_backend

    backend = find_backend(target)
    if backend is None:
        raise VerifyError(f"unknown target {target!r} (known: {', '.join(backend_names())})")
    return _unavailable(backend)


@functools.cache
def _unavailable(backend: Backend) -> str | None:
    return backend.unavailable()  # a toolchain lookup and /proc/cpuinfo: once per backend and process


def available_targets() -> list[str]:
    """Every target that can be built and run on this machine."""
    from cuvil.backends.registry import backend_names

    return [t for t in backend_names() if target_unavailable(t) is None]


def resolve_targets(requested: Sequence[str] | None) -> tuple[list[str], dict[str, str]]:
    """The targets to run and, apart, the requested ones unavailable here with the reason.

    ``None`` is the default (ref and native); ``["all"]`` every available target."""
    names = list(requested if requested else DEFAULT_TARGETS)
    if names == ["all"]:
        return available_targets(), {}
    run: list[str] = []
    skipped: dict[str, str] = {}
    for t in dict.fromkeys(names):
        why = target_unavailable(t)
        if why is None:
            run.append(t)
        else:
            skipped[t] = why
    return run, skipped


# ---- checks -----------------------------------------------------------------------------------------------------


def load_builtin_checks() -> None:
    """Register the checks that ship with Cuvil (the ``cuvil.verify.checks`` package, when present)."""
    if importlib.util.find_spec("cuvil.verify.checks") is not None:
        importlib.import_module("cuvil.verify.checks")


def select_checks(names: Iterable[str] | None) -> list[type[Check]]:
    """Check classes for names of checks or groups (None or "all": every registered check)."""
    known = all_checks()
    wanted = [n.strip() for n in (names or ["all"]) if n.strip()]
    if not wanted:
        raise VerifyError("no checks selected")
    picked: dict[str, type[Check]] = {}
    groups = list(dict.fromkeys(c.group for c in known.values()))
    for name in wanted:
        if name == "all":
            rank = {g: i for i, g in enumerate(GROUP_ORDER)}
            picked.update(sorted(known.items(), key=lambda kv: rank.get(kv[1].group, len(rank))))
        elif name in known:
            picked[name] = known[name]
        else:
            matches = [g for g in groups if g == name] or [g for g in groups if g.startswith(name)]
            if len(matches) != 1:
                what = "ambiguous" if matches else "unknown"
                raise VerifyError(f"{what} check or group {name!r} (checks: {', '.join(sorted(known)) or 'none'}; "
                                  f"groups: {', '.join(groups) or 'none'})")
            picked.update({n: c for n, c in known.items() if c.group == matches[0]})
    return list(picked.values())


# ---- subjects ---------------------------------------------------------------------------------------------------


class Subject:
    """What is verified on each target: the builds a check gets from ``ctx.compiled(target)``.

    A subject makes the context the checks see and may decline checks that do not apply to it
    (a session of another runtime has no generated code to point at, for instance)."""

    name = "subject"

    def context(self, source: ModelSource, targets: list[str], config: VerifyConfig, *, work_dir: Path,
                cache_dir: str | None) -> VerifyContext:
        raise NotImplementedError

    def not_applicable(self, check: type[Check]) -> str | None:
        """None when ``check`` applies to this subject, else why not (the check is reported as skipped)."""
        return None

    def prefetch(self, ctx: VerifyContext, checks: Sequence[Check]) -> None:
        """Start, in the background, the builds ``checks`` will ask for (nothing by default)."""

    def resolve_targets(self, explicit: Sequence[str] | None, configured: Sequence[str] | None
                        ) -> tuple[list[str], dict[str, str]]:
        """The targets to run (asked for by argument, else by the configuration) and the unavailable ones."""
        return resolve_targets(explicit if explicit is not None else configured)


class CuvilSubject(Subject):
    """Cuvil's own compiled models (the default)."""

    name = "cuvil"

    def context(self, source: ModelSource, targets: list[str], config: VerifyConfig, *, work_dir: Path,
                cache_dir: str | None) -> VerifyContext:
        return VerifyContext(source=source, targets=targets, config=config.as_context_config(), seed=config.seed,
                             work_dir=work_dir, cache_dir=cache_dir)

    def prefetch(self, ctx: VerifyContext, checks: Sequence[Check]) -> None:
        requests: list[tuple[str, dict[str, Any]]] = []
        for check in checks:
            declared = getattr(check, "builds", None)
            if callable(declared):
                requests += [(t, dict(o)) for t, o in declared(ctx)]
            else:
                requests += [(t, {}) for t in ctx.targets]
        # every check's default builds first (most checks share them), then the variants
        requests.sort(key=lambda r: bool(r[1]))
        ctx.prefetch(r for r in requests if r[0] != "ref")  # the reference "build" is the interpreter: instant


def _onnxruntime() -> Subject:
    from cuvil.verify.onnxruntime_subject import OnnxRuntimeSubject

    return OnnxRuntimeSubject()


SUBJECTS: dict[str, Callable[[], Subject]] = {"cuvil": CuvilSubject, "onnxruntime": _onnxruntime}


def get_subject(subject: str | Subject) -> Subject:
    if isinstance(subject, Subject):
        return subject
    try:
        return SUBJECTS[subject]()
    except KeyError:
        raise VerifyError(f"unknown subject {subject!r} (known: {', '.join(SUBJECTS)})") from None


# ---- progress ---------------------------------------------------------------------------------------------------


class Progress:
    """Which check and targets are running: a progress bar on a terminal, plain lines otherwise."""

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None, width: int = 24) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.width = width
        self._t0 = time.perf_counter()
        self._bar = ""

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _clear(self) -> None:
        if self.tty and self._bar:
            self._write("\r" + " " * len(self._bar) + "\r")
            self._bar = ""

    def start(self, index: int, total: int, check: str, targets: Sequence[str]) -> None:
        on = f" on {', '.join(targets)}" if targets else ""
        if self.tty:
            done = self.width * index // max(total, 1)
            self._clear()
            self._bar = (f"[{'#' * done}{'.' * (self.width - done)}] {index}/{total} {check}{on} "
                         f"({time.perf_counter() - self._t0:.0f} s)")
            self._write(self._bar)
        else:
            self._write(f"[{index + 1}/{total}] {check}{on} ...\n")

    def result(self, r: CheckResult) -> None:
        self._clear()
        target = f" [{r.target}]" if r.target else ""
        self._write(f"  {str(r.status).upper():4s} {r.check}{target}: {r.summary} ({r.seconds:.2f} s)\n")

    def finish(self, report: Report) -> None:
        """Where the inputs' values and the symbolic dims' extents came from, then the verdict."""
        self._clear()
        for i in report.inputs:
            self._write(f"input {i['name']}: {i['domain']} ({i['source']})\n")
        for d in report.dims:
            self._write(f"dim {d['symbol']}: {d['why']}\n")
        self._write(f"{report.verdict} in {report.seconds:.1f} s\n")


class _Silent(Progress):
    def __init__(self) -> None:
        super().__init__(open(os.devnull, "w"), tty=False)  # noqa: SIM115  (closed with the object)


# ---- running ----------------------------------------------------------------------------------------------------


def crash_result(check: str, exc: BaseException, seconds: float) -> CheckResult:
    """The result of a check that raised: a failure carrying the exception."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return CheckResult(check=check, status=Status.FAIL, summary=f"the check crashed: {type(exc).__name__}: {exc}",
                       details={"error": {"type": type(exc).__name__, "message": str(exc), "traceback": tb}},
                       seconds=seconds)


def run_check(check: Check, ctx: VerifyContext) -> list[CheckResult]:
    """Run one check; a crash or a malformed return becomes a failed result, never an exception
    (except VerifyError, a usage error that ends the run)."""
    t0 = time.perf_counter()
    try:
        results: Any = check.run(ctx)
    except VerifyError:
        raise
    except Exception as exc:
        return [crash_result(check.name, exc, time.perf_counter() - t0)]
    elapsed = time.perf_counter() - t0
    if not isinstance(results, list) or not all(isinstance(r, CheckResult) for r in results):
        wrong = TypeError(f"{type(check).__name__}.run returned {type(results).__name__}, not a list of CheckResult")
        return [crash_result(check.name, wrong, elapsed)]
    if not results:
        return [CheckResult(check.name, Status.FAIL, "the check returned no result", seconds=elapsed,
                            details={"error": {"type": "NoResult", "message": "run() returned []", "traceback": ""}})]
    for r in results:
        if r.check != check.name:
            r.details.setdefault("reported_as", r.check)
            r.check = check.name
        if not r.seconds:
            r.seconds = elapsed / len(results)
    return results


@dataclass
class Suite:
    """One run, planned: the context, the checks, and the targets that will be skipped."""

    ctx: VerifyContext
    checks: list[Check]
    skipped_targets: dict[str, str]
    subject: Subject
    strict: bool = False
    config_path: str | None = None

    def run(self, progress: Progress | None = None) -> Report:
        progress = progress if progress is not None else _Silent()
        t0 = time.perf_counter()
        report = Report(model=self.ctx.source.label, targets=list(self.ctx.targets),
                        checks=[c.name for c in self.checks], strict=self.strict, subject=self.subject.name,
                        environment=environment(), config_path=self.config_path)
        applicable = [c for c in self.checks if self.subject.not_applicable(type(c)) is None]
        try:
            describe_inputs(report, self.ctx)
            self.subject.prefetch(self.ctx, applicable)
            self._run_checks(report, progress)
        finally:
            self.ctx.close()
        report.seconds = time.perf_counter() - t0
        progress.finish(report)
        return report

    def _run_checks(self, report: Report, progress: Progress) -> None:
        for i, check in enumerate(self.checks):
            progress.start(i, len(self.checks), check.name, self.ctx.targets)
            t_check, built = time.perf_counter(), len(self.ctx.builds)
            why = self.subject.not_applicable(type(check))
            if why is not None:
                results = [CheckResult(check.name, Status.SKIP, f"does not apply to {self.subject.name}: {why}")]
            else:
                if check.group == TIMED_GROUP:
                    self.ctx.settle()
                results = run_check(check, self.ctx)
            for target, reason in self.skipped_targets.items():
                results.append(CheckResult(check.name, Status.SKIP, f"target {target} is not available here: {reason}",
                                           target=target))
            for r in results:
                progress.result(r)
            report.results.extend(results)
            builds = self.ctx.builds[built:]
            report.timings.append({"check": check.name, "seconds": time.perf_counter() - t_check,
                                   "builds": builds, "build_seconds": sum(b["seconds"] for b in builds)})


GENERATED_ONLY = ("every check ran on generated inputs only: no real samples were given; the values follow "
                  "the domains listed per input, which may miss what the model meets in use")


def describe_inputs(report: Report, ctx: VerifyContext) -> None:
    """Record in ``report`` what each input's samples are drawn from, and warn when all of them are
    generated. A model that cannot be imported is left to the checks, which report why."""
    try:
        domains = ctx.input_domains()
    except VerifyError:
        raise
    except Exception:
        return
    report.inputs = [{"name": name, "source": d.source, "domain": d.what()} for name, d in domains.items()]
    if domains and all(d.source != "user data" for d in domains.values()):
        report.warnings.append(GENERATED_ONLY)
    try:
        dims = ctx.dim_domains()
    except VerifyError:
        raise
    except Exception:  # the checks drawing samples meet the same error and report it
        return
    report.dims = [{"symbol": s, "smallest": d.min, "sample": d.sample, "why": d.describe()} for s, d in dims.items()]


def plan(source: ModelSource, *, config: VerifyConfig, checks: Sequence[str] | None = None,
         targets: Sequence[str] | None = None, strict: bool | None = None, subject: str | Subject = "cuvil",
         work_dir: Path, cache_dir: str | None = None) -> Suite:
    """Resolve checks, targets and options (explicit arguments over the configuration) into a Suite."""
    load_builtin_checks()
    classes = select_checks(checks if checks is not None else config.select)
    unknown = set(config.checks) - set(all_checks())
    if unknown:
        raise VerifyError(f"{config.path or 'config'}: [checks.NAME] tables for unknown checks: {', '.join(sorted(unknown))}")
    subj = get_subject(subject)
    run_targets, skipped = subj.resolve_targets(targets, config.targets)
    if not run_targets:
        raise VerifyError("none of the requested targets is available here: "
                          + "; ".join(f"{t}: {why}" for t, why in skipped.items()))
    work_dir.mkdir(parents=True, exist_ok=True)
    ctx = subj.context(source, run_targets, config, work_dir=work_dir, cache_dir=cache_dir)
    instances = [cls(config.checks.get(cls.name, {})) for cls in classes]
    return Suite(ctx, instances, skipped, subj, config.strict if strict is None else strict,
                 str(config.path) if config.path else None)
