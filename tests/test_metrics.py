"""The comparison policy of cuvil.metrics, case by case: non-finite values in each position, empty and
all-zero tensors, integer, bool and reduced-precision inputs, shape mismatches, and drift."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import cuvil.metrics
from cuvil.metrics import Comparison, compare, drift, error_figures, max_abs_error, relative_l2, snr_db

NAN, INF = math.nan, math.inf
F64 = np.float64

# (case, got, want, relative L2, max abs, SNR dB); None for SNR: not checked beyond its sign rules below
CASES: list[tuple[str, Any, Any, float, float, float | None]] = [
    ("equal", [3.0, 4.0], [3.0, 4.0], 0.0, 0.0, INF),
    ("plain error", [3.0, 4.5], [3.0, 4.0], 0.1, 0.5, 20.0),
    ("relative to the oracle, not to got", [3.0, 4.0], [3.0, 4.5], 0.5 / math.hypot(3, 4.5), 0.5, None),
    # NaN: got only, want only, both (matching), and against an infinity
    ("nan in got only", [NAN, 2.0], [1.0, 2.0], INF, INF, -INF),
    ("nan in want only", [1.0, 2.0], [NAN, 2.0], INF, INF, -INF),
    ("nan in both, rest equal", [NAN, 1.0], [NAN, 1.0], 0.0, 0.0, INF),
    ("nan in both, rest differs", [NAN, 2.0], [NAN, 1.0], 1.0, 1.0, 0.0),
    ("nan against +inf", [NAN, 1.0], [INF, 1.0], INF, INF, -INF),
    ("+inf against nan", [INF, 1.0], [NAN, 1.0], INF, INF, -INF),
    # +inf and -inf: got only, want only, both with the same sign, both with opposite signs
    ("+inf in got only", [INF, 2.0], [1.0, 2.0], INF, INF, -INF),
    ("-inf in got only", [-INF, 2.0], [1.0, 2.0], INF, INF, -INF),
    ("+inf in want only", [1.0, 2.0], [INF, 2.0], INF, INF, -INF),
    ("-inf in want only", [1.0, 2.0], [-INF, 2.0], INF, INF, -INF),
    ("+inf in both, rest differs", [INF, 2.0], [INF, 1.0], 1.0, 1.0, 0.0),
    ("-inf in both, rest differs", [-INF, 2.0], [-INF, 1.0], 1.0, 1.0, 0.0),
    ("+inf against -inf", [INF, 1.0], [-INF, 1.0], INF, INF, -INF),
    ("-inf against +inf", [-INF, 1.0], [INF, 1.0], INF, INF, -INF),
    ("every element a matching non-finite", [NAN, INF, -INF], [NAN, INF, -INF], 0.0, 0.0, INF),
    ("one mismatch among matching ones", [NAN, INF, 5.0], [NAN, INF, NAN], INF, INF, -INF),
    # empty tensors and all-zero oracles
    ("empty", np.zeros((0,)), np.zeros((0,)), 0.0, 0.0, INF),
    ("empty, two dimensions", np.zeros((2, 0), np.float32), np.zeros((2, 0), np.float32), 0.0, 0.0, INF),
    ("all-zero oracle, zero got", [0.0, 0.0], [0.0, 0.0], 0.0, 0.0, INF),
    ("all-zero oracle, nonzero got", [0.0, 1e-9], [0.0, 0.0], INF, 1e-9, -INF),
    ("oracle zero on the finite rest", [NAN, 1.0], [NAN, 0.0], INF, 1.0, -INF),
    # shape mismatches: no broadcasting
    ("shape mismatch", [1.0, 2.0], [[1.0, 2.0]], INF, INF, -INF),
    ("shape mismatch, both empty", np.zeros((0, 2)), np.zeros((2, 0)), INF, INF, -INF),
    ("scalar against one element", np.float64(1.0), [1.0], INF, INF, -INF),
    # integer and bool outputs (float64; bools as 0 and 1)
    ("int64", np.array([1, 2], np.int64), np.array([1, 3], np.int64), 1 / math.sqrt(10), 1.0, None),
    ("int8 against int32", np.array([-128, 0], np.int8), np.array([-128, 0], np.int32), 0.0, 0.0, INF),
    ("uint8 wraps nothing", np.array([0, 255], np.uint8), np.array([255, 0], np.uint8), math.sqrt(2), 255.0, None),
    ("bool", np.array([True, False]), np.array([True, True]), 1 / math.sqrt(2), 1.0, None),
    ("bool equal", np.array([True, False]), np.array([True, False]), 0.0, 0.0, INF),
    ("bool against float", np.array([True, False]), np.array([1.0, 0.5]), 0.5 / math.hypot(1, 0.5), 0.5, None),
    # reduced-precision floats, widened exactly before the difference
    ("float16", np.array([1.0, 2.0], np.float16), np.array([1.0, 2.5], np.float16), 0.5 / math.hypot(1, 2.5), 0.5,
     None),
    ("bfloat16", np.array([1.0, 3.0], ml_dtypes.bfloat16), np.array([1.0, 2.0], ml_dtypes.bfloat16),
     1 / math.sqrt(5), 1.0, None),
    ("bfloat16 against float32", np.array([1.0, 256.0], ml_dtypes.bfloat16), np.array([1.0, 257.0], np.float32),
     1 / math.hypot(1, 257), 1.0, None),
    ("float16 nan and inf, matching", np.array([NAN, INF, 1.5], np.float16), np.array([NAN, INF, 1.0], np.float16),
     0.5, 0.5, None),
    ("bfloat16 nan against finite", np.array([NAN, 1.0], ml_dtypes.bfloat16), np.array([1.0, 1.0], np.float32),
     INF, INF, -INF),
    ("float16 overflow to inf", np.array([INF, 2.0], np.float16), np.array([131008.0, 2.0]), INF, INF, -INF),
]


@pytest.mark.parametrize(("got", "want", "rel", "peak", "snr"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_figures(got: Any, want: Any, rel: float, peak: float, snr: float | None) -> None:
    assert relative_l2(got, want) == pytest.approx(rel, rel=1e-12)
    assert max_abs_error(got, want) == pytest.approx(peak, rel=1e-12)
    figures = error_figures(got, want)
    assert figures["rel_l2"] == relative_l2(got, want)
    assert figures["max_abs"] == max_abs_error(got, want)
    assert figures["snr_db"] == snr_db(got, want)
    if snr is not None:
        assert snr_db(got, want) == pytest.approx(snr, rel=1e-12)
    elif rel not in (0.0, INF):  # SNR and relative L2 say the same thing on a finite nonzero error
        assert snr_db(got, want) == pytest.approx(-20 * math.log10(rel), rel=1e-12)


@pytest.mark.parametrize(("got", "want", "rel"), [c[1:4] for c in CASES], ids=[c[0] for c in CASES])
def test_an_error_says_why_and_a_scale_problem_does_not(got: Any, want: Any, rel: float) -> None:
    c = compare(got, want)
    if c.problem is not None:
        assert rel == INF and not c.ok
        assert "shape" in c.problem or "non-finite" in c.problem
    else:
        assert c.ok


def test_a_problem_names_the_first_bad_element_and_the_shapes() -> None:
    c = compare(np.array([[1.0, 2.0], [NAN, INF]]), np.array([[1.0, 2.0], [3.0, 4.0]]))
    assert "2 of 4 elements" in str(c.problem) and "[1, 0]" in str(c.problem)
    assert compare(np.zeros((2, 3)), np.zeros((3, 2))).problem == "shape [2, 3] against the oracle's [3, 2]"


def test_the_inputs_are_not_modified_and_order_matters() -> None:
    got = np.array([NAN, 2.0], np.float32)
    want = np.array([NAN, 1.0], np.float32)
    relative_l2(got, want)
    assert np.isnan(got[0]) and got[1] == 2.0 and np.isnan(want[0]) and want[1] == 1.0
    assert relative_l2(got, want) == 1.0
    assert relative_l2(want, got) == 0.5  # the oracle gives the scale


def test_complex_tensors_are_refused() -> None:
    with pytest.raises(TypeError, match="complex"):
        relative_l2(np.array([1j]), np.array([1j]))


def test_summed_comparisons_are_the_concatenation() -> None:
    pairs = [(np.array([1.0, 2.0]), np.array([1.0, 1.0])), (np.array([NAN, 3.0]), np.array([NAN, 4.0])),
             (np.zeros(0), np.zeros(0))]
    total = sum((compare(g, w) for g, w in pairs), Comparison())
    whole = compare(np.concatenate([g for g, _ in pairs]), np.concatenate([w for _, w in pairs]))
    assert total.figures() == pytest.approx(whole.figures(), rel=1e-12)
    assert total.rel_l2 == pytest.approx(math.sqrt(2 / 18))
    broken = total + compare(np.array([NAN]), np.array([1.0])) + compare(np.array([1.0]), np.array([1.0]))
    assert broken.figures() == {"rel_l2": INF, "max_abs": INF, "snr_db": -INF}
    assert broken.problem is not None and "nan" in broken.problem


DRIFT: list[tuple[str, Any, Any, Any, float]] = [
    ("identical", [1.0, 2.0], [1.0, 2.0], [1.0, 2.0], 0.0),
    ("identical, zero reference", [1.0, 2.0], [1.0, 2.0], [0.0, 0.0], 0.0),
    ("scaled by the reference", [1.0, 2.0], [1.0, 3.0], [0.0, 2.0], 0.5),
    ("symmetric", [1.0, 3.0], [1.0, 2.0], [0.0, 2.0], 0.5),
    ("matching nan left out", [NAN, 2.0], [NAN, 1.0], [NAN, 1.0], 1.0),
    ("matching nan, finite reference there", [NAN, 2.0], [NAN, 1.0], [3.0, 1.0], 1.0),
    ("nan on one side", [NAN, 2.0], [1.0, 2.0], [1.0, 2.0], INF),
    ("inf of the other sign", [INF, 2.0], [-INF, 2.0], [1.0, 2.0], INF),
    ("zero reference", [1.0, 2.0], [1.0, 3.0], [0.0, 0.0], INF),
    ("shape mismatch", [1.0, 2.0], [[1.0, 2.0]], [1.0, 2.0], INF),
    ("reference of another shape", [1.0, 2.0], [1.0, 3.0], [1.0, 2.0, 3.0], INF),
    ("empty", np.zeros(0), np.zeros(0), np.zeros(0), 0.0),
]


@pytest.mark.parametrize(("a", "b", "ref", "want"), [c[1:] for c in DRIFT], ids=[c[0] for c in DRIFT])
def test_drift(a: Any, b: Any, ref: Any, want: float) -> None:
    assert drift(a, b, ref) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(("got", "want"), [c[1:3] for c in CASES], ids=[c[0] for c in CASES])
def test_drift_against_the_reference_itself_is_the_relative_error(got: Any, want: Any) -> None:
    assert drift(got, want, want) == relative_l2(got, want)


def test_the_module_imports_numpy_and_the_standard_library_only() -> None:
    """Any layer may compare tensors: the module must not pull in the IR, backends, passes or verify."""
    tree = ast.parse(Path(cuvil.metrics.__file__).read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {str(n.module).split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "math", "dataclasses", "typing", "numpy"}, imported
