"""The broad benchmark corpus: Cuvil (``native``) against onnxruntime and OpenVINO on every real model.

Usage: ``python benchmarks/corpus.py`` (every corpus model and the five zoo models, batch 1 and 16,
1 and 2 threads), ``--models bert,resnet18 --batch 1 --threads 1``, ``--quick`` (few rounds, batch 1,
one thread; with no ``--models``, two small models), ``--json FILE``, ``--profile`` (for each row
where Cuvil is slower than the best peer: Cuvil's per-kernel time next to onnxruntime's profiler,
both summed by op kind).

How it measures, and why:

1. Models: the real-model corpus (``tests/support/corpus``: tiny ``transformers`` architectures with
   seeded weights) exported by the dynamo ONNX exporter (``--route onnx_torchscript`` for the
   TorchScript one) with static shapes at the benchmarked batch, the corpus's sequence lengths; and
   the zoo's five models (``tests/support/zoo/networks.py``) exported as ``zoo.py`` exports them.
   Every runtime runs the same ONNX file.  Exports are kept in ``~/.cache/cuvil-corpus/`` under the
   corpus's cache key (a change to torch, transformers or the corpus's source exports afresh).
2. Runtimes: Cuvil ``cuvil.compile(onnx, target="native", num_threads=T)``; onnxruntime CPU provider,
   ``ORT_ENABLE_ALL``, ``intra_op_num_threads=T``, ``inter_op_num_threads=1``, sequential; OpenVINO
   CPU, the model reshaped to the static input shapes, ``PERFORMANCE_HINT=LATENCY``,
   ``INFERENCE_NUM_THREADS=T`` and ``INFERENCE_PRECISION_HINT=f32`` (on CPUs with bf16 OpenVINO
   otherwise computes in bf16, which is not the fp32 comparison this benchmark makes).  A peer that
   is not installed is named once and its column left empty.
3. Timing: ``zoo.py``'s interleaving (after warm-up, each round runs every runtime in turn in one
   process, in blocks after a pause that outlasts the thread pools' spinning); medians per runtime,
   Cuvil / best peer (the faster of onnxruntime and OpenVINO in the same run) and its geometric mean
   per (batch, threads).
4. Correctness: each runtime's first outputs against onnxruntime's by relative L2
   (``cuvil.metrics``): Cuvil above 1e-5 is flagged ``MISMATCH``; any runtime above 1e-3 is wrong
   and its latency left out of the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository root: the models live in tests/support
sys.path.insert(0, str(HERE))  # zoo.py's runtimes, interleaving and statistics

import zoo  # noqa: E402

from cuvil.metrics import relative_l2  # noqa: E402

PEERS = ("onnxruntime", "openvino")
RUNTIMES = ("cuvil", *PEERS)
MATCH = 1e-5  # Cuvil's relative L2 against onnxruntime above which a row is flagged
WRONG = zoo.WRONG  # above which a runtime's latency is not used
ZOO_MODELS = ("mlp", "resnet18", "mobilenet_v2", "bert_tiny", "cifar_cnn")
QUICK_MODELS = "distilbert,mlp"


# -- the machine -----------------------------------------------------------------------------------


def cpu_line() -> str:
    """The CPU model and its AVX-512 flags: every figure is this machine's."""
    from cuvil.backends.c.toolchain import cpu_flags

    name = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
    flags = cpu_flags()
    avx512 = sorted(f for f in flags if f.startswith("avx512"))
    isa = " ".join(avx512) if avx512 else ("none (AVX2 only)" if "avx2" in flags else "none")
    return f"cpu: {name}, {os.cpu_count()} logical CPUs; avx512 flags: {isa}"


def peer_available(name: str) -> str | None:
    """None when the peer can be imported, else why not."""
    import importlib.util

    module = "onnxruntime" if name == "onnxruntime" else "openvino"
    if importlib.util.find_spec(module) is None:
        return f"{name} is not installed (pip install {module}): its column is skipped"
    return None


# -- the models ------------------------------------------------------------------------------------


def corpus_names() -> list[str]:
    from tests.support.corpus.models import MODELS

    return list(MODELS)


def real_names() -> list[str]:
    from real_models import MODELS

    return list(MODELS)


SETS = {"tiny": lambda: [*corpus_names(), *ZOO_MODELS], "real": real_names,
        "all": lambda: [*corpus_names(), *ZOO_MODELS, *real_names()]}


