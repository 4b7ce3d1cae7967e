"""The precision benchmark: Cuvil fp32, fp16, bf16 and int8 against onnxruntime fp32 and int8.

Usage: ``python benchmarks/precision.py`` (ResNet-18 and MobileNetV2, batch 1, one thread),
``--threads 1,2`` (also two threads), ``--models resnet18 --rounds 50``, ``--quick`` (both models,
a few rounds and test inputs: a smoke run; the int8 builds still calibrate on 128 samples),
``--json FILE`` (every figure).

How it measures, and why:

1. Every model is built in plain PyTorch (``tests/support/zoo/networks.py``, ``BENCHMARKS``) and exported once to ONNX at batch 1
   (opset 18, static shapes, as ``zoo.py`` does); every variant starts from that one file.
2. Inputs have structure, not white noise: a quantizer calibrated on white noise sees ranges no
   real image produces.  Each image is the sum of two octaves of Gaussian noise drawn on coarse
   grids (7x7 with weight 1, 28x28 with weight 0.35) and upsampled bilinearly to 224x224, plus a
   little pixel noise (0.05), then normalised per channel to mean 0 and standard deviation 1 (what
   an ImageNet-normalised photograph looks like to the network).  The 128 calibration images and
   the ``--test-inputs`` test images are drawn from that one distribution with different seeds.
3. The variants, for each thread count T:
   - ``cuvil-fp32``: ``cuvil.compile(onnx, target="native", num_threads=T)``, the reference for
     every accuracy figure;
   - ``cuvil-fp16`` / ``cuvil-bf16``: the same with ``precision="fp16"`` / ``"bf16"`` (the
     calibration images feed its precision report);
   - ``cuvil-int8``: ``quant_dtype="int8"``, ``calibration_dataset=`` the 128 calibration images
     (Cuvil's defaults: symmetric, per-channel weights, minmax ranges; 7-bit weights where the
     target's int8 kernels gain from them, ``reduce_range``);
   - ``cuvil-int8-w8``: the same with ``reduce_range=False`` (8-bit weights on every target);
   - ``ort-fp32``: onnxruntime's CPU provider, ``ORT_ENABLE_ALL``, ``intra_op_num_threads=T``
     (its build time: creating the session);
   - ``ort-int8``: ``onnxruntime.quantization.quant_pre_process`` and then ``quantize_static``
     (QDQ format, per-channel, int8 weights and activations, minmax calibration) on the same 128
     images through a ``CalibrationDataReader``, run like ``ort-fp32``.
   A Cuvil variant is compiled for each T (``num_threads`` is a compile option), so an int8 build
   calibrates again for each thread count; its calibration time is that of the first.
4. A variant that fails to build or run is reported with its error, verbatim, and the run goes on.
5. Accuracy: each variant runs the test images; against ``cuvil-fp32`` the script prints the
   relative L2 error of all logits together (``rel_l2``), the worst single image (``worst``), and
   top-1 agreement (the share of images whose arg-max class is the same).
6. Latency is interleaved: after warm-up, each of ``--rounds`` rounds runs every variant once on
   the first test image, round-robin in one process, so machine noise lands on all alike; each
   turn is a block of ``--block`` runs, the first not timed, after a 40 ms pause that outlasts a
   spin-waiting thread pool (onnxruntime's spins about 33 ms after a run), so no variant is timed
   while another's threads still hold the cores (as ``zoo.py`` does).  Printed: median and p90 per variant and the ratios of medians
   int8/fp32 (Cuvil), Cuvil-int8/ORT-int8, fp16/fp32 and bf16/fp32 (Cuvil); below 1.0 the
   first is faster.
7. Build times: each variant's build (Cuvil: ``cuvil.compile`` wall time, fresh build cache;
   onnxruntime int8: pre-processing, calibration and quantization) and, separately, the
   calibration of the int8 builds (Cuvil: its "calibration and quantization" compile stage).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the repository root: the zoo's networks are tests/support/zoo

from zoo import export_onnx, interleave, load_average, machine_header, ort_session, percentile  # noqa: E402

from cuvil.metrics import relative_l2  # noqa: E402

MODELS = ("resnet18", "mobilenet_v2")
VARIANTS = ("cuvil-fp32", "cuvil-fp16", "cuvil-bf16", "cuvil-int8", "cuvil-int8-w8", "ort-fp32", "ort-int8")
REFERENCE = "cuvil-fp32"
RATIOS = (("int8/fp32", "cuvil-int8", "cuvil-fp32"), ("int8 cuvil/ort", "cuvil-int8", "ort-int8"),
          ("int8-w8/fp32", "cuvil-int8-w8", "cuvil-fp32"),
          ("fp16/fp32", "cuvil-fp16", "cuvil-fp32"), ("bf16/fp32", "cuvil-bf16", "cuvil-fp32"))
CALIBRATION_SEED, TEST_SEED = 7, 8


# -- inputs ----------------------------------------------------------------------------------------


def smooth_images(n: int, seed: int, size: int = 224) -> np.ndarray:
    """``n`` structured images (N, 3, size, size) float32: the distribution of the module docstring."""
    import torch
    from torch.nn import functional as F

    gen = torch.Generator().manual_seed(seed)
    x = torch.zeros(n, 3, size, size)
    for grid, weight in ((7, 1.0), (28, 0.35)):
        coarse = torch.randn(n, 3, grid, grid, generator=gen)
        x += weight * F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    x += 0.05 * torch.randn(n, 3, size, size, generator=gen)
    mean = x.mean(dim=(2, 3), keepdim=True)
    std = x.std(dim=(2, 3), keepdim=True)
    return ((x - mean) / std).numpy().astype(np.float32)


# -- the variants ----------------------------------------------------------------------------------


class StageTimes(logging.Handler):
    """Collects Cuvil's compile-stage timings (``stage NAME: X ms`` debug records) while attached."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seconds: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if record.msg == "stage %s: %.1f ms" and isinstance(args, tuple) and len(args) == 2:
            self.seconds[str(args[0])] = self.seconds.get(str(args[0]), 0.0) + float(str(args[1])) / 1e3


