"""Judging candidates in children forked from one pre-imported process.

A fresh interpreter per candidate spends most of its time importing Cuvil, NumPy and ONNX.  The
oracle instead asks a fork server (``multiprocessing``'s ``forkserver`` start method): one process,
started once, imports :data:`PRELOAD`, and every candidate runs in a child forked from it, so each
child starts with the compiler already imported and still shares nothing with the search.  The
child is judged as the fresh process was: it has its own timeout (a child past it is killed, a
``hang``), a death by a signal is a ``crash``, and its stderr goes to ``stderr.txt`` in the
candidate's folder for the oracle to read.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from multiprocessing.context import BaseContext
from pathlib import Path

#: What the fork server imports before it forks: everything a candidate's judgement imports.
PRELOAD = ("cuvil.reduce.forkserver", "cuvil.reduce.worker", "cuvil.api", "cuvil.ir.parser", "cuvil.ir.verify",
           "cuvil.backends.ref.interpreter", "cuvil.backends.registry", "cuvil.backends.c.target",
           "cuvil.passes.manager", "cuvil.pipeline", "cuvil.metrics", "cuvil.frontends.onnx.cut",
           "cuvil.verify.onnxruntime_subject", "numpy", "onnx", "onnxruntime")

_context: BaseContext | None = None


def context() -> BaseContext:
    """The fork-server context, with its preload set (the server itself starts on the first fork)."""
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        _context = ctx
    return _context


def _child(folder: str) -> None:
    from cuvil.reduce.worker import main

    fd = os.open(os.path.join(folder, "stderr.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    sys.exit(main([folder]))


def run_forked(d: Path, timeout: float) -> tuple[int | None, str]:
    """Judge folder ``d`` in a forked child: (its exit status, negative for a signal, or None when it ran
    past ``timeout`` and was killed; its stderr)."""
    proc = context().Process(target=_child, args=(str(d),), name=f"cuvil-reduce-{d.name}")  # type: ignore[attr-defined]
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return None, ""
    err = d / "stderr.txt"
    return proc.exitcode, err.read_text(errors="replace") if err.exists() else ""
