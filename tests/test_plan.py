"""The run plan of the GPU profiles, field by field, and the preflight refusal without GPUs."""

from __future__ import annotations

import json

import pytest

from repro import cli, plan, runner, weights
from repro.engine.process_vars import GPU_HOST_VARIABLES
from repro.profiles import NUM_SPECULATIVE_TOKENS, get_profile

NO_GPU = {"gpus": [], "cpu": {}, "memory_bytes": 0}
H200 = {"name": "NVIDIA H200", "memory_bytes": 143771 << 20}
SHA = "89abcdef0123456789abcdef0123456789abcdef"


def _common(settings, *, tp, apc, arm):
    assert settings["tensor_parallel_size"] == tp
    assert settings["enable_prefix_caching"] is apc
    assert settings["max_model_len"] == 10240
    # Upstream: 8 at a time in cold-race only; multi-turn sends all 32 at vLLM's default.
    assert settings["max_num_seqs"] == (8 if arm == "cold-race" else "vLLM default")
    assert settings["gpu_memory_utilization"] == 0.8
    assert settings["trust_remote_code"] is True
    assert settings["enforce_eager"] is True
    assert settings["enable_chunked_prefill"] is True
    assert settings["mamba_cache_mode"] == "align"
    assert settings["speculative_config"] == {
        "method": "mtp",
        "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
    }
    assert settings["seed"] == 0


def _plan(name, tmp_path, hardware=NO_GPU, lock=None):
    return plan.build_plan(
        get_profile(name),
        hardware=hardware,
        cache=tmp_path / "cache",
        out_dir=tmp_path / "out",
        lock_path=lock or tmp_path / "weights.lock.json",
    )


def test_nemotron_plan(tmp_path):
    doc = _plan("nemotron-super", tmp_path)
    repo = "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16"
    assert doc["profile"] == "nemotron-super"
    assert doc["model"] == {
        "repo_id": repo,
        "revision": "unresolved: first fetch pins it",
        "revision_source": "unresolved",
    }
    assert doc["arms"] == ["cold-race", "multi-turn"]
    assert doc["hardware"]["needed"] == {
        "gpus": 4,
        "memory_gib_each": 140,
        "tensor_parallel_size": 4,
    }
    assert doc["hardware"]["found"]["gpus"] == []
    assert doc["hardware"]["found"]["satisfied"] is False
    assert "needs 4 GPU(s)" in doc["hardware"]["found"]["refusal"]

    assert set(doc["runs"]) == {"cold-race", "multi-turn"}
    for arm in ("cold-race", "multi-turn"):
        _common(doc["runs"][arm]["apc"], tp=4, apc=True, arm=arm)
        _common(doc["runs"][arm]["control"], tp=4, apc=False, arm=arm)
    assert doc["runs"]["cold-race"]["apc"]["max_num_batched_tokens"] == 4096
    assert doc["runs"]["cold-race"]["control"]["max_num_batched_tokens"] == 4096
    assert "max_num_batched_tokens" not in doc["runs"]["multi-turn"]["apc"]
    # APC and control differ in that one setting only.
    for arm in doc["runs"]:
        apc, control = doc["runs"][arm]["apc"], doc["runs"][arm]["control"]
        assert {k for k in apc if apc[k] != control.get(k)} == {"enable_prefix_caching"}

    assert doc["environment"] == {
        **GPU_HOST_VARIABLES,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "HF_HUB_OFFLINE": "1",
    }

    repo_dir = (
        tmp_path / "cache"
    ).resolve() / "models--nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-BF16"
    assert doc["weights"]["repo_folder"] == str(repo_dir)
    assert doc["weights"]["snapshot"] is None and doc["weights"]["manifest_present"] is False
    container = doc["container"]
    assert "--image" in container["image"]
    assert container["network"] == "none"
    assert container["mounts"] == [
        {
            "what": "model",
            "source": str(repo_dir),
            "target": "/model",
            "read_only": True,
        },
        {
            "what": "output",
            "source": str((tmp_path / "out").resolve()),
            "target": "/out",
            "read_only": False,
        },
    ]
    assert container["model_path"] == "/model/snapshots/<revision>"

    est = doc["memory_estimate"]
    assert est["kind"] == "estimate"
    assert est["weights_gib_per_gpu"] == round(120e9 * 2 / 4 / 2**30, 1)  # 55.9
    assert est["estimate_gib_per_gpu"] == round(120e9 * 2 / 4 / 2**30 + 16, 1)
    json.dumps(doc)  # the plan is JSON