@contextlib.contextmanager
def stage_times() -> Any:
    loggers = [logging.getLogger(n) for n in ("cuvil.api", "cuvil.quant")]
    handler = StageTimes()
    saved = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    try:
        yield handler.seconds
    finally:
        for lg, level in zip(loggers, saved):
            lg.removeHandler(handler)
            lg.setLevel(level)


def build_cuvil(variant: str, onnx_path: Path, cache: Path, threads: int,
                calib: np.ndarray) -> tuple[Callable[[np.ndarray], np.ndarray], dict[str, float]]:
    """One Cuvil variant: a function of one image to its logits, and its build times."""
    import cuvil

    samples = [(a[None],) for a in calib]
    kwargs: dict[str, Any] = {}
    if variant in ("cuvil-fp16", "cuvil-bf16"):
        kwargs = {"precision": variant.split("-")[1], "calibration_dataset": samples}
    elif variant in ("cuvil-int8", "cuvil-int8-w8"):
        kwargs = {"quant_dtype": "int8", "calibration_dataset": samples}
        if variant == "cuvil-int8-w8":
            kwargs["reduce_range"] = False
    t0 = time.perf_counter()
    with stage_times() as stages:
        m = cuvil.compile(str(onnx_path), target="native", cache_dir=str(cache), num_threads=threads, **kwargs)
    times = {"build_s": time.perf_counter() - t0}
    if "calibration and quantization" in stages:
        times["calibration_s"] = stages["calibration and quantization"]
    return (lambda x: np.asarray(m(x)[0])), times


