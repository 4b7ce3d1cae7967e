"""Cuvil's logging: the ``cuvil`` logger, :func:`set_log_level`, and timing of compile stages.

Every module logs through ``logging.getLogger(__name__)``: a child of the
``cuvil`` logger, so one level set on ``cuvil`` governs them all and an
application can route them like any other library's records.

What each level shows for a compile:

- ``DEBUG``: the front end's mapping decisions (ONNX or ATen op -> Cuvil ops),
  the graph partitions and fusion groups, the kernel chosen for each node and
  why (``KernelCtx.note`` in the C backend), the shape relations left to run
  time, and the time each stage took (import, verify, shape checks, codegen,
  C build or cache hit, load);
- ``INFO``: one summary line per compile (model, target, nodes, seconds, cache);
- ``WARNING`` and above: problems a user should see even when not asking.

Cuvil attaches no handler by default (a library must not configure logging):
at the default level only warnings reach stderr, through logging's last-resort
handler.  :func:`set_log_level` is the one switch for people who just want to
see more; it adds a stderr handler unless the application has configured
logging itself (the root logger has handlers), in which case records flow there.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager

LOGGER_NAME = "cuvil"
_FORMAT = "%(name)s %(levelname)s: %(message)s"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class _CuvilHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The stderr handler :func:`set_log_level` adds (a class of its own, so it is added once)."""


def set_log_level(level: int | str) -> None:
    """Show Cuvil's log records at ``level`` and above ("DEBUG", "INFO", "WARNING", ... or an int)."""
    if isinstance(level, str):
        name = level.strip().upper()
        if name not in _LEVELS:
            raise ValueError(f"unknown log level {level!r}; choose one of {', '.join(_LEVELS)}")
        value = logging.getLevelName(name)
    elif isinstance(level, int) and not isinstance(level, bool):
        value = level
    else:
        raise TypeError(f"a log level is a name or an int, got {type(level).__name__}")
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(value)
    ours = [h for h in logger.handlers if isinstance(h, _CuvilHandler)]
    if not ours and not logging.getLogger().handlers:
        handler = _CuvilHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT))
        logger.addHandler(handler)


@contextmanager
def stage(logger: logging.Logger, name: str, times: MutableMapping[str, float] | None = None) -> Iterator[None]:
    """Time one compile stage: logged at DEBUG (``stage codegen: 12.3 ms``) and kept in ``times``."""
    t0 = time.perf_counter()
    try:
        yield
    except BaseException:
        logger.debug("stage %s failed after %.1f ms", name, (time.perf_counter() - t0) * 1e3)
        raise
    dt = time.perf_counter() - t0
    if times is not None:
        times[name] = times.get(name, 0.0) + dt
    logger.debug("stage %s: %.1f ms", name, dt * 1e3)
