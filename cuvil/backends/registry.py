"""The backend table: what a target is, and the one table of targets every other module asks.

A target is one registered :class:`Backend`: it builds a verified graph with the compile options
into an executor (``cuvil.runtime.compiled.Executor``), states what it can run (the ops it has
kernels for), which CPU features it needs and why it cannot run here, whether it splits work over
threads, what ``cc=`` and ``sanitize=`` mean for it, and its default pass pipeline.
``cuvil.compile`` looks the target up here; the CLI's choices, ``cuvil verify``'s targets and the
checks' questions ("is it a C target?", "can its build be saved and run in another process?") are
answered from the table too, never from a list of names.

The built-in backends register themselves when their packages' ``target`` modules are imported
(``cuvil/backends/ref/target.py``, ``c/target.py``, ``wasm/target.py``, ``cuda/target.py``); the table imports those on
first use.  A new target is one more registered backend: docs/adding-a-target.md.
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Any, ClassVar

from cuvil.errors import CuvilError

if TYPE_CHECKING:
    from cuvil.ir.graph import Graph
    from cuvil.options import CompileOptions


class Backend:
    """One target: a name and what Cuvil needs to know to compile for it and run it.

    Subclasses set the capability attributes and implement :meth:`build`; a family of targets
    that differ only in a name (the C targets) registers one instance per name."""

    #: What the family's targets are called in messages ("C", "wasm32").
    family_label: ClassVar[str] = ""
    #: One line on what runs the code, after the target's name ("runs the reference interpreter").
    summary: ClassVar[str] = ""
    #: It builds something (a library, a module) into the build cache; False: it runs the graph itself.
    builds: ClassVar[bool] = True
    #: It is a C target built with the system C compiler: ``cc=`` names that compiler, ``sanitize=``
    #: adds AddressSanitizer and UBSan, and its kernels are the C backend's (profiling, int8, fp16).
    is_c: ClassVar[bool] = False
    #: ``num_threads=`` splits a call's large kernels over worker threads.
    supports_threads: ClassVar[bool] = False
    #: ``conv_algorithm=`` chooses among its convolution kernels.
    chooses_conv_algorithm: ClassVar[bool] = False
    #: Its build can be saved as an artifact (``CompiledModel.save``) and run in another process.
    saves_artifacts: ClassVar[bool] = False
    #: What runs the code, in messages where the target's name would not say ("the reference interpreter").
    runs_as: ClassVar[str] = ""
    #: ``cc=`` names the system C compiler it builds with.
    uses_system_cc: ClassVar[bool] = False
    #: What builds it, for messages about ``cc=`` on targets that do not use the system compiler.
    toolchain: ClassVar[str] = ""
    #: GPUs one run of its code occupies (a fleet's Ray task asks for them: ``num_gpus``); 0 for code
    #: that runs on the CPU, emulated GPU code included.
    gpus: ClassVar[int] = 0
    #: ``cross-target`` compares it by default wherever it is available (False: only when asked for,
    #: a target whose kernels do not yet cover the models every check is run on).
    compared_by_default: ClassVar[bool] = True

    def __init__(self, name: str) -> None:
        self.name = name

    def display_name(self) -> str:
        """What runs the target, in messages ("the reference interpreter"; else the target's name)."""
        return self.runs_as or self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # ---- what it runs, and where ------------------------------------------------------------------------------

    def default_pipeline(self, *, enable_fusion: bool = True) -> str:
        """The pipeline text compile runs for this target when the options name none."""
        from cuvil.backends.pipelines import standard_pipeline

        return standard_pipeline(enable_fusion=enable_fusion)

    def quantization_pipeline(self, *, enable_fusion: bool = True) -> str:
        """The pipeline an int8 compile for this target splits around calibration (after
        ``fold-batchnorm``); the default pipeline unless that runs no ``fold-batchnorm``."""
        return self.default_pipeline(enable_fusion=enable_fusion)

    def kernel_ops(self) -> frozenset[str] | None:
        """The ops it has kernels for (None: every op the IR declares, as the reference interpreter)."""
        return None

    def unsupported_ops(self) -> frozenset[str]:
        """The declared ops it has no kernel for yet, listed on purpose beside its kernel table (a
        compile of a graph using one fails naming it); the completeness test requires exactly these
        to be the missing ones, so the list can only shrink deliberately."""
        return frozenset()

    def required_features(self) -> frozenset[str]:
        """The CPU features (as /proc/cpuinfo names them) its code needs on every machine; empty for
        code that runs on any machine of its kind (generic C, wasm32) or on this one (native)."""
        return frozenset()

    def cannot_run_here(self) -> str | None:
        """Why code built for it cannot run on this machine's CPU (None when it can, or when that
        cannot be told: then loading checks); a build is still made, to be saved and run elsewhere."""
        return None

    def unavailable(self) -> str | None:
        """Why it can be neither built nor run here (a missing toolchain or package, a CPU without
        its features), or None: what ``cuvil verify`` asks before it runs checks on the target."""
        return None

    def check_options(self, options: CompileOptions) -> None:
        """Refuse option values this backend cannot take (beyond what ``cuvil.options.validate``, which
        calls this, checks from the capability flags): e.g. an unknown convolution algorithm."""

    def reduce_range_default(self) -> bool:
        """Whether int8 weights default to 7 bits (``reduce_range=None``) on this target."""
        return False

    # ---- building -----------------------------------------------------------------------------------------------

    def build(self, graph: Graph, options: CompileOptions, *, build_key: str, times: dict[str, float]) -> Any:
        """An executor running ``graph`` (verified, after the pipeline) built with ``options``.

        ``build_key``: what of the options decides the generated code (``CompileOptions.build_key``),
        for a backend with a build cache to hash; ``times``: stage timings to add to."""
        raise NotImplementedError


_lock = threading.RLock()
_table: dict[str, Backend] = {}
_loaded = False
# The built-in backends' registration modules, imported on the table's first use.
_BUILTIN = ("cuvil.backends.ref.target", "cuvil.backends.c.target", "cuvil.backends.wasm.target",
            "cuvil.backends.cuda.target")


def _ensure_builtin() -> None:
    global _loaded
    if _loaded:
        return
    with _lock:
        if not _loaded:
            _loaded = True
            for module in _BUILTIN:
                importlib.import_module(module)


def register_backend(backend: Backend, *, replace: bool = False) -> Backend:
    """Add ``backend`` to the table under its name (a second backend of one name is an error unless
    ``replace``); returns it."""
    if not backend.name or not isinstance(backend.name, str):
        raise CuvilError(f"a backend needs a name, not {backend.name!r}")
    with _lock:
        if backend.name in _table and not replace and _table[backend.name] is not backend:
            raise CuvilError(f"a backend named {backend.name!r} is already registered ({_table[backend.name]!r})")
        _table[backend.name] = backend
    return backend


def unregister_backend(name: str) -> None:
    """Remove the backend ``name`` from the table (a test's own backend, once the test is done)."""
    _ensure_builtin()
    with _lock:
        if _table.pop(name, None) is None:
            raise CuvilError(f"no backend named {name!r} is registered")


def get_backend(name: str) -> Backend:
    """The backend of target ``name``; an unknown name is a :class:`CuvilError` listing the known ones."""
    found = find_backend(name)
    if found is None:
        raise CuvilError(f"unknown target {name!r}; choose one of {', '.join(backend_names())}")
    return found


def find_backend(name: str) -> Backend | None:
    """The backend of target ``name``, or None (a name such as a verification subject's that is no target)."""
    _ensure_builtin()
    return _table.get(name)


def backend_names() -> tuple[str, ...]:
    """Every registered target, in registration order (the built-in ones first)."""
    _ensure_builtin()
    with _lock:
        return tuple(_table)


def backends() -> tuple[Backend, ...]:
    """Every registered backend, in registration order."""
    _ensure_builtin()
    with _lock:
        return tuple(_table.values())
