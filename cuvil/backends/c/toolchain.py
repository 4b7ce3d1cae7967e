"""The C compiler: which one, with which flags per target, and building libraries."""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from cuvil.errors import CuvilError

RUNTIME_DIR = Path(__file__).parent / "runtime"

# Flags per target. "generic" is portable C: no target-specific instructions.
TARGET_FLAGS: dict[str, tuple[str, ...]] = {
    "generic": (),
    "x86_avx2": ("-mavx2", "-mfma", "-mf16c"),
    "x86_avx512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"),
    "native": ("-march=native",),
}


# The CPU features (as /proc/cpuinfo names them) each x86 target's flags switch on; the kernels'
# #if __AVX2__ / __AVX512BW__ / __AVX512VNNI__ choices follow from these.
TARGET_ISA: dict[str, frozenset[str]] = {
    "x86_avx2": frozenset({"avx2", "fma", "f16c"}),
    "x86_avx512": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c"}),
}


@dataclass(frozen=True)
class Variant:
    """A second library of a model, for CPUs with more than its target assumes: the same source
    compiled with ``flags`` on top of the target's, saved beside the base library as
    ``model.<name>.so`` and loaded instead of it where the CPU has ``features`` (as /proc/cpuinfo
    names them).  It is built only for a source that calls a kernel whose code the extension
    changes (``kernels``, a pattern over the generated C); other models would get the same code."""

    name: str
    flags: tuple[str, ...]
    features: frozenset[str]
    kernels: str = field(repr=False)

    @property
    def library(self) -> str:
        return f"model.{self.name}.so"

    def used_by(self, source: str) -> bool:
        return re.search(self.kernels, source) is not None


# The variants of each target, the most capable first: where a CPU runs several, it loads the
# first.  x86_avx512 assumes the AVX-512 foundation only (Skylake-SP on); most AVX-512 CPUs since
# (Cascade Lake, Ice Lake, Sapphire Rapids, Zen 4) add VNNI, which multiplies int8 pairs twice as
# fast as int16 pairs, and Cooper Lake, Sapphire Rapids and Zen 4 add the bf16 dot product.  Every
# library checks the CPU when it is loaded (cuvil_cpu.h), so a wrong pick is refused, never run.
TARGET_VARIANTS: dict[str, tuple[Variant, ...]] = {
    "x86_avx512": (
        Variant("avx512bf16", ("-mavx512vnni", "-mavx512bf16"), frozenset({"avx512_vnni", "avx512_bf16"}),
                r"\bcuvil_(?:bf16_gemm|conv_bf16|conv_nhwc_half)\("),
        Variant("avx512vnni", ("-mavx512vnni",), frozenset({"avx512_vnni"}), r"\bcuvil_q(?:gemm|conv)\("),
    ),
}


def variants_for(target: str, source: str) -> tuple[Variant, ...]:
    """The variants of ``target`` worth building for this generated source."""
    return tuple(v for v in TARGET_VARIANTS.get(target, ()) if v.used_by(source))


def variant_here(variants: tuple[Variant, ...]) -> Variant | None:
    """The variant of those built that this machine's CPU loads (None: the base library)."""
    have = cpu_flags()
    return next((v for v in variants if v.features <= have), None)


