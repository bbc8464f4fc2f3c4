"""What an image holds, asked of the image itself: `python -m repro image-check`.

Inside the image (at the end of its build, and afterwards in a container without network or
GPU) it imports the stack and reports it as JSON: Python, vllm, torch and the CUDA it was
built for, the kit, and every locked distribution whose installed version is not the lock's.
On the host, `check_image` runs it in a container and compares the answer with the image's
labels. No GPU is needed: importing torch loads its CUDA libraries (from the nvidia-* wheels)
but not the driver.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
from pathlib import Path
from typing import Any

from repro import __version__
from repro.containers import labels as label_keys
from repro.core.errors import ReproError
from repro.machine_facts import kit_source_sha256


class ImageCheckFailed(ReproError):
    """The image's Python stack does not import, or is not what its labels or lock say."""


def in_image_facts(lock_path: Path | None = None) -> dict[str, Any]:
    """The stack as this interpreter sees it (run inside the image)."""
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "kit": {"version": __version__, "source_sha256": kit_source_sha256()},
        "problems": [],
    }
    try:
        # lazy: torch, found only where models are built or engines run
        import torch

        facts["torch"] = {
            # torch.__version__ carries the CUDA build (2.11.0+cu130) where the wheel's own
            # version does not (2.11.0): the labels and the lock name the distribution's.
            "version": md.version("torch"),
            "build": torch.__version__,
            "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(),
        }
        if not torch.version.cuda:
            facts["problems"].append(f"torch {torch.__version__} is not a CUDA build")
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding
        facts["torch"] = None
        facts["problems"].append(f"import torch failed: {type(exc).__name__}: {exc}")
    try:
        # lazy: vllm, found only in an engine environment
        import vllm

        facts["vllm"] = {"version": md.version("vllm"), "build": vllm.__version__}
    except Exception as exc:  # noqa: BLE001
        facts["vllm"] = None
        facts["problems"].append(f"import vllm failed: {type(exc).__name__}: {exc}")
    if lock_path is not None:
        lock = json.loads(Path(lock_path).read_text(encoding="utf-8"))
        mismatched = []
        for pkg in lock["packages"]:
            try:
                found = md.version(pkg["name"])
            except md.PackageNotFoundError:
                found = None
            if found != pkg["version"]:
                mismatched.append(f"{pkg['name']}: lock {pkg['version']}, installed {found}")
        facts["lock"] = {"packages": len(lock["packages"]), "mismatched": mismatched}
        facts["problems"] += mismatched
    return facts


def compare_with_labels(facts: dict[str, Any], labels: dict[str, str]) -> list[str]:
    """Where the image's own answer and its labels disagree (empty: they agree)."""
    problems = list(facts.get("problems", []))
    torch = facts.get("torch") or {}
    vllm = facts.get("vllm") or {}
    want = {
        label_keys.TORCH: torch.get("version"),
        label_keys.VLLM_VERSION: vllm.get("version"),
        label_keys.PYTHON: ".".join(facts.get("python", "").split(".")[:2]),
        label_keys.TORCH_CUDA: torch.get("cuda"),
    }
    for label, found in want.items():
        if label in labels and labels[label] != found:
            problems.append(f"label {label}={labels[label]!r}, the image has {found!r}")
    return problems


def check_image(client, image_id: str, labels: dict[str, str]) -> dict[str, Any]:
    """Run `image-check` in a container of ``image_id`` (no network) and compare with labels."""
    # lazy: docker-py, needed only where a Docker daemon is used
    import docker

    # One container for both questions: under vfs each container copies the whole image.
    script = (
        "python -m repro image-check --lock /opt/repro-pip/lock.json"
        " && python -m repro --help | head -1"
    )
    try:
        out = client.containers.run(
            image_id,
            ["-c", script],
            entrypoint=["sh"],
            remove=True,
            network_mode="none",
            stderr=False,
        )
    except docker.errors.ContainerError as exc:
        raise ImageCheckFailed(
            f"the in-image check of {image_id[:19]} exited {exc.exit_status}: "
            f"{(exc.stderr or b'').decode(errors='replace')[-2000:]}"
        ) from exc
    lines = out.decode(errors="replace").strip().splitlines()
    help_text = lines[-1] if lines else ""
    json_lines = [line for line in lines if line.startswith("{")]
    if not json_lines:
        raise ImageCheckFailed(f"the in-image check of {image_id[:19]} printed no report")
    facts = json.loads(json_lines[-1])
    facts["label_problems"] = compare_with_labels(facts, labels)
    facts["repro_help_runs"] = help_text.startswith("usage: python -m repro")
    if not facts["repro_help_runs"]:
        facts["label_problems"].append("`python -m repro --help` printed no usage")
    return facts


__all__ = ["ImageCheckFailed", "check_image", "compare_with_labels", "in_image_facts"]
