"""Runs fuzz cases through the real command line in a child process, and classifies each outcome.

A child process (``python -m tests.fuzz.runner MODE FOLDER``) works through the case files of a folder in
order, under a memory limit, calling ``cuvil.cli.main`` as the console script does, and writes one JSON line
per case.  The parent watches it: a child killed by a signal, or one silent for longer than the time limit,
has its case recorded as ``signal`` or ``hang`` and a new child carries on with the next case.

The outcomes:

* ``ok``: the command succeeded (exit 0);
* ``clean``: a one-line ``cuvil: error: ...`` and exit 2 (or argparse's usage error), the promised failure;
* ``traceback``: an exception escaped the command, or an exit status other than 0 and 2;
* ``memory``: a MemoryError under the limit (a size Cuvil should have refused with a message first);
* ``mismatch``: ``run-native`` only: the native build's outputs differ from the reference interpreter's;
* ``signal``, ``hang``: the child died of a signal, or exceeded the time limit.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BAD = frozenset({"traceback", "memory", "mismatch", "signal", "hang"})
MODES = ("inspect", "compile-ref", "run-native", "selftest")
REPO = Path(__file__).resolve().parents[2]
# a native output farther than both of these from the reference's is a mismatch
MISMATCH_REL_L2, MISMATCH_ABS = 1e-4, 1e-5


@dataclass(frozen=True)
class Outcome:
    case: str
    label: str
    detail: str = ""

    @property
    def bad(self) -> bool:
        return self.label in BAD


def _call(argv: Sequence[str]) -> tuple[str, str]:
    """(label, detail) of one command line run in this process."""
    from cuvil.cli import main

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors exit 2 with a message
        code = exc.code if isinstance(exc.code, int) else 1
    except MemoryError:
        return "memory", "MemoryError"
    except BaseException as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
        return "traceback", f"{type(exc).__name__} at {where}: {str(exc)[:300]}"
    text = err.getvalue().strip()
    if code == 0:
        return "ok", ""
    lines = text.splitlines()
    if code == 2 and lines and "Traceback" not in text and (
        lines[-1].startswith("cuvil: error: ")  # a CuvilError, as main prints it (after any warnings)
        or (lines[0].startswith("usage: cuvil") and _USAGE_ERROR.match(lines[-1]))  # argparse's refusal
    ):
        return "clean", lines[-1][:300]
    return "traceback", f"exit {code}: {text[-300:]}"


#: The last line of argparse's usage error: ``cuvil compile: error: argument --dim: ...``.
_USAGE_ERROR = re.compile(r"cuvil(?: [a-z-]+)?: error: ")


def _outputs(path: Path) -> dict[str, object]:
    import numpy as np

    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def _selftest(source: str) -> tuple[str, str]:
    """The runner's own test: a case whose file is Python source, run as a command would be."""
    try:
        exec(compile(source, "<case>", "exec"), {})
    except MemoryError:
        return "memory", "MemoryError"
    except BaseException as exc:
        return "traceback", f"{type(exc).__name__}: {exc}"
    return "ok", ""


def run_case(mode: str, path: Path, scratch: Path) -> tuple[str, str]:
    if mode == "selftest":
        return _selftest(path.read_text())
    if mode == "inspect":
        return _call(["inspect", str(path)])
    if mode == "compile-ref":
        return _call(["compile", str(path), "-t", "ref"])
    ref_out, nat_out = scratch / "ref.npz", scratch / "native.npz"
    label, detail = _call(["run", str(path), "-t", "ref", "--random", "--seed", "0", "-o", str(ref_out)])
    if label != "ok":
        return label, detail
    label, detail = _call(["run", str(path), "-t", "native", "--random", "--seed", "0", "-o", str(nat_out)])
    if label != "ok":
        return label, f"native: {detail}"
    from cuvil.metrics import compare

    want, got = _outputs(ref_out), _outputs(nat_out)
    if sorted(want) != sorted(got):
        return "mismatch", f"outputs {sorted(got)} against {sorted(want)}"
    for name, w in want.items():
        c = compare(got[name], w)
        # the native build's float error stays within what the C targets promise against the reference
        if c.problem is not None or (c.rel_l2 > MISMATCH_REL_L2 and c.max_abs > MISMATCH_ABS):
            return "mismatch", f"{name}: {c.problem or f'relative L2 {c.rel_l2:.3g}, max abs {c.max_abs:.3g}'}"
    return "ok", ""


def _child(mode: str, folder: Path, start: int, limit_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    cases = sorted(p for p in folder.iterdir() if p.suffix == ".onnx")
    for i, path in enumerate(cases[start:], start):
        print(json.dumps({"start": i}), flush=True)
        with tempfile.TemporaryDirectory() as scratch:
            label, detail = run_case(mode, path, Path(scratch))
        print(json.dumps({"done": i, "label": label, "detail": detail}), flush=True)


def run_folder(mode: str, folder: Path, *, seconds_per_case: float = 60.0, memory_mb: int = 4096,
               cache_dir: Path | None = None) -> list[Outcome]:
    """The outcome of every ``*.onnx`` case in ``folder`` (sorted by name) under ``mode``."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    cases = sorted(p for p in folder.iterdir() if p.suffix == ".onnx")
    results: dict[int, Outcome] = {}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if cache_dir is not None:
        env["CUVIL_CACHE_DIR"] = str(cache_dir)
    start = 0
    while start < len(cases):
        cmd = [sys.executable, "-m", "tests.fuzz.runner", mode, str(folder), str(start), str(memory_mb)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO, env=env,
                                start_new_session=True)
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        current, deadline = start, time.monotonic() + seconds_per_case + 30  # the child's own start-up
        pending, ended = b"", False
        while not ended:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                results[current] = Outcome(cases[current].name, "hang", f"over {seconds_per_case:.0f} s")
                start = current + 1
                break
            chunk = os.read(fd, 1 << 16)  # unbuffered: select() only knows what the pipe still holds
            if not chunk:
                code = proc.wait()
                if current < len(cases) and current not in results:
                    label = "signal" if code < 0 else "traceback"
                    what = signal.Signals(-code).name if code < 0 else f"child exit {code}"
                    results[current] = Outcome(cases[current].name, label, what)
                start = current + 1
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                rec = json.loads(line)
                if "start" in rec:
                    current, deadline = rec["start"], time.monotonic() + seconds_per_case
                else:
                    results[rec["done"]] = Outcome(cases[rec["done"]].name, rec["label"], rec["detail"])
                    if rec["done"] == len(cases) - 1:
                        ended = True
        if ended:
            proc.wait()
            start = len(cases)
        sel.close()
        proc.stdout.close()
    return [results[i] for i in sorted(results)]


if __name__ == "__main__":
    _child(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) << 20)