def cpu_flags() -> frozenset[str]:
    """The feature flags of this machine's CPU, as /proc/cpuinfo names them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def missing_features(target: str) -> list[str] | None:
    """The CPU features code built for ``target`` uses that this machine's CPU lacks (sorted; empty
    when it has them all), or None when they cannot be read (no /proc/cpuinfo)."""
    need = TARGET_ISA.get(target, frozenset())
    if not need:
        return []
    have = cpu_flags()
    return sorted(need - have) if have else None


def cpu_cannot_run(target: str, *, unreadable: str | None = None) -> str | None:
    """Why this machine's CPU cannot run code built for ``target`` ("this CPU lacks avx2, fma"), or
    None when it can; ``unreadable`` where its features cannot be read (no /proc/cpuinfo)."""
    lacks = missing_features(target)
    if lacks is None:
        return unreadable
    return f"this CPU lacks {', '.join(lacks)}" if lacks else None


def target_isa(target: str) -> frozenset[str]:
    """The CPU features code built for ``target`` uses (``native``: this machine's CPU)."""
    return cpu_flags() if target == "native" else TARGET_ISA.get(target, frozenset())


def int8_products(target: str) -> str:
    """How the int8 GEMM and convolution kernels (``cuvil_qgemm.h``) multiply on ``target`` (``native``:
    this machine's CPU): "vnni" (AVX-512 VNNI, exact for any bytes), "int16" (AVX-512BW: int16
    pairs), "bytes" (AVX2 without AVX-512: vpmaddubsw when one operand is a constant whose bytes lie
    in [-64, 64], which is exact and faster than int16 pairs: 1.36x the multiply rate, 1.2 to 1.3x
    end to end on CNNs, measured on AMD Zen 3; int16 pairs otherwise), "portable" (plain C:
    generic, wasm32, ref). It follows the header's ``#if`` choices from :data:`TARGET_ISA`; an
    x86_avx512 model also has a VNNI library (:data:`TARGET_VARIANTS`), which CPUs with VNNI load:
    both are exact for any bytes, so they compute the same integers."""
    isa = target_isa(target)
    if "avx512bw" in isa:
        return "vnni" if "avx512_vnni" in isa else "int16"
    return "bytes" if "avx2" in isa else "portable"


# A runtime header's own #include "..." lines (a plain file name each).
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"/\\]+)"', re.M)


@functools.cache
def header_closure(header: str) -> frozenset[str]:
    """``header`` and the runtime headers it includes, directly or through each other."""
    seen = {header}
    todo = [header]
    while todo:
        path = RUNTIME_DIR / todo.pop()
        for name in INCLUDE_RE.findall(path.read_text(encoding="utf-8")) if path.is_file() else ():
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return frozenset(seen)


SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer")
# -fno-trapping-math: Cuvil reads no floating-point exception flags, and without it GCC will not
# if-convert a loop whose selects guard arithmetic unless the target has masked vectors: on AVX2,
# loops over cuvil_vmath.h's exp, erf, tanh ... stayed scalar.  It changes no result.
BASE_FLAGS = ("-std=c11", "-O2", "-fvect-cost-model=dynamic", "-fPIC", "-shared", "-fvisibility=hidden", "-ffp-contract=off",
              "-fno-math-errno", "-fno-trapping-math")
WARN_FLAGS = ("-Wall", "-Wextra")


class BuildError(CuvilError):
    """The C compiler rejected generated code (a Cuvil bug: please report it)."""


@dataclass(frozen=True)
class Compiler:
    """A C compiler command line, e.g. ``("cc",)`` or ``("ccache", "gcc")``."""

    argv: tuple[str, ...] = ("cc",)

    @staticmethod
    def from_string(cmd: str | None) -> Compiler:
        return Compiler(tuple(shlex.split(cmd))) if cmd else Compiler()

    @functools.cached_property
    def version(self) -> str:
        try:
            out = subprocess.run([*self.argv, "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CuvilError(f"C compiler {' '.join(self.argv)!r} cannot run: {exc}") from None
        if out.returncode != 0:
            raise CuvilError(f"C compiler {' '.join(self.argv)!r} failed: {out.stderr.strip()[:300]}")
        return out.stdout.splitlines()[0] if out.stdout else "unknown"


def compile_flags(target: str, *, sanitize: bool = False, variant: Variant | None = None) -> list[str]:
    if target not in TARGET_FLAGS:
        raise CuvilError(f"unknown C target {target!r}")
    extra = variant.flags if variant else ()
    flags = [*BASE_FLAGS, *WARN_FLAGS, *TARGET_FLAGS[target], *extra, f"-I{RUNTIME_DIR}"]
    if sanitize:
        flags += [*SANITIZE_FLAGS]
        flags = [f for f in flags if f != "-O2"] + ["-O1"]
    return flags


# A model library linked with the kernel library (kernel_library.py): its unit declares the
# library's functions instead of defining them, and the link keeps only the sections it calls.
MODEL_UNIT_FLAGS = ("-DCUVIL_KERNEL_LIBRARY=1",)
LINK_FLAGS = ("-Wl,--gc-sections",)


def run_compiler(cmd: list[str], what: str, *, timeout: float = 900,
                 error: type[CuvilError] = BuildError) -> str:
    """Run one compiler command line; returns what it printed (its warnings).  A compiler that cannot
    run, runs past ``timeout`` or fails raises ``error`` naming ``what`` it was compiling."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise error(f"{Path(cmd[0]).name} failed to run on {what}: {exc}") from None
    if r.returncode != 0:
        raise error(f"compiling {what} failed ({' '.join(cmd[:2])} ...):\n{r.stderr[-4000:]}")
    return r.stderr


def build_library(compiler: Compiler, source: Path, out: Path, target: str, *, sanitize: bool = False,
                  variant: Variant | None = None, kernels: Path | None = None) -> str:
    """Compile one generated source file into a shared library, linked with the kernel library's
    object ``kernels`` (None: the source defines everything itself); returns the compiler's warnings."""
    unit = MODEL_UNIT_FLAGS if kernels else ()
    link = (str(kernels), *LINK_FLAGS) if kernels else ()
    cmd = [*compiler.argv, *compile_flags(target, sanitize=sanitize, variant=variant), *unit, str(source), *link,
           "-o", str(out), "-lm"]
    return run_compiler(cmd, "the generated C")
