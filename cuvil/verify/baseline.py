"""Baselines: the figures of a stored run, and a check that this run's figures did not regress.

``--save-baseline FILE`` writes every result's figures (keyed by check and target) as JSON;
``--baseline FILE`` (that file, or a ``report.json``) compares this run with it and adds one
``baseline`` result per target: failed when a figure got worse than its margin allows.

Direction: a figure is better lower (latency, error, arena size) unless its name matches a
"higher is better" glob (built in: throughput, SNR, speedup, per-second rates; more in the
configuration's ``[baseline] higher_is_better``) or the result lists it in
``details["higher_is_better"]``. A figure may get worse by ``max(relative * |baseline|, absolute)``;
margins come from ``[baseline]`` in the configuration, per figure by glob on ``check.figure``
(the first matching glob wins). A NaN where the baseline had a number is a regression.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from cuvil.verify.base import CheckResult, Status, VerifyError
from cuvil.verify.config import BaselineConfig, Margin
from cuvil.verify.report import Report, from_json_number, to_jsonable

FORMAT = "cuvil-verify-baseline"
HIGHER_IS_BETTER = ("*throughput*", "*snr*", "*speedup*", "*per_s", "*per_second*")

Key = tuple[str, str | None]  # (check, target)


@dataclass(frozen=True)
class Baseline:
    """Figures of a stored run, per (check, target)."""

    figures: Mapping[Key, Mapping[str, float]]
    model: str = ""
    path: str = ""


def save_baseline(report: Report, path: str | Path) -> Path:
    """Write the figures of ``report`` to ``path`` (JSON)."""
    p = Path(path)
    data = {
        "format": FORMAT,
        "version": 1,
        "model": report.model,
        "started": report.started,
        "environment": report.environment,
        "results": [{"check": r.check, "target": r.target, "status": str(r.status), "figures": r.figures}
                    for r in report.results if r.figures and r.check != "baseline"],
    }
    if p.parent != Path():
        p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(to_jsonable(data), indent=1) + "\n", encoding="utf-8")
    return p


def load_baseline(path: str | Path) -> Baseline:
    """A baseline file, or a report.json (whose results carry the same figures)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise VerifyError(f"{p}: cannot read the baseline: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise VerifyError(f"{p}: not a baseline (invalid JSON: {exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise VerifyError(f"{p}: not a baseline or report.json (no results list)")
    figures: dict[Key, dict[str, float]] = {}
    for entry in data["results"]:
        if not isinstance(entry, dict) or "check" not in entry or entry.get("check") == "baseline":
            continue
        nums = {str(k): v for k, v in ((k, from_json_number(v)) for k, v in (entry.get("figures") or {}).items())
                if v is not None}
        if nums:
            figures.setdefault((str(entry["check"]), entry.get("target")), {}).update(nums)
    return Baseline(figures, str(data.get("model", "")), str(p))


def _higher_is_better(key: str, name: str, result: CheckResult | None, config: BaselineConfig) -> bool:
    if result is not None and name in (result.details.get("higher_is_better") or ()):
        return True
    return any(fnmatchcase(key.lower(), g.lower()) or fnmatchcase(name.lower(), g.lower())
               for g in (*HIGHER_IS_BETTER, *config.higher_is_better))


def margin_for(key: str, config: BaselineConfig) -> Margin:
    """The margin of the figure ``check.figure``: the first matching glob's, else the default."""
    for glob, margin in config.figures:
        if fnmatchcase(key, glob):
            return margin
    return config.default


def compare_figure(base: float, now: float, margin: Margin, higher_is_better: bool) -> tuple[str, float]:
    """("regressed" | "improved" | "ok", how much worse ``now`` is, in the figure's own units)."""
    if math.isnan(base) and math.isnan(now):
        return "ok", 0.0
    if math.isnan(now) or math.isnan(base):
        return ("regressed", math.inf) if math.isnan(now) else ("improved", -math.inf)
    worse = (base - now) if higher_is_better else (now - base)
    if math.isinf(worse) or worse > margin.allowed(base):
        return ("regressed" if worse > 0 else "improved"), worse
    return ("improved" if worse < 0 else "ok"), worse


def compare(report: Report, baseline: Baseline, config: BaselineConfig) -> list[CheckResult]:
    """One ``baseline`` result per target of this run: its figures against the baseline's."""
    current: dict[Key, CheckResult] = {}
    for r in report.results:
        if r.figures and r.check != "baseline":
            current.setdefault((r.check, r.target), r)
    targets = list(dict.fromkeys([k[1] for k in current] + [k[1] for k in baseline.figures
                                                              if k[1] in report.targets or k[1] is None]))
    out: list[CheckResult] = []
    for target in targets:
        rows: list[dict[str, Any]] = []
        missing: list[str] = []
        for (check, t), base_figs in baseline.figures.items():
            if t != target:
                continue
            got = current.get((check, t))
            for name, base in base_figs.items():
                key = f"{check}.{name}"
                if got is None or name not in got.figures:
                    if check in report.checks:
                        missing.append(key)
                    continue
                now = float(got.figures[name])
                margin = margin_for(key, config)
                hib = _higher_is_better(key, name, got, config)
                verdict, worse = compare_figure(base, now, margin, hib)
                rows.append({"figure": key, "baseline": base, "current": now, "worse_by": worse,
                             "allowed": margin.allowed(base), "higher_is_better": hib, "verdict": verdict})
        if not rows and not missing:
            continue
        regressed = [row for row in rows if row["verdict"] == "regressed"]
        if regressed:
            status = Status.FAIL
            worst = max(regressed, key=lambda row: _relative(row))
            summary = f"{len(regressed)} of {len(rows)} figures regressed: " + ", ".join(
                f"{row['figure']} {row['baseline']:.4g} -> {row['current']:.4g}" for row in regressed[:4])
            where = {"check": worst["figure"].split(".", 1)[0], "figure": worst["figure"]}
        elif missing:
            status, where = Status.WARN, {"figure": missing[0]}
            summary = f"{len(rows)} figures within their margins; {len(missing)} in the baseline are missing now"
        else:
            status, where = Status.PASS, {}
            summary = f"{len(rows)} figures within their margins of {baseline.path or 'the baseline'}"
        out.append(CheckResult(
            check="baseline", status=status, summary=summary, target=target,
            figures={"compared": float(len(rows)), "regressed": float(len(regressed)),
                     "improved": float(sum(row["verdict"] == "improved" for row in rows))},
            details={"baseline": baseline.path, "rows": rows, "missing": missing,
                     "table": {"columns": ["figure", "baseline", "current", "allowed", "verdict"],
                               "rows": [[row[c] for c in ("figure", "baseline", "current", "allowed", "verdict")]
                                        for row in rows]}},
            where=where))
    return out


def _relative(row: Mapping[str, Any]) -> float:
    base = abs(float(row["baseline"]))
    worse = float(row["worse_by"])
    return worse / base if base else math.inf
