"""pytest integration for ``cuvil verify``: the ``--cuvil-verify`` option and the ``cuvil_verify`` fixture.

Registered through the ``pytest11`` entry point (``cuvil = cuvil.pytest_plugin``
in ``pyproject.toml``), so installing Cuvil is enough; without the entry point
load it with ``pytest -p cuvil.pytest_plugin``.

``pytest --cuvil-verify MODEL`` (repeatable) adds one test item per check per
target to the session, beside whatever else pytest collects. MODEL is what
``cuvil verify`` takes: an ONNX file, or ``path/to/file.py:factory``. The suite
runs once per model while pytest collects, because its results are what
defines the items (a check may report per target or once overall); each item
then reports its result: ``fail`` fails the test with the check's summary,
``where`` and figures, ``skip`` skips it, ``warn`` passes with a
:class:`CuvilVerifyWarning` (and fails under ``--cuvil-strict``). A usage or
input error (an unknown check, a missing model) is a collection error, so
pytest's exit statuses line up with the command's: 0 pass, 1 a check failed,
2 a usage error. Each result's figures are recorded as ``user_properties``,
so they appear in pytest's own ``--junitxml`` report.

The ``cuvil_verify`` fixture verifies a model from inside a project's own
tests and returns the :class:`Report`::

    def test_model_is_deployable(cuvil_verify):
        report = cuvil_verify("model.onnx", checks=["coverage", "precision"], targets=["native"])
        cuvil_verify.assert_ok(report)

This module is imported by every pytest run in an environment with Cuvil
installed, so it imports nothing heavy at module level and does nothing
unless its option or fixture is used.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from cuvil.verify.base import CheckResult

_MAX_DETAIL_CHARS = 2000


class CuvilVerifyWarning(UserWarning):
    """A check ended with status ``warn``: reported, not failed (unless ``--cuvil-strict``)."""


class CheckFailedError(Exception):
    """Raised by an item whose check failed; carries the result for the failure report."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.summary)
        self.result = result


# --------------------------------------------------------------------------- running the suite


def run_verify(model: str, *, checks: Sequence[str] | None = None, targets: Sequence[str] | None = None,
               **options: Any) -> Any:
    """``cuvil.verify(model, checks=..., targets=..., **options)``, passing only what was given."""
    import cuvil

    kwargs: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
    if checks is not None:
        kwargs["checks"] = list(checks)
    if targets is not None:
        kwargs["targets"] = list(targets)
    verify = getattr(cuvil, "verify", None)
    if not callable(verify):
        raise pytest.UsageError("this Cuvil has no cuvil.verify(): the verification suite is not installed")
    return verify(model, **kwargs)


def failing(results: Iterable[CheckResult], *, strict: bool = False) -> list[CheckResult]:
    """The results that fail a run: status ``fail``, and ``warn`` too when ``strict``."""
    bad = {"fail", "warn"} if strict else {"fail"}
    return [r for r in results if str(r.status) in bad]


def format_result(result: CheckResult, *, details: bool = True) -> str:
    """A few readable lines for one result: verdict, summary, where, figures (and details, shortened)."""
    head = f"cuvil verify: {result.check}" + (f" on {result.target}" if result.target else "")
    lines = [f"{head}: {str(result.status).upper()}", f"  {result.summary}"]
    if result.where:
        lines.append("  where: " + ", ".join(f"{k}={v}" for k, v in result.where.items()))
    if result.figures:
        lines.append("  figures: " + ", ".join(f"{k}={_fmt(v)}" for k, v in result.figures.items()))
    if details and result.details:
        text = ", ".join(f"{k}={v!r}" for k, v in result.details.items())
        if len(text) > _MAX_DETAIL_CHARS:
            text = text[:_MAX_DETAIL_CHARS] + " ... (full details in the JSON report)"
        lines.append("  details: " + text)
    return "\n".join(lines)


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _model_path(model: str) -> Path:
    """The file a model spec names: ``net.onnx``, or ``net.py`` in ``net.py:factory``."""
    head, sep, _factory = model.rpartition(":")
    return Path(head) if sep and head.endswith(".py") else Path(model)


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    return items or None


# --------------------------------------------------------------------------- command line


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cuvil", "cuvil verify: pre-deployment verification of compiled models")
    group.addoption("--cuvil-verify", action="append", default=[], metavar="MODEL",
                    help="run `cuvil verify` on MODEL (ONNX file or path/to/file.py:factory) as test items: "
                         "one per check per target (repeatable)")
    group.addoption("--cuvil-checks", default=None, metavar="LIST",
                    help="comma-separated checks to run (default: those `cuvil verify` runs)")
    group.addoption("--cuvil-targets", default=None, metavar="LIST",
                    help="comma-separated targets (default: those `cuvil verify` picks)")
    group.addoption("--cuvil-config", default=None, metavar="FILE",
                    help="thresholds and options (cuvil.toml or pyproject.toml with [tool.cuvil.verify])")
    group.addoption("--cuvil-strict", action="store_true", default=False,
                    help="checks that end with a warning fail")


