"""calibrate/step_profile.py: kernels sorted into kinds and summed per step (the profiling itself needs
a GPU; its summary does not)."""
from __future__ import annotations

import pytest

from calibrate import step_profile


@pytest.mark.parametrize("name, kind", [
    ("nvjet_sm90_qqtst_128x256_64x4_2x1_v_bz_coopB_TNT", "fp8 gemm"),     # E4M3 x E4M3 cuBLAS GEMM
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTN", "gemm"),           # 16-bit cuBLAS GEMM
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("void at::native::unrolled_elementwise_kernel<float8_copy>", "cast/transpose"),
    ("flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", "attention"),
    ("void at::native::reduce_kernel<512, 1>", "reduction"),
    ("void multi_tensor_apply_kernel<AdamFunctor>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", "element-wise"),
    ("void at::native::embedding_backward_feature_kernel<c10::BFloat16>", "other"),
])
def test_kind_of(name, kind):
    assert step_profile.kind_of(name) == kind


def test_kernel_summary_is_per_step_and_leaves_out_markers_and_aten_operators():
    kernels = [("nvjet_sm90_tst_gemm", 4000.0), ("flash_bwd_kernel", 2000.0), ("ProfilerStep#3", 9e6),
               ("aten::mm", 3000.0), ("nvjet_sm90_tst_gemm", 2000.0), ("idle", 0.0)]
    out = step_profile.kernel_summary(kernels, steps=2)
    assert out["kinds_ms"] == {"gemm": 3.0, "attention": 1.0}
    assert list(out["kinds_ms"]) == ["gemm", "attention"]                 # longest first
    assert out["device_ms"] == pytest.approx(4.0)
    assert out["top_kernels_ms"] == [("nvjet_sm90_tst_gemm", 3.0), ("flash_bwd_kernel", 1.0)]
    with pytest.raises(ValueError, match="steps 0"):
        step_profile.kernel_summary(kernels, steps=0)


def test_the_gpu_measurements_are_importable_without_a_gpu():
    assert callable(step_profile.profile_job) and callable(step_profile.time_casts)
    assert callable(step_profile.cast_transpose_matches_eager)
