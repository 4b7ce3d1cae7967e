"""What the commands share: the one place the environment is read (CC, the C compiler;
CUVIL_CACHE_DIR, the build cache; CUDA_HOME, the CUDA toolkit; LD_PRELOAD for the sanitizer runtimes), ``--dim`` and
``--input-spec`` parsing, and how a compiled model is described."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cuvil.errors import CuvilError

if TYPE_CHECKING:
    from cuvil.api import DimConstraint
    from cuvil.ir.types import SymbolInfo
    from cuvil.runtime.compiled import CompiledModel

DIM_HELP = "constrain a symbolic dim: NAME=LO:HI, NAME=N or NAME=%%N (a multiple), combined with commas"
SPEC_HELP = ("a TorchScript or TensorFlow model's input, once per input in order: dims separated by commas (ints or symbol "
             "names), then the element type: 1,3,224,224 or batch,128:int64 (default float32)")


def cache_dir() -> str | None:
    """The build cache folder CUVIL_CACHE_DIR names (None, unset or empty: the default)."""
    return os.environ.get("CUVIL_CACHE_DIR") or None


def c_compiler() -> str | None:
    """The system C compiler CC names (None, unset or empty: the default)."""
    return os.environ.get("CC") or None


def configure_toolkits() -> None:
    """Where the CUDA toolkit lives when nvcc is not on PATH: CUDA_HOME (unset or empty: the default folders)."""
    home = os.environ.get("CUDA_HOME")
    if home:
        from cuvil.backends.cuda.toolchain import add_toolkit_home

        add_toolkit_home(home)


def reexec_with_sanitizers() -> bool:
    """Sanitized libraries need the sanitizer runtimes loaded first: restart under LD_PRELOAD."""
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        return False
    import subprocess

    libs = []
    for name in ("libasan.so", "libubsan.so"):
        r = subprocess.run(["cc", f"-print-file-name={name}"], capture_output=True, text=True)
        path = r.stdout.strip()
        if r.returncode != 0 or not os.path.isabs(path):
            raise CuvilError(f"--sanitize needs the C compiler's {name}, which was not found")
        libs.append(path)
    env = dict(os.environ, LD_PRELOAD=":".join(libs), ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "cuvil", *sys.argv[1:]], env)
    return True


def compile_model(model: str, target: str, dim_args: Sequence[str] | None, **options: Any) -> CompiledModel:
    """cuvil.compile, with ``cache_dir=`` from CUVIL_CACHE_DIR and, for the C targets, ``cc=`` from CC.

    Unset or empty variables leave the defaults. CC names the system C compiler, so it does not apply to
    targets built with another toolchain (wasm32 builds with zig cc)."""
    from cuvil.api import compile as cuvil_compile
    from cuvil.backends.registry import get_backend

    cc = c_compiler()
    uses_cc = get_backend(target).uses_system_cc
    return cuvil_compile(model, target=target, dims=dims_of(dim_args), cc=cc if uses_cc else None,
                         cache_dir=cache_dir(), **options)


def parse_dim(text: str) -> tuple[str, DimConstraint]:
    """One ``--dim`` value as a ``dims=`` entry of cuvil.compile.

    ``NAME=SPEC[,SPEC...]``, each SPEC one of ``LO:HI`` (a range; either end may be left out),
    ``N`` (a fixed value) or ``%N`` (a multiple of N): ``batch=1:256``, ``h=%32``, ``h=%32,32:1024``."""
    from cuvil.api import multiple_of

    name, eq, spec = text.partition("=")
    name = name.strip()
    if not eq or not name or not spec.strip():
        raise CuvilError(f"--dim {text!r}: expected NAME=SPEC, e.g. batch=1:256, h=%32 or seq=128")

    def number(part: str, what: str) -> int:
        try:
            return int(part)
        except ValueError:
            raise CuvilError(f"--dim {text!r}: {what} {part!r} is not an integer") from None

    lo: int | None = None
    hi: int | None = None
    multiple: int | None = None
    fixed: int | None = None
    for part in (x.strip() for x in spec.split(",")):
        if part.startswith("%"):
            multiple = number(part[1:], "multiple")
            if multiple <= 0:
                raise CuvilError(f"--dim {text!r}: the multiple must be positive")
        elif ":" in part:
            a, _, b = part.partition(":")
            lo = number(a, "minimum") if a.strip() else None
            hi = number(b, "maximum") if b.strip() else None
        else:
            fixed = number(part, "value")
    if fixed is not None and (lo is not None or hi is not None or multiple is not None):
        raise CuvilError(f"--dim {text!r}: a fixed value cannot be combined with a range or a multiple")
    if fixed is not None:
        return name, fixed
    if multiple is not None:
        return name, multiple_of(multiple, lo, hi)
    return name, (lo, hi)


def dims_of(values: Sequence[str] | None) -> dict[str, DimConstraint]:
    dims: dict[str, DimConstraint] = {}
    for text in values or ():
        name, c = parse_dim(text)
        if name in dims:
            raise CuvilError(f"--dim {name} is given twice")
        dims[name] = c
    return dims


def describe(m: CompiledModel) -> None:
    print_signature(m.input_specs, m.output_specs, m.symbols)


def print_signature(inputs: Iterable[Any], outputs: Iterable[Any], symbols: Mapping[str, SymbolInfo]) -> None:
    """One line per input and output (anything with ``name`` and ``type``: specs or IR values) and symbol."""
    from cuvil.ir.printer import format_type

    for s in inputs:
        print(f"  input  {s.name}: {format_type(s.type)}")
    for s in outputs:
        print(f"  output {s.name}: {format_type(s.type)}")
    for info in symbols.values():
        print(f"  symbol {info.name}: {info.describe() or 'unconstrained'}")


def compiled_note(m: CompiledModel) -> str:
    """How a compile went, e.g. "in 1.234 s (built)" or "in 0.045 s (from the build cache)"."""
    how = {None: "", True: " (from the build cache)", False: " (built)"}[m.info.cached]
    return f"in {m.info.seconds or 0.0:.3f} s{how}"


def input_spec(values: Sequence[str] | None) -> dict[str, Any]:
    """``--input-spec`` values (a TorchScript or TensorFlow model's inputs, in order) as cuvil.compile's ``input_spec=``."""
    from cuvil.ir.spec import parse_spec

    return {"input_spec": [parse_spec(t) for t in values]} if values else {}
