"""The zoo benchmark: Cuvil (``native``) against onnxruntime, PyTorch eager and torch.compile.

Usage: ``python benchmarks/zoo.py`` (the whole zoo: 5 models x batch 1, 16 x 1, 2 threads; several
minutes), ``--models resnet18,mlp --batches 1 --threads 2``, ``--quick`` (the MLP at batch 1, one
thread, a few rounds: a smoke run), ``--json FILE`` (every figure, for the project notes).

How it measures, and why:

1. Every model is built in plain PyTorch (``tests/support/zoo/networks.py``, ``BENCHMARKS``), exported once per batch size to ONNX
   (``torch.onnx.export(dynamo=True)``, opset 18, static shapes), and Cuvil and onnxruntime both
   run that same ONNX file.  PyTorch eager and torch.compile run the module itself.
2. Cuvil: ``cuvil.compile(onnx, target="native")`` with a benchmark-private build cache; when
   ``cuvil.compile`` takes ``num_threads`` it is passed, otherwise Cuvil runs single-threaded and
   the header says so.  ``--frontend torch``: Cuvil compiles ``torch.export.export`` of the module at
   the same static shapes instead (PyTorch's front end; the export itself is not in the compile
   time), the other runtimes as before.  onnxruntime: CPU provider, ``ORT_ENABLE_ALL``, ``intra_op_num_threads``
   = the thread count, ``inter_op_num_threads=1``.  Eager: ``torch.set_num_threads`` under
   ``torch.inference_mode``.  torch.compile: the default backend (inductor), compiled afresh for
   every (batch, threads) configuration, since inductor fixes the thread count in the code it
   generates; a failure is reported for that model and the run goes on.
3. Latency is interleaved: after warm-up, each round runs every runtime in turn, in the same
   process, so machine noise (frequency, other tenants) lands on all of them alike.  Each turn is
   a block of ``--block`` runs (default 4), and at least ``--block-ms`` (default 10 ms) of timed
   runs, after a pause of ``--pause-ms`` (default 40 ms); the first run of a block is not timed.
   A model of a fraction of a millisecond thus runs for a while in a row, as in a serving loop:
   its first calls after another runtime has had the cores and caches are slower for every
   runtime (onnxruntime's CIFAR CNN at 2 threads: 0.33 ms in a 4-run block, 0.18 back to back).  Thread pools spin-wait after a run (onnxruntime's workers
   for about 33 ms, OpenMP's for about 6, Cuvil's for 2): the pause outlasts them, so no runtime
   is timed while another's threads still hold the cores, and the untimed run absorbs waking the
   runtime's own threads, so that each is timed as a serving loop runs it.  Printed: the median and p90 over the timed
   runs, and Cuvil/onnxruntime and Cuvil/torch.compile as ratios of the medians.
4. Correctness is checked, not assumed: each runtime's first outputs are compared with
   onnxruntime's (relative L2 error, printed); a runtime whose error exceeds 1e-3 is reported as
   wrong and its latency is not used in any ratio.
5. Cuvil compile time: cold (a fresh cache folder: import, passes, C compile, load) and cached
   (the same compile again: everything but the C compiler), wall clock around ``cuvil.compile``.
   The torch.compile figure is the wall time of its first call (tracing and code generation), with
   inductor's on-disk cache pointed at a fresh folder so earlier runs cannot shorten it.
6. Peak memory: for each runtime and model, a fresh subprocess imports only what that runtime needs,
   reads the inputs, notes its resident set (VmRSS), loads the model (Cuvil: ``cuvil.load`` of a
   saved artifact; onnxruntime: an InferenceSession; eager/compile: builds the module), runs it
   ``PROBE_RUNS`` times and reads the kernel's high-water mark (VmHWM).  Printed: the HWM minus the
   RSS before loading, i.e. what loading and running the model cost, C allocations included.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import io
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.metrics import relative_l2

HERE = Path(__file__).resolve().parent
RUNTIMES = ("cuvil", "onnxruntime", "eager", "torch.compile")
WRONG = 1e-3  # relative L2 against onnxruntime above which a runtime's latency is not reported
PROBE_RUNS = 5


# -- the runtimes ----------------------------------------------------------------------------------


def cuvil_threads_supported() -> bool:
    import importlib.util

    import cuvil

    if "num_threads" in inspect.signature(cuvil.compile).parameters:  # a Cuvil of keyword parameters
        return True
    if importlib.util.find_spec("cuvil.options") is None:
        return False
    from cuvil.options import KEYWORDS  # the options object's keyword spelling

    return "num_threads" in KEYWORDS


def compile_cuvil(source: Any, cache: Path, threads: int) -> Any:
    """``source``: the ONNX file, or the ``torch.export`` program (``--frontend torch``)."""
    import cuvil

    kwargs: dict[str, Any] = {"num_threads": threads} if cuvil_threads_supported() else {}
    return cuvil.compile(str(source) if isinstance(source, Path) else source, target="native", cache_dir=str(cache),
                         **kwargs)


def ort_session(onnx_path: Path, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])


def torch_outputs(out: Any) -> list[np.ndarray]:
    outs = out if isinstance(out, tuple | list) else (out,)
    return [o.detach().numpy() for o in outs]


def export_onnx(module: Any, inputs: tuple[Any, ...], path: Path) -> None:
    import torch

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed" chatter
    # the exporter prints progress and warns about itself: keep the benchmark's output readable
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, inputs, str(path), dynamo=True, opset_version=18, external_data=False,
                          verbose=False)


# -- statistics ------------------------------------------------------------------------------------


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class Timing:
    median_ms: float | None = None
    p90_ms: float | None = None
    rel_l2: float | None = None  # first outputs against onnxruntime's
    error: str | None = None  # why there is no timing


@dataclass
class ConfigResult:
    model: str
    batch: int
    threads: int
    rounds: int
    timings: dict[str, Timing] = field(default_factory=dict)
    cuvil_threads: str | None = None  # what Cuvil's worker threads did in the timed rounds

    def ratio(self, a: str, b: str) -> float | None:
        ta, tb = self.timings.get(a), self.timings.get(b)
        if ta is None or tb is None or ta.median_ms is None or tb.median_ms is None:
            return None
        return ta.median_ms / tb.median_ms


@dataclass
class CompileResult:
    model: str
    batch: int
    cuvil_cold_s: float
    cuvil_cached_s: float
    torch_compile_s: float | None = None  # first call of the compiled module (threads = the first count)
    torch_compile_error: str | None = None


# -- one configuration -----------------------------------------------------------------------------


def interleave(calls: dict[str, Callable[[], Any]], rounds: int, pause_s: float, block: int = 1,
               block_ms: float = 0.0) -> dict[str, list[float]]:
    """Runs each call ``block`` times per round, in a fixed order, and returns the wall times (ms)
    per call.  With ``block`` > 1 the first run of each block is not timed: it absorbs the switch
    from the runtime before (its thread pool still spinning, or this one's gone to sleep).  A block
    goes on until its timed runs also add up to ``block_ms``: a model of a fraction of a
    millisecond then runs for a while in a row, as in a serving loop, rather than being timed only
    in its first calls after the other runtimes have had the cores and caches."""
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            time.sleep(pause_s)
            if block > 1:
                call()
            runs, spent = 0, 0.0
            while runs < max(block - 1, 1) or spent < block_ms:
                t0 = time.perf_counter()
                call()
                ms = (time.perf_counter() - t0) * 1e3
                times[name].append(ms)
                runs, spent = runs + 1, spent + ms
    return times


def run_config(name: str, batch: int, threads: int, onnx_path: Path, source: Any, module: Any,
               inputs: tuple[Any, ...], cache: Path, args: argparse.Namespace,
               compile_info: CompileResult | None) -> ConfigResult:
    """Builds the four runtimes for one (model, batch, threads), checks their outputs, times them."""
    import torch

    torch.set_num_threads(threads)
    arrays = [t.numpy() for t in inputs]
    sess = ort_session(onnx_path, threads)
    feeds = {i.name: a for i, a in zip(sess.get_inputs(), arrays)}
    calls: dict[str, Callable[[], Any]] = {}
    errors: dict[str, str] = {}

    cm = compile_cuvil(source, cache, threads)
    calls["cuvil"] = lambda: cm(*arrays)
    calls["onnxruntime"] = lambda: sess.run(None, feeds)

    def eager() -> Any:
        with torch.inference_mode():
            return module(*inputs)

    calls["eager"] = eager
    if not args.no_torch_compile:
        try:
            torch._dynamo.reset()
            compiled = torch.compile(copy.deepcopy(module))

            def run_compiled() -> Any:
                with torch.inference_mode():
                    return compiled(*inputs)  # type: ignore[no-untyped-call]

            t0 = time.perf_counter()
            run_compiled()  # the first call traces and generates code
            if compile_info is not None:
                compile_info.torch_compile_s = time.perf_counter() - t0
            calls["torch.compile"] = run_compiled
        except Exception as e:  # any failure of torch.compile is a result to report, not a crash
            errors["torch.compile"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:120]
            if compile_info is not None:
                compile_info.torch_compile_error = errors["torch.compile"]

    result = ConfigResult(name, batch, threads, 0)
    want = [np.asarray(o) for o in sess.run(None, feeds)]
    for rt, call in list(calls.items()):
        out = call()
        got = torch_outputs(out) if rt in ("eager", "torch.compile") else [np.asarray(o) for o in out]
        err = max(relative_l2(g, w) for g, w in zip(got, want))
        result.timings[rt] = Timing(rel_l2=err)
        if not err <= WRONG:  # also catches NaN
            result.timings[rt].error = f"wrong result: relative L2 {err:.2e} against onnxruntime"
            del calls[rt]
    for rt, msg in errors.items():
        result.timings[rt] = Timing(error=msg)

    for _ in range(args.warmup):
        for call in calls.values():
            call()
    # enough rounds to fill the time budget, within [min_rounds, max_rounds]
    one = {name: 0.0 for name in calls}
    for name, call in calls.items():
        t1 = time.perf_counter()
        call()
        one[name] = time.perf_counter() - t1
    per_round = sum(max(t * max(args.block, 1), t + args.block_ms * 1e-3) for t in one.values())
    per_round += args.pause_ms * 1e-3 * len(calls)
    rounds = int(min(args.max_rounds, max(args.min_rounds, args.seconds / max(per_round, 1e-9))))
    result.rounds = rounds
    stats_before = cm.thread_stats() if threads > 1 and hasattr(cm, "thread_stats") else None
    times = interleave(calls, rounds, args.pause_ms * 1e-3, args.block, args.block_ms)
    for rt, ts in times.items():
        result.timings[rt].median_ms = statistics.median(ts)
        result.timings[rt].p90_ms = percentile(ts, 0.9)
    if stats_before is not None and "cuvil" in times:
        result.cuvil_threads = threads_summary(cm.thread_stats().since(stats_before), sum(times["cuvil"]))
    return result


def threads_summary(st: Any, cuvil_ms: float) -> str:
    """One line on what Cuvil's workers did over timed calls taking ``cuvil_ms`` in all: a row whose
    Cuvil time hardly drops with threads shows here whether regions were declined (too short, or
    workers late to join) or run with workers that hardly got a core."""
    if not st.calls:
        return "no call had the worker threads"
    share = st.worker_share
    return (f"per call {st.regions / st.calls:.1f} regions threaded, {st.declined_regions / st.calls:.1f} run alone; "
            f"workers ran {'-' if share is None else f'{100 * share:.0f}%'} of the threaded tasks; "
            f"end-of-region waits {100 * st.wait_s * 1e3 / max(cuvil_ms, 1e-9):.1f}% of the time")


# -- peak memory in a subprocess -------------------------------------------------------------------


def _proc_status_kb(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field_name}")


def probe(runtime: str, model: str, batch: int, threads: int, folder: Path) -> None:
    """The child's side: load one runtime's model, run it, print ``{"hwm_kb", "base_kb"}`` as JSON."""
    data = np.load(folder / "inputs.npz")
    arrays = [data[f"arg{i}"] for i in range(len(data.files))]
    if runtime == "cuvil":
        import cuvil

        base = _proc_status_kb("VmRSS")
        m = cuvil.load(folder / "cuvil_artifact")
        run: Callable[[], Any] = lambda: m(*arrays)  # noqa: E731
    elif runtime == "onnxruntime":
        base = _proc_status_kb("VmRSS")
        sess = ort_session(folder / "model.onnx", threads)
        feeds = {i.name: a for i, a in zip(sess.get_inputs(), arrays)}
        run = lambda: sess.run(None, feeds)  # noqa: E731
    else:
        import torch

        sys.path.insert(0, str(HERE.parent))  # the repository root: the networks are tests/support/zoo
        from tests.support.zoo.networks import BENCHMARKS as ZOO

        torch.set_num_threads(threads)
        tensors = [torch.from_numpy(a) for a in arrays]
        base = _proc_status_kb("VmRSS")
        module = ZOO[model].build()
        fn = torch.compile(module) if runtime == "torch.compile" else module

        def run() -> Any:
            with torch.inference_mode():
                return fn(*tensors)

    for _ in range(PROBE_RUNS):
        run()
    print(json.dumps({"hwm_kb": _proc_status_kb("VmHWM"), "base_kb": base}))


def measure_memory(runtime: str, model: str, batch: int, threads: int, folder: Path) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--probe", runtime, "--models", model,
           "--batches", str(batch), "--threads", str(threads), "--workdir", str(folder)]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(folder / "inductor-cache"))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {p.returncode}: {tail[:120]}"}
    r: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return r


# -- the driver ------------------------------------------------------------------------------------


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: how busy the machine was while it was measured."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def machine_header(threads_supported: bool) -> list[str]:
    import onnxruntime
    import torch

    cpu = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    lines = [f"machine: {cpu}, {os.cpu_count()} logical CPUs; Python {platform.python_version()}, "
             f"onnxruntime {onnxruntime.__version__}, torch {torch.__version__}"]
    lines.append(f"load average at start: {load_average()} (other processes share these cores)")
    if not threads_supported:
        lines.append("note: cuvil.compile has no num_threads option: Cuvil runs single-threaded in every row")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,resnet18,mobilenet_v2,bert_tiny,cifar_cnn")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--seconds", type=float, default=4.0, help="time budget of the timed rounds per row")
    parser.add_argument("--min-rounds", type=int, default=15)
    parser.add_argument("--max-rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--pause-ms", type=float, default=40.0, help="pause before each block of runs")
    parser.add_argument("--block", type=int, default=4,
                        help="runs of one runtime in a row per round, the first not timed (1: one timed run)")
    parser.add_argument("--block-ms", type=float, default=10.0,
                        help="a block also runs until its timed runs add up to this many ms")
    parser.add_argument("--frontend", choices=("onnx", "torch"), default="onnx",
                        help="what Cuvil compiles: the ONNX file onnxruntime runs, or torch.export's program")
    parser.add_argument("--no-torch-compile", action="store_true")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--quick", action="store_true", help="smoke run: the MLP, batch 1, 1 thread, few rounds")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--workdir", type=Path, help="keep exports, caches and artifacts here")
    parser.add_argument("--probe", choices=RUNTIMES, help=argparse.SUPPRESS)  # the memory child's mode
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.batches, args.threads = "mlp", "1", "1"
        args.seconds, args.min_rounds, args.max_rounds, args.warmup = 0.2, 3, 10, 1
    models = args.models.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    if args.probe:
        probe(args.probe, models[0], batches[0], threads[0], args.workdir)
        return 0

    with contextlib.ExitStack() as stack:
        work = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cuvil-zoo-")))
        work.mkdir(parents=True, exist_ok=True)
        # torch.compile's on-disk caches start empty, like Cuvil's: compile times are cold for both
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor-cache")
        return run_zoo(args, models, batches, threads, work)


def run_zoo(args: argparse.Namespace, models: list[str], batches: list[int], threads: list[int],
            work: Path) -> int:
    import torch

    sys.path.insert(0, str(HERE.parent))  # the repository root: the networks are tests/support/zoo
    import cuvil
    from tests.support.zoo.networks import BENCHMARKS as ZOO

    unknown = [m for m in models if m not in ZOO]
    if unknown:
        print(f"unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(ZOO)}", file=sys.stderr)
        return 2
    supported = cuvil_threads_supported()
    header = machine_header(supported)
    header.append("cuvil compiles: " + ("torch.export's program of each module" if args.frontend == "torch"
                                        else "the ONNX file onnxruntime runs"))
    for line in header:
        print(line, flush=True)
    results: list[ConfigResult] = []
    compiles: list[CompileResult] = []
    memory: dict[str, dict[str, dict[str, Any]]] = {}
    for name in models:
        module = ZOO[name].build()
        for batch in batches:
            folder = work / f"{name}-b{batch}"
            folder.mkdir(exist_ok=True)
            inputs = ZOO[name].inputs(batch)
            onnx_path = folder / "model.onnx"
            export_onnx(module, inputs, onnx_path)
            np.savez(folder / "inputs.npz", **{f"arg{i}": t.numpy() for i, t in enumerate(inputs)})  # type: ignore[arg-type]
            source: Any = onnx_path
            if args.frontend == "torch":
                source = torch.export.export(module, inputs)
            cache = folder / f"cuvil-cache-{args.frontend}"
            t0 = time.perf_counter()
            cm = compile_cuvil(source, cache, threads[-1])
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            compile_cuvil(source, cache, threads[-1])
            cached = time.perf_counter() - t0
            cm.save(folder / "cuvil_artifact")
            info = CompileResult(name, batch, cold, cached)
            compiles.append(info)
            for i, t in enumerate(threads):
                r = run_config(name, batch, t, onnx_path, source, module, inputs, cache, args, info if i == 0 else None)
                results.append(r)
                print_row(r, header=len(results) == 1)
            if not args.no_memory:
                tag = f"{name} b{batch}"
                memory[tag] = {}
                rts = RUNTIMES if not args.no_torch_compile else RUNTIMES[:3]
                for rt in rts:
                    memory[tag][rt] = measure_memory(rt, name, batch, threads[-1], folder)
        del module
        torch._dynamo.reset()

    print_summary(results, compiles, memory, threads[-1], supported)
    if args.json:
        args.json.write_text(json.dumps({
            "machine": header, "load_average_end": load_average(), "cuvil_version": cuvil.__version__,
            "cuvil_threads": supported, "rows": [asdict(r) for r in results],
            "compile": [asdict(c) for c in compiles], "memory_kb": memory,
        }, indent=1))
    return 0


COLS = "model          batch thr rounds " + " ".join(f"{rt:>17}" for rt in RUNTIMES) + "  cuvil/ort cuvil/tc  cuvil err"


def print_row(r: ConfigResult, header: bool) -> None:
    if header:
        print("\nlatency in ms, median / p90 of interleaved rounds; err = relative L2 against onnxruntime")
        print(COLS)
    cells = []
    for rt in RUNTIMES:
        t = r.timings.get(rt)
        if t is None:
            cells.append(f"{'off':>17}")
        elif t.median_ms is None:
            cells.append(f"{'failed':>17}")
        else:
            cells.append(f"{t.median_ms:8.3f} /{t.p90_ms:7.3f}")
    cu = r.timings.get("cuvil")
    err = fmt(cu.rel_l2 if cu else None, ".1e")
    print(f"{r.model:14} {r.batch:5d} {r.threads:3d} {r.rounds:6d} " + " ".join(cells)
          + f"  {fmt(r.ratio('cuvil', 'onnxruntime')):>9} {fmt(r.ratio('cuvil', 'torch.compile')):>8}  {err:>9}",
          flush=True)
    if r.cuvil_threads:
        print(f"    cuvil threads: {r.cuvil_threads}", flush=True)
    for rt, t in r.timings.items():
        if t.error:
            print(f"    {rt}: {t.error}", flush=True)


def print_summary(results: list[ConfigResult], compiles: list[CompileResult],
                  memory: dict[str, dict[str, dict[str, Any]]], mem_threads: int, supported: bool) -> None:
    print(f"\nload average at end: {load_average()}")
    print("\ngeometric mean of Cuvil/onnxruntime and Cuvil/torch.compile (median latencies) over the models run")
    for batch in sorted({r.batch for r in results}):
        for t in sorted({r.threads for r in results}):
            rows = [r for r in results if r.batch == batch and r.threads == t]
            ort_r = [x for r in rows if (x := r.ratio("cuvil", "onnxruntime")) is not None]
            tc_r = [x for r in rows if (x := r.ratio("cuvil", "torch.compile")) is not None]
            worst = max(rows, key=lambda r: r.ratio("cuvil", "onnxruntime") or 0.0)
            print(f"  batch {batch:2d}, {t} thread{'s' if t > 1 else ' '}: cuvil/ort {fmt(geomean(ort_r))} "
                  f"(worst {worst.model} {fmt(worst.ratio('cuvil', 'onnxruntime'))}), "
                  f"cuvil/torch.compile {fmt(geomean(tc_r))}"
                  + ("" if supported or t == 1 else "  [Cuvil single-threaded]"))
    print("\ncompile time, seconds (Cuvil: cuvil.compile wall time; torch.compile: its first call)")
    print("model          batch  cuvil cold  cuvil cached  torch.compile")
    for c in compiles:
        tc = fmt(c.torch_compile_s) if c.torch_compile_error is None else "failed"
        print(f"{c.model:14} {c.batch:5d} {c.cuvil_cold_s:11.2f} {c.cuvil_cached_s:13.3f} {tc:>14}")
    if memory:
        print(f"\npeak memory, MiB: VmHWM minus the RSS before loading the model ({PROBE_RUNS} runs, "
              f"{mem_threads} threads, one subprocess each)")
        print("model      batch " + " ".join(f"{rt:>14}" for rt in RUNTIMES))
        for tag, per in memory.items():
            cells = []
            for rt in RUNTIMES:
                m = per.get(rt)
                if m is None:
                    cells.append(f"{'off':>14}")
                elif "error" in m:
                    cells.append(f"{'failed':>14}")
                else:
                    cells.append(f"{(m['hwm_kb'] - m['base_kb']) / 1024:14.1f}")
            name, b = tag.rsplit(" b", 1)
            print(f"{name:14} {int(b):2d} " + " ".join(cells))
            for rt, m in per.items():
                if "error" in m:
                    print(f"    {rt}: {m['error']}")


if __name__ == "__main__":
    sys.exit(main())
