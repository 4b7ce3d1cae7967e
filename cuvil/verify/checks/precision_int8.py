"""The int8 part of the ``precision`` check: a build calibrated on the user's samples, judged against float32.

Its settings, in ``[checks.precision]`` (a relative folder is relative to the config file)::

    calibration = "calib"          # folder of .npz samples, as `cuvil compile --calibration DIR` reads
    int8_samples = "held-out"      # samples to judge on (default: the calibration samples)
    symmetric = true               # the compile's int8 options
    per_channel = true
    calibration_method = "minmax"  # or "percentile", "entropy"
    min_calibration_samples = 64   # only to override the compile's minimum
    int8_min_top1 = 0.99           # top-1 agreement with float32, classifier outputs
    int8_min_snr_db = 30.0         # output SNR against float32, every other float output
    classifier_outputs = "auto"    # or the names of the classifier outputs

The rules:

1. Without ``calibration`` int8 is not checked, and the result says how to enable it.  It is
   checked on the C targets, as fp16 and bf16 are.
2. The int8 build is ``cuvil.compile(..., quant_dtype="int8", calibration_dataset=DIR, ...)``
   with the options above; a compile that refuses (too few samples, a declared range the
   samples never exercise ...) fails the check with the compiler's message.
3. The samples judged on (``int8_samples``, else the calibration samples) are split into the
   calls the model takes, as calibration splits them (``cuvil/quant/data.py``), and run on the
   int8 build and on the float32 build of the same target: int8 is judged against what the
   user would ship otherwise.
4. A classifier output is a float output of rank 2 (``[batch, classes]``, at least 2 classes)
   under ``"auto"``, or one named in ``classifier_outputs``.  Its figure is the top-1 agreement
   (the fraction of rows whose arg max matches float32's), at least ``int8_min_top1``.  Every
   other float output is judged by its SNR in dB over all samples, at least ``int8_min_snr_db``.
   Integer outputs are listed as not compared.
5. The per-layer errors come from the compile's accuracy metadata (``m.info.precision``: relative
   L2 and SNR of every layer against the float32 graph); the worst layers, and the quantization's
   warnings, are in the details, and the worst layer is named in a failure's summary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.dtypes import is_float_np
from cuvil.metrics import error_figures
from cuvil.verify.base import VerifyError

WORST_LAYERS = 5
ENABLE_HINT = ('set calibration = "DIR" in [checks.precision]: a folder of .npz samples from the inputs the model '
               'will see, one sample per file keyed by input name (what cuvil compile --quantize int8 '
               '--calibration DIR reads)')


@dataclass(frozen=True)
class Int8Settings:
    """The int8 settings of ``[checks.precision]`` (see the module docstring)."""

    calibration: Path
    samples: Path
    symmetric: bool = True
    per_channel: bool = True
    method: str = "minmax"
    min_samples: int | None = None
    min_top1: float = 0.99
    min_snr_db: float = 30.0
    classifiers: tuple[str, ...] | None = None  # None: "auto"

    def compile_options(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"quant_dtype": "int8", "calibration_dataset": str(self.calibration),
                              "symmetric": self.symmetric, "per_channel": self.per_channel,
                              "calibration": self.method}
        if self.min_samples is not None:
            kw["min_calibration_samples"] = self.min_samples
        return kw

    def thresholds(self) -> dict[str, Any]:
        return {"int8_min_top1": self.min_top1, "int8_min_snr_db": self.min_snr_db,
                "classifier_outputs": "auto" if self.classifiers is None else list(self.classifiers)}


def _bad(key: str, want: str, value: Any) -> VerifyError:
    return VerifyError(f"[checks.precision] {key} must be {want}, got {value!r}")


def int8_settings(cfg: Mapping[str, Any]) -> Int8Settings | None:
    """The int8 settings of a ``[checks.precision]`` table; None when it names no calibration data.
    A mistyped or out-of-range value is a :class:`VerifyError` naming the key."""
    from cuvil.quant.observers import METHODS

    folder = cfg.get("calibration")
    if folder is None:
        for key in ("int8_samples", "calibration_method", "min_calibration_samples"):
            if key in cfg:
                raise VerifyError(f"[checks.precision] {key} is an int8 setting, and int8 is checked only with "
                                  f"calibration data: {ENABLE_HINT}")
        return None
    paths = {}
    for key in ("calibration", "int8_samples"):
        value = cfg.get(key, folder)
        if not isinstance(value, str | Path) or not str(value):
            raise _bad(key, "a folder of .npz samples", value)
        paths[key] = Path(value)
    flags = {}
    for key in ("symmetric", "per_channel"):
        flags[key] = cfg.get(key, True)
        if not isinstance(flags[key], bool):
            raise _bad(key, "true or false", flags[key])
    method = cfg.get("calibration_method", "minmax")
    if method not in METHODS:
        raise _bad("calibration_method", f"one of {', '.join(METHODS)}", method)
    min_samples = cfg.get("min_calibration_samples")
    if min_samples is not None and (isinstance(min_samples, bool) or not isinstance(min_samples, int)
                                    or min_samples < 1):
        raise _bad("min_calibration_samples", "a positive integer", min_samples)
    min_top1 = cfg.get("int8_min_top1", 0.99)
    if isinstance(min_top1, bool) or not isinstance(min_top1, int | float) or not 0.0 <= min_top1 <= 1.0:
        raise _bad("int8_min_top1", "a fraction in [0, 1]", min_top1)
    min_snr = cfg.get("int8_min_snr_db", 30.0)
    if isinstance(min_snr, bool) or not isinstance(min_snr, int | float) or not math.isfinite(min_snr):
        raise _bad("int8_min_snr_db", "a number of dB", min_snr)
    names = cfg.get("classifier_outputs", "auto")
    if names == "auto":
        classifiers = None
    elif isinstance(names, list) and all(isinstance(n, str) for n in names):
        classifiers = tuple(names)
    else:
        raise _bad("classifier_outputs", '"auto" or a list of output names', names)
    return Int8Settings(paths["calibration"], paths["int8_samples"], flags["symmetric"], flags["per_channel"],
                        method, min_samples, float(min_top1), float(min_snr), classifiers)


def judged_feeds(settings: Int8Settings, graph: Any, output_names: Sequence[str]) -> list[tuple[np.ndarray, ...]]:
    """The model calls int8 is judged on (rule 3); unreadable or ill-fitting samples are a :class:`VerifyError`."""
    from cuvil.quant.data import calibration_set

    if settings.classifiers is not None:
        unknown = [n for n in settings.classifiers if n not in output_names]
        if unknown:
            raise VerifyError(f"[checks.precision] classifier_outputs names {', '.join(map(repr, unknown))}, "
                              f"not outputs of the model ({', '.join(map(repr, output_names))})")
    try:
        return list(calibration_set(settings.samples, graph).feeds)
    except CuvilError as exc:
        raise VerifyError(f"[checks.precision] int8_samples / calibration: {exc}") from None


@dataclass
class Int8Outcome:
    """What the int8 build of one target measured: details for the report, figures, and the first failure."""

    details: dict[str, Any]
    figures: dict[str, float]
    summary: str  # appended to a passing result's summary
    failure: str | None = None  # the summary of a failing result
    where: dict[str, str] | None = None


def judge_int8(model: Any, fp32: Any, feeds: Sequence[Sequence[np.ndarray]], names: Sequence[str],
               settings: Int8Settings, node_of: Mapping[str, str]) -> Int8Outcome:
    """Rules 3-5 for one target: ``model`` the int8 build, ``fp32`` the float32 build of the same target."""
    got: list[list[np.ndarray]] = [[] for _ in names]
    want: list[list[np.ndarray]] = [[] for _ in names]
    for feed in feeds:
        for i, (g, w) in enumerate(zip(model(*feed), fp32(*feed))):
            got[i].append(np.asarray(g))
            want[i].append(np.asarray(w))
    rows = []
    for name, g, w in zip(names, got, want):
        rows.append(_output_row(name, g, w, settings, node_of.get(name, "")))
    layers, report = _layers(model)
    details: dict[str, Any] = {"samples": len(feeds), "judged_on": str(settings.samples),
                               "calibration": str(settings.calibration), "thresholds": settings.thresholds(),
                               "outputs": rows, "worst_layers": layers, **report}
    figures: dict[str, float] = {}
    top1 = [r["top1_agreement"] for r in rows if r["kind"] == "classifier"]
    snrs = [r["snr_db"] for r in rows if r["kind"] == "snr"]
    parts = []
    if top1:
        figures["int8_top1_agreement"] = min(top1)
        parts.append(f"top-1 agreement with fp32 {100 * min(top1):.2f}% (at least {100 * settings.min_top1:g}%)")
    if snrs:
        figures["int8_snr_db"] = min(snrs)
        parts.append(f"output SNR {min(snrs):.1f} dB (at least {settings.min_snr_db:g} dB)")
    if layers:
        figures["int8_worst_layer_snr_db"] = min(float(x["snr_db"]) for x in layers)
    worst_layer = (f"; worst layer: node {layers[0]['node']!r} ({layers[0]['op']}), relative L2 "
                   f"{float(layers[0]['rel_l2']):.3g}, SNR {float(layers[0]['snr_db']):.1f} dB"
                   if layers else "")
    summary = f"; int8: {', '.join(parts) if parts else 'no float outputs to compare'} on {len(feeds)} samples"
    if report.get("warnings"):
        summary += f" ({len(report['warnings'])} calibration warnings in the details)"
    bad = [r for r in rows if not r["ok"]]
    if not bad:
        return Int8Outcome(details, figures, summary)
    r = bad[0]
    why = (f"top-1 agreement with fp32 {100 * r['top1_agreement']:.2f}% below {100 * settings.min_top1:g}%"
           if r["kind"] == "classifier" else f"SNR {r['snr_db']:.1f} dB below {settings.min_snr_db:g} dB")
    where = {"precision": "int8", "output": r["output"], "node": r["node"]}
    if layers:
        where["layer"] = str(layers[0]["node"])
    return Int8Outcome(details, figures, summary,
                       f"int8 output {r['output']!r}: {why} on {len(feeds)} samples{worst_layer}", where)


def _output_row(name: str, got: list[np.ndarray], want: list[np.ndarray], settings: Int8Settings,
                node: str) -> dict[str, Any]:
    w0 = want[0]
    row: dict[str, Any] = {"output": name, "node": node}
    if not is_float_np(w0.dtype):
        return {**row, "kind": "not compared: integer output", "ok": True}
    if any(g.shape != w.shape for g, w in zip(got, want)):
        shapes = next((list(g.shape), list(w.shape)) for g, w in zip(got, want) if g.shape != w.shape)
        return {**row, "kind": "snr", "snr_db": -math.inf, "rel_l2": math.inf, "ok": False,
                "problem": f"int8 shape {shapes[0]} against fp32 {shapes[1]}"}
    figs = error_figures(np.concatenate([g.reshape(-1) for g in got]), np.concatenate([w.reshape(-1) for w in want]))
    row.update(rel_l2=figs["rel_l2"], snr_db=figs["snr_db"], max_abs=figs["max_abs"])
    classifier = (name in settings.classifiers if settings.classifiers is not None
                  else w0.ndim == 2 and w0.shape[-1] >= 2)
    if not classifier:
        return {**row, "kind": "snr", "ok": figs["snr_db"] >= settings.min_snr_db}
    if w0.ndim == 0 or w0.shape[-1] < 2:
        raise VerifyError(f"[checks.precision] classifier_outputs: output {name!r} has shape {list(w0.shape)}, "
                          "no class axis to take a top-1 over")
    a = np.concatenate([np.argmax(w, axis=-1).reshape(-1) for w in want])
    b = np.concatenate([np.argmax(g, axis=-1).reshape(-1) for g in got])
    agreement = float(np.mean(a == b))
    return {**row, "kind": "classifier", "top1_agreement": agreement, "rows": int(a.size),
            "disagreements": int(np.sum(a != b)), "ok": agreement >= settings.min_top1}


def _layers(model: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The worst layers of the compile's accuracy metadata, and what the quantization recorded."""
    from cuvil.quant.accuracy import PrecisionReport

    meta = getattr(model.info, "precision", None)
    if not meta:
        return [], {"layer_report": "the int8 build recorded no accuracy report"}
    report = PrecisionReport.from_json(meta)
    quant = meta.get("quantization", {})
    return [e.to_json() for e in report.worst(WORST_LAYERS)], {
        "quantization": {k: quant.get(k) for k in ("symmetric", "per_channel", "calibration")},
        "layer_samples": report.samples, "layers_compared": len(report.layers),
        "quantized_nodes": len(quant.get("nodes", ())), "left_in_float32": list(quant.get("skipped", ())),
        "calibration_examples": quant.get("examples"), "warnings": list(quant.get("warnings", ()))}
