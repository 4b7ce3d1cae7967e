"""The ``onnxruntime`` subject: verify an onnxruntime session on the ONNX model instead of a Cuvil build.

``cuvil verify model.onnx --subject onnxruntime`` runs the checks that apply to
another runtime on one pseudo-target, ``onnxruntime`` (an InferenceSession on the
CPU execution provider with every graph optimisation on), so a team can set
Cuvil's verdict beside what they run today.  The oracles stay Cuvil's: seeded
inputs, the symbol constraints and the float64 reference come from the
reference interpreter on the imported graph.

What each applicable check sees:

- ``dynamic-shapes``: the session at the symbols' boundaries; values outside a
  constraint are run too and ORT's answer is reported as it is (ONNX declares no
  ranges, so a session accepting them is a warning, not a failure);
- ``precision``, ``reproducibility`` (repeated runs), ``concurrency`` (threads
  sharing the session), ``batch-scaling``: as for any target;
- ``latency``: end to end, decomposed with ORT's own profiler
  (``SessionOptions.enable_profiling``: one span per kernel the optimised graph runs);
- ``layerwise``: taps at ORT's fusion boundaries: the optimised model ORT saves is
  reloaded with the tensors it still computes added as outputs (and optimisation
  off, as it is already optimised), so the taps do not change the kernels.

Checks that look at Cuvil's own compiler (coverage, passes, cross-target ...) are
skipped with the reason.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.errors import CuvilError, InputError
from cuvil.ir.spec import TensorSpec
from cuvil.runtime.compiled import Signature
from cuvil.verify.base import Check, VerifyError
from cuvil.verify.config import VerifyConfig
from cuvil.verify.context import ModelSource, VerifyContext
from cuvil.verify.runner import Subject

ORT_TARGET = "onnxruntime"
PROVIDER = "CPUExecutionProvider"

#: The checks that apply to an onnxruntime session; every other check is skipped.
APPLIES = frozenset({"dynamic-shapes", "precision", "reproducibility", "latency", "batch-scaling", "concurrency",
                     "layerwise"})
_WHY_NOT = {
    "coverage": "it maps source ops to Cuvil ops and kernels",
    "custom-ops": "it checks Cuvil's custom-op registrations",
    "cross-target": "it compares Cuvil's targets with each other",
    "passes": "it checks Cuvil's pass pipeline",
    "fusion-memory": "it compares Cuvil's fused and memory-planned builds",
    "control-flow": "it drives Cuvil's If/Loop code generation",
}


class OrtRunError(CuvilError):
    """onnxruntime failed while running the model (not while checking its inputs)."""


def _model_bytes(model: Any) -> bytes:
    if hasattr(model, "SerializeToString"):
        return bytes(model.SerializeToString())
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    return Path(str(model)).read_bytes()


class OrtModel:
    """An onnxruntime InferenceSession behind the interface checks use on a compiled model.

    Its contract (input and output specs, symbols) is the imported graph's, so inputs are
    generated and judged the same way as for Cuvil's targets; the session itself checks
    only what ONNX declares (element types, ranks, static dims)."""

    target = ORT_TARGET
    graph = None  # no Cuvil graph: the checks that tap or profile use the methods below

    def __init__(self, model_bytes: bytes, signature: Signature, work_dir: Path, *,
                 optimization: str = "all", threads: int = 0) -> None:
        import onnxruntime as ort

        self.signature = signature
        self.input_specs = list(signature.inputs)
        self.output_specs = list(signature.outputs)
        self._bytes = model_bytes
        self._work = work_dir
        self._threads = threads
        opts = self._options(optimization)
        self.optimized_path = work_dir / "onnxruntime-optimized.onnx"
        if optimization == "all":
            opts.optimized_model_filepath = str(self.optimized_path)
        self.session = ort.InferenceSession(model_bytes, opts, providers=[PROVIDER])
        self.providers = list(self.session.get_providers())
        self.version = ort.__version__

    def _options(self, optimization: str) -> Any:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                         "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[optimization]
        opts.intra_op_num_threads = self._threads
        opts.log_severity_level = 3  # ORT warns that an NCHWc-optimised model is hardware specific: we know
        return opts

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.input_specs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.output_specs]

    @property
    def symbols(self) -> dict[str, Any]:
        return dict(self.signature.symbols)

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        return _run(self.session, self.input_names, arrays, self.output_names)

    # layerwise -----------------------------------------------------------------------------------------------
    def computed_tensors(self) -> list[tuple[str, str, str]]:
        """(tensor, node, op) of every tensor the optimised graph still computes, in its node order:
        the values at ORT's fusion-group boundaries."""
        import onnx

        proto = onnx.load(str(self.optimized_path), load_external_data=False)
        return [(o, n.name, n.op_type) for n in proto.graph.node for o in n.output if o]

    def tapped(self, names: Sequence[str]) -> tuple[Any, list[str]]:
        """A session of the optimised model with ``names`` added as outputs (optimisation off: it is
        optimised already, so the kernels are the untapped session's), and its output names."""
        import onnx
        import onnxruntime as ort

        proto = onnx.load(str(self.optimized_path))
        present = {o.name for o in proto.graph.output}
        for name in names:
            if name not in present:
                proto.graph.output.append(onnx.ValueInfoProto(name=name))
        sess = ort.InferenceSession(proto.SerializeToString(), self._options("none"), providers=[PROVIDER])
        return sess, [o.name for o in sess.get_outputs()]

    # batch-scaling -------------------------------------------------------------------------------------------
    def peak_memory(self, input_sets: Sequence[Sequence[np.ndarray]]) -> list[int]:
        """Measured memory of one run per input set: in a fresh process each (so no allocation survives
        from another size), the session is made and the inputs loaded, the peak resident set is reset
        (``/proc/self/clear_refs``), one run made, and the peak minus the resident set before the run
        returned, in bytes: what the run needs on top of the loaded session (ORT's arena included)."""
        import subprocess
        import sys

        model = self._work / "onnxruntime-memory.onnx"
        model.write_bytes(self._bytes)
        out: list[int] = []
        with tempfile.TemporaryDirectory(prefix="ort-memory-", dir=self._work) as tmp:
            for i, arrays in enumerate(input_sets):
                feed = Path(tmp) / f"inputs{i}.npz"
                arrays_by_name: dict[str, Any] = {n: np.asarray(a) for n, a in zip(self.input_names, arrays)}
                np.savez(feed, **arrays_by_name)
                proc = subprocess.run([sys.executable, "-c", _PEAK_MEMORY_SCRIPT, str(model), str(feed),
                                       str(self._threads)], capture_output=True, text=True, timeout=600)
                if proc.returncode != 0:
                    raise OrtRunError(f"measuring onnxruntime's memory failed: {proc.stderr.strip()[-500:]}")
                out.append(int(proc.stdout.split()[-1]))
        return out

    # latency -------------------------------------------------------------------------------------------------
    def profile(self, inputs: Sequence[np.ndarray], runs: int) -> list[list[tuple[str, str, float]]]:
        """``runs`` profiled calls of a second session (same options, ORT's profiler on): per call, the
        (span, category, seconds) of each kernel, the session's own overhead and the Python call's."""
        opts = self._options("all")
        opts.enable_profiling = True
        with tempfile.TemporaryDirectory(prefix="ort-profile-", dir=self._work) as tmp:
            opts.profile_file_prefix = os.path.join(tmp, "profile")
            import onnxruntime as ort

            sess = ort.InferenceSession(self._bytes, opts, providers=[PROVIDER])
            walls = []
            for _ in range(runs):
                t0 = time.perf_counter()
                _run(sess, self.input_names, inputs, self.output_names)
                walls.append(time.perf_counter() - t0)
            events = json.loads(Path(sess.end_profiling()).read_text(encoding="utf-8"))
        return _spans(events, walls)


