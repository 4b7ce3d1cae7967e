"""The ``concurrency`` check: many instances at once give exactly their isolated results.

``instances`` (default 4) callers run the model at the same time, each on its
own seeded inputs, ``repeats`` times (default 3), started together at a
barrier: threads sharing one loaded model (every target), and separate
processes each loading the saved artifact (C and wasm32 targets).  Every
output of every run must equal, bitwise, the output of the same inputs run
alone beforehand.

When runs differ, the same concurrent runs are repeated on a build tapped at
every top-level node (the layerwise check's taps) and the first layer, in graph
order, that differs from its isolated run is named: the kernel with the race.

The model's persistent state is fingerprinted before and after: the sha256
of its weights file, of the weights buffer the loaded C library holds, and
of the outputs of a canary run; any change fails the check.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.backends.registry import find_backend
from cuvil.verify.base import Check, CheckResult, Status, register_check

DEFAULTS: dict[str, Any] = {"instances": 4, "repeats": 3, "processes": True, "timeout_s": 120}

# Run by each process: load the artifact, wait for the start signal, run its inputs, save every output.
_WORKER = r"""
import sys, time, pathlib, numpy as np, cuvil
art, inp, out, go, repeats = sys.argv[1], sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4]), int(sys.argv[5])
m = cuvil.load(art)
data = np.load(inp)
arrays = [data[f"in{i}"] for i in range(len(data.files))]
pathlib.Path(out + ".ready").write_text("1")
while not go.exists():
    time.sleep(0.001)
results = {}
for r in range(repeats):
    for j, a in enumerate(m(*arrays)):
        results[f"r{r}_out{j}"] = np.asarray(a)
np.savez(out, **results)
"""


def _digest(arrays: Any) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def state_fingerprint(m: Any, canary: list[np.ndarray]) -> dict[str, str]:
    """Hashes of what must not change while the model runs: weights (file, loaded buffer) and a canary's outputs."""
    fp: dict[str, str] = {"canary_outputs": _digest(m(*canary))}
    build = getattr(m, "build_info", None)
    if build is not None and build.weights.is_file():
        fp["weights_file"] = hashlib.sha256(build.weights.read_bytes()).hexdigest()
        loaded = m.loaded_weights()
        if loaded is not None:
            fp["weights_loaded"] = hashlib.sha256(loaded).hexdigest()
    return fp