def export_model(name: str, batch: int, route: str) -> tuple[Path, list[np.ndarray]]:
    """The ONNX file of ``name`` at ``batch`` (static shapes) and its inputs."""
    if name in ZOO_MODELS:
        from cuvil.backends.c.cache import get_or_build
        from tests.support.corpus.routes import cache_root
        from tests.support.zoo.networks import BENCHMARKS

        net = BENCHMARKS[name]
        inputs = net.inputs(batch)
        folder, _ = get_or_build(cache_root() / "bench", f"zoo-{name}-b{batch}",
                                 lambda f: zoo.export_onnx(net.build(), inputs, f / "model.onnx"))
        return folder / "model.onnx", [t.numpy() for t in inputs]
    from real_models import MODELS as REAL

    from cuvil.backends.c.cache import get_or_build
    from tests.support.corpus.models import MODELS, Shape
    from tests.support.corpus.routes import cache_root, export_onnx

    model = REAL[name] if name in REAL else MODELS[name]
    at = dataclasses.replace(model, example=Shape(batch, model.example.seq))
    folder, _ = get_or_build(cache_root() / "bench", f"{name}-{route}-b{batch}",
                             lambda f: export_onnx(at, route, "fixed", f / "model.onnx"))
    return folder / "model.onnx", [t.numpy() for t in at.sample(at.example)]


# -- the runtimes ----------------------------------------------------------------------------------


def openvino_call(onnx_path: Path, arrays: list[np.ndarray], threads: int) -> Callable[[], list[np.ndarray]]:
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(onnx_path))
    model.reshape({p.get_any_name(): list(a.shape) for p, a in zip(model.inputs, arrays)})
    compiled = core.compile_model(model, "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
                                                 "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    n_out = len(compiled.outputs)

    def run() -> list[np.ndarray]:
        request.infer(arrays)
        return [request.get_output_tensor(i).data for i in range(n_out)]

    return run


@dataclass
class Row:
    model: str
    batch: int
    threads: int
    rounds: int = 0
    timings: dict[str, zoo.Timing] = field(default_factory=dict)
    error: str | None = None  # the model could not be exported or compiled
    profile: dict[str, dict[str, float]] | None = None  # runtime: {op kind: ms per call}

    def median(self, rt: str) -> float | None:
        t = self.timings.get(rt)
        return None if t is None or t.error else t.median_ms

    def best_peer(self) -> tuple[str, float] | None:
        got = [(rt, m) for rt in PEERS if (m := self.median(rt)) is not None]
        return min(got, key=lambda x: x[1]) if got else None

    def ratio(self) -> float | None:
        cu, best = self.median("cuvil"), self.best_peer()
        return None if cu is None or best is None else cu / best[1]

    def mismatch(self) -> bool:
        t = self.timings.get("cuvil")
        return t is not None and t.rel_l2 is not None and not t.rel_l2 <= MATCH


def first_error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]


def run_row(name: str, batch: int, threads: int, onnx_path: Path, arrays: list[np.ndarray], cache: Path,
            peers: list[str], args: argparse.Namespace) -> tuple[Row, Any]:
    row = Row(name, batch, threads)
    calls: dict[str, Callable[[], Any]] = {}
    sess = zoo.ort_session(onnx_path, threads) if "onnxruntime" in peers else None
    cm = None
    try:
        cm = zoo.compile_cuvil(onnx_path, cache, threads)
        calls["cuvil"] = lambda: cm(*arrays)
    except Exception as e:  # a model Cuvil cannot compile is a result, not a crash
        row.timings["cuvil"] = zoo.Timing(error=first_error(e))
    if sess is not None:
        feeds = {i.name: a for i, a in zip(sess.get_inputs(), arrays)}
        calls["onnxruntime"] = lambda: sess.run(None, feeds)
    if "openvino" in peers:
        try:
            calls["openvino"] = openvino_call(onnx_path, arrays, threads)
        except Exception as e:
            row.timings["openvino"] = zoo.Timing(error=first_error(e))
    want = [np.asarray(o) for o in sess.run(None, feeds)] if sess is not None else None
    for rt, call in list(calls.items()):
        try:
            got = [np.asarray(o) for o in call()]
        except Exception as e:
            row.timings[rt] = zoo.Timing(error=first_error(e))
            del calls[rt]
            continue
        err = max(relative_l2(g, w) for g, w in zip(got, want)) if want is not None else None
        row.timings[rt] = zoo.Timing(rel_l2=err)
        if err is not None and not err <= WRONG:
            row.timings[rt].error = f"wrong result: relative L2 {err:.2e} against onnxruntime"
            del calls[rt]
    for _ in range(args.warmup):
        for call in calls.values():
            call()
    one = {}
    for rt, call in calls.items():
        t0 = time.perf_counter()
        call()
        one[rt] = time.perf_counter() - t0
    per_round = sum(max(t * args.block, t + args.block_ms * 1e-3) for t in one.values()) + args.pause_ms * 1e-3 * len(calls)
    row.rounds = int(min(args.max_rounds, max(args.min_rounds, args.seconds / max(per_round, 1e-9))))
    times = zoo.interleave(calls, row.rounds, args.pause_ms * 1e-3, args.block, args.block_ms)
    for rt, ts in times.items():
        row.timings[rt].median_ms = statistics.median(ts)
        row.timings[rt].p90_ms = zoo.percentile(ts, 0.9)
    return row, cm


