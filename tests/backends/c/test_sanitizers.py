"""A sample of conformance cases passes under AddressSanitizer and UBSan builds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

# One or two cases per kernel family: elementwise and broadcasting, reductions, softmax,
# normalisation, matmul/gemm, conv, pooling, resize, pad, shape ops, gather/scatter, control flow,
# sampling, spectral, detection and sorting.
SAMPLE = (
    "test_add_bcast|test_mul_uint8|test_div_example|test_pow_types_float32_int64|test_where_long_example"
    "|test_cast_FLOAT_to_FLOAT16|test_clip_default_inbounds|test_gelu_tanh_2"
    "|test_reduce_sum_negative_axes_keepdims_random|test_reduce_max_do_not_keepdims_random|test_argmax_keepdims_random"
    "|test_softmax_axis_1|test_logsoftmax_large_number|test_layer_normalization_4d_axis1"
    "|test_batchnorm_epsilon|test_instancenorm_example|test_matmul_4d|test_gemm_all_attributes|test_einsum_batch_matmul"
    "|test_conv_with_strides_and_asymmetric_padding|test_convtranspose_pads|test_basic_conv_with_padding"
    "|test_maxpool_2d_ceil|test_averagepool_2d_pads_count_include_pad|test_globalaveragepool"
    "|test_resize_upsample_scales_linear|test_resize_downsample_sizes_cubic|test_reflect_pad|test_edge_pad"
    "|test_reshape_negative_extended_dims|test_transpose_all_permutations_3|test_concat_3d_axis_negative_2"
    "|test_slice_neg_steps|test_split_variable_parts_2d_opset18|test_tile|test_expand_dim_changed"
    "|test_gather_negative_indices|test_gather_elements_1|test_gathernd_example_int32_batch_dim1"
    "|test_scatter_elements_with_reduction_max|test_scatternd_add|test_onehot_with_axis|test_nonzero_example"
    "|test_range_float_type_positive_delta|test_top_k_smallest|test_cumsum_2d_axis_1|test_triu"
    "|test_if|test_loop11|test_depthtospace_crd_mode_example"
    "|test_gridsample_bicubic|test_roialign_mode_max|test_col2im_pads|test_dft_irfft|test_stft_with_window"
    "|test_nonmaxsuppression_two_batches|test_unique_sorted_with_axis_3d|test_deform_conv_with_mask_bias"
)


@pytest.mark.slow
def test_sample_passes_under_asan_and_ubsan(node_tests: Path, tmp_path: Path) -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out = tmp_path / "results.json"
    env = dict(os.environ, CUVIL_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run(
        [sys.executable, "-m", "cuvil", "conformance", str(node_tests), "-t", "generic", "--sanitize",
         "-k", f"^({SAMPLE})$", "--json", str(out)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=1500,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "AddressSanitizer" not in r.stderr and "runtime error:" not in r.stderr, r.stderr[-3000:]
    cases = json.loads(out.read_text())["cases"]
    assert len(cases) == SAMPLE.count("|") + 1
    bad = [(c["name"], c["status"], c["message"][:200]) for c in cases if c["status"] != "pass"]
    assert not bad, bad


@pytest.mark.slow
def test_sample_builds_without_warnings(node_tests: Path, tmp_path: Path) -> None:
    """-Wall -Wextra are on for every build: the generated C must not trigger them."""
    import onnx

    import cuvil

    noisy = []
    for name in SAMPLE.split("|"):
        model = onnx.load(str(node_tests / name / "model.onnx"))
        m = cuvil.compile(model, target="native", cache_dir=str(tmp_path))
        log = m.build_info.warnings  # type: ignore[union-attr]
        if log.strip():
            noisy.append((name, log[:500]))
    assert not noisy, noisy
