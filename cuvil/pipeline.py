"""The one function that says which passes a compile runs: :func:`build_pipeline` (target, options).

``cuvil.compile`` runs what it returns; an int8 compile splits it around calibration at
:attr:`Pipeline.quantize_at`; the verification checks that rebuild a model with fusion or memory
planning turned off derive their pipelines from it (with changed options), so what they check is
what compile runs.  The rules:

1. The passes are the options' ``passes`` when given (text, a list, or a PassManager run as given
   with its instruments), else the target's default pipeline (``Backend.default_pipeline``, with
   or without the fusion passes as ``enable_fusion`` says).
2. ``precision`` fp16 or bf16 adds ``convert-precision`` right after the clean-up passes and
   batch-norm folding, before any pass that fuses, changes layout or plans memory (fused regions
   and NHWC kernels are float32-only rewrites, and a memory plan must describe the final graph);
   a pipeline that already holds a ``convert-precision`` pass keeps its own.  A PassManager must
   hold it already.
3. ``quant_dtype`` runs the target's quantization pipeline (``Backend.quantization_pipeline``): the
   passes up to and including ``fold-batchnorm``, then calibration and quantization, then
   ``fold-qdq`` (where the pipeline has it) and the rest.  It cannot be combined with ``passes``
   nor with a reduced ``precision``.
4. Every pass is handed the compile's planted faults (``CompileOptions.faults``, cuvil/faults.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cuvil.errors import CuvilError

if TYPE_CHECKING:
    from cuvil.backends.registry import Backend
    from cuvil.options import CompileOptions, PrecisionOptions
    from cuvil.passes import Pass, PassManager


@dataclass(frozen=True)
class Pipeline:
    """The passes a compile runs, in order."""

    passes: tuple[Pass, ...]
    # An int8 compile calibrates and quantizes before passes[quantize_at:] (None: no quantization).
    quantize_at: int | None = None
    # The PassManager the options gave (its instruments and limit), which runs ``passes``.
    manager: PassManager | None = None

    @property
    def text(self) -> str:
        """The pipeline text (``cuvil opt --passes`` reads it back)."""
        from cuvil.passes import format_pipeline

        return format_pipeline(self.passes)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.passes]

    def before_quantization(self) -> list[Pass]:
        return list(self.passes if self.quantize_at is None else self.passes[:self.quantize_at])

    def after_quantization(self) -> list[Pass]:
        return [] if self.quantize_at is None else list(self.passes[self.quantize_at:])

    def pass_manager(self) -> PassManager:
        """The manager that runs the pipeline (the options' own, or a plain one)."""
        from cuvil.passes import PassManager

        return self.manager if self.manager is not None else PassManager(list(self.passes))


def build_pipeline(target: str | Backend, options: CompileOptions) -> Pipeline:
    """The pass pipeline a compile for ``target`` with ``options`` runs (the module docstring's rules)."""
    from cuvil.backends.registry import get_backend
    from cuvil.passes import ConvertPrecision, FoldBatchNorm, PassManager, parse_pipeline

    backend = get_backend(target) if isinstance(target, str) else target
    convert = precision_pass(options.precision)
    planted = options.faults
    if options.quantization.dtype is not None:
        from cuvil.quant.ptq import QuantizationError

        q = options.quantization.dtype
        if options.passes is not None:
            raise QuantizationError("quant_dtype= runs its own pipeline (the passes up to fold-batchnorm, "
                                    "calibration, then fold-qdq and fusion); it cannot be combined with passes=")
        if convert is not None:
            raise QuantizationError(f"quant_dtype={q!r} and precision={options.precision.dtype!r} cannot be "
                                    "combined: int8 layers compute in float32 where they are not quantized")
        full = parse_pipeline(backend.quantization_pipeline(enable_fusion=options.enable_fusion))
        fold_qdq = [p for p in full if p.name == "fold-qdq"][:1]
        full = [p for p in full if p.name != "fold-qdq"]
        at = next((i for i, p in enumerate(full) if isinstance(p, FoldBatchNorm)), None)
        if at is None:
            raise QuantizationError(f"{backend.name}: its quantization pipeline has no fold-batchnorm to quantize "
                                    "after")
        passes = [*full[:at + 1], *fold_qdq, *full[at + 1:]]
        return Pipeline(tuple(p.with_faults(planted) for p in passes), quantize_at=at + 1)
    given = options.passes
    if given is None:
        given = backend.default_pipeline(enable_fusion=options.enable_fusion)
    if isinstance(given, PassManager):
        if convert is not None and not any(isinstance(p, ConvertPrecision) for p in given.passes):
            raise CuvilError(f"precision= with a PassManager: put {convert} in its pipeline "
                             "(before the fusion passes)")
        given.passes = [p.with_faults(planted) for p in given.passes]
        return Pipeline(tuple(given.passes), manager=given)
    passes = PassManager(given).passes
    if convert is not None and not any(isinstance(p, ConvertPrecision) for p in passes):
        passes = with_precision(passes, convert)
    return Pipeline(tuple(p.with_faults(planted) for p in passes))


def precision_pass(precision: PrecisionOptions) -> Pass | None:
    """The ``convert-precision`` pass the precision options ask for (None for fp32; the options are
    checked by ``cuvil.options.validate``)."""
    from cuvil.options import PRECISION_ALIASES as ALIASES
    from cuvil.passes.convert_precision import ConvertPrecision, format_overrides, parse_overrides

    p = ALIASES.get(precision.dtype.lower())
    if p is None or p == "f32":
        return None
    return ConvertPrecision(dtype=p, overrides=format_overrides(parse_overrides(precision.overrides or {})))


def with_precision(passes: list[Pass], convert: Pass) -> list[Pass]:
    """``passes`` with ``convert`` right after the clean-up passes and batch-norm folding (rule 2)."""
    from cuvil.passes import (
        Canonicalize,
        CommonSubexpressionElimination,
        DeadCodeElimination,
        FoldBatchNorm,
        FoldConstants,
    )

    basic = (Canonicalize, FoldConstants, CommonSubexpressionElimination, DeadCodeElimination, FoldBatchNorm)
    at = next((i for i, p in enumerate(passes) if not isinstance(p, basic)), len(passes))
    return [*passes[:at], convert, *passes[at:]]
