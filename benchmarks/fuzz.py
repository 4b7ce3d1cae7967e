"""The fuzzer, run for as long as you like: seeded campaigns of mutants of the seed models (``tests/fuzz``)
through ``cuvil inspect``, ``cuvil compile -t ref`` and, for the mutants that import, ``cuvil run -t native``
against the reference, until the time is up.  Every bad outcome (traceback, signal, hang, memory, mismatch)
is reduced to a minimal reproduction (nodes, initializers and attributes dropped while the outcome stays
the same) and written to ``--out`` with a line saying what it does.

Usage: ``python benchmarks/fuzz.py --minutes 30 --out fuzz-findings``; ``--seed N`` starts from another
seed; ``--quick`` runs one small campaign (a smoke run).  ``--graphs N`` runs the registry-driven generator
(``tests/fuzz/graphs.py``) instead: N random valid graphs on generic, native and wasm32 against the
reference, each disagreement saved as the graph's IR text (``cuvil opt FILE.cir`` reads it back); the
nightly budget is ``--graphs 1000``.  Exit status 1 when anything bad was found.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzz.campaign import campaign
from tests.fuzz.runner import run_folder


def _outcome(mode: str, model: bytes, scratch: Path) -> str:
    folder = Path(tempfile.mkdtemp(dir=scratch))
    (folder / "case.onnx").write_bytes(model)
    (found,) = run_folder(mode, folder, seconds_per_case=60)
    return found.label


def minimize(mode: str, data: bytes, label: str, scratch: Path, budget: int = 60) -> bytes:
    """``data`` with as much removed as keeps the outcome ``label``: whole nodes, initializers, attributes
    (for a file that parses), else trailing and inner byte ranges."""
    try:
        model = onnx.ModelProto.FromString(data)
    except Exception:  # a byte-level mutant that no longer parses: cut bytes instead
        model = None
    tries = 0
    if model is not None:
        changed = True
        while changed and tries < budget:
            changed = False
            for field in ("node", "initializer", "value_info"):
                items = getattr(model.graph, field)
                i = 0
                while i < len(items) and tries < budget:
                    trial = onnx.ModelProto()
                    trial.CopyFrom(model)
                    del getattr(trial.graph, field)[i]
                    tries += 1
                    if _outcome(mode, trial.SerializeToString(), scratch) == label:
                        model, changed = trial, True
                        items = getattr(model.graph, field)
                    else:
                        i += 1
        return model.SerializeToString()
    chunk = max(1, len(data) // 2)
    while chunk >= 1 and tries < budget:
        i, cut = 0, False
        while i < len(data) and tries < budget:
            trial = data[:i] + data[i + chunk:]
            tries += 1
            if trial and _outcome(mode, trial, scratch) == label:
                data, cut = trial, True
            else:
                i += chunk
        if not cut:
            chunk //= 2
    return data


def graphs(first: int, count: int, targets: list[str], out: Path) -> int:
    """Runs ``count`` generated graphs from seed ``first``; writes each disagreeing one to ``out``."""
    from cuvil.ir.printer import print_graph
    from cuvil.verify.runner import target_unavailable
    from tests.fuzz.graphs import disagreements, generate

    usable = [t for t in targets if target_unavailable(t) is None]
    found = 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(first, first + count):
            gen = generate(seed)
            problems = disagreements(gen, usable, Path(tmp))
            if problems:
                out.mkdir(parents=True, exist_ok=True)
                (out / f"graph-{seed}.cir").write_text(print_graph(gen.graph))
                (out / f"graph-{seed}.txt").write_text("\n".join(problems) + "\n")
                print(f"graph {seed}: " + "; ".join(problems), flush=True)
                found += 1
    print(f"{count} graphs on {','.join(usable)}: {found} with disagreements")
    return 1 if found else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=300, help="mutants per campaign")
    ap.add_argument("--native", type=int, default=20, help="native runs per campaign")
    ap.add_argument("--out", type=Path, default=Path("fuzz-findings"))
    ap.add_argument("--quick", action="store_true", help="one small campaign")
    ap.add_argument("--graphs", type=int, default=0, help="run N generated graphs instead of mutants")
    ap.add_argument("--targets", default="generic,native,wasm32", help="targets of --graphs")
    args = ap.parse_args(argv)
    if args.graphs:
        return graphs(args.seed, args.graphs, args.targets.split(","), args.out)
    if args.quick:
        args.count, args.native, args.minutes = 20, 1, 0.0
    end = time.monotonic() + args.minutes * 60
    seed, totals, found = args.seed, {}, 0
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        while True:
            work = scratch / f"campaign-{seed}"
            report = campaign(work, seed, args.count, args.native, cache_dir=scratch / "cache")
            for mode, counts in report.counts().items():
                for label, n in counts.items():
                    totals.setdefault(mode, {}).setdefault(label, 0)
                    totals[mode][label] += n
            for mode, o in report.bad():
                folder = work / ("native" if mode == "run-native" else "all")
                small = minimize(mode, (folder / o.case).read_bytes(), o.label, scratch)
                args.out.mkdir(parents=True, exist_ok=True)
                stem = f"{mode}-{o.label}-{Path(o.case).stem}"
                (args.out / f"{stem}.onnx").write_bytes(small)
                (args.out / f"{stem}.txt").write_text(report.describe(mode, o) + "\n")
                print(f"found: {report.describe(mode, o)} -> {args.out / stem}.onnx", flush=True)
                found += 1
            print(f"seed {seed}: {json.dumps(report.counts())}", flush=True)
            seed += 1
            if time.monotonic() >= end:
                break
    print(f"total: {json.dumps(totals)}; {found} bad outcome(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
