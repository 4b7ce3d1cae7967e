"""A fuzz campaign: mutants of the seed models written to a folder, run through ``cuvil inspect`` and
``cuvil compile -t ref``; the mutants that still import are then run on ``native`` against the reference
(``cuvil run -t native --random --seed 0``).  What CI runs on a small seeded budget, and
``benchmarks/fuzz.py`` for longer."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from tests.fuzz import mutate
from tests.fuzz.runner import Outcome, run_folder
from tests.fuzz.seeds import SEEDS


@dataclass
class Report:
    """Every outcome of a campaign, by mode, and what each case's mutation was."""

    outcomes: dict[str, list[Outcome]] = field(default_factory=dict)
    mutations: dict[str, str] = field(default_factory=dict)

    def bad(self) -> list[tuple[str, Outcome]]:
        return [(mode, o) for mode, found in self.outcomes.items() for o in found if o.bad]

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for mode, found in self.outcomes.items():
            for o in found:
                out.setdefault(mode, {}).setdefault(o.label, 0)
                out[mode][o.label] += 1
        return out

    def describe(self, mode: str, o: Outcome) -> str:
        return f"{mode} {o.case} [{self.mutations.get(o.case, '?')}]: {o.label}: {o.detail}"


def write_mutants(folder: Path, seed: int, count: int, byte_share: float = 0.3) -> dict[str, str]:
    """``count`` mutants (structured, and byte-level for ``byte_share`` of them) of the seed models, as
    ``folder/NNNNN-SEED.onnx``; returns each file's mutation."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(SEEDS)
    models = {n: SEEDS[n]() for n in names}
    done = {}
    for i in range(count):
        name = names[i % len(names)]
        if rng.random() < byte_share:
            data, what = mutate.byte_level(models[name].SerializeToString(), rng)
        else:
            data, what = mutate.structured(models[name], rng, rng.randint(1, 2))
        file = f"{seed:06d}-{i:05d}-{name}.onnx"
        (folder / file).write_bytes(data)
        done[file] = what
    return done


def campaign(folder: Path, seed: int, count: int, native: int, *, cache_dir: Path | None = None) -> Report:
    """Runs ``count`` mutants through inspect and compile-ref, then up to ``native`` of those that compiled
    through the native run."""
    report = Report()
    report.mutations = write_mutants(folder / "all", seed, count)
    report.outcomes["inspect"] = run_folder("inspect", folder / "all", seconds_per_case=30)
    report.outcomes["compile-ref"] = run_folder("compile-ref", folder / "all", seconds_per_case=30)
    compiled = [o.case for o in report.outcomes["compile-ref"] if o.label == "ok"][:native]
    (folder / "native").mkdir(exist_ok=True)
    for case in compiled:
        (folder / "native" / case).write_bytes((folder / "all" / case).read_bytes())
    report.outcomes["run-native"] = run_folder("run-native", folder / "native", seconds_per_case=120,
                                               cache_dir=cache_dir)
    return report
