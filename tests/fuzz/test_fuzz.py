"""A seeded budget of the fuzzer (about a minute on two cores): no mutant of the seed models makes the
command line print a traceback, die of a signal, hang, run out of memory, or give native outputs that
differ from the reference's.  ``benchmarks/fuzz.py --minutes N`` runs the same campaign for longer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.campaign import campaign
from tests.fuzz.runner import run_folder

pytestmark = pytest.mark.slow


def test_a_seeded_budget_of_mutants_gives_only_clean_outcomes(tmp_path: Path) -> None:
    report = campaign(tmp_path, seed=20261202, count=240, native=8, cache_dir=tmp_path / "cache")
    counts = report.counts()
    # the campaign exercised every mode: some mutants import, most are refused cleanly
    assert counts["compile-ref"].get("ok", 0) >= 8 and counts["compile-ref"].get("clean", 0) >= 100, counts
    assert sum(counts["run-native"].values()) == 8, counts
    bad = [report.describe(mode, o) for mode, o in report.bad()]
    assert not bad, "\n".join(bad)


def test_the_runner_tells_each_outcome_apart(tmp_path: Path) -> None:
    cases = {
        "a-ok": "x = 1",
        "b-traceback": "raise KeyError('planted')",
        "c-signal": "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
        "d-memory": "b = bytearray(1 << 40)",
        "e-hang": "while True: pass",
        "f-after": "y = 2",
    }
    for name, source in cases.items():
        (tmp_path / f"{name}.onnx").write_text(source)
    outcomes = run_folder("selftest", tmp_path, seconds_per_case=3, memory_mb=2048)
    assert [o.label for o in outcomes] == ["ok", "traceback", "signal", "memory", "hang", "ok"], outcomes
    assert outcomes[2].detail == "SIGSEGV" and "planted" in outcomes[1].detail


def test_a_malformed_file_is_a_clean_error_through_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "garbage.onnx").write_bytes(b"\x08\x01garbage")
    (outcome,) = run_folder("inspect", tmp_path, seconds_per_case=20)
    assert outcome.label == "clean" and outcome.detail.startswith("cuvil: error:"), outcome


@pytest.mark.parametrize("first,count,targets", [(0, 4, ("generic", "native")), (100, 1, ("wasm32",))],
                         ids=["c", "wasm32"])
def test_random_registry_graphs_agree_with_the_reference(first: int, count: int, targets: tuple[str, ...],
                                                         tmp_path: Path) -> None:
    from cuvil.verify.runner import target_unavailable
    from tests.fuzz.graphs import disagreements, generate

    for t in targets:
        if target_unavailable(t) is not None:
            pytest.skip(f"{t}: {target_unavailable(t)}")
    found = []
    for seed in range(first, first + count):
        gen = generate(seed)
        assert sum(n.op != "constant" for n in gen.graph.nodes) >= 2
        found += [f"graph {seed}: {d}" for d in disagreements(gen, targets, tmp_path / "cache")]
    assert not found, "\n".join(found)


_SANITIZED_GRAPHS = """
import sys
from pathlib import Path
import numpy as np
import cuvil
from tests.fuzz.graphs import generate, inputs_for
from cuvil.errors import InputError
for seed in range(int(sys.argv[1]), int(sys.argv[2])):
    gen = generate(seed)
    m = cuvil.compile(gen.graph, "native", sanitize=True, cache_dir=sys.argv[3])
    for batch in (3, 2, 1):
        try:
            with np.errstate(all="ignore"):
                m(*inputs_for(gen, batch))
            break
        except InputError:
            continue
print("clean")
"""


def test_random_registry_graphs_are_clean_under_asan_and_ubsan(tmp_path: Path) -> None:
    from tests.support.sanitizers import assert_clean_under_sanitizers

    assert_clean_under_sanitizers(_SANITIZED_GRAPHS, "200", "203", str(tmp_path / "cache"))
