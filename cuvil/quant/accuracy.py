"""The per-layer accuracy report of a reduced-precision or quantized graph against its float32 graph.

Both graphs run in the reference interpreter on the same samples, and their values are matched by
name: the precision and quantization passes keep the name of every value they convert (a
reduced-precision node's output keeps the float32 value's name), so each value of the candidate's
top graph that the float32 graph also has, with the same shape, is one layer of the report.  Values
a pass adds (casts, rounded weights, named ``NAME.f16`` and so on) have no float32 counterpart and
are not layers.  Errors are summed over all samples: relative L2 and SNR over the concatenation,
max abs error over every element, under the comparison policy of :mod:`cuvil.metrics` (a NaN or
infinity on one side only is an infinite error; matching ones are left out).

An int8 graph's integer values are layers too, when the caller says which float32 value each one
quantizes and at what scale and zero point (``dequantize``): a folded integer kernel's output
(``r1_quantized``, the int8 form of ``r1``) is compared, dequantized, with that float32 value, so
the layers that run on integers are in the report on every target, not only where the reference
interpreter keeps their float32 form.

The same run finds overflows: a value the candidate holds in a reduced type whose float32
counterpart exceeds that type's largest finite value somewhere (fp16: 65504), or that comes out
infinite or NaN in the candidate where the float32 value is finite.  Given calibration data, the
float32 ranges of those values are also taken over every calibration example, on the native
calibration build (:func:`reduced_peaks`), so that an overflow in any example is found, not only
in the few samples the two graphs run on in the reference interpreter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from cuvil.backends.ref.interpreter import run_graph
from cuvil.errors import CuvilError, InputError
from cuvil.ir.dtypes import DType, is_float_np, max_finite
from cuvil.ir.graph import Graph, Node
from cuvil.metrics import Comparison, compare
from cuvil.passes.convert_precision import PrecisionOverflowError, mask_fills

if TYPE_CHECKING:
    from cuvil.quant.calibrate import RunnerOptions
    from cuvil.quant.data import CalibrationSet

REDUCED_FLOATS = (DType.f16, DType.bf16)


@dataclass(frozen=True)
class LayerError:
    """The error of one value of the candidate graph against the float32 graph's value of that name."""

    name: str  # the value
    node: str  # the node of the candidate graph that produces it
    op: str
    dtype: str  # its element type in the candidate
    rel_l2: float
    snr_db: float
    max_abs: float

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "node": self.node, "op": self.op, "dtype": self.dtype,
                "rel_l2": _num(self.rel_l2), "snr_db": _num(self.snr_db), "max_abs": _num(self.max_abs)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> LayerError:
        return LayerError(str(d["name"]), str(d["node"]), str(d["op"]), str(d.get("dtype", "")),
                          float(d["rel_l2"]), float(d["snr_db"]), float(d["max_abs"]))


@dataclass(frozen=True)
class Overflow:
    """A value that leaves the reduced type's range on the samples."""

    name: str
    node: str
    op: str
    dtype: str
    max_abs: float  # the largest |value| of the float32 graph's value (inf when only the candidate overflowed)

    def describe(self) -> str:
        limit = max_finite(DType(self.dtype))
        return (f"node {self.node!r} ({self.op}): value {self.name!r} reaches |x| = {self.max_abs:.6g}, "
                f"beyond {self.dtype}'s largest finite value {limit:.6g}")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "node": self.node, "op": self.op, "dtype": self.dtype,
                "max_abs": _num(self.max_abs)}


@dataclass
class PrecisionReport:
    """What a reduced-precision compile measured: per-layer errors, output errors and overflows."""

    precision: str
    samples: int
    layers: list[LayerError] = field(default_factory=list)
    overflows: list[Overflow] = field(default_factory=list)
    overrides: dict[str, str] = field(default_factory=dict)

    def worst(self, n: int = 10) -> list[LayerError]:
        return sorted(self.layers, key=lambda e: (-_key(e.rel_l2), e.name))[:n]

    def to_json(self) -> dict[str, Any]:
        return {"precision": self.precision, "samples": self.samples, "overrides": dict(self.overrides),
                "layers": [e.to_json() for e in self.layers], "overflows": [o.to_json() for o in self.overflows]}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> PrecisionReport:
        return PrecisionReport(
            str(d["precision"]), int(d["samples"]), [LayerError.from_json(e) for e in d.get("layers", ())],
            [Overflow(str(o["name"]), str(o["node"]), str(o["op"]), str(o["dtype"]), float(o["max_abs"]))
             for o in d.get("overflows", ())],
            {str(k): str(v) for k, v in d.get("overrides", {}).items()})