def _options(config: pytest.Config) -> dict[str, Any]:
    return {
        "checks": _split(config.getoption("cuvil_checks")),
        "targets": _split(config.getoption("cuvil_targets")),
        "config": config.getoption("cuvil_config"),
        "strict": True if config.getoption("cuvil_strict") else None,   # else the configuration decides
    }


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection, so those select among these items too
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    for model in config.getoption("cuvil_verify") or []:
        # the node id is the model as the user named it: items read ``net.onnx::coverage[native]``
        collector = CuvilModel.from_parent(session, name=model, nodeid=model, path=_model_path(model).absolute())
        items.extend(session.genitems(collector))


# --------------------------------------------------------------------------- collection


class CuvilModel(pytest.Collector):
    """One model under ``--cuvil-verify``: collecting it runs the suite and yields one item per result."""

    def collect(self) -> Iterator[pytest.Item]:
        from cuvil.verify.base import VerifyError

        config = self.config
        try:
            report = run_verify(self.name, **_options(config))
        except VerifyError as e:
            raise self.CollectError(f"cuvil verify {self.name}: {e}") from e
        # warnings fail under --cuvil-strict, or when the configuration made the run strict
        strict = bool(config.getoption("cuvil_strict")) or bool(getattr(report, "strict", False))
        seen: dict[str, int] = {}
        for result in report.results:
            base = f"{result.check}[{result.target}]" if result.target else result.check
            seen[base] = seen.get(base, 0) + 1
            name = base if seen[base] == 1 else f"{base}#{seen[base]}"
            yield CuvilCheck.from_parent(self, name=name, result=result, strict=strict)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]) -> str:  # type: ignore[override]
        if isinstance(excinfo.value, self.CollectError):
            return str(excinfo.value.args[0])
        return str(super().repr_failure(excinfo))


class CuvilCheck(pytest.Item):
    """One check's result on one target, reported as a test."""

    def __init__(self, *, result: CheckResult, strict: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.result = result
        self.strict = strict
        self.add_marker(pytest.mark.cuvil_verify)
        props: list[tuple[str, object]] = [(f"cuvil.{k}", v) for k, v in result.figures.items()]
        props += [(f"cuvil.where.{k}", v) for k, v in result.where.items()]
        self.user_properties.extend(props)

    def runtest(self) -> None:
        result = self.result
        status = str(result.status)
        if status == "fail" or (status == "warn" and self.strict):
            raise CheckFailedError(result)
        if status == "skip":
            pytest.skip(f"{result.check}: {result.summary}")
        if status == "warn":
            warnings.warn(CuvilVerifyWarning(format_result(result, details=False)), stacklevel=1)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CheckFailedError):
            return format_result(excinfo.value.result)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        target = f" on {self.result.target}" if self.result.target else ""
        return self.path, None, f"cuvil verify {self.parent.name if self.parent else ''}: {self.result.check}{target}"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuvil_verify: a `cuvil verify` check result collected by --cuvil-verify")


# --------------------------------------------------------------------------- fixture


class VerifyFixture:
    """What the ``cuvil_verify`` fixture returns: call it to verify a model, ``assert_ok`` to gate on it."""

    def __init__(self, defaults: dict[str, Any], strict: bool) -> None:
        self.defaults = defaults
        self.strict = strict
        self.reports: list[Any] = []

    def __call__(self, model: str | Any, *, checks: Sequence[str] | None = None,
                 targets: Sequence[str] | None = None, **options: Any) -> Any:
        """Run ``cuvil.verify`` on ``model``; the command-line ``--cuvil-*`` options are the defaults."""
        d = self.defaults
        options.setdefault("config", d.get("config"))
        options.setdefault("strict", d.get("strict"))
        report = run_verify(model, checks=d.get("checks") if checks is None else checks,
                            targets=d.get("targets") if targets is None else targets, **options)
        self.reports.append(report)
        return report

    def assert_ok(self, report: Any, *, strict: bool | None = None) -> None:
        """Fail the calling test, listing every failing result, when ``report`` has any."""
        if strict is None:
            strict = self.strict or bool(getattr(report, "strict", False))
        bad = failing(report.results, strict=strict)
        if bad:
            pytest.fail("\n".join(format_result(r) for r in bad), pytrace=False)


@pytest.fixture
def cuvil_verify(request: pytest.FixtureRequest) -> VerifyFixture:
    """Verify a model from a test: ``report = cuvil_verify("model.onnx", checks=[...], targets=[...])``."""
    config = request.config
    return VerifyFixture(_options(config), strict=bool(config.getoption("cuvil_strict")))
