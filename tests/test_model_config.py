"""`run --model`: the config.json preflight refuses a model that cannot show the bug.

The hybrid configs are the kit's tiny models' (built here by `repro.models.tinymodel`, as a run
would); the dense one is a Llama-3-shaped config.json (tests/fixtures/model-configs).
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from repro import model_config
from repro.model_config import ModelUnsupported
from repro.models import tinymodel

FIXTURES = Path(__file__).parent / "fixtures" / "model-configs"
REPO = Path(__file__).resolve().parent.parent


def checkpoint(tmp_path: Path, config: dict, name: str = "model") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def tiny_configs() -> dict[str, Path]:
    """The kit's tiny hybrid models, built (or found in the cache) as a tiny run does."""
    pytest.importorskip("torch", reason="building the tiny models needs the engine environment")
    return {
        family: tinymodel.ensure_tiny_model(recipe=tinymodel.recipe_for(family))
        for family in tinymodel.FAMILIES
    }


def test_llama_is_refused_naming_what_it_found(tmp_path):
    folder = checkpoint(tmp_path, fixture("llama-3.2-1b-shaped.json"))
    with pytest.raises(ModelUnsupported) as refused:
        model_config.check_model(str(folder))
    message = str(refused.value)
    assert "it has no Mamba or linear-attention layers and no MTP head" in message
    assert "model_type 'llama' (LlamaForCausalLM)" in message
    assert "no Mamba or linear-attention layers; no MTP head" in message
    assert "nothing was started" in message


def test_the_kits_tiny_models_pass(tiny_configs):
    qwen = model_config.check_model(str(tiny_configs["qwen3-next"]))
    assert (qwen.recurrent_layers, qwen.recurrent_source) == (2, "layer_types")
    assert (qwen.mtp_layers, qwen.mtp_source) == (1, "num_nextn_predict_layers")
    nemotron = model_config.check_model(str(tiny_configs["nemotron-h"]))
    assert (nemotron.recurrent_layers, nemotron.recurrent_source) == (
        2,
        "hybrid_override_pattern",
    )
    assert nemotron.mtp_layers == 1


def test_hybrid_without_an_mtp_head_is_refused(tiny_configs, tmp_path):
    config = json.loads((tiny_configs["nemotron-h"] / "config.json").read_text())
    config["num_nextn_predict_layers"] = 0
    folder = checkpoint(tmp_path, config)
    with pytest.raises(ModelUnsupported, match="it has no MTP head") as e:
        model_config.check_model(str(folder))
    assert "2 Mamba/linear-attention layers (from hybrid_override_pattern); no MTP head" in str(
        e.value
    )


def test_mtp_head_found_in_the_weights_when_the_config_is_silent(tiny_configs, tmp_path):
    # The tiny Qwen3-Next checkpoint carries mtp.* tensors; without the config's count the
    # preflight reads them from the safetensors header.
    source = tiny_configs["qwen3-next"]
    folder = tmp_path / "silent"
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["num_nextn_predict_layers"]
    (folder / "config.json").write_text(json.dumps(config))
    shape = model_config.check_model(str(folder))
    assert shape.mtp_layers == 1 and "mtp.* tensors in the checkpoint" in shape.mtp_source


def test_nested_text_config_of_a_multimodal_hybrid(tmp_path):
    shape = model_config.check_model(str(checkpoint(tmp_path, fixture("qwen3.5-shaped.json"))))
    assert (shape.recurrent_layers, shape.recurrent_source) == (6, "text_config.layer_types")
    assert (shape.mtp_layers, shape.mtp_source) == (1, "text_config.mtp_num_hidden_layers")


def test_safetensors_header_is_read_without_torch(tmp_path):
    header = json.dumps({"__metadata__": {}, "mtp.fc.weight": {}, "model.norm.weight": {}})
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode())
    assert model_config._mtp_tensor_count(tmp_path) == 1


def test_unreadable_models_are_named(tmp_path):
    with pytest.raises(model_config.ModelConfigUnavailable, match="has no config.json"):
        model_config.check_model(str(tmp_path))
    with pytest.raises(model_config.ModelConfigUnavailable, match="neither a model directory"):
        model_config.check_model("not-a-repo")
    with pytest.raises(model_config.ModelConfigUnavailable, match="fetch-weights --repo"):
        model_config.check_model("nobody-has/this-model-0")


def test_cli_refuses_a_non_hybrid_model_before_anything_starts(tmp_path):
    folder = checkpoint(tmp_path, fixture("llama-3.2-1b-shaped.json"), name="llama")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "repro", "run", "--model", str(folder), "--out", str(out)],
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "cannot show the hybrid prefix-cache bug" in proc.stderr, proc.stderr
    assert "model_type 'llama'" in proc.stderr
    assert not out.exists()  # no run directory, no engine, no arm


def test_cli_model_on_a_host_without_gpus_is_refused_after_the_config(
    tiny_configs, tmp_path, capsys
):
    from repro import cli

    out = tmp_path / "out"
    assert cli.main(["run", "--model", str(tiny_configs["nemotron-h"]), "--out", str(out)]) != 0
    assert "--model runs on NVIDIA GPUs and none was found" in capsys.readouterr().err
    assert not out.exists()


H200 = {"name": "NVIDIA H200", "memory_bytes": 143771 << 20}


@pytest.mark.parametrize(("tp_flag", "expected_tp"), [([], 2), (["--tp", "1"], 1)])
def test_cli_model_takes_tp_from_the_gpus_or_the_flag(
    tiny_configs, tmp_path, monkeypatch, tp_flag, expected_tp
):
    # Stand-in at the GPU boundary: two H200s reported by machine_facts, and the arms not run (no
    # GPU here). What is checked is the profile the kit would run.
    from repro import cli, runner
    from repro.evidence import summary

    monkeypatch.setattr("repro.machine_facts.collect_hardware", lambda: {"gpus": [H200, H200]})
    seen = {}

    def fake_run_profile(**kwargs):
        seen.update(kwargs)
        return {}

    monkeypatch.setattr(runner, "run_profile", fake_run_profile)
    monkeypatch.setattr(summary, "print_summary", lambda *a, **k: None)
    model = str(tiny_configs["qwen3-next"])
    assert cli.main(["run", "--model", model, *tp_flag, "--out", str(tmp_path)]) == 0
    profile = seen["profile"]
    assert (profile.name, profile.model, profile.tensor_parallel_size) == (
        "model",
        model,
        expected_tp,
    )
    assert seen["model_path"] == str(Path(model).resolve())
    assert seen["arms"] == ["cold-race", "multi-turn"]
    assert profile.engine_settings(arm="cold-race", prefix_caching=True)["max_num_seqs"] == 8
