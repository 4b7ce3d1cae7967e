"""The pipeline texts the compiled targets name as theirs.

A backend names its default pipeline as text (``Backend.default_pipeline``); the passes the text
names are registered by ``cuvil.passes``, which sits above the backends (the passes run the reference
interpreter and the C memory planner), so the text lives here and the pass manager reads it."""

from __future__ import annotations

# The passes every compiled target runs first; a layout pass joins here.  fold-constants runs again
# after fold-qdq, which leaves the weights of the products it does not fold as float constants:
# what reads them only to reshape or transpose them (a quantized nn.Linear's weight) folds then.
_BASIC = "canonicalize,fold-constants,cse,dce,fold-batchnorm,fold-qdq,fold-constants"
# Fusion, in this order: GELU and LayerNorm written out become one op each, attention written out
# becomes one op (before its matmuls can take the scale and mask as epilogues), then
# Conv/Gemm/MatMul take their elementwise tails as epilogues, then the chains left become single loops.
# convert-layout goes before the epilogues, so they form on the channels-last convolutions, and
# after where cuvil.compile puts convert-precision (before the first fusion pass): only float32
# convolutions change layout.
_FUSION = "recognize-gelu,convert-layout,recognize-layernorm,fuse-attention,fuse-epilogue,fuse-elementwise"
# Last, once the schedule is final: every intermediate gets its offset in one arena.
_MEMORY = "plan-memory"


def standard_pipeline(*, enable_fusion: bool = True) -> str:
    """The pipeline of the compiled targets (the C and wasm32 backends name it as theirs):
    ``canonicalize,fold-constants,cse,dce,fold-batchnorm,fold-qdq,fold-constants``,
    then, unless ``enable_fusion`` is False,
    ``recognize-gelu,convert-layout,recognize-layernorm,fuse-attention,fuse-epilogue,fuse-elementwise``,
    and last ``plan-memory`` (the intermediates in one arena per call)."""
    return f"{_BASIC},{_FUSION},{_MEMORY}" if enable_fusion else f"{_BASIC},{_MEMORY}"


#: The passes ``enable_fusion=False`` leaves out of the standard pipeline.
FUSION_PASSES: tuple[str, ...] = tuple(_FUSION.split(","))