# -- profiles --------------------------------------------------------------------------------------


def cuvil_profile(cm: Any, arrays: list[np.ndarray], threads: int, work: Path, runs: int) -> dict[str, float]:
    """Per op kind (a fusion group counts as its head op), median ms per call, from a profiling build."""
    from cuvil.verify.checks.latency import ProfiledModel

    prof = ProfiledModel(cm.graph, "native", work, threads)
    per: dict[str, list[float]] = defaultdict(list)
    samples = [prof.run_once(arrays, lambda: None) for _ in range(runs)]
    for spans in samples:
        sums: dict[str, float] = defaultdict(float)
        for span, cat, s in spans:
            if cat == "python":
                continue
            kind = span.rsplit("(", 1)[-1].rstrip(")") if cat == "kernel" else span
            sums[kind] += s * 1e3
        for k, v in sums.items():
            per[k].append(v)
    return {k: statistics.median(v) for k, v in per.items()}


def ort_profile(onnx_path: Path, arrays: list[np.ndarray], threads: int, work: Path, runs: int) -> dict[str, float]:
    """Per op type, ms per call from onnxruntime's profiler (kernel events summed, divided by runs)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.enable_profiling = True
    opts.profile_file_prefix = str(work / "ort-profile")
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: a for i, a in zip(sess.get_inputs(), arrays)}
    for _ in range(runs):
        sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    sums: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
            sums[str(e.get("args", {}).get("op_name", "?"))] += float(e["dur"]) * 1e-3 / runs
        elif e.get("cat") == "Session" and e.get("name") == "model_run":
            sums["(session total)"] += float(e["dur"]) * 1e-3 / runs
    return dict(sums)


def print_profile(row: Row) -> None:
    assert row.profile is not None
    cu = sorted(row.profile.get("cuvil", {}).items(), key=lambda x: -x[1])
    ort = sorted(((k, v) for k, v in row.profile.get("onnxruntime", {}).items() if k != "(session total)"),
                 key=lambda x: -x[1])
    total = sum(v for _, v in cu)
    print(f"    profile {row.model} b{row.batch} t{row.threads}, ms per call by op kind "
          f"(cuvil total {total:.3f}, onnxruntime session {row.profile.get('onnxruntime', {}).get('(session total)', 0):.3f})")
    print(f"      {'cuvil':<34} {'onnxruntime':<34}")
    for i in range(min(12, max(len(cu), len(ort)))):
        a = f"{cu[i][0][:24]:<24} {cu[i][1]:8.3f}" if i < len(cu) else ""
        b = f"{ort[i][0][:24]:<24} {ort[i][1]:8.3f}" if i < len(ort) else ""
        print(f"      {a:<34} {b:<34}")


# -- the driver ------------------------------------------------------------------------------------


def print_row(r: Row, header: bool) -> None:
    if header:
        print("\nlatency in ms, median of interleaved rounds; err = Cuvil's relative L2 against onnxruntime")
        print("model             batch thr rounds " + " ".join(f"{rt:>11}" for rt in RUNTIMES)
              + "  cuvil/best peer   cuvil err")
    cells = []
    for rt in RUNTIMES:
        t = r.timings.get(rt)
        cells.append(f"{'-' if t is None else 'failed' if t.median_ms is None else f'{t.median_ms:.3f}':>11}")
    best = r.best_peer()
    ratio = f"{zoo.fmt(r.ratio())} ({best[0][:4]})" if best and r.ratio() is not None else "-"
    cu = r.timings.get("cuvil")
    err = zoo.fmt(cu.rel_l2 if cu else None, ".1e") + ("  MISMATCH" if r.mismatch() else "")
    print(f"{r.model:17} {r.batch:5d} {r.threads:3d} {r.rounds:6d} " + " ".join(cells) + f"  {ratio:>15}   {err}",
          flush=True)
    for rt, t in r.timings.items():
        if t.error:
            print(f"    {rt}: {t.error}", flush=True)
    if r.error:
        print(f"    {r.error}", flush=True)


def print_summary(rows: list[Row]) -> None:
    print(f"\nload average at end: {zoo.load_average()}")
    print("geometric mean of Cuvil / best peer (median latencies; below 1.0: Cuvil faster)")
    for batch in sorted({r.batch for r in rows}):
        for t in sorted({r.threads for r in rows}):
            sel = [r for r in rows if r.batch == batch and r.threads == t and r.ratio() is not None]
            if not sel:
                continue
            worst = max(sel, key=lambda r: r.ratio() or 0.0)
            gm = zoo.geomean([r.ratio() or 0.0 for r in sel])
            print(f"  ratio batch {batch:2d}, {t} thread{'s' if t > 1 else ' '}: {zoo.fmt(gm)} over {len(sel)} models "
                  f"(worst {worst.model} {zoo.fmt(worst.ratio())})")
    bad = [f"{r.model} b{r.batch} t{r.threads}" for r in rows if r.mismatch()]
    if bad:
        print(f"MISMATCH (Cuvil's relative L2 against onnxruntime above {MATCH:g}): {', '.join(bad)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated; default: every model of --set")
    parser.add_argument("--set", default="all", choices=sorted(SETS),
                        help="tiny: the test corpus (hidden ~32) and the five zoo models; real: the same "
                             "architectures and more at deployed sizes (benchmarks/real_models.py); all: both")
    parser.add_argument("--batch", default="1,16")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--route", default="onnx_dynamo", choices=("onnx_dynamo", "onnx_torchscript"))
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget of the timed rounds per row")
    parser.add_argument("--min-rounds", type=int, default=15)
    parser.add_argument("--max-rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--pause-ms", type=float, default=40.0)
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--block-ms", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="few rounds, batch 1, one thread (a smoke run)")
    parser.add_argument("--profile", action="store_true", help="per-op-kind profiles where Cuvil loses")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.models = args.models or QUICK_MODELS
        args.batch, args.threads = "1", args.threads if args.threads != "1,2" else "1"
        args.seconds, args.min_rounds, args.max_rounds, args.warmup = 0.3, 3, 10, 1
    batches = [int(b) for b in args.batch.split(",")]
    threads = [int(t) for t in args.threads.split(",")]

    print(cpu_line(), flush=True)
    print(f"load average at start: {zoo.load_average()} (other processes share these cores)", flush=True)
    peers = []
    for p in PEERS:
        why = peer_available(p)
        if why:
            print(f"note: {why}", flush=True)
        else:
            peers.append(p)
    if "onnxruntime" not in peers:
        print("note: without onnxruntime no output is checked", flush=True)
    models = args.models.split(",") if args.models else SETS[args.set]()
    known = set(ZOO_MODELS) | (set(SETS["all"]()) if any(m not in ZOO_MODELS for m in models) else set())
    unknown = [m for m in models if m not in known]
    if unknown:
        print(f"unknown model(s) {', '.join(unknown)}; the corpus has {', '.join(SETS['all']())}",
              file=sys.stderr)
        return 2

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="cuvil-corpus-bench-") as tmp:
        work = Path(tmp)
        for name in models:
            for batch in batches:
                try:
                    onnx_path, arrays = export_model(name, batch, args.route)
                except Exception as e:
                    for t in threads:
                        rows.append(Row(name, batch, t, error=f"export failed: {first_error(e)}"))
                        print_row(rows[-1], header=len(rows) == 1)
                    continue
                for t in threads:
                    row, cm = run_row(name, batch, t, onnx_path, arrays, work / f"cache-{name}-b{batch}", peers, args)
                    rows.append(row)
                    print_row(row, header=len(rows) == 1)
                    ratio = row.ratio()
                    if args.profile and cm is not None and ratio is not None and ratio > 1.0:
                        runs = max(args.min_rounds, 10)
                        where = work / f"profile-{name}-b{batch}-t{t}"
                        where.mkdir()
                        row.profile = {"cuvil": cuvil_profile(cm, arrays, t, where, runs)}
                        if "onnxruntime" in peers:
                            row.profile["onnxruntime"] = ort_profile(onnx_path, arrays, t, where, runs)
                        print_profile(row)
    print_summary(rows)
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_line(), "load_average_end": zoo.load_average(), "peers": peers,
                                         "rows": [asdict(r) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
