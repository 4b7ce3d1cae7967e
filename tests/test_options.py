"""CompileOptions: the keyword spelling of cuvil.compile, validation in one place, the build key,
and planted faults as a field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import cuvil
from cuvil.backends.registry import backends, get_backend
from cuvil.options import (
    KEYWORDS,
    BuildSettings,
    CompileOptionError,
    CompileOptions,
    PrecisionOptions,
    QuantizationOptions,
    validate,
)

# every keyword cuvil.compile took as a parameter before the options object, with a value unlike its default
OLD_KEYWORDS = {
    "dims": {"n": (1, 4)}, "cache_dir": "/tmp/c", "cc": "gcc", "sanitize": True, "input_spec": [1],
    "dynamic_shapes": {"x": {}}, "enable_fusion": False, "num_threads": 2, "passes": "cse",
    "precision": "fp16", "precision_overrides": {"softmax": "fp32"}, "allow_overflow": True,
    "calibration_dataset": [(np.zeros(1),)], "precision_samples": 3, "conv_algorithm": "im2col",
    "quant_dtype": "int8", "symmetric": False, "per_channel": False, "calibration": "entropy",
    "min_calibration_samples": 8, "reduce_range": True,
}


def test_every_keyword_users_write_maps_onto_its_field() -> None:
    assert set(OLD_KEYWORDS) | {"faults"} == set(KEYWORDS)
    o = CompileOptions.from_keywords(**OLD_KEYWORDS)
    assert o.dims == {"n": (1, 4)} and o.input_spec == [1] and o.enable_fusion is False and o.passes == "cse"
    assert o.precision == PrecisionOptions("fp16", {"softmax": "fp32"}, True, 3)
    assert o.quantization == QuantizationOptions("int8", False, False, "entropy", 8, True)
    assert o.quantization.dataset is OLD_KEYWORDS["calibration_dataset"]
    assert o.build == BuildSettings("gcc", "/tmp/c", True, 2, "im2col")
    assert CompileOptions.from_keywords(**o.keywords()) == o
    assert CompileOptions().keywords() == {}


def test_options_are_frozen_and_overrides_make_copies() -> None:
    o = CompileOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.enable_fusion = False  # type: ignore[misc]
    p = o.with_overrides(enable_fusion=False, precision="bf16")
    assert o.enable_fusion and o.precision.dtype == "fp32"
    assert not p.enable_fusion and p.precision.dtype == "bf16"
    assert p.with_overrides(precision=PrecisionOptions("fp16")).precision == PrecisionOptions("fp16")
    assert o.replace(enable_fusion=False) == o.with_overrides(enable_fusion=False)


def test_an_unknown_keyword_is_an_error_that_names_it() -> None:
    with pytest.raises(CompileOptionError, match=r"no option 'enable_fuson' \(did you mean 'enable_fusion'\?\)"):
        CompileOptions.from_keywords(enable_fuson=False)
    with pytest.raises(TypeError, match="no option 'bogus'"):  # as an unknown keyword argument always was
        cuvil.compile(str(Path(cuvil.__file__).parent / "examples" / "tiny_cnn.onnx"), "ref", bogus=1)


def test_validation_happens_in_one_place() -> None:
    every = backends()
    with pytest.raises(cuvil.CuvilError, match="unknown precision 'fp8'"):
        validate(CompileOptions.from_keywords(precision="fp8"), get_backend("ref"), every)
    with pytest.raises(cuvil.CuvilError, match="precision_overrides apply to precision='fp16'"):
        validate(CompileOptions.from_keywords(precision_overrides={"softmax": "fp16"}), get_backend("ref"), every)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(cuvil.CuvilError, match="num_threads must be a positive integer"):
            validate(CompileOptions.from_keywords(num_threads=bad), get_backend("native"), every)
    with pytest.raises(cuvil.CuvilError, match="num_threads applies to the native C targets; wasm32 runs one"):
        validate(CompileOptions.from_keywords(num_threads=2), get_backend("wasm32"), every)
    with pytest.raises(cuvil.CuvilError, match="cc= and sanitize= apply to the native C targets; wasm32 builds "
                                               "with zig cc"):
        validate(CompileOptions.from_keywords(cc="gcc"), get_backend("wasm32"), every)
    with pytest.raises(cuvil.CuvilError, match="unknown convolution algorithm 'winograd-f3'"):
        validate(CompileOptions.from_keywords(conv_algorithm="winograd-f3"), get_backend("generic"), every)
    validate(CompileOptions.from_keywords(cc="gcc", sanitize=True), get_backend("ref"), every)  # nothing is built
    validate(CompileOptions.from_keywords(num_threads=1, precision="half"), get_backend("ref"), every)


def test_faults_are_a_field_defaulting_to_the_planted_ones() -> None:
    assert CompileOptions().faults == frozenset()
    with cuvil.faults.plant("bn-epsilon"):
        assert CompileOptions().faults == {"bn-epsilon"}
        assert CompileOptions(faults=frozenset()).faults == frozenset()
    assert CompileOptions().faults == frozenset()
    assert CompileOptions.from_keywords(faults={"conv-pad"}).faults == {"conv-pad"}
    with pytest.raises(cuvil.CuvilError, match="unknown fault"):
        CompileOptions.from_keywords(faults={"nope"})


def test_the_build_key_holds_what_decides_the_code_and_nothing_else() -> None:
    base = CompileOptions()
    key = base.build_key("cse")
    assert base.build_key("dce") != key
    for changed in ({"precision": "fp16"}, {"quant_dtype": "int8"}, {"per_channel": False},
                    {"conv_algorithm": "im2col"}, {"faults": {"conv-pad"}}):
        assert base.with_overrides(**changed).build_key("cse") != key, changed
    for same in ({"num_threads": 3}, {"cache_dir": "/elsewhere"}, {"calibration_dataset": [(np.ones(1),)]},
                 {"allow_overflow": True}):
        assert base.with_overrides(**same).build_key("cse") == key, same


def test_a_planted_fault_passed_as_an_option_changes_the_code(tmp_path: Path) -> None:
    model = str(Path(cuvil.__file__).parent / "examples" / "tiny_cnn.onnx")
    good = cuvil.compile(model, "generic", cache_dir=str(tmp_path))
    bad = cuvil.compile(model, "generic", cache_dir=str(tmp_path), faults={"conv-pad"})
    assert good.build_info is not None and bad.build_info is not None
    assert good.build_info.folder != bad.build_info.folder
    assert good.build_info.source.read_text() != bad.build_info.source.read_text()
    with cuvil.faults.plant("conv-pad"):  # the convenience block plants the same fault
        planted = cuvil.compile(model, "generic", cache_dir=str(tmp_path))
    assert planted.build_info is not None and planted.build_info.folder == bad.build_info.folder
    assert planted.info.cached is True