_PEAK_MEMORY_SCRIPT = """
import sys
import numpy as np
import onnxruntime as ort

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise SystemExit(f"/proc/self/status has no {key}")

model, inputs, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
opts = ort.SessionOptions()
opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
opts.intra_op_num_threads = threads
opts.log_severity_level = 3
sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
with np.load(inputs) as data:
    feed = {k: np.array(data[k]) for k in data.files}
with open("/proc/self/clear_refs", "w") as f:  # resets the peak resident set (VmHWM) to the current one
    f.write("5")
before = status("VmRSS")
sess.run(None, feed)
print(max(status("VmHWM") - before, 0))
"""


def _spans(events: Sequence[Mapping[str, Any]], walls: Sequence[float]) -> list[list[tuple[str, str, float]]]:
    """ORT profiler events split per run (each ends with its ``model_run`` event) as span lists."""
    out: list[list[tuple[str, str, float]]] = []
    kernels: list[tuple[str, str, float]] = []
    for e in events:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "")
            name = str(e["name"])[: -len("_kernel_time")]
            kernels.append((f"{name} ({op})" if op else name, "kernel", float(e["dur"]) * 1e-6))
        elif e.get("cat") == "Session" and e.get("name") == "model_run":
            if len(out) < len(walls):
                run = float(e["dur"]) * 1e-6
                inside = sum(k[2] for k in kernels)
                spans = [*kernels, ("session overhead", "overhead", max(run - inside, 0.0)),
                         ("call overhead", "overhead", max(walls[len(out)] - run, 0.0))]
                out.append(spans)
            kernels = []
    if len(out) != len(walls):
        raise OrtRunError(f"onnxruntime's profile holds {len(out)} runs, {len(walls)} were made")
    return out


