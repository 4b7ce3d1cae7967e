"""The vectorisable float32 math of ``cuvil_vmath.h`` (exp, erf, erfc, sigmoid, GELU, tanh, expm1,
log, log1p): its error
against double-precision libm over a sweep of all floats, its special values, that loops over it
vectorise, and that GELU kernels (elementwise, fused loop, GEMM epilogue) all use it."""

from __future__ import annotations

import ctypes
import math
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.backends.c.toolchain import Compiler, compile_flags

# Maximum errors in ulp of the correctly rounded result, where it is a normal float.  Over every
# 7th float bit pattern (600 million) they were: exp 0.98, erf 2.52, erfc 6.87, gelu 7.83,
# sigmoid 2.33, tanh 1.32, expm1 1.69, log 0.81, log1p 2.42; the test sweeps every 4099th, a million floats.
MAX_ULP = {"exp": 1.0, "erf": 2.6, "erfc": 7.0, "gelu": 8.0, "sigmoid": 2.4, "tanh": 1.4, "expm1": 1.8, "log": 0.9, "log1p": 2.5}
# Where the result is subnormal, in units of the smallest subnormal, 2**-149.
MAX_SUBNORMAL_UNITS = 1.0
STRIDE = 4099

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "cuvil_math.h"

#define EXPORT __attribute__((visibility("default"))) /* the build hides symbols by default */

/* |got - want| in ulp of want rounded to float (want in double), or, for a subnormal want, in
 * units of 2^-149 (returned negative so the caller can tell).  Overflow of want to inf is right. */
static double err(float got, double want) {
    if (isnan(want)) return isnan(got) ? 0.0 : INFINITY;
    const float wf = (float)want;
    if (isinf(wf)) return got == wf ? 0.0 : INFINITY;
    if (isnan(got)) return INFINITY;
    const double d = fabs((double)got - want);
    if (fabs(want) < 1.1754943508222875e-38) return -d / 1.401298464324817e-45;
    int e;
    frexp(fabs(want), &e);
    return d / ldexp(1.0, e - 24);
}

static double want_of(int f, double x) {
    switch (f) {
    case 0: return exp(x);
    case 1: return erf(x);
    case 2: return erfc(x);
    case 3: return 0.5 * x * erfc(-x / sqrt(2.0));
    case 4: return 1.0 / (1.0 + exp(-x));
    case 5: return tanh(x);
    case 6: return expm1(x);
    case 7: return log(x);
    default: return log1p(x);
    }
}

static float got_of(int f, float x) {
    switch (f) {
    case 0: return cuvil_exp_f(x);
    case 1: return cuvil_erf_f(x);
    case 2: return cuvil_erfc_f(x);
    case 3: return cuvil_gelu_f(x);
    case 4: return cuvil_sigmoid_vf(x);
    case 5: return cuvil_tanh_f(x);
    case 6: return cuvil_expm1_f(x);
    case 7: return cuvil_log_f(x);
    default: return cuvil_log1p_f(x);
    }
}

/* Function f at every stride-th float bit pattern: the largest error on normal results (ulp) and
 * on subnormal ones (units of 2^-149), and where each is. */
EXPORT void sweep(int f, uint32_t stride, double *worst, float *at, double *worst_sub, float *at_sub) {
    *worst = 0.0, *worst_sub = 0.0, *at = 0.0f, *at_sub = 0.0f;
    for (uint64_t u = 0; u < 0x100000000ull; u += stride) {
        const uint32_t b = (uint32_t)u;
        float x;
        memcpy(&x, &b, sizeof x);
        const double e = err(got_of(f, x), want_of(f, (double)x));
        if (e >= 0.0 && e > *worst) *worst = e, *at = x;
        if (e < 0.0 && -e > *worst_sub) *worst_sub = -e, *at_sub = x;
    }
}

