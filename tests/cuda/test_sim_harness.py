"""The CUDA execution harness (cuvil_cuda_sim.h) runs hand-written CUDA programs on the CPU.

``kernels/sim_suite.cu`` is ordinary CUDA launched through CUVIL_LAUNCH; compiled with g++ and
-DCUVIL_CUDA_SIM it runs its checks and prints ``PASS name`` / ``FAIL name: why``. The same source
with a planted bug (-DPLANT_...) must fail the checks that bug breaks, and only those. Every program
runs under a subprocess timeout: a barrier that hangs instead of being reported fails the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tests.support.paths import REPO

RUNTIME = REPO / "cuvil" / "backends" / "cuda" / "runtime"
SUITE = Path(__file__).parent / "kernels" / "sim_suite.cu"
SIM_FLAGS = ["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-DCUVIL_CUDA_SIM", f"-I{RUNTIME}", "-pthread"]
RUN_TIMEOUT = 120

# Every check the clean program reports (sim_suite.cu prints them in this order).
CHECKS = (
    "vadd", "matmul_tiled", "deterministic_across_workers", "block_reduce", "row_softmax", "atomics_histogram",
    "atomics_mix", "dynamic_shared_needs_attribute", "dynamic_shared", "warp_votes_and_shuffles", "wmma_half",
    "wmma_bf16", "barrier_votes_and_warp_reduce", "large_local_arrays", "graph_capture_records_without_running", "graph_replay", "host_threads_with_streams", "launch_config_errors",
    "launch_after_errors", "reports_barrier_after_exit", "reports_barrier_divergent", "reports_shuffle_partial",
    "memory_events_properties",
)

# Builds of the one source: the clean program and the planted bugs (each build breaks other checks).
BUILDS = {
    "clean": [],
    "missing_sync": ["-DPLANT_MISSING_SYNC"],
    "tile_and_lane": ["-DPLANT_TILE_OFF_BY_ONE", "-DPLANT_SHFL_WRONG_LANE"],
}


def _compiler() -> str:
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    return cxx


def _compile(out: Path, extra: list[str]) -> Path:
    r = subprocess.run([_compiler(), *SIM_FLAGS, *extra, "-x", "c++", str(SUITE), "-o", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return out


def _run(exe: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=RUN_TIMEOUT)


def _results(stdout: str) -> dict[str, bool]:
    results: dict[str, bool] = {}
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASS", "FAIL"):
            name = rest.split(":")[0]
            # a check that runs twice (vadd after the error cases) must pass both times
            results[name] = results.get(name, True) and word == "PASS"
    return results


@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sim")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(_compile, folder / f"suite_{name}", flags) for name, flags in BUILDS.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.fixture(scope="module")
def clean_run(binaries: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    return _run(binaries["clean"])


@pytest.mark.parametrize("check", CHECKS)
def test_clean_program_passes(clean_run: subprocess.CompletedProcess[str], check: str) -> None:
    results = _results(clean_run.stdout)
    assert check in results, clean_run.stdout[-3000:] + clean_run.stderr[-2000:]
    assert results[check], [line for line in clean_run.stdout.splitlines() if check in line]


def test_clean_program_exits_zero(clean_run: subprocess.CompletedProcess[str]) -> None:
    assert clean_run.returncode == 0, clean_run.stdout[-3000:] + clean_run.stderr[-2000:]
    assert set(_results(clean_run.stdout)) == set(CHECKS)


def test_barrier_and_collective_errors_name_the_fault(clean_run: subprocess.CompletedProcess[str]) -> None:
    """The divergent cases end with a launch error whose message says what went wrong (never a hang:
    the run has a timeout)."""
    out = clean_run.stdout
    assert "__syncthreads() at line" in out and "16 threads exited" in out
    assert "divergent __syncthreads(): thread 16 waits at line" in out
    assert "wait at a warp collective" in out and "__shfl_sync with mask 0xffffffff" in out
    assert "unspecified launch failure" in out


def _assert_only_failing(run: subprocess.CompletedProcess[str], expected_failures: set[str]) -> None:
    results = _results(run.stdout)
    assert set(results) == set(CHECKS), run.stdout[-3000:] + run.stderr[-2000:]
    # a planted bug's wrong matmul may or may not depend on the worker count: not judged here
    failed = {name for name, ok in results.items() if not ok} - {"deterministic_across_workers"}
    assert failed == expected_failures, run.stdout
    assert run.returncode != 0


def test_planted_missing_syncthreads_is_caught(binaries: dict[str, Path]) -> None:
    """Without the barrier after the compute loop the next tile's loads overwrite shared memory other
    threads still read; without the barrier after the warp sums are written the softmax reads stale
    sums."""
    _assert_only_failing(_run(binaries["missing_sync"]), {"matmul_tiled", "row_softmax"})


def test_planted_tile_bound_and_wrong_lane_are_caught(binaries: dict[str, Path]) -> None:
    """The off-by-one tile bound reads one float past the end of A: the guard zone after every
    allocation reads as NaN. The shuffle from lane + offset + 1 sums the wrong values."""
    run = _run(binaries["tile_and_lane"])
    _assert_only_failing(run, {"matmul_tiled", "block_reduce"})
    assert "block_reduce: sum" in run.stdout


def test_bench_kernel_runs(binaries: dict[str, Path]) -> None:
    run = _run(binaries["clean"], "bench", "64")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS bench_stencil" in run.stdout and "blocks/s" in run.stdout


def _conversion_inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, 65536.0, 1e9, -1e9, np.inf, -np.inf,
                        2.0**-14, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0001, 2.0**-26, 3 * 2.0**-25, 6.1e-5, 1e-40,
                        1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.4e38, 1.17e-38,
                        0.1, 1 / 3, 2.5, 1e-8], dtype=np.float32)
    # halfway points between neighbouring halves and bfloat16s: the round-to-nearest-even cases
    h = rng.integers(0, 0x7BFF, 400).astype(np.uint16)
    ties_h = ((h.view(np.float16).astype(np.float32) + (h + 1).view(np.float16).astype(np.float32)) / 2)
    b = rng.integers(0, 0x7F00, 400).astype(np.uint32) << 16
    ties_b = (b | 0x8000).view(np.float32)
    wide = (rng.standard_normal(3000) * np.exp(rng.uniform(-20, 12, 3000))).astype(np.float32)
    a = np.concatenate([special, ties_h.astype(np.float32), -ties_b, wide]).astype(np.float32)
    other = (rng.standard_normal(a.size) * np.exp(rng.uniform(-8, 6, a.size))).astype(np.float32)
    return a, other


def test_half_and_bfloat16_match_numpy_and_ml_dtypes(binaries: dict[str, Path], tmp_path: Path) -> None:
    a, b = _conversion_inputs()
    n = a.size
    (tmp_path / "in.bin").write_bytes(np.concatenate([a, b]).tobytes())
    run = _run(binaries["clean"], "convert", str(tmp_path / "in.bin"), str(tmp_path / "out.bin"))
    assert run.returncode == 0, run.stdout + run.stderr
    raw = (tmp_path / "out.bin").read_bytes()
    u16 = np.frombuffer(raw[: 7 * 2 * n], dtype=np.uint16).reshape(7, n)
    f32 = np.frombuffer(raw[7 * 2 * n:], dtype=np.float32).reshape(4, n)
    bf16 = ml_dtypes.bfloat16
    with np.errstate(over="ignore", invalid="ignore"):
        ha, hb = a.astype(np.float16), b.astype(np.float16)
        ba, bb = a.astype(bf16), b.astype(bf16)
        expected_u16 = {
            "__float2half_rn": ha.view(np.uint16),
            "__float2bfloat16_rn": ba.view(np.uint16),
            "__hadd": (ha + hb).view(np.uint16),
            "__hmul": (ha * hb).view(np.uint16),
            # float64 holds the exact product; one rounding of the sum to half is the fused result
            "__hfma": (ha.astype(np.float64) * hb.astype(np.float64) + hb.astype(np.float64)).astype(np.float16)
            .view(np.uint16),
            "__hadd(bf16)": (ba.astype(np.float32) + bb.astype(np.float32)).astype(bf16).view(np.uint16),
            "__hmul(bf16)": (ba.astype(np.float32) * bb.astype(np.float32)).astype(bf16).view(np.uint16),
        }
        expected_f32 = {
            "__half2float": ha.astype(np.float32),
            "__bfloat162float": ba.astype(np.float32),
            "__low2float": ha.astype(np.float32),
            "__high2float": hb.astype(np.float32),
        }
    for row, (name, want) in enumerate(expected_u16.items()):
        got = u16[row]
        # NaN results: CUDA returns the canonical NaN 0x7FFF, NumPy keeps a payload; compare NaN-ness
        want_nan = np.isnan(want.view(np.float16) if "bf16" not in name and "bfloat" not in name
                            else want.view(bf16).astype(np.float32))
        got_nan = (got & 0x7FFF) == 0x7FFF
        bad = np.flatnonzero((got != want) & ~(want_nan & got_nan))
        assert bad.size == 0, f"{name}: {bad.size} differ, e.g. a={a[bad[0]]!r} b={b[bad[0]]!r} " \
                              f"got 0x{got[bad[0]]:04x} want 0x{want[bad[0]]:04x}"
    for row, (name, want) in enumerate(expected_f32.items()):
        got = f32[row]
        assert np.array_equal(got, want, equal_nan=True), name


@pytest.mark.slow
def test_sanitizers_find_nothing_in_the_clean_checks_and_the_tile_overrun(tmp_path: Path) -> None:
    """Under AddressSanitizer and UBSan (fiber switches annotated for ASan) the checks run clean,
    and the planted off-by-one tile bound is reported as a heap-buffer-overflow in the kernel."""
    exe = _compile(tmp_path / "suite_asan", ["-DPLANT_TILE_OFF_BY_ONE", "-fsanitize=address,undefined", "-g"])
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="print_stacktrace=1")
    clean = subprocess.run([str(exe), "all-but-matmul"], capture_output=True, text=True, timeout=RUN_TIMEOUT,
                           env=env)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
    assert "AddressSanitizer" not in clean.stderr and "runtime error:" not in clean.stderr, clean.stderr[-3000:]
    assert set(_results(clean.stdout)) == set(CHECKS) - {"matmul_tiled", "deterministic_across_workers"}
    overrun = subprocess.run([str(exe), "matmul"], capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env)
    assert overrun.returncode != 0
    assert "AddressSanitizer: heap-buffer-overflow" in overrun.stderr, overrun.stderr[-3000:]
    assert "matmul_tiled" in overrun.stderr


@pytest.mark.slow
def test_suite_compiles_with_nvcc(tmp_path: Path) -> None:
    """The test programs are real CUDA: nvcc compiles them, warnings as errors, for sm_90 (and
    with each planted bug)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc")
    defines = ["-DPLANT_MISSING_SYNC", "-DPLANT_TILE_OFF_BY_ONE", "-DPLANT_SHFL_WRONG_LANE"]
    for extra in ([], defines):
        r = subprocess.run([nvcc, "-arch=sm_90", "-Werror", "all-warnings", "-std=c++17", f"-I{RUNTIME}", *extra,
                            "-c", str(SUITE), "-o", str(tmp_path / "suite.o")],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-4000:]