def _run(sess: Any, names: Sequence[str], arrays: Sequence[Any], outputs: Sequence[str] | None) -> list[np.ndarray]:
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    if len(arrays) != len(names):
        raise InputError(f"expected {len(names)} inputs ({', '.join(map(repr, names))}), got {len(arrays)}")
    feed = {n: np.asarray(a) for n, a in zip(names, arrays)}
    try:
        return [np.asarray(o) for o in sess.run(list(outputs) if outputs is not None else None, feed)]
    except InvalidArgument as exc:  # ORT's own input checks (types, ranks, static dims)
        raise InputError(f"onnxruntime refused the inputs: {str(exc).strip()}") from None
    except Exception as exc:
        raise OrtRunError(f"onnxruntime failed: {type(exc).__name__}: {str(exc).strip()}") from None


def run_once(model_bytes: bytes, names: Sequence[str], arrays: Sequence[Any], outputs: Sequence[str]) -> list[np.ndarray]:
    """One run of a session on ``model_bytes`` as the subject makes it (CPU, every graph optimisation on):
    ``cuvil reduce --subject onnxruntime`` judges each candidate so."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    return _run(ort.InferenceSession(model_bytes, opts, providers=[PROVIDER]), names, arrays, outputs)


class OrtContext(VerifyContext):
    """A context whose one target, ``onnxruntime``, is a session; ``ref`` stays Cuvil's reference (the oracle)."""

    enforces_constraints = False  # ONNX declares no ranges for its symbolic dims

    def compiled(self, target: str, **options: Any) -> Any:
        if target != ORT_TARGET:
            return super().compiled(target, **options)
        key = (target, tuple(sorted(options.items())))
        if key not in self._builds:
            if options:
                raise VerifyError(f"the onnxruntime subject takes no build options ({', '.join(options)})")
            ref = super().compiled("ref")
            sig = Signature(tuple(TensorSpec(s.name, s.type) for s in ref.input_specs),
                            tuple(TensorSpec(s.name, s.type) for s in ref.output_specs), ref.symbols, ())
            self._builds[key] = OrtModel(_model_bytes(self.source.model), sig, self.work_dir)  # type: ignore[assignment]
        return self._builds[key]


class OnnxRuntimeSubject(Subject):
    """onnxruntime (CPU execution provider, every graph optimisation on) on the ONNX model."""

    name = ORT_TARGET

    def resolve_targets(self, explicit: Sequence[str] | None, configured: Sequence[str] | None
                        ) -> tuple[list[str], dict[str, str]]:
        # the configuration's targets name Cuvil's targets: only targets asked for explicitly are checked
        names = [t for t in (explicit or [ORT_TARGET]) if t != "all"] or [ORT_TARGET]
        other = [t for t in names if t != ORT_TARGET]
        if other:
            raise VerifyError(f"the onnxruntime subject runs on one target, {ORT_TARGET!r}; "
                              f"{', '.join(map(repr, other))} are Cuvil targets (use --subject cuvil)")
        return [ORT_TARGET], {}

    def context(self, source: ModelSource, targets: list[str], config: VerifyConfig, *, work_dir: Path,
                cache_dir: str | None) -> VerifyContext:
        if source.kind != "onnx":
            raise VerifyError(f"the onnxruntime subject verifies ONNX models; {source.label} is a "
                              f"{ {'torch': 'PyTorch module', 'tensorflow': 'TensorFlow model'}.get(source.kind, 'Cuvil graph')}")
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            raise VerifyError("the onnxruntime subject needs the onnxruntime package") from None
        return OrtContext(source=source, targets=targets, config=config.as_context_config(), seed=config.seed,
                          work_dir=work_dir, cache_dir=cache_dir)

    def not_applicable(self, check: type[Check]) -> str | None:
        if check.name in APPLIES:
            return None
        return _WHY_NOT.get(check.name, "it looks at Cuvil's own compiler, not at a runtime session")