/* y[i] = f(x[i]): the loops the compiler is expected to vectorise. */
EXPORT void map_gelu(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = cuvil_gelu_f(x[i]); }
EXPORT void map_erf(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = cuvil_erf_f(x[i]); }
EXPORT void map_erfc(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = cuvil_erfc_f(x[i]); }
EXPORT void map_exp(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = cuvil_exp_f(x[i]); }
EXPORT void map_sigmoid(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = cuvil_sigmoid_vf(x[i]); }
EXPORT void map_tanh(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = cuvil_tanh_f(x[i]); }
EXPORT void map_expm1(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = cuvil_expm1_f(x[i]); }
EXPORT void map_log(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = cuvil_log_f(x[i]); }
EXPORT void map_log1p(const float *x, float *y, int64_t n) { for (int64_t i = 0; i < n; i++) y[i] = cuvil_log1p_f(x[i]); }
/* A second loop over the GELU in the same file: the function is inlined in both, not called. */
EXPORT void map_gelu_bias(const float *x, const float *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = cuvil_gelu_f(x[i] + b[i]);
}
"""

FUNCS = ("exp", "erf", "erfc", "gelu", "sigmoid", "tanh", "expm1", "log", "log1p")


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> tuple[ctypes.CDLL, str]:
    d = tmp_path_factory.mktemp("vmath")
    src, so = d / "vmath.c", d / "vmath.so"
    src.write_text(_SOURCE)
    cmd = [*Compiler().argv, *compile_flags("native"), "-fopt-info-vec-optimized", str(src), "-o", str(so), "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return ctypes.CDLL(str(so)), r.stderr


def _map(lib: ctypes.CDLL, name: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    fn = getattr(lib, f"map_{name}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn(x.ctypes.data, y.ctypes.data, x.size)
    return y


@pytest.mark.parametrize("f", range(len(FUNCS)), ids=FUNCS)
def test_error_against_double_libm_over_all_floats(lib: tuple[ctypes.CDLL, str], f: int) -> None:
    so, _ = lib
    worst, worst_sub = ctypes.c_double(), ctypes.c_double()
    at, at_sub = ctypes.c_float(), ctypes.c_float()
    so.sweep.argtypes = [ctypes.c_int, ctypes.c_uint32, *(ctypes.c_void_p,) * 4]
    so.sweep(f, STRIDE, ctypes.byref(worst), ctypes.byref(at), ctypes.byref(worst_sub), ctypes.byref(at_sub))
    name = FUNCS[f]
    assert worst.value <= MAX_ULP[name], f"{name}: {worst.value:.2f} ulp at {at.value!r}"
    # exp and sigmoid are within one subnormal unit; erfc and GELU round a product into the subnormals
    assert worst_sub.value <= (MAX_SUBNORMAL_UNITS if name in ("exp", "sigmoid") else 4.0), (
        f"{name}: {worst_sub.value:.2f} subnormal units at {at_sub.value!r}")


def test_special_values(lib: tuple[ctypes.CDLL, str]) -> None:
    so, _ = lib
    inf, nan = np.float32(np.inf), np.float32(np.nan)
    x = np.array([0.0, -0.0, inf, -inf, nan, 200.0, -200.0, 1e-30, -1e-30], np.float32)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(_map(so, "exp", x), [1, 1, inf, 0, nan, inf, 0, 1, 1])
        erf = _map(so, "erf", x)
        np.testing.assert_array_equal(erf[:7], [0, -0.0, 1, -1, nan, 1, -1])
        np.testing.assert_allclose(erf[7:], x[7:].astype(np.float64) * 2 / math.sqrt(math.pi), rtol=2**-22)
        np.testing.assert_array_equal(_map(so, "erfc", x), [1, 1, 0, 2, nan, 0, 2, 1, 1])
        np.testing.assert_array_equal(_map(so, "sigmoid", x), [0.5, 0.5, 1, 0, nan, 1, 0, 0.5, 0.5])
        np.testing.assert_array_equal(_map(so, "tanh", x), [0, -0.0, 1, -1, nan, 1, -1, x[7], x[8]])
        np.testing.assert_array_equal(_map(so, "expm1", x), [0, -0.0, inf, -1, nan, inf, -1, x[7], x[8]])
        log = _map(so, "log", x)
        np.testing.assert_array_equal(log[[0, 1, 2, 3, 4, 6, 8]], [-inf, -inf, inf, nan, nan, nan, nan])
        np.testing.assert_allclose(log[[5, 7]], np.log(x[[5, 7]].astype(np.float64)), rtol=2**-23)
        np.testing.assert_array_equal(_map(so, "log1p", x)[[0, 1, 2, 3, 4, 6, 7, 8]], [0, -0.0, inf, nan, nan, nan, x[7], x[8]])
        # x Phi(x): +inf stays, -inf gives NaN as the reference's -inf * erfc(inf) = -inf * 0 does
        np.testing.assert_array_equal(_map(so, "gelu", x), [0, -0.0, inf, nan, nan, 200, -0.0, x[7] / 2, x[8] / 2])
    assert np.signbit(_map(so, "erf", x)[1]) and np.signbit(_map(so, "gelu", x)[1]) and np.signbit(_map(so, "tanh", x)[1])
    assert np.signbit(_map(so, "expm1", x)[1]) and np.signbit(_map(so, "log1p", x)[1])


def test_gelu_keeps_relative_accuracy_in_the_far_negative_tail(lib: tuple[ctypes.CDLL, str]) -> None:
    """Where 1 + erf(x / sqrt 2) would cancel to nothing, x Phi(x) keeps a few ulp."""
    so, _ = lib
    x = np.linspace(-13.0, -4.0, 2001, dtype=np.float32)
    want = np.array([0.5 * float(v) * math.erfc(-float(v) / math.sqrt(2.0)) for v in x])
    np.testing.assert_allclose(_map(so, "gelu", x), want, rtol=MAX_ULP["gelu"] * 2.0**-23, atol=0)


def test_loops_over_the_functions_vectorise(lib: tuple[ctypes.CDLL, str]) -> None:
    _, log = lib
    vectorised = {int(line.split(":")[1]) for line in log.splitlines() if "loop vectorized" in line}
    lines = _SOURCE.splitlines()
    for name in (*(f"map_{f}(" for f in FUNCS), "map_gelu_bias("):
        no = next(i for i, text in enumerate(lines) if f"EXPORT void {name}" in text) + 1
        assert any(no <= v <= no + 2 for v in vectorised), f"{name} not vectorised:\n{log}"


def _ffn_model(approximate: str) -> onnx.ModelProto:
    """MatMul + bias + Gelu (fused into one GEMM epilogue), then a standalone Gelu and an erf."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((64, 96)) * 0.6).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(96).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
        helper.make_node("Gelu", ["hb"], ["g"], approximate=approximate),
        helper.make_node("Gelu", ["x"], ["gx"], approximate=approximate),
        helper.make_node("Erf", ["x"], ["ex"]),
    ]
    g = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [40, 64])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, [40, s])
                           for n, s in (("g", 96), ("gx", 64), ("ex", 64))], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_in_an_epilogue_and_standalone_agree_with_the_reference(tmp_path: Path, approximate: str) -> None:
    model = _ffn_model(approximate)
    x = (np.random.default_rng(1).standard_normal((40, 64)) * 4).astype(np.float32)
    fused = cuvil.compile(model, target="native", cache_dir=str(tmp_path))
    unfused = cuvil.compile(model, target="native", cache_dir=str(tmp_path), enable_fusion=False)
    ref = cuvil.compile(model, target="ref")
    got, plain, want = fused(x), unfused(x), ref(x)
    info = fused.build_info
    assert info is not None
    src = info.source.read_text()
    assert "erfcf(" not in src and "erff(" not in src
    assert ("cuvil_gelu_f(" if approximate == "none" else "cuvil_sigmoid_vf(") in src
    # the epilogue computes the same float32 expression as the unfused kernels: the same bits
    for a, b in zip(got, plain):
        np.testing.assert_array_equal(a, b)
    # after the product, float32 sums of 64 terms in another order than the reference's
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
    for a, c in zip(got[1:], want[1:]):  # elementwise on the input: a few ulp
        np.testing.assert_allclose(a, c, rtol=1e-6, atol=1e-7)


