"""The pass pipeline over the zoo: what each pass does to the numbers, and what the memory plan costs.

Usage: ``python benchmarks/pipeline.py`` (the whole zoo at batch 1 and 16; a few minutes, most of it
the reference interpreter and the C compiler), ``--models resnet18,bert_tiny --batches 16``,
``--per-pass`` (every pass's error under each row), ``--quick`` (the MLP and the CIFAR CNN at batch
1: a smoke run), ``--json FILE`` (every figure), ``--workdir DIR`` (keep the exports and builds).

What it measures, and how:

1. Every model is built in plain PyTorch (``tests/support/zoo/networks.py``, ``BENCHMARKS``) and exported once per batch size to ONNX
   with ``zoo.export_onnx`` (opset 18, static shapes), exactly as ``zoo.py`` exports it; Cuvil and
   onnxruntime both read that file.
2. Cuvil compiles it for ``native`` with the default pipeline (``default_pipeline("native")``) run
   by a ``PassManager`` carrying the ``NumericEach`` instrument.  That instrument runs the reference
   interpreter on the graph as imported and again after every pass, and records for each pass the
   relative L2 error (``cuvil.metrics.relative_l2``: float64 norms of the float32 outputs) between
   the outputs after the pass and the outputs before it; the per-pass records are the manager's
   ``PassReport``.  Per row the table shows the largest of those errors (over passes and outputs),
   the pass it belongs to (``-`` when every pass left the outputs bit-for-bit unchanged), how many
   passes ran, and ``total``, the error accumulated over the whole pipeline (the last pass's
   outputs against the imported graph's).  The inputs are the zoo's own seeded inputs, the ones
   onnxruntime gets below, not the instrument's default random ones: BERT's token ids must lie in
   its vocabulary and its mask must hold 0 and 1 to exercise the model as it is used.  These are
   reference-interpreter runs: they measure what each rewrite changed, not how the C kernels
   round (point 3 does).
3. The compiled native code runs those inputs once, and its outputs are compared with
   onnxruntime's (CPU provider, ``ORT_ENABLE_ALL``, ``zoo.ort_session``) on the same file: the
   relative L2 error against onnxruntime, the largest over the outputs.  Both run one thread:
   results do not depend on it (Cuvil's are bitwise the same for any thread count), and this
   script need not compete for the cores.
4. The memory plan of that compile (``CompiledModel.memory_plan``, at the static shapes): the
   arena's bytes, the lower bound (the most bytes live at any one node: no placement of these
   buffers can use less) and their ratio.
5. Goals, printed in the header, and every row that misses one is marked: every pass's error at
   most 1e-6 (``PASS_GOAL``), the final outputs within 1e-5 of onnxruntime (``ORT_GOAL``), the
   arena at most 1.1x its lower bound (``PLAN_GOAL``).  A figure that could not be measured (the
   interpreter could not run the graph, no plan-memory pass) counts as a miss, not a pass.

A row whose compile or run fails is printed with its error and the run goes on; the script then
exits with status 1.  Missing a goal is a result, not a failure: the exit status stays 0.  In the
JSON, an error that is not a finite number (an output that became NaN) is written as the string
``"inf"`` or ``"nan"``, so the file stays strict JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the repository root: the zoo's networks are tests/support/zoo

from zoo import export_onnx, load_average, machine_header, ort_session  # noqa: E402

PASS_GOAL = 1e-6  # relative L2 error one pass may introduce (fp32, reference interpreter)
ORT_GOAL = 1e-5  # relative L2 error of the compiled outputs against onnxruntime
PLAN_GOAL = 1.1  # arena bytes / lower bound
TARGET = "native"
QUICK = (("mlp", "cifar_cnn"), (1,))


@dataclass
class PassRow:
    """One pass of one compile, as numeric-each saw it."""

    index: int
    name: str
    changed: bool | None
    error: float | None  # the largest over the outputs; None: not measured
    errors: dict[str, float] | None  # per output
    total_error: float | None  # against the imported graph, after this pass
    notes: list[str] = field(default_factory=list)


@dataclass
class Row:
    model: str
    batch: int
    pipeline: str = ""
    passes_run: int = 0
    worst_pass: str | None = None  # "#11 fuse-epilogue"; None when no pass changed the outputs at all
    worst_pass_error: float | None = None  # None: not measured
    passes_ok: bool = False
    total_error: float | None = None
    ort_rel_l2: float | None = None
    arena_bytes: int | None = None
    lower_bound_bytes: int | None = None
    plan_ratio: float | None = None
    misses: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    per_pass: list[PassRow] = field(default_factory=list)
    error: str | None = None  # why the row could not be measured


def largest(values: dict[str, float] | None) -> float | None:
    """The largest of ``values``, NaN winning (``max`` would let a NaN hide behind a number)."""
    if values is None:
        return None
    vals = list(values.values())
    if any(math.isnan(v) for v in vals):
        return math.nan
    return max(vals, default=0.0)


def _order(error: float | None) -> float:
    """A sort key that puts NaN above every number."""
    return math.inf if error is None or math.isnan(error) else error


def within(value: float | None, goal: float) -> bool:
    # written so that None (not measured) and NaN both miss
    return value is not None and value <= goal


def measure(name: str, batch: int, folder: Path, cache: Path) -> Row:
    """Exports one zoo model at one batch size, compiles it under numeric-each, checks it against
    onnxruntime and reads its memory plan."""
    import cuvil
    from cuvil.metrics import relative_l2
    from cuvil.passes import NumericEach, PassManager, default_pipeline
    from tests.support.zoo.networks import BENCHMARKS as ZOO

    row = Row(name, batch)
    folder.mkdir(parents=True, exist_ok=True)
    inputs = ZOO[name].inputs(batch)
    arrays = [t.numpy() for t in inputs]
    onnx_path = folder / "model.onnx"
    export_onnx(ZOO[name].build(), inputs, onnx_path)

    pm = PassManager(default_pipeline(TARGET), instruments=[NumericEach(inputs=arrays)])
    row.pipeline = pm.pipeline
    m = cuvil.compile(str(onnx_path), target=TARGET, passes=pm, cache_dir=str(cache), num_threads=1)
    report = pm.report
    assert report is not None  # the manager ran, so it left a report
    row.notes += report.notes
    for r in report.ran():
        row.per_pass.append(PassRow(r.index, r.name, r.changed, largest(r.errors), r.errors,
                                    largest(r.total_errors), list(r.notes)))
    row.passes_run = len(row.per_pass)
    measured = [p for p in row.per_pass if p.error is not None]
    if measured and len(measured) == len(row.per_pass):
        worst = max(measured, key=lambda p: _order(p.error))
        row.worst_pass_error = worst.error
        row.worst_pass = f"#{worst.index} {worst.name}" if worst.error != 0.0 else None
        row.total_error = row.per_pass[-1].total_error
    row.passes_ok = row.passes_run > 0 and all(within(p.error, PASS_GOAL) for p in row.per_pass)

    sess = ort_session(onnx_path, 1)
    want = sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), arrays)})
    got = m(*arrays)
    row.ort_rel_l2 = largest({str(i): relative_l2(g, w)
                              for i, (w, g) in enumerate(zip(want, got))})

    plan = m.memory_plan
    if plan is None:
        row.notes.append("no memory plan: the pipeline has no plan-memory pass")
    else:
        row.arena_bytes, row.lower_bound_bytes = plan.arena_bytes(), plan.lower_bound_bytes()
        # an empty arena (nothing planned) meets any bound
        row.plan_ratio = row.arena_bytes / row.lower_bound_bytes if row.lower_bound_bytes else 1.0

    if not row.passes_ok:
        row.misses.append(f"pass > {PASS_GOAL:g}" if row.worst_pass_error is not None else "passes not measured")
    if not within(row.ort_rel_l2, ORT_GOAL):
        row.misses.append(f"ort > {ORT_GOAL:g}")
    if not within(row.plan_ratio, PLAN_GOAL):
        row.misses.append(f"plan > {PLAN_GOAL:g}x" if row.plan_ratio is not None else "no plan")
    return row


# -- printing --------------------------------------------------------------------------------------


def fmt(x: float | None, spec: str = ".1e") -> str:
    return "-" if x is None else format(x, spec)


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


COLS = (f"{'model':14} {'batch':>5} {'passes':>6}  {'worst pass':22} {'its error':>9} {'all<=goal':>9} "
        f"{'total':>8}  {'vs ort':>8}  {'arena MiB':>9} {'bound MiB':>9} {'ratio':>6}  goals")


def print_header(header: list[str]) -> None:
    for line in header:
        print(line)
    print(f"\ngoals: every pass's relative L2 error <= {PASS_GOAL:g} (numeric-each, fp32 reference interpreter); "
          f"outputs vs onnxruntime <= {ORT_GOAL:g} (relative L2); arena <= {PLAN_GOAL:g}x its lower bound")
    print("worst pass: the pass with the largest error it introduced ('-': no pass changed the outputs at all); "
          "total: error over the whole pipeline; vs ort: the native build against onnxruntime ORT_ENABLE_ALL")
    print(COLS, flush=True)


def print_row(r: Row, per_pass: bool) -> None:
    if r.error is not None:
        print(f"{r.model:14} {r.batch:5d}  FAILED: {r.error}", flush=True)
        return
    ok = "yes" if r.passes_ok else "NO"
    goals = "MISS: " + ", ".join(r.misses) if r.misses else "ok"
    print(f"{r.model:14} {r.batch:5d} {r.passes_run:6d}  {r.worst_pass or '-':22} {fmt(r.worst_pass_error):>9} "
          f"{ok:>9} {fmt(r.total_error):>8}  {fmt(r.ort_rel_l2):>8}  {mib(r.arena_bytes):>9} "
          f"{mib(r.lower_bound_bytes):>9} {fmt(r.plan_ratio, '.3f'):>6}  {goals}", flush=True)
    for note in r.notes:
        print(f"    note: {note}")
    if per_pass:
        for p in r.per_pass:
            changed = {None: "", True: "changed", False: "unchanged"}[p.changed]
            outs = ""
            if p.errors is not None and len(p.errors) > 1:  # one output: its error is the pass's
                outs = "  (" + ", ".join(f"{k}: {v:.1e}" for k, v in p.errors.items()) + ")"
            extra = "; ".join(p.notes)
            print(f"    #{p.index:<3d} {p.name:20} {changed:9} {fmt(p.error):>8}  total {fmt(p.total_error):>8}"
                  f"{outs}{'  ' + extra if extra else ''}")
        print(flush=True)


def strict_json(x: Any) -> Any:
    """``x`` with every non-finite float written as "inf", "-inf" or "nan" (strict JSON has none)."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: strict_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [strict_json(v) for v in x]
    return x


