"""What a GPU profile's run would do, before anything runs: `python -m repro plan --profile X`.

The plan names the model and the commit its weights are pinned at, the arms, the hardware
needed and found here, every engine setting of the APC run and the control of each arm, the
environment, where the weights are cached and how a container would mount them, and an
estimate of the GPU memory the model needs. It is what `nox -s repro-nemotron -- --dry-run`
and `nox -s repro-qwen -- --dry-run` print. The run itself goes into the kit's CUDA image
(`python -m repro run --profile X --container`, repro/containers/run.py), built here from
containers/cuda.Dockerfile and the ref's wheel lock when it is missing (docs/cuda-image.md).

GPU memory estimate (an estimate, not a measurement): parameter count x bytes per parameter
of the checkpoint's dtype (FP8: 1, BF16: 2), split evenly over the tensor-parallel GPUs,
plus a fixed headroom of ``HEADROOM_GIB`` per GPU for the KV cache and Mamba state of
``max_num_seqs`` sequences of ``max_model_len`` tokens, activations and the MTP drafter.
vLLM itself claims ``gpu_memory_utilization`` (0.9 by default) of each GPU whatever the model
needs; the estimate says whether the model fits, not what vLLM will take.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from repro import machine_facts, runner, weights
from repro.arms.common import sampling_plan
from repro.containers import DockerUnavailable, base, cuda, docker_client, images, pins
from repro.containers import labels as label_keys
from repro.containers.cuda import DEFAULT_VARIANT, LOCK_PYTHON
from repro.containers.launch import profile_launch
from repro.containers.refs import parse_vllm_ref
from repro.containers.run import RunRequest
from repro.core.atomicio import sha256_file
from repro.core.errors import HardwareUnavailable
from repro.installset import lock as lockmod
from repro.preflight import GIB, check_hardware
from repro.profiles import Profile

PLAN_VERSION = 1
HEADROOM_GIB = 16
IMAGE_CUDA = (
    "the kit's CUDA image for the pins below (containers/cuda.Dockerfile): found by its "
    "labels, or built (`nox -s build-image -- --variant cuda`), or given with --image TAG"
)
# The vLLM a GPU profile's image is built for unless --vllm says otherwise (its CUDA variant
# is containers.cuda.DEFAULT_VARIANT): the newest release whose torch pin
# containers/base-images.json records.
DEFAULT_GPU_VLLM = "0.32.0"
UNRESOLVED = "unresolved: first fetch pins it"

# Known sizes of the profiles' checkpoints: (parameters, bytes per parameter, where from).
MODEL_SIZES: dict[str, tuple[float, int, str]] = {
    "Qwen/Qwen3.6-27B-FP8": (27e9, 1, "27B parameters (model name), FP8 weights"),
    "Qwen/Qwen3.5-4B": (4e9, 2, "4B parameters (model name), BF16 weights"),
    "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16": (
        30e9,
        2,
        "30B parameters in total (model name; 3B active per token), BF16 weights",
    ),
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16": (
        120e9,
        2,
        "120B parameters in total (model name; 12B active per token), BF16 weights",
    ),
}


def memory_estimate(profile: Profile) -> dict[str, Any] | None:
    known = MODEL_SIZES.get(profile.model)
    if known is None:
        return None
    params, bytes_per_param, basis = known
    tp = profile.tensor_parallel_size
    weights_gib = params * bytes_per_param / GIB
    per_gpu = weights_gib / tp
    return {
        "kind": "estimate",
        "rule": (
            f"parameters x bytes per parameter / tensor parallel + {HEADROOM_GIB} GiB "
            "headroom per GPU (KV cache, Mamba state, activations, MTP drafter)"
        ),
        "basis": basis,
        "parameters": params,
        "bytes_per_parameter": bytes_per_param,
        "weights_gib_total": round(weights_gib, 1),
        "tensor_parallel_size": tp,
        "weights_gib_per_gpu": round(per_gpu, 1),
        "headroom_gib_per_gpu": HEADROOM_GIB,
        "estimate_gib_per_gpu": round(per_gpu + HEADROOM_GIB, 1),
        "profile_minimum_gib_per_gpu": profile.min_gpu_memory_gib,
    }


def _runs(profile: Profile) -> dict[str, dict[str, Any]]:
    runs = {}
    for arm in profile.arms:
        per_arm = {}
        for run, apc in (("apc", True), ("control", False)):
            try:
                per_arm[run] = profile.engine_settings(arm=arm, prefix_caching=apc)
            except ValueError:
                # The tiny profile sizes its cold-race budget from the Mamba block measured
                # at boot; show the rule instead of a number.
                settings = profile.engine_settings(arm=arm, prefix_caching=apc, mamba_block_size=1)
                settings["max_num_batched_tokens"] = (
                    f"{profile.cold_race_budget_blocks} x Mamba block size (measured at boot)"
                )
                per_arm[run] = settings
            # Upstream's multi-turn leaves max_num_seqs to vLLM (all 32 requests at once).
            per_arm[run].setdefault("max_num_seqs", "vLLM default")
        runs[arm] = per_arm
    return runs


def _local_client():
    """The daemon here, or None: the plan asks it only what is already built."""
    try:
        return docker_client(timeout=10)
    except DockerUnavailable:
        return None


def image_pins(
    vllm_ref: str, cuda_variant: str, *, python: str = LOCK_PYTHON, client: Any = "auto"
) -> dict[str, Any]:
    """Every pin the CUDA image would be built from, and those that need a registry (or an
    index) to resolve, named with what resolves them.

    ``client``: a docker-py client, None for none, or "auto" (the local daemon if one answers).
    With one, the pins made on this machine (the local base's image id, the image already
    built from the lock and this kit) are resolved instead of described."""
    ref = parse_vllm_ref(vllm_ref)
    if client == "auto":
        client = _local_client()
    table = pins.load_pins()
    entry = table.get("cuda", {}).get(cuda_variant) or {}
    pinned: dict[str, str] = {"vllm": f"{ref.value} ({ref.kind})"}
    needs_registry: list[str] = []
    if entry.get("digest"):
        pinned["base (registry)"] = f"{entry['image']}:{entry['tag']}@{entry['digest']}"
    elif entry:
        pinned["base (registry)"] = f"{entry['image']}:{entry['tag']} (no digest pinned)"
        needs_registry.append(
            f"the digest of {entry['image']}:{entry['tag']} (run containers/update_base_images.py "
            f"where the registry is reachable); until then the image is built on the local base"
        )
    pinned["base (local)"] = _local_base_pin(client, base)
    kit = machine_facts.collect_kit(Path(__file__).resolve().parent.parent)
    pinned["kit"] = f"{kit.get('git_commit') or 'no git commit'}" + (
        " (clean)" if kit.get("dirty") is False else " (uncommitted changes: built anew)"
    )
    if ref.kind == "commit":
        index = cuda.commit_index_url(ref.value, cuda_variant)
        pinned["vllm wheels"] = index
    lock_path = cuda.default_lock_path(ref.value, cuda_variant, python)
    doc: dict[str, Any] = {"vllm_ref": ref.value, "cuda_variant": cuda_variant}
    if lock_path.is_file():
        lock = lockmod.read_lock(lock_path)
        by_name = {p["name"].lower(): p for p in lock["packages"]}
        origins = {o: sum(p["origin"] == o for p in lock["packages"]) for o in lockmod.ORIGINS}
        size = sum(p["bytes"] or 0 for p in lock["packages"])
        pinned["wheel lock"] = f"{lock_path.name} (sha256 {sha256_file(lock_path)})"
        pinned["python"] = lock["python"]["version"]
        for name in ("vllm", "torch", "nvidia-cuda-runtime", "triton"):
            if name in by_name:
                pinned[f"wheel {name}"] = f"{by_name[name]['version']} ({by_name[name]['sha256']})"
        pinned["wheels"] = f"{len(lock['packages'])} wheels, {size / 2**20:.0f} MiB: " + ", ".join(
            f"{n} {o}" for o, n in origins.items()
        )
        pinned["built here"] = _built_image_pin(client, ref.value, cuda_variant, lock_path, kit)
    else:
        needs = "PyPI" if ref.kind == "release" else f"PyPI and {pinned['vllm wheels']}"
        needs_registry.append(
            f"the wheel lock {lock_path.name}: `nox -s cuda-lock -- --vllm {ref.value}` "
            f"(needs {needs})"
        )
        doc["unpinned"] = f"no wheel lock {lock_path}"
    doc["pins"] = pinned
    doc["needs_registry"] = needs_registry
    return doc


def _local_base_pin(client, base) -> str:
    made_by = "`python -m repro base-image --recipe ubuntu-noble` (Ubuntu's archive, no registry)"
    tag, recipe = base.RECIPES["ubuntu-noble"]
    if client is None:
        return (
            f"{tag}: no Docker daemon answers here; made by {made_by}, pinned by its image id "
            f"at build"
        )
    # lazy: docker-py, needed only where a Docker daemon is used
    import docker

    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return f"{tag}: not made here yet; the build makes it ({made_by}, ~3 min)"
    if (image.labels or {}).get(label_keys.BASE_RECIPE) != recipe.digest():
        return f"{tag} = {image.id}, made by another recipe: the build makes it again"
    return f"{tag} = {image.id}, made here by {made_by}"


def _built_image_pin(client, ref: str, variant: str, lock_path: Path, kit) -> str:
    build = f"`nox -s build-image -- --variant cuda --vllm {ref}`"
    if client is None:
        return f"no Docker daemon answers here; a run builds it ({build})"
    found = images.find_cuda_images(
        client, vllm_ref=ref, variant=variant, lock_sha256=sha256_file(lock_path), kit=kit
    )
    if not found:
        return f"not built here from this lock and kit; a run builds it first ({build})"
    return f"{found[0].name} = {found[0].id} (built here from this lock and kit)"


def build_plan(
    profile: Profile,
    *,
    hardware: dict[str, Any],
    cache: Path | None = None,
    out_dir: Path | None = None,
    lock_path: Path = weights.DEFAULT_LOCK,
    vllm_ref: str | None = None,
    run_id: str = "<run id>",
    host_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The plan of ``profile`` on a machine with ``hardware``
    (``machine_facts.collect_hardware()``).

    Its container section is the `repro.containers.launch.Launch` that `run --container`
    starts for the same profile and output folder, with the image and run id not known yet
    (``run_id`` stands in; the host's check of the weights is made at run time)."""
    has_weights = profile.device == "cuda"
    gpus = hardware.get("gpus") or []
    try:
        check_hardware(profile, hardware)
        refusal = None
    except HardwareUnavailable as exc:
        refusal = str(exc)

    model: dict[str, Any] = {"repo_id": profile.model if has_weights else None}
    weights_section = None
    container: dict[str, Any] = {"image": IMAGE_CUDA, "network": "none"}
    if has_weights:
        container["image_pins"] = image_pins(vllm_ref or DEFAULT_GPU_VLLM, DEFAULT_VARIANT)
        revision, source = weights.pinned_revision(
            profile.model, profile_revision=profile.revision, lock_path=lock_path
        )
        model["revision"] = revision or UNRESOLVED
        model["revision_source"] = source
        if revision is None:
            container["image_pins"]["needs_registry"].append(
                f"the weights' commit of {profile.model}: `python -m repro fetch-weights "
                f"--profile {profile.name}` pins it in {lock_path.name} (needs the Hugging Face "
                f"Hub)"
            )
        cache = Path(cache or weights.default_cache_dir()).expanduser().resolve()
        repo_dir = weights.repo_folder(cache, profile.model)
        snapshot = weights.snapshot_dir(cache, profile.model, revision) if revision else None
        weights_section = {
            "cache": str(cache),
            "repo_folder": str(repo_dir),
            "snapshot": str(snapshot) if snapshot else None,
            "manifest_present": bool(snapshot and (snapshot / weights.MANIFEST_NAME).is_file()),
            "fetch": f"python -m repro fetch-weights --profile {profile.name}",
            "verify": f"python -m repro verify-weights --profile {profile.name}",
        }
        out = Path(out_dir).resolve() if out_dir is not None else Path("artifacts/<run id>")
        request = RunRequest(
            profile=profile,
            arms=list(profile.arms),
            out_dir=out,
            run_id=run_id,
            overrides={},
            fault_kind=None,
            command=[],
            run_args=[],
            arm_timeout_s=runner.DEFAULT_ARM_TIMEOUT_S,
        )
        launch = profile_launch(
            request,
            image=IMAGE_CUDA,
            image_env=None,
            # The whole repo folder: snapshot files are links into its blobs/.
            model_dir=repo_dir,
            model_subpath=f"snapshots/{revision or '<revision>'}",
            weights_pin=None,
            host_env=dict(os.environ if host_env is None else host_env),
        )
        container.update(launch.as_record())
    else:
        model["description"] = profile.model

    return {
        "plan_version": PLAN_VERSION,
        "profile": profile.name,
        "device": profile.device,
        "model": model,
        "arms": list(profile.arms),
        "why_arms": profile.why_arms,
        "hardware": {
            "needed": {
                "gpus": profile.min_gpus,
                "memory_gib_each": profile.min_gpu_memory_gib,
                "tensor_parallel_size": profile.tensor_parallel_size,
            },
            "found": {
                "gpus": [
                    {"name": g.get("name"), "memory_gib": round((g["memory_bytes"] or 0) / GIB, 1)}
                    for g in gpus
                ],
                "satisfied": refusal is None,
                "refusal": refusal,
            },
        },
        "runs": _runs(profile),
        "sampling": sampling_plan(profile),
        "environment": {**profile.engine_variables(), "HF_HUB_OFFLINE": "1"},
        "weights": weights_section,
        "container": container,
        "memory_estimate": memory_estimate(profile),
    }