@register_check
class Concurrency(Check):
    """Simultaneous runs in threads and processes equal isolated runs bitwise; persistent state is unchanged."""

    name = "concurrency"
    group = "runtime"
    description = "threads and processes running at once give their isolated outputs bitwise"

    def run(self, ctx: Any) -> list[CheckResult]:
        cfg = self.settings(ctx, DEFAULTS)
        return [self._one(ctx, t, cfg) for t in ctx.targets]

    def _one(self, ctx: Any, target: str, cfg: dict[str, Any]) -> CheckResult:
        t_start = time.perf_counter()
        m = ctx.compiled(target)
        n, repeats = int(cfg["instances"]), int(cfg["repeats"])
        inputs = [ctx.inputs(seed=ctx.seed + 1 + i) for i in range(n)]
        expected = [[np.array(a, copy=True) for a in m(*x)] for x in inputs]
        before = state_fingerprint(m, inputs[0])
        mismatches: list[dict[str, Any]] = []
        mismatches += self._threads(m, inputs, expected, repeats)
        modes = ["threads"]
        backend = find_backend(target)
        if cfg["processes"] and backend is not None and backend.saves_artifacts:
            mismatches += self._processes(ctx, target, m, inputs, expected, repeats, float(cfg["timeout_s"]))
            modes.append("processes")
        after = state_fingerprint(m, inputs[0])
        changed = sorted(k for k in before if before[k] != after.get(k))
        figures = {"instances": float(n), "repeats": float(repeats), "mismatches": float(len(mismatches)),
                   "state_changes": float(len(changed))}
        details = {"modes": modes, "mismatches": mismatches[:20], "fingerprint_before": before,
                   "fingerprint_after": after}
        if mismatches:
            first = mismatches[0]
            where = {"mode": first["mode"], "instance": str(first["instance"]), "output": first["output"]}
            layer = self._first_racy_layer(ctx, target, m, inputs, repeats)
            at = ""
            if layer is not None:
                where.update(layer)
                details["first_racy_layer"] = layer
                at = f"; the first layer that differs is {layer['layer']!r} (node {layer['node']!r}, {layer['op']})"
            return CheckResult(self.name, Status.FAIL,
                               f"{len(mismatches)} concurrent runs differ from their isolated runs; first: "
                               f"{first['mode']} instance {first['instance']} repeat {first['repeat']}, output "
                               f"{first['output']!r} ({first['differing']} elements differ){at}", target=target,
                               figures=figures, details=details, where=where, seconds=time.perf_counter() - t_start)
        if changed:
            return CheckResult(self.name, Status.FAIL, f"persistent state changed while running: {', '.join(changed)}",
                               target=target, figures=figures, details=details, where={"state": changed[0]},
                               seconds=time.perf_counter() - t_start)
        return CheckResult(self.name, Status.PASS,
                           f"{n} instances x {repeats} runs ({' and '.join(modes)}) equal their isolated runs bitwise; "
                           "weights and state unchanged", target=target, figures=figures, details=details,
                           seconds=time.perf_counter() - t_start)

    def _first_racy_layer(self, ctx: Any, target: str, m: Any, inputs: list[list[np.ndarray]], repeats: int
                          ) -> dict[str, str] | None:
        """Where a race shows first: the same concurrent runs on a build tapped at every top-level node
        (the layerwise check's taps: the same kernels), compared layer by layer, in graph order, with
        isolated runs. None when the build keeps no graph or the race does not show again."""
        import cuvil
        from cuvil.verify.checks.layerwise import tap_passes, tap_points, tapped_graph

        if m.graph is None:
            return None
        graph = m.graph
        tapped_g, extra = tapped_graph(graph)
        tapped = cuvil.compile(tapped_g, target=target, options=ctx.compile_options(target, passes=tap_passes(graph)))
        names = [v.name for v in graph.outputs] + extra
        alone = [[np.array(a, copy=True) for a in tapped(*x)] for x in inputs]
        order = {v.name: (n, v) for n, v in tap_points(graph)}
        for _ in range(3):  # a race may need more than one try to show again
            diffs = {d["output"] for d in self._threads(tapped, inputs, alone, repeats, names)}
            for name in [v.name for _, v in tap_points(graph)]:
                if name in diffs:
                    node, v = order[name]
                    return {"layer": v.name, "node": node.name, "op": node.op}
        return None

    @staticmethod
    def _compare(mode: str, i: int, r: int, names: list[str], got: list[np.ndarray], want: list[np.ndarray]
                 ) -> list[dict[str, Any]]:
        out = []
        for name, g, w in zip(names, got, want):
            g = np.asarray(g)
            if g.shape != w.shape or g.dtype != w.dtype or g.tobytes() != w.tobytes():
                differing = int(np.count_nonzero(g != w)) if g.shape == w.shape else int(w.size)
                out.append({"mode": mode, "instance": i, "repeat": r, "output": name, "differing": differing})
        return out

    def _threads(self, m: Any, inputs: list[list[np.ndarray]], expected: list[list[np.ndarray]], repeats: int,
                 names: list[str] | None = None) -> list[dict[str, Any]]:
        barrier = threading.Barrier(len(inputs))
        got: list[list[list[np.ndarray]]] = [[] for _ in inputs]
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                barrier.wait()
                for _ in range(repeats):
                    got[i].append([np.array(a, copy=True) for a in m(*inputs[i])])
            except BaseException as exc:  # reported below, never lost in the thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        out = []
        for i, runs in enumerate(got):
            for r, outs in enumerate(runs):
                out += self._compare("threads", i, r, names or m.output_names, outs, expected[i])
        return out

    def _processes(self, ctx: Any, target: str, m: Any, inputs: list[list[np.ndarray]],
                   expected: list[list[np.ndarray]], repeats: int, timeout: float) -> list[dict[str, Any]]:
        folder = Path(ctx.work_dir) / f"concurrency-{target}"
        folder.mkdir(parents=True, exist_ok=True)
        art = m.save(folder / "artifact")
        go = folder / "go"
        go.unlink(missing_ok=True)
        procs, outs, logs = [], [], []
        for i, x in enumerate(inputs):
            arrays: dict[str, Any] = {f"in{j}": a for j, a in enumerate(x)}
            np.savez(folder / f"in{i}.npz", **arrays)
            out = folder / f"out{i}"
            (folder / f"out{i}.ready").unlink(missing_ok=True)
            outs.append(out)
            logs.append((folder / f"worker{i}.log").open("wb"))
            procs.append(subprocess.Popen([sys.executable, "-c", _WORKER, str(art), str(folder / f"in{i}.npz"),
                                           str(out), str(go), str(repeats)],
                                          stderr=logs[-1]))
        deadline = time.monotonic() + timeout
        try:
            while not all(Path(f"{o}.ready").exists() for o in outs):
                if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            go.write_text("1")
            for p in procs:
                p.wait(timeout=max(deadline - time.monotonic(), 1.0))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for f in logs:
                f.close()
        result = []
        for i, (p, o) in enumerate(zip(procs, outs)):
            if p.returncode != 0:
                err = (folder / f"worker{i}.log").read_text(errors="replace")[-500:]
                raise RuntimeError(f"concurrency worker {i} failed ({p.returncode}): {err}")
            data = np.load(f"{o}.npz")
            for r in range(repeats):
                got = [data[f"r{r}_out{j}"] for j in range(len(m.output_names))]
                result += self._compare("processes", i, r, m.output_names, got, expected[i])
        return result