def test_qwen_plan_with_pinned_revision(tmp_path):
    lock = tmp_path / "weights.lock.json"
    lock.write_text(
        json.dumps({"models": {"Qwen/Qwen3.6-27B-FP8": {"revision": SHA}}}), encoding="utf-8"
    )
    doc = _plan("qwen3.6-27b-fp8", tmp_path, hardware={"gpus": [H200]}, lock=lock)
    assert doc["model"] == {
        "repo_id": "Qwen/Qwen3.6-27B-FP8",
        "revision": SHA,
        "revision_source": "lock file",
    }
    assert doc["arms"] == ["multi-turn"]
    assert list(doc["runs"]) == ["multi-turn"]
    _common(doc["runs"]["multi-turn"]["apc"], tp=1, apc=True, arm="multi-turn")
    _common(doc["runs"]["multi-turn"]["control"], tp=1, apc=False, arm="multi-turn")
    assert doc["hardware"]["needed"] == {
        "gpus": 1,
        "memory_gib_each": 80,
        "tensor_parallel_size": 1,
    }
    assert doc["hardware"]["found"] == {
        "gpus": [{"name": "NVIDIA H200", "memory_gib": 140.4}],
        "satisfied": True,
        "refusal": None,
    }
    assert doc["environment"] == {
        **GPU_HOST_VARIABLES,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "HF_HUB_OFFLINE": "1",
    }
    snapshot = weights.snapshot_dir((tmp_path / "cache").resolve(), "Qwen/Qwen3.6-27B-FP8", SHA)
    assert doc["weights"]["snapshot"] == str(snapshot)
    assert doc["container"]["model_path"] == f"/model/snapshots/{SHA}"
    command = doc["container"]["command"]
    assert command[command.index("--model-path") + 1] == doc["container"]["model_path"]
    assert command[command.index("--out") + 1] == "/out"
    est = doc["memory_estimate"]
    assert (est["parameters"], est["bytes_per_parameter"], est["tensor_parallel_size"]) == (
        27e9,
        1,
        1,
    )
    assert est["estimate_gib_per_gpu"] == round(27e9 / 2**30 + 16, 1)  # 41.1
    assert est["estimate_gib_per_gpu"] < est["profile_minimum_gib_per_gpu"]


