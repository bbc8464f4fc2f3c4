"""The container engine: one docker-py client, made in one place.

The engine is a value handed to the functions that need it (cibuildwheel style), not a global;
`docker_client()` makes one and turns "no daemon" into an error that says what to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from repro.core.errors import ReproError

if TYPE_CHECKING:
    import docker

# Debian bookworm's docker.io (20.10) speaks API 1.41, older than docker-py 7's default (1.44):
# let the client ask the daemon instead of assuming.
API_VERSION = "auto"
START_HINT = (
    "start one with `sh containers/start-dockerd.sh` "
    "(needs root and `apt-get install -y docker.io debootstrap`)"
)


class DockerUnavailable(ReproError):
    """No Docker daemon answers, or docker-py is not installed."""


def docker_client(*, timeout: int = 600) -> docker.DockerClient:
    """Return a client connected to the daemon named by DOCKER_HOST (default: the local socket)."""
    try:
        # lazy: docker-py, needed only where a Docker daemon is used
        import docker
    except ImportError as exc:
        raise DockerUnavailable(
            "docker-py is not installed; `pip install 'docker>=7'` (a dependency of the kit)"
        ) from exc
    try:
        client = docker.from_env(version=API_VERSION, timeout=timeout)
        client.ping()
    except docker.errors.DockerException as exc:
        raise DockerUnavailable(f"no Docker daemon answers ({exc}); {START_HINT}") from exc
    return client


__all__ = ["API_VERSION", "DockerUnavailable", "docker_client"]