def print_plan(doc: dict[str, Any], *, with_json: bool = True) -> None:
    """The plan as tables (rich), then as JSON."""
    # lazy: rich is slow to import; only output that draws needs it
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console.width = 200  # piped or under nox: wide rows rather than wrapped cells
    model = doc["model"]
    hw = doc["hardware"]
    found = hw["found"]["gpus"]
    summary = Table(title=f"plan: {doc['profile']}", show_header=False)
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("model", model.get("repo_id") or model.get("description", ""))
    if model.get("repo_id"):
        source = model["revision_source"]
        summary.add_row(
            "revision", model["revision"] + (f" ({source})" if source != "unresolved" else "")
        )
    summary.add_row("arms", f"{', '.join(doc['arms'])}: {doc['why_arms']}")
    summary.add_row(
        "needed",
        f"{hw['needed']['gpus']} GPU(s) x {hw['needed']['memory_gib_each']} GiB, "
        f"tensor parallel {hw['needed']['tensor_parallel_size']}",
    )
    summary.add_row(
        "found",
        ", ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in found) or "no GPU",
    )
    summary.add_row("hardware ok", "yes" if hw["found"]["satisfied"] else "NO")
    if est := doc["memory_estimate"]:
        summary.add_row(
            "GPU memory (estimate)",
            f"{est['estimate_gib_per_gpu']} GiB per GPU = {est['weights_gib_per_gpu']} weights "
            f"+ {est['headroom_gib_per_gpu']} headroom; rule: {est['rule']}",
        )
    summary.add_row("environment", " ".join(f"{k}={v}" for k, v in doc["environment"].items()))
    if w := doc["weights"]:
        summary.add_row("weights cache", w["repo_folder"])
        summary.add_row("snapshot", w["snapshot"] or "(after the first fetch)")
        summary.add_row("manifest", "present" if w["manifest_present"] else "absent")
    container = doc["container"]
    summary.add_row("container image", container["image"])
    pinned = container.get("image_pins")
    if pinned:
        summary.add_row("image vLLM", f"{pinned['vllm_ref']} ({pinned['cuda_variant']})")
        for key, value in (pinned.get("pins") or {}).items():
            summary.add_row(f"image {key}", value)
        for item in pinned.get("needs_registry", []):
            summary.add_row("NEEDS A REGISTRY", item)
    summary.add_row("network", container["network"])
    for key in ("gpus", "shm_size", "ipc_mode", "ulimits", "timeout_s"):
        if key in container:
            summary.add_row(f"container {key}", json.dumps(container[key]))
    for mount in container.get("mounts", []):
        mode = "ro" if mount["read_only"] else "rw"
        summary.add_row(
            f"mount {mount['what']}", f"{mount['source']} -> {mount['target']} ({mode})"
        )
    if "command" in container:
        summary.add_row("command", " ".join(container["command"]))
    console.print(summary)

    settings = Table(title="engine settings (LLM(...) keyword arguments)")
    settings.add_column("setting", style="bold")
    columns = [(arm, run) for arm in doc["runs"] for run in ("apc", "control")]
    for arm, run in columns:
        settings.add_column(f"{arm}\n{run}")
    keys = sorted({k for arm, run in columns for k in doc["runs"][arm][run]})
    for key in keys:
        cells = [doc["runs"][arm][run].get(key, "-") for arm, run in columns]
        settings.add_row(key, *(json.dumps(c) if not isinstance(c, str) else c for c in cells))
    console.print(settings)

    sampling = Table(title="sampling (greedy; B = Mamba block size, n = facts in the manual)")
    for column in ("arm", "requests", "asks", "max_tokens", "min_tokens", "stop", "ignore_eos"):
        sampling.add_column(column, style="bold" if column == "arm" else None)
    for arm, groups in doc["sampling"].items():
        for name, s in groups.items():
            sampling.add_row(
                f"{arm}: {name}",
                str(s["requests"]),
                s["asks"],
                str(s["max_tokens"]),
                str(s["min_tokens"]),
                json.dumps(s["stop"]),
                str(s["ignore_eos"]),
            )
    console.print(sampling)
    if with_json:
        print(json.dumps(doc, indent=2))