@pytest.mark.parametrize("name", ["nemotron-super", "qwen3.6-27b-fp8"])
def test_cli_plan_and_preflight_refusal(name, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr("repro.machine_facts.collect_hardware", lambda: NO_GPU)
    assert cli.main(["plan", "--profile", name, "--json", "--cache", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["profile"] == name

    code = cli.main(["plan", "--profile", name, "--preflight", "--cache", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 2
    profile = get_profile(name)
    assert (
        f"error: profile {name!r} needs {profile.min_gpus} GPU(s) with at least "
        f"{profile.min_gpu_memory_gib} GB each" in captured.err
    )
    assert "found: no NVIDIA GPU (nvidia-smi found none)" in captured.err
    assert "engine settings" in captured.out  # the plan was printed first


def test_preflight_with_the_gpus_names_the_container_run(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr("repro.machine_facts.collect_hardware", lambda: {"gpus": [H200]})
    code = cli.main(
        ["plan", "--profile", "qwen3.6-27b-fp8", "--preflight", "--cache", str(tmp_path)]
    )
    assert code == 0
    assert "--container --image TAG" in capsys.readouterr().err


def test_refusal_on_this_machine():
    from repro import machine_facts

    hardware = machine_facts.collect_hardware()
    if hardware["gpus"]:
        pytest.skip("this machine has GPUs; the refusal is tested with a faked machine above")
    doc = plan.build_plan(get_profile("nemotron-super"), hardware=hardware)
    assert doc["hardware"]["found"]["refusal"] == (
        "profile 'nemotron-super' needs 4 GPU(s) with at least 140 GB each (tensor parallel 4); "
        "found: no NVIDIA GPU (nvidia-smi found none). Run it on such a host, or run "
        "`nox -s repro-tiny` here."
    )


def test_plan_names_the_image_pins_and_the_one_that_is_missing(monkeypatch):
    """The CUDA base digest cannot be resolved on a machine that cannot reach the registry:
    the plan shows every other pin (the wheel lock's) and names the one that needs it."""
    doc = plan.build_plan(get_profile("nemotron-super"), hardware={"gpus": []}, vllm_ref="0.26.0")
    pins = doc["container"]["image_pins"]
    assert pins["vllm_ref"] == "0.26.0" and pins["cuda_variant"] == "cu130"
    assert pins["pins"]["wheel torch"].startswith("2.11.0 (")  # 0.26.0's torch, from the lock
    assert pins["pins"]["python"] == "3.12"
    assert "no digest" in pins["pins"]["base (registry)"]
    assert sum("update_base_images.py" in item for item in pins["needs_registry"]) == 1

    from repro.containers import pins as pins_mod

    table = pins_mod.load_pins()
    table["cuda"]["cu130"]["digest"] = "sha256:" + "ab" * 32
    monkeypatch.setattr(pins_mod, "load_pins", lambda path=None: table)
    pinned = plan.image_pins("0.26.0", "cu130")
    assert pinned["needs_registry"] == []
    assert pinned["pins"]["base (registry)"].endswith("@sha256:" + "ab" * 32)


def test_plans_show_upstreams_sampling(tmp_path):
    doc = _plan("nemotron-super", tmp_path)
    cold, multi = doc["sampling"]["cold-race"], doc["sampling"]["multi-turn"]
    for group in (cold["wave1"], cold["wave2"], multi["turn 2"]):
        assert (group["temperature"], group["max_tokens"], group["stop"]) == (0.0, 24, ["\n"])
        assert group["ignore_eos"] is False
    assert cold["wave1"]["requests"] == 16 and cold["wave1"]["asks"] == "fact n - 2"
    assert cold["liveness probe"]["max_tokens"] == 8
    assert (cold["liveness decode"]["requests"], cold["liveness decode"]["max_tokens"]) == (4, 128)
    assert multi["turn 1"]["min_tokens"].startswith("2 B - m + 96")
    assert multi["turn 1"]["max_tokens"] == "min_tokens + 64"
    assert multi["turn 1"]["requests"] == multi["turn 2"]["requests"] == 32


@pytest.mark.parametrize(
    ("name", "repo", "memory"),
    [
        ("qwen3.5-4b", "Qwen/Qwen3.5-4B", 40),
        ("nemotron-3.5-nano", "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16", 140),
    ],
)
def test_one_gpu_small_model_plans(name, repo, memory, tmp_path):
    doc = _plan(name, tmp_path, hardware={"gpus": [H200]})
    assert doc["model"]["repo_id"] == repo
    assert doc["hardware"]["needed"] == {
        "gpus": 1,
        "memory_gib_each": memory,
        "tensor_parallel_size": 1,
    }
    assert doc["hardware"]["found"]["satisfied"] is True
    assert doc["arms"] == ["cold-race", "multi-turn"]
    for arm in doc["arms"]:
        _common(doc["runs"][arm]["apc"], tp=1, apc=True, arm=arm)
        _common(doc["runs"][arm]["control"], tp=1, apc=False, arm=arm)
    assert set(doc["sampling"]) == {"cold-race", "multi-turn"}
    est = doc["memory_estimate"]
    assert est["estimate_gib_per_gpu"] < memory


class _CapturingDocker:
    """Stands in for the Docker daemon at the one call that would start a GPU container
    (this machine has no GPU): it keeps `containers.create`'s arguments and refuses."""

    def __init__(self):
        self.created = None
        self.containers = self

    def list(self, **_filters):
        return []

    def create(self, image, **kwargs):
        self.created = {"image": image, **kwargs}
        raise RuntimeError("stand-in daemon: nothing is started")


def test_the_plan_is_the_container_a_run_starts(tmp_path):
    """`plan` prints the Launch that `run --container` starts: same command, mounts,
    environment and limits (the image and the host's weights check are known only then)."""
    from repro.containers.images import ImageFacts
    from repro.containers.launch import CONTAINER_OUT
    from repro.containers.run import RunRequest, run_profile_in_container
    from repro.runcontext import IMAGE_ENV

    lock = tmp_path / "weights.lock.json"
    lock.write_text(json.dumps({"models": {"Qwen/Qwen3.6-27B-FP8": {"revision": SHA}}}))
    profile = get_profile("qwen3.6-27b-fp8")
    host_env = {"NCCL_NVLS_ENABLE": "7"}  # a user's own value travels in both
    doc = plan.build_plan(
        profile,
        hardware={"gpus": [H200]},
        cache=tmp_path / "cache",
        out_dir=tmp_path / "out",
        lock_path=lock,
        run_id="r1",
        host_env=host_env,
    )
    planned = doc["container"]
    client = _CapturingDocker()
    image = ImageFacts(id="sha256:" + "1" * 64, labels={}, tags=["kit:cuda"])
    request = RunRequest(
        profile=profile,
        arms=list(profile.arms),
        out_dir=tmp_path / "out",
        run_id="r1",
        overrides={},
        fault_kind=None,
        command=["python", "-m", "repro", "run"],
        run_args=[],
        arm_timeout_s=runner.DEFAULT_ARM_TIMEOUT_S,
    )
    repo_dir = weights.repo_folder((tmp_path / "cache").resolve(), profile.model)
    repo_dir.mkdir(parents=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("os.environ", {**host_env, "PATH": "/usr/bin"})
        run_profile_in_container(
            request, client=client, image=image, model_dir=repo_dir,
            model_subpath=f"snapshots/{SHA}", echo=None,
        )  # fmt: skip
    started = client.created
    assert started["image"] == image.id and planned["image"].startswith("the kit's CUDA image")
    assert ["python", "-m", "repro", *started["command"]] == planned["command"]
    assert planned["command"][planned["command"].index("--out") + 1] == CONTAINER_OUT
    assert [
        {"source": m["Source"], "target": m["Target"], "read_only": m["ReadOnly"]}
        for m in started["mounts"]
    ] == [{k: m[k] for k in ("source", "target", "read_only")} for m in planned["mounts"]]
    environment = dict(started["environment"])
    assert json.loads(environment.pop(IMAGE_ENV))["id"] == image.id
    assert environment == planned["environment"] and environment["NCCL_NVLS_ENABLE"] == "7"
    assert started["device_requests"][0]["Count"] == planned["gpus"] == 1
    assert (started["shm_size"], started["ipc_mode"]) == (planned["shm_size"], "private")
    assert {u["Name"]: {"soft": u["Soft"], "hard": u["Hard"]} for u in started["ulimits"]} == (
        planned["ulimits"]
    )
