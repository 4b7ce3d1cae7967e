"""Code built for x86_avx512 run on a CPU without AVX-512.

The model's generated C is compiled again with the ISA macros the target's flags would define
(``__AVX512F__``, ``__AVX512VNNI__``, ...) and every intrinsic taken from SIMDe's portable
emulation (``avx512_emulation/immintrin.h``), so that the AVX-512 kernel paths, VNNI and BF16
included, run and can be checked against the reference on any x86-64 machine.  Only the
instructions are emulated: the source, the weights and the kernels' choices are the target's."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

from cuvil.backends.c import Build, CExecutor
from cuvil.backends.c.toolchain import BASE_FLAGS, RUNTIME_DIR, SANITIZE_FLAGS, TARGET_ISA
from cuvil.runtime.compiled import CompiledModel

EMULATION = Path(__file__).resolve().parent / "avx512_emulation"
# CPU feature names (as /proc/cpuinfo and TARGET_ISA spell them) -> the macro GCC predefines for each
MACROS = {"avx512f": "__AVX512F__", "avx512bw": "__AVX512BW__", "avx512vl": "__AVX512VL__",
          "avx512dq": "__AVX512DQ__", "avx512_vnni": "__AVX512VNNI__", "avx512_bf16": "__AVX512BF16__"}


def simde_include() -> Path | None:
    """SIMDe's headers (the ``simde-py`` package), or None when it is not installed."""
    try:
        import simde_py
    except ImportError:
        return None
    return Path(simde_py.get_include())


def emulation_flags(features: Iterable[str], *, sanitize: bool = False) -> list[str]:
    """C compiler flags that build x86_avx512 code (plus ``features``) to run on an AVX2 CPU."""
    simde = simde_include()
    if simde is None:
        raise RuntimeError("simde-py is not installed")
    isa = sorted(set(TARGET_ISA["x86_avx512"]) | set(features))
    macros = [f"-D{MACROS[f]}" for f in isa if f in MACROS]
    # -O1, not the target's -O2: GCC spends six times as long optimising SIMDe's emulated intrinsics
    # at -O2 (17 s against 2.7 s of CPU for the int8 kernel graph), and the level changes nothing
    # these builds check: the kernels' #if choices follow from the ISA macros, and without fast-math
    # and with -ffp-contract=off every integer and IEEE result is the same at any level.
    flags = [*(f for f in BASE_FLAGS if f != "-O2"), "-O1", "-mavx2", "-mfma", "-mf16c", f"-I{EMULATION}",
             f"-I{simde}", f"-I{RUNTIME_DIR}", "-Wno-psabi", "-DSIMDE_NO_NATIVE", "-DCUVIL_CPU_CHECKS=0",
             "-DCUVIL_ATT_KEEP(v)=((void)0)", *macros]
    if sanitize:
        flags += [*SANITIZE_FLAGS]
    return flags


def build_emulated(source: Path, library: Path, features: Iterable[str] = (), *, sanitize: bool = False) -> None:
    """Compiles a model's C source (built for x86_avx512) into ``library`` under emulation."""
    cmd = ["cc", *emulation_flags(features, sanitize=sanitize), str(source), "-o", str(library), "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise AssertionError(f"emulated build failed:\n{r.stderr[-4000:]}")


def emulated(m: CompiledModel, folder: Path, features: Iterable[str] = ()) -> CompiledModel:
    """``m`` (compiled for x86_avx512, so not loaded on this CPU) running its own source under
    emulation, with ``features`` (e.g. ``avx512_vnni``) on top of the target's."""
    info = m.build_info
    assert m.target == "x86_avx512" and info is not None
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / "model.so"
    build_emulated(info.source, library, features)
    executor = CExecutor(Build(info.folder, cached=True, seconds=0.0), {}, library=library)
    return CompiledModel(m.signature, executor, m.target, m.graph, m.info)