# -- the driver ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,resnet18,mobilenet_v2,bert_tiny,cifar_cnn")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--per-pass", action="store_true", help="print every pass's error under each row")
    parser.add_argument("--quick", action="store_true", help="smoke run: the MLP and the CIFAR CNN at batch 1")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--workdir", type=Path, help="keep exports and builds here")
    args = parser.parse_args(argv)
    models = list(QUICK[0]) if args.quick else args.models.split(",")
    batches = list(QUICK[1]) if args.quick else [int(b) for b in args.batches.split(",")]

    import cuvil
    from tests.support.zoo.networks import BENCHMARKS as ZOO

    unknown = [m for m in models if m not in ZOO]
    if unknown:
        print(f"unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(ZOO)}", file=sys.stderr)
        return 2

    header = machine_header(True)
    print_header(header)
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        work = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cuvil-pipeline-")))
        work.mkdir(parents=True, exist_ok=True)
        for name in models:
            for batch in batches:
                try:
                    row = measure(name, batch, work / f"{name}-b{batch}", work / "cuvil-cache")
                except Exception as exc:  # a failing model is a result to report; the others still run
                    row = Row(name, batch, error=f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
                    traceback.print_exc(file=sys.stderr)
                rows.append(row)
                print_row(row, args.per_pass)

    end = load_average()
    missed = [f"{r.model} b{r.batch} ({', '.join(r.misses)})" for r in rows if r.misses]
    failed = [f"{r.model} b{r.batch}" for r in rows if r.error is not None]
    print(f"\nload average at end: {end}")
    print(f"rows missing a goal: {', '.join(missed) if missed else 'none'}")
    if failed:
        print(f"rows that failed: {', '.join(failed)}")
    if args.json:
        data = {"machine": header, "load_average_end": end, "cuvil_version": cuvil.__version__, "target": TARGET,
                "goals": {"pass_rel_l2": PASS_GOAL, "ort_rel_l2": ORT_GOAL, "plan_ratio": PLAN_GOAL},
                "rows": [asdict(r) for r in rows]}
        args.json.write_text(json.dumps(strict_json(data), indent=1, allow_nan=False))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
