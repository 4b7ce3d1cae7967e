"""Golden IR tests: each pass on each ``golden/<pass>/<case>.before.cir`` gives ``<case>.after.cir``.

After an intended change to a pass, rewrite the expected texts with
``python -m pytest tests/passes/test_golden.py --update-golden`` and review the diff.
Every case also checks, with the reference interpreter on seeded inputs, that
the pass changed no output by a single bit (or, for a pass that rewrites arithmetic
into an op that rounds differently, by more than its ``TOLERANCE``), that it kept
the signature and valid IR (the manager's instruments), and that it is idempotent.
Every registered pass of Cuvil has golden cases (test passes that test modules
register are not Cuvil's); ``plan-memory``'s are memory plans (``golden_plan/``,
tests/passes/test_plan_memory.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import cuvil.ops  # noqa: F401  (registers the op set)
from cuvil.ir.parser import parse_graph
from cuvil.ir.printer import print_graph
from cuvil.passes import NumericEach, PassManager, VerifyEach, all_passes

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(GOLDEN.glob("*/*.before.cir"))
# passes whose golden cases are not IR before and after: where they are
ELSEWHERE = {"plan-memory": (Path(__file__).parent / "golden_plan", "*.cir")}
# relative L2 error a pass may introduce on a case's outputs: folding a batch norm into the
# convolution's weights rounds them once; gelu and layer_norm compute what the written-out
# chains compute, rounded differently (each pass's own tests bound it the same way)
# canonicalize's cube (rule 7: pow(x, 3) as (x * x) * x) rounds twice: within float32's epsilon
TOLERANCE = {"canonicalize": 2e-7, "fold-batchnorm": 1e-6, "recognize-gelu": 1e-6, "recognize-layernorm": 1e-6}


def _run(pipeline: str, text: str) -> tuple[str, PassManager]:
    pm = PassManager(pipeline, instruments=[VerifyEach(), NumericEach(seed=0)])
    graph = pm.run(parse_graph(text))
    return print_graph(graph), pm


def test_every_pass_has_golden_cases() -> None:
    passes = sorted(name for name, cls in all_passes().items() if cls.__module__.startswith("cuvil."))
    assert {"canonicalize", "dce", "cse", "fold-constants", "plan-memory"} <= set(passes)  # the registry is read
    missing = []
    for name in passes:
        folder, pattern = ELSEWHERE.get(name, (GOLDEN / name, "*.before.cir"))
        if not any(folder.glob(pattern)):
            missing.append(name)
    assert not missing, f"no golden case for {', '.join(missing)} (add {GOLDEN}/<pass>/<case>.before.cir)"


@pytest.mark.parametrize("before", CASES, ids=lambda p: f"{p.parent.name}/{p.name.removesuffix('.before.cir')}")
def test_pass_output_matches_golden(before: Path, update_golden: bool) -> None:
    pass_name = before.parent.name
    after = before.with_name(before.name.replace(".before.cir", ".after.cir"))
    text, pm = _run(pass_name, before.read_text(encoding="utf-8"))
    if update_golden:
        after.write_text(text, encoding="utf-8")
    assert after.is_file(), f"{after.name} is missing: run with --update-golden"
    assert text == after.read_text(encoding="utf-8"), f"{pass_name} output differs from {after.name}"

    assert pm.report is not None
    (record,) = pm.report.records
    assert record.changed, f"{pass_name} did nothing on {before.name}: the case tests nothing"
    assert record.verified
    assert not record.notes, record.notes  # the interpreter ran before and after
    limit = TOLERANCE.get(pass_name, 0.0)
    assert record.errors is not None and all(e <= limit for e in record.errors.values()), record.errors

    again, pm2 = _run(pass_name, text)
    assert again == text, f"{pass_name} is not idempotent on {after.name}"
    assert pm2.report is not None and pm2.report.records[0].changed is False
