"""Targets as pytest parameters, skipped with the reason where this machine cannot run them."""

from __future__ import annotations

from typing import Any

import pytest

from cuvil.verify.runner import target_unavailable


def runnable(*targets: str) -> list[Any]:
    """``targets`` as pytest parameters, each skipped where this machine cannot run it (a C target
    whose instructions this CPU lacks, wasm32 without its packages), with the reason."""
    return [pytest.param(t, marks=pytest.mark.skipif(target_unavailable(t) is not None,
                                                     reason=f"{t}: {target_unavailable(t)}")) for t in targets]


def slow_builds(*targets: str) -> list[Any]:
    """``runnable(*targets)``, every target but ref marked slow: for a test whose C build is the first of
    a kernel (seconds), run in the slow tier."""
    return [p if p.values[0] == "ref" else pytest.param(*p.values, marks=[*p.marks, pytest.mark.slow])
            for p in runnable(*targets)]
