"""Cuvil's passes and the machinery that runs them.

A pass is a small named object with typed options (``cuvil.passes.base``);
a pipeline is a list of them that prints and parses as text
(``canonicalize,fold-constants,fuse{max-ops=16}``); the :class:`PassManager`
runs one with instruments around every pass (``verify-each``,
``numeric-each``, ``dump-ir``, ``timing``) and a limit on how many run.

Importing this package registers every pass: a new pass module is imported
here.
"""

from __future__ import annotations

from cuvil.backends.pipelines import FUSION_PASSES, standard_pipeline
from cuvil.passes.base import GraphPass, Pass, PassError, PassResult, all_passes, get_pass, register_pass
from cuvil.passes.canonicalize import Canonicalize
from cuvil.passes.convert_precision import ConvertPrecision
from cuvil.passes.cse import CommonSubexpressionElimination
from cuvil.passes.dce import DeadCodeElimination
from cuvil.passes.fold_batchnorm import FoldBatchNorm
from cuvil.passes.fold_constants import FoldConstants, fold_node
from cuvil.passes.fold_qdq import FoldQDQ
from cuvil.passes.fuse_attention import FuseAttention
from cuvil.passes.fuse_elementwise import FuseElementwise, RecognizeGelu
from cuvil.passes.fuse_epilogue import FuseEpilogue
from cuvil.passes.instruments import (
    DumpIR,
    Instrument,
    NumericEach,
    PassRecord,
    PassReport,
    PipelineError,
    Timing,
    VerifyEach,
)
from cuvil.passes.layout import ConvertLayout
from cuvil.passes.manager import (
    PassManager,
    default_pipeline,
    format_pipeline,
    parse_pipeline,
)
from cuvil.passes.plan_memory import PlanMemory
from cuvil.passes.recognize_layernorm import RecognizeLayerNorm

__all__ = [
    "FUSION_PASSES",
    "Canonicalize",
    "ConvertLayout",
    "ConvertPrecision",
    "CommonSubexpressionElimination",
    "DeadCodeElimination",
    "DumpIR",
    "FoldBatchNorm",
    "FoldConstants",
    "FoldQDQ",
    "FuseAttention",
    "FuseElementwise",
    "FuseEpilogue",
    "GraphPass",
    "Instrument",
    "NumericEach",
    "Pass",
    "PassError",
    "PassManager",
    "PassRecord",
    "PassReport",
    "PassResult",
    "PlanMemory",
    "PipelineError",
    "RecognizeGelu",
    "RecognizeLayerNorm",
    "Timing",
    "VerifyEach",
    "all_passes",
    "default_pipeline",
    "fold_node",
    "format_pipeline",
    "get_pass",
    "parse_pipeline",
    "register_pass",
    "standard_pipeline",
]
