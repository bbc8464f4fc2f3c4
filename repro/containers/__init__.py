"""Container images for the kit: a local base image, the CPU and CUDA images, and runs in them.

- `engine`: the Docker daemon connection (docker-py), and the error when there is none;
- `refs`: vLLM refs (release, 40-hex commit, branch) validated before they reach a build;
- `base`: a Debian base image made locally (debootstrap + docker import), no registry needed;
- `build`: build arguments, OCI labels, the build itself and the image record;
- `labels`: the label keys the images carry, one name each;
- `pins`: the pinned inputs in `containers/base-images.json`.
"""

from __future__ import annotations

from repro.containers.engine import DockerUnavailable, docker_client
from repro.containers.refs import InvalidRef, VllmRef, parse_vllm_ref

__all__ = ["DockerUnavailable", "InvalidRef", "VllmRef", "docker_client", "parse_vllm_ref"]
