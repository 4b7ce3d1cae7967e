"""cuvil.pipeline.build_pipeline: the one pipeline compile, int8 calibration and the verify
rebuilds run."""

from __future__ import annotations

from typing import Any

import pytest

import cuvil
from cuvil.options import CompileOptions
from cuvil.passes import FUSION_PASSES, ConvertPrecision, PassManager, default_pipeline
from cuvil.pipeline import build_pipeline
from cuvil.quant.ptq import split_pipeline
from cuvil.verify.checks.fusion_memory import FusionMemory, compiled_pipeline

CASES = {
    "default": {},
    "fp16": {"precision": "fp16", "precision_overrides": {"softmax": "fp16"}},
    "int8": {"quant_dtype": "int8", "per_channel": False},
}


class _Context:
    """What the fusion-memory check asks of a verification context to know its builds' options."""

    def __init__(self, **options: Any) -> None:
        self.options = options

    def compile_options(self, target: str, **options: Any) -> CompileOptions:
        return CompileOptions.from_keywords(**{**self.options, **options})


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fusion_off_rebuild_is_the_compile_pipeline_without_the_fusion_passes(case: str) -> None:
    ctx = _Context(**CASES[case])
    fused = compiled_pipeline(ctx, "native")
    assert fused.names == build_pipeline("native", CompileOptions.from_keywords(**CASES[case])).names
    unfused = compiled_pipeline(ctx, "native", **FusionMemory.variants(ctx, "native")["unfused"])
    assert set(FUSION_PASSES) <= set(fused.names)
    assert unfused.names == [n for n in fused.names if n not in FUSION_PASSES]
    if case == "fp16":
        assert fused.names.index("convert-precision") < fused.names.index(FUSION_PASSES[0])
        assert "convert-precision" in unfused.names
    if case == "int8":  # quantization sits after fold-batchnorm in both, fold-qdq right after it
        for p in (fused, unfused):
            assert p.quantize_at is not None and p.names[p.quantize_at - 1] == "fold-batchnorm"
            assert p.names[p.quantize_at] == "fold-qdq"


def test_the_memory_variants_come_from_the_compile_pipeline() -> None:
    ctx = _Context(precision="bf16")
    base = compiled_pipeline(ctx, "generic")
    variants = FusionMemory.variants(ctx, "generic")
    assert "planned" not in variants or variants["planned"] == {}
    unplanned = build_pipeline("generic", ctx.compile_options("generic", **variants["unplanned"]))
    assert unplanned.names == [n for n in base.names if n != "plan-memory"]
    assert sum(isinstance(p, ConvertPrecision) for p in unplanned.passes) == 1  # not added twice


def test_the_default_pipeline_and_the_int8_split_are_the_builders() -> None:
    assert build_pipeline("native", CompileOptions()).text == default_pipeline("native")
    assert build_pipeline("ref", CompileOptions()).passes == ()
    pre, post = split_pipeline("native", True)
    p = build_pipeline("native", CompileOptions.from_keywords(quant_dtype="int8"))
    assert [*pre, *post] == list(p.passes) and len(pre) == p.quantize_at
    ref_pre, ref_post = split_pipeline("ref", True)
    assert [x.name for x in ref_pre][-1] == "fold-batchnorm" and ref_post == []


def test_the_faults_reach_every_pass() -> None:
    p = build_pipeline("native", CompileOptions.from_keywords(faults={"bn-epsilon"}))
    assert all(x.faults == {"bn-epsilon"} for x in p.passes)
    assert p.text == default_pipeline("native")  # faults are no part of the pipeline text
    manager = PassManager("fold-batchnorm")
    q = build_pipeline("ref", CompileOptions.from_keywords(passes=manager, faults={"bn-epsilon"}))
    assert q.manager is manager and manager.passes[0].faults == {"bn-epsilon"}


def test_options_the_pipeline_refuses() -> None:
    with pytest.raises(cuvil.CuvilError, match="cannot be combined with passes="):
        build_pipeline("native", CompileOptions.from_keywords(quant_dtype="int8", passes="cse"))
    with pytest.raises(cuvil.CuvilError, match="cannot be combined"):
        build_pipeline("native", CompileOptions.from_keywords(quant_dtype="int8", precision="fp16"))
    with pytest.raises(cuvil.CuvilError, match="put convert-precision"):
        build_pipeline("native", CompileOptions.from_keywords(precision="fp16", passes=PassManager("cse")))