# Activations whose float32 kernels read cuvil_vmath.h, each a node of its own (fusion off), with
# their onnx attributes; the input goes through Abs first for Log.
_ACTIVATIONS = [("Exp", {}), ("Log", {}), ("Tanh", {}), ("Sigmoid", {}), ("Erf", {}), ("Elu", {"alpha": 0.7}),
                ("Selu", {}), ("Celu", {"alpha": 1.3}), ("Softplus", {}), ("Mish", {}), ("Gelu", {}),
                ("Gelu", {"approximate": "tanh"})]


def _activations_in_double(x: np.ndarray) -> list[np.ndarray]:
    """_ACTIVATIONS in float64, from their definitions (the reference computes in float32, and its
    GELU's tail carries the rounding of x / sqrt 2 amplified by x^2: 4e-6 relative at x = -9)."""
    erf = np.vectorize(math.erf)
    erfc = np.vectorize(math.erfc)
    softplus = np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)
    alpha, gamma = 1.67326319217681884765625, 1.05070102214050292968750  # Selu's defaults
    u = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
    return [np.exp(x), np.log(np.abs(x)), np.tanh(x), 1 / (1 + np.exp(-x)), erf(x),
            np.where(x < 0, 0.7 * np.expm1(x), x), gamma * np.where(x > 0, x, alpha * np.expm1(x)),
            np.maximum(x, 0) + np.minimum(0, 1.3 * np.expm1(x / 1.3)), softplus, x * np.tanh(softplus),
            0.5 * x * erfc(-x / math.sqrt(2)), x / (1 + np.exp(-2 * u))]


