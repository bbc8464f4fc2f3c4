"""One container start, described once: what `plan` prints is what `containers.run` starts.

A `Launch` is the image, the `python -m repro` arguments inside, the mounts, the environment
and the limits of one container. `profile_launch` makes it from a run's request; the run
executes it (`ContainerRun.from_launch`) and `plan` prints `as_record()` of the same call with
the image and run id not yet known, so the dry run and the run cannot drift apart
(tests/test_plan.py holds the two equal).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.engine.cpu_threads import CAP_ENV
from repro.engine.process_vars import SHARED_CORES_VARIABLES, gpu_host_variables
from repro.profiles import get_profile
from repro.run_settings import RunSettings
from repro.runcontext import IMAGE_ENV
from repro.weights import PIN_ENV

CONTAINER_MODEL = "/model"
CONTAINER_OUT = "/out"
# A PATH.py connector's folder, mounted read-only (repro.connectors).
CONTAINER_CONNECTOR = "/connector"
# Docker's default /dev/shm is 64 MiB. vLLM's CPU backend and torch keep tensors there in
# multiprocess mode, and NCCL between tensor-parallel GPUs needs far more (vLLM's own docs run
# its image with --ipc=host or a large --shm-size).
SHM_SIZE = {"cpu": "2g", "cuda": "16g"}
# What NVIDIA's containers are documented to want for multi-GPU work: locked memory without a
# cap (NCCL and CUDA pin host buffers) and a 64 MiB stack; a private IPC namespace holding the
# tensor-parallel workers of one container, with the shm size above.
GPU_ULIMITS = {"memlock": (-1, -1), "stack": (67108864, 67108864)}
GPU_IPC_MODE = "private"
# Seconds a container gets beyond its arms' own timeouts (image start, engine imports, records).
STARTUP_GRACE_S = 300


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool
    what: str = ""  # model, output or connector: what `plan` calls it

    def docker(self):
        import docker  # lazy: the plan is printed where docker-py is not installed

        return docker.types.Mount(
            target=self.target, source=str(self.source), type="bind", read_only=self.read_only
        )

    def as_record(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "source": str(self.source),
            "target": self.target,
            "read_only": self.read_only,
        }


@dataclass(frozen=True)
class Launch:
    image: str
    argv: tuple[str, ...]  # after `python -m repro`
    mounts: tuple[Mount, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    gpus: int = 0
    shm_size: str = SHM_SIZE["cpu"]
    ulimits: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    ipc_mode: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = STARTUP_GRACE_S
    model_path: str = CONTAINER_MODEL

    @property
    def command(self) -> list[str]:
        return ["python", "-m", "repro", *self.argv]

    def as_record(self) -> dict[str, Any]:
        """The launch as `plan` prints it (JSON)."""
        return {
            "image": self.image,
            "network": "none",
            "command": self.command,
            "mounts": [m.as_record() for m in self.mounts],
            "model_path": self.model_path,
            "environment": dict(self.environment),
            "gpus": self.gpus,
            "shm_size": self.shm_size,
            "ipc_mode": self.ipc_mode,
            "ulimits": {name: {"soft": s, "hard": h} for name, (s, h) in self.ulimits.items()},
            "labels": dict(self.labels),
            "timeout_s": self.timeout_s,
        }


def shared_cores_environment(host_env: Mapping[str, str]) -> dict[str, str]:
    """What a host whose engines share its cores carries into the container: the wait policy
    it asked for (OMP_WAIT_POLICY) and the share its engine keeps to (a test-suite worker's,
    `cpu_threads.CAP_ENV`)."""
    return {k: host_env[k] for k in (*SHARED_CORES_VARIABLES, CAP_ENV) if k in host_env}


def profile_launch(
    request,
    *,
    image: str,
    image_env: str | None,
    model_dir: Path,
    model_subpath: str | None,
    weights_pin: dict[str, Any] | None,
    host_env: Mapping[str, str],
) -> Launch:
    """The container that runs ``request`` (a `containers.run.RunRequest`): its profile's
    arms with the model folder at /model (``model_subpath`` inside it is the model, for a Hub
    cache whose snapshots link into blobs/), the request's folder at /out. ``image_env`` is the
    image's record handed to the run inside; ``weights_pin`` the host's check of the weights;
    ``host_env`` the environment whose GPU-host and shared-core settings carry over."""
    profile, arms = request.profile, request.arms
    model_path = f"{CONTAINER_MODEL}/{model_subpath}" if model_subpath else CONTAINER_MODEL
    connector_spec, connector_config, connector_mounts = connector_inside(request.connector)
    moved = profile.device != get_profile(profile.name).device  # by --device
    inside = RunSettings(
        profile=profile.name,
        run_id=request.run_id,
        out=Path(CONTAINER_OUT),
        model_path=model_path,
        device=profile.device if moved else None,
        arms=list(arms),
        arm_timeout=request.arm_timeout_s,
        connector=connector_spec,
        connector_config=connector_config,
    )
    argv = [*inside.run_argv(), *request.run_args]
    environment = {
        "HF_HUB_OFFLINE": "1",
        "REPRO_IN_CONTAINER": "1",
        "PYTHONUNBUFFERED": "1",
        # A uid without a home of its own (containers.run._user): vLLM and torch keep caches
        # under ~.
        "HOME": "/tmp",
    }
    if image_env is not None:
        environment[IMAGE_ENV] = image_env
    if profile.device == "cuda":
        # The host's own values of the NVLink switches, where set, else the kit's defaults.
        environment.update(gpu_host_variables(host_env))
    environment.update(shared_cores_environment(host_env))
    if weights_pin is not None:  # the host's check of the mounted weights
        environment[PIN_ENV] = json.dumps(weights_pin, sort_keys=True)
    mounts = (
        Mount(Path(model_dir), CONTAINER_MODEL, read_only=True, what="model"),
        Mount(Path(request.out_dir), CONTAINER_OUT, read_only=False, what="output"),
        *connector_mounts,
    )
    gpus = profile.tensor_parallel_size if profile.device == "cuda" else 0
    return Launch(
        image=image,
        argv=tuple(argv),
        mounts=mounts,
        environment=environment,
        gpus=gpus,
        shm_size=SHM_SIZE[profile.device],
        ulimits=GPU_ULIMITS if gpus else {},
        ipc_mode=GPU_IPC_MODE if gpus else None,
        labels={},
        timeout_s=request.arm_timeout_s * len(arms) + STARTUP_GRACE_S,
        model_path=model_path,
    )


def connector_inside(connector) -> tuple[str | None, str | None, list[Mount]]:
    """The connector as the command inside the container names it (spec, extra config), and
    what to mount: a PATH.py connector's folder goes in read-only at CONTAINER_CONNECTOR."""
    if connector is None:
        return None, None, []
    spec, mounts = connector.spec, []
    if connector.file:
        source = Path(connector.file)
        spec = f"{CONTAINER_CONNECTOR}/{source.name}:{connector.cls}"
        mounts.append(Mount(source.parent, CONTAINER_CONNECTOR, read_only=True, what="connector"))
    config = json.dumps(connector.extra_config) if connector.extra_config else None
    return spec, config, mounts
