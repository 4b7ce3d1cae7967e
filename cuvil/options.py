"""What a compile is asked to do: the frozen :class:`CompileOptions`, its option groups, the keyword
spelling ``cuvil.compile`` accepts, their validation against a target, and the part of them that
belongs in the build-cache key.

The options are one value passed down from ``cuvil.compile`` to the pipeline builder
(``cuvil.pipeline``), the backends and, through them, the passes and the code generator.  Nothing
here imports NumPy or a backend: a backend is known only by the capabilities it states
(``cuvil.backends.registry.Backend``).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cuvil import faults as _faults
from cuvil.errors import CuvilError

if TYPE_CHECKING:
    from cuvil.api import DimConstraint
    from cuvil.backends.registry import Backend
    from cuvil.passes import Pass, PassManager


class CompileOptionError(CuvilError, TypeError):
    """An option ``cuvil.compile`` does not have, or a value it cannot take (a TypeError too, as an
    unknown keyword argument is)."""


@dataclass(frozen=True)
class PrecisionOptions:
    """Reduced-precision compiles (``precision=``, ``precision_overrides=``, ``allow_overflow=``,
    ``precision_samples=``)."""

    dtype: str = "fp32"  # "fp32", "fp16" or "bf16" (or an alias: "float16", "half" ...)
    overrides: Mapping[str, str] | None = None  # op name or node:NAME -> "fp32" or the reduced type
    allow_overflow: bool = False
    samples: int = 2  # the inputs the per-layer error report runs on (int8's report too)


@dataclass(frozen=True)
class QuantizationOptions:
    """Post-training quantization (``quant_dtype=``, ``symmetric=``, ``per_channel=``, ``calibration=``,
    ``min_calibration_samples=``, ``reduce_range=``) and the calibration data (``calibration_dataset=``,
    also read by a reduced-precision compile's overflow check)."""

    dtype: str | None = None  # "int8", or None: no quantization
    symmetric: bool = True
    per_channel: bool = True
    calibration: str = "minmax"  # "minmax", "percentile" or "entropy"
    min_samples: int | None = None
    reduce_range: bool | None = None  # None: where the target's int8 kernels gain from 7-bit weights
    # The data itself is consumed before code generation (its effect is in the graph's constants,
    # which the build key hashes), so it takes no part in equality or the build key.
    dataset: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class BuildSettings:
    """How a backend builds and runs the generated code (``cc=``, ``cache_dir=``, ``sanitize=``,
    ``num_threads=``, ``conv_algorithm=``)."""

    cc: str | None = None  # the system C compiler (the native C targets)
    cache_dir: str | None = None  # the build cache (default ~/.cache/cuvil)
    sanitize: bool = False  # AddressSanitizer and UBSan (the native C targets)
    num_threads: int | None = None  # worker threads per call (None: the physical cores this process may use)
    conv_algorithm: str | Mapping[str, str] | None = None  # "auto" when None; see docs/conv-algorithms.md


@dataclass(frozen=True, kw_only=True)
class CompileOptions:
    """Everything ``cuvil.compile`` is asked to do besides the model and the target, as one frozen value.

    ``cuvil.compile(model, target, options=None, **overrides)`` takes either this object or its keyword
    spelling (the table :data:`KEYWORDS`), or both: ``overrides`` replace the fields of ``options``.
    ``options.with_overrides(enable_fusion=False)`` makes a changed copy the same way.

    ``input_spec`` / ``dynamic_shapes``: a PyTorch module is exported with ``torch.export`` for
    ``input_spec`` (example tensors or ``cuvil.TensorSpec`` objects, in a list for positional inputs or
    a dict for keyword inputs) and ``dynamic_shapes`` (torch.export's convention:
    ``{"x": {0: torch.export.Dim("batch", min=1, max=64)}}``).  ``dims`` constrains symbolic dims by
    name for every kind of model.  ``enable_fusion`` asks for operator fusion (the fusion passes of the
    default pipeline; ``ref`` runs no passes, which ``m.info.notes`` records).  ``num_threads``: the
    threads each call of a native C target splits its large kernels over (None: the physical cores
    this process may use; 1: no worker threads); results are bitwise the same for any number.

    ``passes`` is the pass pipeline run on the imported graph: pipeline text
    (``"canonicalize,fold-constants,cse,dce"``), a list of ``cuvil.passes.Pass`` objects, or a
    ``cuvil.passes.PassManager`` (with instruments and a limit; its ``report`` is filled in).
    ``None`` runs the target's default pipeline (``cuvil.passes.default_pipeline``), ``""`` none.
    A Cuvil Graph given as ``model`` is copied first, never changed.  ``cuvil.pipeline.build_pipeline``
    is the one function that turns the target and these options into the pipeline compile runs.

    ``conv_algorithm`` (C and wasm32 targets) picks how convolutions run: "auto" (default: a cost
    model per node), "im2col" (the GEMM-based kernels), "winograd" (Winograd, tile size by the cost
    model), "winograd-f2" / "winograd-f4" / "winograd-f6" (F(2x2,3x3), F(4x4,3x3), F(6x6,3x3)), for
    every convolution it applies to, or per node: ``{"layer1.0.conv1": "winograd-f4", ...}`` (a
    node not named keeps "auto").  Winograd applies to f32 2-D 3x3 convolutions with unit strides
    and dilations and one group; naming a node that is not such a convolution of the compiled graph,
    or an unknown algorithm, is a ``ConvAlgorithmError`` (docs/conv-algorithms.md).

    ``precision`` ("fp32", "fp16" or "bf16") stores weights and computes in that type, accumulating
    GEMM, matmul and convolution in float32 and keeping numerically sensitive ops (softmax,
    normalisations, summing reductions, exp/log ...) in float32: the ``convert-precision`` pass,
    run before fusion.  ``precision_overrides`` maps an op name or ``node:NAME`` to "fp32" or the
    reduced type (``{"softmax": "fp16", "node:encoder.0.attn": "fp32"}``; a node's entry wins).
    The float32 graph and the converted one then run in the reference interpreter on
    ``precision_samples`` inputs (the first samples of ``calibration_dataset`` when given, else
    seeded random ones): a value that overflows the reduced type there, or (fp16) on any example of
    ``calibration_dataset`` (its float32 ranges taken on a native calibration build), is refused with
    a ``PrecisionOverflowError`` naming the node, op and value, unless ``allow_overflow``; the
    per-layer errors are kept in ``m.info.precision`` (saved with the model; ``cuvil inspect
    --precision`` prints the worst layers).

    ``quant_dtype="int8"`` quantizes after calibration on ``calibration_dataset`` (a DataLoader, an
    iterable of input tuples or dicts, or a folder of .npz files; at least 64 examples unless
    ``min_calibration_samples`` says otherwise): conv, gemm and matmul get int8 weights per output
    channel (``per_channel``) and activations per tensor, int8 with zero point 0 (``symmetric``) or
    uint8 with a zero point, their ranges from ``calibration`` ("minmax", "percentile", "entropy").
    The quantize/dequantize nodes are explicit in the IR, inserted after ``fold-batchnorm`` and
    before fusion (``cuvil/quant/ptq.py``); ``m.info.precision`` records the per-layer errors
    against the float32 graph on ``precision_samples`` calibration inputs, every tensor's scale and
    zero point, and the warnings (also logged on ``cuvil.quant``).  ``reduce_range`` quantizes weights
    to ``[-64, 64]`` (7 bits) instead of ``[-127, 127]``; ``None`` (default) does so where the
    target's int8 kernels gain from it: AVX2 without AVX-512 (``x86_avx2``, or ``native`` on such a
    CPU) multiplies 7-bit weights with vpmaddubsw, exactly and faster than 8-bit ones (1.2 to 1.3x end
    to end on CNNs, measured on AMD Zen 3).
    The choice is logged and recorded in ``m.info.precision``, whose per-layer errors include it.

    ``faults``: the planted faults of this compile (``cuvil.faults``; a test's known bugs), by default
    those :func:`cuvil.faults.plant` plants where the options are made."""

    dims: Mapping[str, DimConstraint] | None = None
    input_spec: Any = None
    dynamic_shapes: Any = None
    enable_fusion: bool = True
    passes: str | Sequence[Pass] | PassManager | None = None
    precision: PrecisionOptions = PrecisionOptions()
    quantization: QuantizationOptions = QuantizationOptions()
    build: BuildSettings = BuildSettings()
    faults: frozenset[str] = field(default_factory=_faults.planted)

    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", _faults.checked(self.faults))

    @staticmethod
    def from_keywords(**keywords: Any) -> CompileOptions:
        """The options ``cuvil.compile``'s keyword arguments spell (:data:`KEYWORDS`)."""
        return CompileOptions().with_overrides(**keywords)

    def with_overrides(self, **keywords: Any) -> CompileOptions:
        """A copy with the fields the keywords name replaced: any name of :data:`KEYWORDS`, or a whole
        group (``precision=PrecisionOptions(...)``, ``quantization=...``, ``build=...``).  An unknown
        keyword is a :class:`CompileOptionError` naming it."""
        top: dict[str, Any] = {}
        groups: dict[str, dict[str, Any]] = {}
        for key, value in keywords.items():
            if key in _GROUPS and isinstance(value, _GROUPS[key]):
                top[key] = value
                continue
            where = KEYWORDS.get(key)
            if where is None:
                close = difflib.get_close_matches(key, KEYWORDS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise CompileOptionError(f"cuvil.compile has no option {key!r}{hint}; its options: "
                                         f"{', '.join(KEYWORDS)}")
            group, name = where
            if group is None:
                top[name] = value
            else:
                groups.setdefault(group, {})[name] = value
        for group, changes in groups.items():
            top[group] = dataclasses.replace(top.get(group, getattr(self, group)), **changes)
        return dataclasses.replace(self, **top) if top else self

    def replace(self, **fields: Any) -> CompileOptions:
        """A copy with the named fields (of this class, not the keyword spelling) replaced."""
        return dataclasses.replace(self, **fields)

    def keywords(self) -> dict[str, Any]:
        """The keyword spelling of the options that differ from the defaults (``faults`` included
        when any is planted): ``CompileOptions.from_keywords(**o.keywords()) == o``."""
        default = CompileOptions(faults=frozenset())
        out: dict[str, Any] = {}
        for key, (group, name) in KEYWORDS.items():
            mine = getattr(self if group is None else getattr(self, group), name)
            theirs = getattr(default if group is None else getattr(default, group), name)
            if mine is not theirs and mine != theirs:
                out[key] = mine
        return out

    def build_key(self, pipeline: str) -> str:
        """What of these options decides the generated code, as text for the build-cache key: the
        pipeline compile runs (``pipeline``, which carries ``enable_fusion``, ``passes`` and the
        precision pass), the precision and quantization settings, the convolution algorithms and the
        planted faults.  Options that only say where or how a build is made or run (``cache_dir``,
        ``num_threads``; the compiler and flags are keyed by the backend) and the calibration data
        (consumed before code generation; its effect is in the weights) are left out."""
        p, q = self.precision, self.quantization
        conv = self.build.conv_algorithm
        return json.dumps({
            "pipeline": pipeline,
            "precision": [p.dtype, _plain(p.overrides)],
            "quantization": [q.dtype, q.symmetric, q.per_channel, q.calibration, q.reduce_range],
            "conv_algorithm": _plain(conv),
            "faults": sorted(self.faults),
        }, sort_keys=True)


_GROUPS: dict[str, type] = {"precision": PrecisionOptions, "quantization": QuantizationOptions,
                            "build": BuildSettings}

#: ``cuvil.compile``'s keyword arguments: each one's (group, field) of :class:`CompileOptions`
#: (group None: a field of CompileOptions itself).
KEYWORDS: dict[str, tuple[str | None, str]] = {
    "dims": (None, "dims"),
    "input_spec": (None, "input_spec"),
    "dynamic_shapes": (None, "dynamic_shapes"),
    "enable_fusion": (None, "enable_fusion"),
    "passes": (None, "passes"),
    "faults": (None, "faults"),
    "precision": ("precision", "dtype"),
    "precision_overrides": ("precision", "overrides"),
    "allow_overflow": ("precision", "allow_overflow"),
    "precision_samples": ("precision", "samples"),
    "quant_dtype": ("quantization", "dtype"),
    "symmetric": ("quantization", "symmetric"),
    "per_channel": ("quantization", "per_channel"),
    "calibration": ("quantization", "calibration"),
    "min_calibration_samples": ("quantization", "min_samples"),
    "reduce_range": ("quantization", "reduce_range"),
    "calibration_dataset": ("quantization", "dataset"),
    "cc": ("build", "cc"),
    "cache_dir": ("build", "cache_dir"),
    "sanitize": ("build", "sanitize"),
    "num_threads": ("build", "num_threads"),
    "conv_algorithm": ("build", "conv_algorithm"),
}


def _plain(v: Any) -> Any:
    """A mapping as sorted pairs, for JSON that does not depend on insertion order."""
    return sorted((str(k), str(x)) for k, x in v.items()) if isinstance(v, Mapping) else v


# Spellings users write for a precision; the pass and the IR speak f32/f16/bf16.
PRECISION_ALIASES = {"fp32": "f32", "float32": "f32", "f32": "f32", "fp16": "f16", "float16": "f16", "half": "f16",
                     "f16": "f16", "bf16": "bf16", "bfloat16": "bf16"}


# ---- validation -------------------------------------------------------------------------------------------------


def check_num_threads(num_threads: object) -> None:
    """A :class:`CuvilError` unless ``num_threads`` is a positive int or None."""
    if num_threads is None:
        return
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise CuvilError(f"num_threads must be a positive integer or None, not {num_threads!r}")


def validate(options: CompileOptions, backend: Backend, others: Collection[Backend]) -> None:
    """Every check of ``options`` for ``backend`` (``others``: all registered backends, to say where an
    option applies), in one place: the precision and its overrides, the thread count, and the
    options the target has no use for."""
    p = options.precision
    dtype = PRECISION_ALIASES.get(p.dtype.lower()) if isinstance(p.dtype, str) else None
    if dtype not in ("f32", "f16", "bf16"):
        raise CuvilError(f"unknown precision {p.dtype!r}; choose fp32, fp16 or bf16")
    if dtype == "f32" and p.overrides:
        raise CuvilError("precision_overrides apply to precision='fp16' or 'bf16'")
    b = options.build
    check_num_threads(b.num_threads)

    def where(flag: str) -> str:
        labels = list(dict.fromkeys(o.family_label for o in others if getattr(o, flag)))
        return " and ".join(labels) or "no"

    if b.conv_algorithm not in (None, "auto") and not backend.chooses_conv_algorithm:
        raise CuvilError(f"conv_algorithm applies to the {where('chooses_conv_algorithm')} targets; "
                         f"{backend.name} {backend.summary}")
    if b.num_threads is not None and b.num_threads != 1 and not backend.supports_threads:
        raise CuvilError(f"num_threads applies to the native {where('supports_threads')} targets; "
                         f"{backend.name} runs one thread")
    if (b.cc or b.sanitize) and backend.builds and not backend.uses_system_cc:
        raise CuvilError(f"cc= and sanitize= apply to the native {where('uses_system_cc')} targets; "
                         f"{backend.name} {backend.toolchain}")
    backend.check_options(options)