def _num(x: float) -> float | str:
    """JSON has no infinities: they are written as strings that ``float()`` reads back."""
    return x if math.isfinite(x) else str(x)


def _key(x: float) -> float:
    return math.inf if math.isnan(x) else x


def trace(graph: Graph, inputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """Every value the top graph's nodes produce (and its inputs), by name, on ``inputs``."""
    top = set(graph.nodes)
    names = {id(n): [o.name for o in n.outputs] for n in graph.nodes}
    values: dict[str, np.ndarray] = {v.name: np.asarray(a) for v, a in zip(graph.inputs, inputs)}

    def hook(node: Node, outs: list[np.ndarray]) -> None:
        if node in top:
            values.update(zip(names[id(node)], outs))

    run_graph(graph, inputs, on_node=hook)
    return values


@dataclass(frozen=True)
class Dequantize:
    """How an integer value of the candidate stands for a float32 value: ``(q - zero_point) * scale``."""

    of: str  # the float32 value's name
    scale: float
    zero_point: int


def layer_errors(reference: Graph, candidate: Graph, samples: Iterable[Sequence[np.ndarray]],
                 dequantize: Mapping[str, Dequantize] | None = None) -> list[LayerError]:
    """Per layer of ``candidate``, its error against ``reference`` (the float32 graph) on ``samples``;
    ``dequantize``: the candidate's integer values that stand for float32 ones, by name."""
    return _compare(reference, candidate, samples, dequantize or {})[0]


def precision_report(reference: Graph, candidate: Graph, samples: Sequence[Sequence[np.ndarray]], precision: str,
                     overrides: Mapping[str, str] | None = None,
                     peaks: Mapping[str, float] | None = None) -> PrecisionReport:
    """Layer errors and overflows of ``candidate`` against ``reference`` in one run over ``samples``;
    ``peaks``: the largest finite |x| of reference values on more inputs (:func:`reduced_peaks`)."""
    layers, overflows = _compare(reference, candidate, samples, peaks=peaks)
    return PrecisionReport(precision, len(samples), layers, overflows, dict(overrides or {}))


def reduced_values(candidate: Graph) -> dict[str, DType]:
    """The values ``candidate`` holds in a reduced float type, by name, those of fused nodes' bodies
    included (they keep the names of the float32 graph's values they compute)."""
    return {o.name: o.type.dtype for n in candidate.walk() if n.op != "constant" for o in n.outputs
            if o.type.dtype in REDUCED_FLOATS}


def reduced_peaks(reference: Graph, names: Sequence[str], calib: CalibrationSet,
                  options: RunnerOptions | None = None) -> dict[str, float]:
    """The largest finite |x| of each named top-level value of the float32 ``reference`` over every
    feed of ``calib``, run on the calibration runner (a native build where a C compiler runs)."""
    from cuvil.quant.calibrate import RunnerOptions, batched_feeds, calibration_runner, confirm_batch_axis

    wanted = set(names)
    watched = [o for n in reference.nodes if n.op != "constant" for o in n.outputs
               if o.name in wanted and o.type.dtype.is_float]
    if not watched:
        return {}
    options = options or RunnerOptions()
    runner = calibration_runner(reference, watched, options)
    calib = confirm_batch_axis(reference, calib, runner)
    peaks = dict.fromkeys((v.name for v in watched), 0.0)
    for feed in batched_feeds(reference, calib.feeds, options.batch, calib.batch_axis):
        for v, a in zip(watched, runner.run(feed)):
            a64 = np.abs(a.astype(np.float64))
            peaks[v.name] = max(peaks[v.name], float(np.max(a64, initial=0.0, where=np.isfinite(a64))))
    return peaks


def _compare(reference: Graph, candidate: Graph, samples: Iterable[Sequence[np.ndarray]],
             dequantize: Mapping[str, Dequantize] | None = None,
             peaks: Mapping[str, float] | None = None) -> tuple[list[LayerError], list[Overflow]]:
    dequantize = dequantize or {}
    producers = {o.name: n for n in candidate.nodes for o in n.outputs if n.op != "constant"}
    nodes = {o.name: n for n in candidate.walk() for o in n.outputs}
    reduced = {name: (nodes[name], dt) for name, dt in reduced_values(candidate).items()}
    sums: dict[str, Comparison] = {}  # summed over the samples: the figures of the concatenation
    peaks = {k: v for k, v in (peaks or {}).items() if k in reduced}
    n_samples = 0
    for sample in samples:
        n_samples += 1
        want = trace(reference, sample)
        got = trace(candidate, sample)
        for name, (_, dt) in reduced.items():
            w = want.get(name)
            if w is None or not is_float_np(w.dtype):
                continue
            w64 = np.abs(w.astype(np.float64))
            peak = float(np.max(w64, initial=0.0, where=np.isfinite(w64)))
            g = got.get(name)
            finite_in_f32 = g is not None and g.shape == w.shape and bool(
                np.any(~np.isfinite(g.astype(np.float32)) & np.isfinite(w)))
            if finite_in_f32 and peak <= max_finite(dt):
                peak = math.inf  # only the reduced computation left the range (inside it, not at this value)
            peaks[name] = max(peaks.get(name, 0.0), peak)
        for name in producers:
            g, dq = got.get(name), dequantize.get(name)
            w = want.get(name if dq is None else dq.of)
            if dq is not None and g is not None and np.issubdtype(g.dtype, np.integer):
                g = (g.astype(np.float64) - dq.zero_point) * dq.scale
            if g is None or w is None or g.shape != w.shape or not _float(g) or not _float(w):
                continue
            sums[name] = sums.get(name, Comparison()) + compare(g, w)
    layers = []
    for name, node in producers.items():
        if name not in sums:
            continue
        c = sums[name]
        dtype = next((o.type.dtype.value for o in node.outputs if o.name == name), "")
        layers.append(LayerError(name, node.name, node.op, dtype, c.rel_l2, c.snr_db, c.max_abs))
    overflows = []
    # values that carry a mask fill to a softmax hold the reduced extreme by design (convert-precision)
    carriers = {dt: mask_fills(reference, dt).carriers for dt in {dt for _, dt in reduced.values()}}
    for name, peak in peaks.items():
        node, dt = reduced[name]
        if peak > max_finite(dt) and name not in carriers[dt]:
            overflows.append(Overflow(name, node.name, node.op, dt.value, peak))
    return layers, overflows


def _float(a: np.ndarray) -> bool:
    return is_float_np(a.dtype)


def sample_inputs(graph: Graph, dataset: Iterable[Any] | None, count: int, seed: int = 0) -> list[list[np.ndarray]]:
    """Up to ``count`` input lists: from ``dataset`` (tuples or lists in input order, dicts by input name,
    or single arrays for a one-input model) when given, else seeded random inputs from the signature.

    A given sample must meet the model's input contract (element types, shapes: the checks of
    ``cuvil/runtime/guards.py``); one that does not is an :class:`InputError` naming the sample and
    the input."""
    from cuvil.ir.domains import infer_domains
    from cuvil.ir.samples import random_inputs
    from cuvil.runtime.compiled import Signature
    from cuvil.runtime.guards import bind_inputs
    from cuvil.runtime.torch_io import is_torch_tensor, tensor_to_numpy

    specs = Signature.of(graph).inputs
    if dataset is None:
        domains = infer_domains(graph)  # token ids within their tables, masks as masks
        return [random_inputs(specs, graph.symbols, seed=seed + i, domains=[domains.get(s.name) for s in specs])
                for i in range(count)]
    out: list[list[np.ndarray]] = []
    for item in dataset:
        if len(out) == count:
            break
        if isinstance(item, Mapping):
            missing = [s.name for s in specs if s.name not in item]
            if missing:
                raise CuvilError(f"calibration sample {len(out)} lacks inputs {', '.join(missing)}")
            arrays = [item[s.name] for s in specs]
        elif isinstance(item, tuple | list):
            arrays = list(item)
        else:
            arrays = [item]
        if len(arrays) != len(specs):
            raise CuvilError(f"calibration sample {len(out)} has {len(arrays)} inputs; the model takes {len(specs)}")
        sample = [np.array(tensor_to_numpy(a, f"calibration sample {len(out)}, input {s.name!r}"))
                  if is_torch_tensor(a) else np.asarray(a) for a, s in zip(arrays, specs)]
        try:  # the checks a compiled model makes of its inputs: no silent conversion of element types
            bind_inputs([s.name for s in specs], [s.type for s in specs], sample, graph.symbols)
        except InputError as exc:
            raise InputError(f"calibration sample {len(out)}: {exc}") from None
        out.append(sample)
    if not out:
        raise CuvilError("the calibration dataset is empty")
    return out


def check_reduced_precision(reference: Graph, candidate: Graph, samples: Sequence[Sequence[np.ndarray]],
                            precision: str, overrides: Mapping[str, str], allow_overflow: bool,
                            calib: CalibrationSet | None = None,
                            runner: RunnerOptions | None = None) -> PrecisionReport:
    """The report of a reduced-precision compile; refuses (``PrecisionOverflowError``) when a value
    overflows the reduced type on the samples, or on any example of ``calib`` where it is given (on
    the calibration runner, with ``runner``'s compiler, cache and threads), unless ``allow_overflow``."""
    peaks = None
    half = [n for n, dt in reduced_values(candidate).items() if dt is DType.f16] if calib is not None else []
    if calib is not None and half:  # bf16 has float32's range, all but 0.4 %
        peaks = reduced_peaks(reference, half, calib, runner)
    report = precision_report(reference, candidate, samples, precision, overrides, peaks)
    if report.overflows and not allow_overflow:
        first = report.overflows[0]
        more = f" (and {len(report.overflows) - 1} more values)" if len(report.overflows) > 1 else ""
        where = (f"on the {calib.examples} calibration examples" if calib is not None
                 else f"on {report.samples} sample inputs")
        raise PrecisionOverflowError(
            f"precision={precision!r}: {where}, {first.describe()}{more}. "
            f"Keep that node in float32 (precision_overrides={{'node:{first.node}': 'fp32'}} or "
            f"{{'{first.op}': 'fp32'}}), use precision='bf16' (float32's range), or pass allow_overflow=True "
            "to compile anyway (the overflows are then recorded in the model's precision report)")
    return report


def format_report(report: PrecisionReport, top: int = 10, quantization: Mapping[str, Any] | None = None) -> str:
    """The worst ``top`` layers (largest relative L2 first) and every overflow, as a text table;
    ``quantization``: an int8 report's options (its ``quantization`` entry), summarised first."""
    lines = [f"precision: {report.precision}, {report.samples} samples, {len(report.layers)} layers compared "
             "with the float32 graph"]
    if report.overrides:
        lines.append("overrides: " + ", ".join(f"{k}={v}" for k, v in report.overrides.items()))
    q = quantization if quantization is not None else getattr(report, "quantization", None)
    if q:
        wr = q.get("weight_range") or [-127, 127]
        lines.append(f"quantization: weights in [{wr[0]}, {wr[1]}]{' (reduce_range)' if q.get('reduce_range') else ''}"
                     f"{' per channel' if q.get('per_channel') else ' per tensor'}, activations "
                     f"{'symmetric int8' if q.get('symmetric') else 'asymmetric uint8'}, {q.get('calibration')} "
                     f"calibration on {q.get('examples')} examples")
    lines.append(f"{'value':32s} {'node':32s} {'op':18s} {'dtype':5s} {'rel_l2':>10s} {'snr_db':>8s} {'max_abs':>10s}")
    for e in report.worst(top):
        lines.append(f"{e.name[:32]:32s} {e.node[:32]:32s} {e.op[:18]:18s} {e.dtype:5s} {e.rel_l2:10.3e} "
                     f"{e.snr_db:8.2f} {e.max_abs:10.3e}")
    for o in report.overflows:
        lines.append(f"OVERFLOW {o.describe()}")
    return "\n".join(lines)