def test_activation_kernels_vectorise_and_are_accurate(tmp_path: Path) -> None:
    """Every flat loop of the generated source vectorises (a libm call or a branch left in the loop
    would keep it scalar: Tanh, Elu and Softplus ran 5 to 30 times slower than onnxruntime so), and
    each op is within a few ulp of its definition computed in double."""
    nodes, outs = [helper.make_node("Abs", ["x"], ["ax"])], []
    for i, (op, attrs) in enumerate(_ACTIVATIONS):
        nodes.append(helper.make_node(op, ["ax" if op == "Log" else "x"], [f"y{i}"], **attrs))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [4, 300]))
    g = helper.make_graph(nodes, "acts", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 300])], outs)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    m = cuvil.compile(model, target="native", cache_dir=str(tmp_path), enable_fusion=False)
    x = (np.random.default_rng(2).standard_normal((4, 300)) * 3).astype(np.float32)
    x64 = x.astype(np.float64)
    # the tanh form of GELU rounds its exponent's argument 2u (u ~ x^3) to float32 first, and
    # exp turns that rounding into a relative error of |2u| ulp: allowed on top
    tanh_arg = 2 * math.sqrt(2 / math.pi) * np.abs(x64 + 0.044715 * x64**3)
    for (op, attrs), got, want in zip(_ACTIVATIONS, m(x), _activations_in_double(x64)):
        rtol = 2e-6 + (tanh_arg * 2.0**-23 if attrs.get("approximate") == "tanh" else 0.0)
        assert np.all(np.abs(got - want) <= rtol * np.abs(want) + 1e-37), (
            f"{op} {attrs}: relative error {np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-37)):.3g}")

    info = m.build_info
    assert info is not None
    src = info.source.read_text()
    # each loop tells the pool it computes (cuvil_parallel_range's per-element cost), not only streams:
    # a small Sigmoid would otherwise never be split though it takes six times its streaming time
    calls = [line for line in src.splitlines() if "cuvil_parallel_range(" in line]
    assert len(calls) == len(_ACTIVATIONS) + 1  # and the Abs before Log, which only streams
    assert sum(float(c.split(",")[2]) > 0 for c in calls) == len(_ACTIVATIONS), calls
    for fn in ("tanhf(", "expf(", "logf(", "log1pf(", "expm1f(", "erff("):
        assert f" {fn}" not in src and f"({fn}" not in src, f"{fn} (libm, scalar) in the generated source"
    cmd = [*Compiler().argv, *compile_flags("native"), "-fopt-info-vec-optimized", "-c", str(info.source), "-o",
           str(tmp_path / "model.o")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    vectorised = {int(line.split(":")[1]) for line in r.stderr.splitlines()
                  if info.source.name in line and "loop vectorized" in line}
    lines = src.splitlines()
    starts = [i + 1 for i, text in enumerate(lines) if text.startswith("static void cuvil_flat_")]
    assert len(starts) >= len(_ACTIVATIONS)
    for start in starts:
        end = next(i + 1 for i in range(start, len(lines)) if lines[i] == "}")
        assert any(start <= v <= end for v in vectorised), "not vectorised:\n" + "\n".join(lines[start - 1:end])