def quantize_ort(onnx_path: Path, folder: Path, calib: np.ndarray) -> Path:
    """onnxruntime's static QDQ int8 model of ``onnx_path``, calibrated on ``calib``."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepped, out = folder / "model.prep.onnx", folder / "model.int8.onnx"
    with contextlib.redirect_stdout(sys.stderr):  # the quantizer prints progress
        quant_pre_process(str(onnx_path), str(prepped))
    name = onnx.load(str(prepped), load_external_data=False).graph.input[0].name

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        """The calibration images, one feed each; rewinding starts them again."""

        def __init__(self) -> None:
            self.rewind()

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._feeds, None)

        def rewind(self) -> None:
            self._feeds = iter([{name: a[None]} for a in calib])

    with contextlib.redirect_stdout(sys.stderr):
        quantize_static(str(prepped), str(out), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax)
    return out


def build_ort(path: Path, threads: int) -> Callable[[np.ndarray], np.ndarray]:
    sess = ort_session(path, threads)
    name = sess.get_inputs()[0].name
    return lambda x: np.asarray(sess.run(None, {name: x})[0])


# -- results ---------------------------------------------------------------------------------------


@dataclass
class VariantResult:
    median_ms: float | None = None
    p90_ms: float | None = None
    rel_l2: float | None = None  # all test logits against cuvil-fp32's
    worst_rel_l2: float | None = None  # the worst single test image
    top1: float | None = None  # share of test images whose arg-max agrees with cuvil-fp32's
    build_s: float | None = None
    calibration_s: float | None = None
    error: str | None = None


@dataclass
class Row:
    model: str
    threads: int
    rounds: int
    test_inputs: int
    variants: dict[str, VariantResult] = field(default_factory=dict)

    def ratio(self, a: str, b: str) -> float | None:
        va, vb = self.variants.get(a), self.variants.get(b)
        if va is None or vb is None or va.median_ms is None or vb.median_ms is None:
            return None
        return va.median_ms / vb.median_ms

    def ratios(self) -> dict[str, float | None]:
        return {label: self.ratio(a, b) for label, a, b in RATIOS}


def describe(e: BaseException) -> str:
    """The error as raised: its type and full message."""
    return f"{type(e).__name__}: {e}"


def accuracy(res: VariantResult, got: np.ndarray, ref: np.ndarray) -> None:
    if not np.all(np.isfinite(got)):
        res.error = f"non-finite outputs ({int(np.sum(~np.isfinite(got)))} of {got.size} logits)"
    res.rel_l2 = relative_l2(got, ref)
    res.worst_rel_l2 = max(relative_l2(g, r) for g, r in zip(got, ref))
    res.top1 = float(np.mean(np.argmax(got, axis=-1) == np.argmax(ref, axis=-1)))


def run_model(name: str, threads: list[int], args: argparse.Namespace, work: Path) -> list[Row]:
    from tests.support.zoo.networks import BENCHMARKS as ZOO

    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    onnx_path = folder / "model.onnx"
    export_onnx(ZOO[name].build(), ZOO[name].inputs(1), onnx_path)
    calib = smooth_images(args.calibration_samples, CALIBRATION_SEED)
    tests = smooth_images(args.test_inputs, TEST_SEED)

    ort_int8: Path | None = None
    ort_int8_error: str | None = None
    ort_int8_s = 0.0
    if "ort-int8" in args.variants:
        t0 = time.perf_counter()
        try:
            ort_int8 = quantize_ort(onnx_path, folder, calib)
        except Exception as e:  # a failing variant is a result to report, not a crash
            ort_int8_error = describe(e)
            traceback.print_exc(file=sys.stderr)
        ort_int8_s = time.perf_counter() - t0

    rows = []
    for t in threads:
        row = Row(name, t, args.rounds, len(tests))
        runs: dict[str, Callable[[np.ndarray], np.ndarray]] = {}
        for v in args.variants:
            res = row.variants[v] = VariantResult()
            try:
                if v.startswith("cuvil-"):
                    fn, times = build_cuvil(v, onnx_path, folder / f"cache-t{t}", t, calib)
                    res.build_s, res.calibration_s = times["build_s"], times.get("calibration_s")
                elif v == "ort-fp32":
                    t0 = time.perf_counter()
                    fn = build_ort(onnx_path, t)
                    res.build_s = time.perf_counter() - t0
                else:
                    if ort_int8 is None:
                        res.error = ort_int8_error
                        continue
                    fn = build_ort(ort_int8, t)
                    res.build_s = ort_int8_s
                runs[v] = fn
            except Exception as e:  # reported with the variant, and the run goes on
                res.error = describe(e)
                traceback.print_exc(file=sys.stderr)
            if res.error is None:
                print(f"  built {name} {v} (threads {t}) in {fmt(res.build_s, '.1f')} s", flush=True)
            else:
                print(f"  {name} {v} (threads {t}) FAILED: {res.error}", flush=True)

        outputs: dict[str, np.ndarray] = {}
        for v, fn in list(runs.items()):
            try:
                outputs[v] = np.stack([fn(x[None])[0] for x in tests])
            except Exception as e:
                row.variants[v].error = describe(e)
                print(f"  {name} {v} (threads {t}) FAILED when run: {row.variants[v].error}", flush=True)
                del runs[v]
        ref = outputs.get(REFERENCE)
        if ref is not None:
            for v, out in outputs.items():
                accuracy(row.variants[v], out, ref)

        x0 = tests[:1]
        calls: dict[str, Callable[[], Any]] = {v: functools.partial(fn, x0) for v, fn in runs.items()}
        for _ in range(args.warmup):
            for call in calls.values():
                call()
        for v, ts in interleave(calls, args.rounds, args.pause_ms * 1e-3, args.block).items():
            row.variants[v].median_ms = statistics.median(ts)
            row.variants[v].p90_ms = percentile(ts, 0.9)
        rows.append(row)
        print_row(row)
    return rows


# -- printing --------------------------------------------------------------------------------------


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_row(row: Row) -> None:
    print(f"\n{row.model}, batch 1, {row.threads} thread(s), {row.rounds} rounds, "
          f"accuracy on {row.test_inputs} test images against {REFERENCE}:")
    print(f"  {'variant':<11} {'median ms':>10} {'p90 ms':>8} {'rel_l2':>9} {'worst':>9} {'top-1':>7} "
          f"{'build s':>8} {'calib s':>8}")
    for v, r in row.variants.items():
        print(f"  {v:<11} {fmt(r.median_ms):>10} {fmt(r.p90_ms):>8} {fmt(r.rel_l2, '.2e'):>9} "
              f"{fmt(r.worst_rel_l2, '.2e'):>9} {fmt(None if r.top1 is None else 100 * r.top1, '.1f'):>6}% "
              f"{fmt(r.build_s, '.1f'):>8} {fmt(r.calibration_s, '.1f'):>8}")
        if r.error:
            print(f"    error: {r.error}")
    print("  ratios of medians: " + ", ".join(f"{k} {fmt(x, '.3f')}" for k, x in row.ratios().items()),
          flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", default="1", help="comma-separated thread counts, e.g. 1,2")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=40, help="rounds (each runs every variant --block times in a row)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--pause-ms", type=float, default=40.0, help="pause before each block of runs")
    parser.add_argument("--block", type=int, default=4,
                        help="runs of one variant in a row per round, the first not timed (as in zoo.py)")
    parser.add_argument("--calibration-samples", type=int, default=128)
    parser.add_argument("--test-inputs", type=int, default=64, help="images the accuracy figures are taken on")
    parser.add_argument("--quick", action="store_true", help="smoke run: few rounds and test images")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--workdir", type=Path, help="keep exports, quantized models and build caches here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup, args.test_inputs = 8, 1, 16
    models = args.models.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    args.variants = args.variants.split(",")
    bad = [m for m in models if m not in MODELS] + [v for v in args.variants if v not in VARIANTS]
    if bad:
        print(f"unknown model(s) or variant(s) {', '.join(bad)}; models: {', '.join(MODELS)}; "
              f"variants: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    if REFERENCE not in args.variants:
        print(f"--variants must include {REFERENCE}: every accuracy figure is against it", file=sys.stderr)
        return 2

    header = machine_header(True)
    for line in header:
        print(line, flush=True)
    t_start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        work = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cuvil-precision-")))
        work.mkdir(parents=True, exist_ok=True)
        rows = [r for name in models for r in run_model(name, threads, args, work)]
    total = time.perf_counter() - t_start
    print(f"\ntotal {total:.0f} s; load average at end: {load_average()}")
    if args.json:
        args.json.write_text(json.dumps({
            "header": header, "load_average_end": load_average(), "total_s": total,
            "calibration_samples": args.calibration_samples,
            "rows": [dict(asdict(r), ratios=r.ratios()) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
