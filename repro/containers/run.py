"""Run `python -m repro run …` inside one of the kit's images.

The container adds isolation and pinning, nothing else: the command inside is the one a bare
host runs (docs/measured.md), with the network off, the model mounted read-only at /model, the
output directory mounted read-write at /out and `HF_HUB_OFFLINE=1`. GPUs are passed through
device requests only when the profile runs on CUDA.

`ContainerRun` is one running container used as a context manager (cibuildwheel's
oci_container): entering creates and starts it, leaving removes it, whatever happened (an
exception, Ctrl-C, SIGTERM or SIGHUP to this process). `run_profile_in_container` wraps it:
it streams the container's output to the terminal and to `logs/container.log`, and afterwards
makes sure every arm has a record: the container's own artifacts when it wrote them, otherwise
an `error` record written here (repro.runner.write_error_record) that keeps the logs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from repro import machine_facts, runner
from repro.artifact import ArtifactInvalid, redact_env, validate_artifact
from repro.connectors import Connector
from repro.containers import labels as label_keys
from repro.containers.images import ImageFacts
from repro.containers.launch import (
    CONTAINER_MODEL,
    SHM_SIZE,
    STARTUP_GRACE_S,
    Launch,
    Mount,
    profile_launch,
)
from repro.core import redaction
from repro.core.errors import ReproError
from repro.models import tinymodel
from repro.profiles import Profile, get_profile
from repro.runcontext import FACTS_FILE, EngineFacts, RunContext

CONTAINER_CACHE = "/cache"
# Every container the kit starts carries this label (value: the run id), so that one left by a
# host process killed with SIGKILL (no `finally` runs then) is found and removed by the next run.


CONTAINER_LOG = "logs/container.log"


class ContainerRunError(ReproError):
    """The container could not be started, or did not finish its run."""


@dataclass
class Outcome:
    exit_code: int | None
    timed_out: bool
    oom_killed: bool
    seconds: float

    def describe(self) -> str:
        if self.timed_out:
            return f"ran past its time limit and was killed after {self.seconds:.0f} s"
        if self.oom_killed:
            return "was killed for lack of memory (OOM)"
        if self.exit_code is None:
            return "stopped without an exit status"
        if self.exit_code >= 128:
            sig = self.exit_code - 128
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else sig
            return f"was killed ({name}, exit status {self.exit_code})"
        return f"exited with status {self.exit_code}"


class ContainerRun:
    """One container of the kit's image, created and started on enter, removed on exit."""

    def __init__(
        self,
        *,
        client,
        image: str,
        command: Sequence[str],
        mounts: Sequence[Mount] = (),
        environment: Mapping[str, str] | None = None,
        gpus: int = 0,
        shm_size: str = SHM_SIZE["cpu"],
        user: str | None = None,
        labels: Mapping[str, str] | None = None,
        name: str | None = None,
        ulimits: Mapping[str, tuple[int, int]] | None = None,
        ipc_mode: str | None = None,
    ) -> None:
        self.client = client
        self.image = image
        self.command = list(command)
        self.mounts = list(mounts)
        self.environment = dict(environment or {})
        self.gpus = gpus
        self.shm_size = shm_size
        self.user = user
        self.labels = dict(labels or {})
        self.name = name
        self.ulimits = dict(ulimits or {})
        self.ipc_mode = ipc_mode
        self.container = None
        self._old_handlers: dict[int, Any] = {}

    @classmethod
    def from_launch(
        cls, launch: Launch, *, client, user: str | None, labels: Mapping[str, str]
    ) -> ContainerRun:
        """The container ``launch`` describes (`repro.containers.launch`)."""
        return cls(
            client=client,
            image=launch.image,
            command=launch.argv,
            mounts=launch.mounts,
            environment=launch.environment,
            gpus=launch.gpus,
            shm_size=launch.shm_size,
            ulimits=launch.ulimits or None,
            ipc_mode=launch.ipc_mode,
            user=user,
            labels={**launch.labels, **labels},
        )

    def create_kwargs(self) -> dict[str, Any]:
        """docker-py's ``containers.create`` arguments for this run (all but the image)."""
        # lazy: docker-py, needed only where a Docker daemon is used
        import docker

        device_requests = (
            [docker.types.DeviceRequest(driver="nvidia", count=self.gpus, capabilities=[["gpu"]])]
            if self.gpus
            else None
        )
        ulimits = [
            docker.types.Ulimit(name=name, soft=soft, hard=hard)
            for name, (soft, hard) in self.ulimits.items()
        ] or None
        return dict(
            command=self.command,
            name=self.name,
            labels=self.labels,
            environment=self.environment,
            mounts=[m.docker() for m in self.mounts],
            network_mode="none",
            shm_size=self.shm_size,
            device_requests=device_requests,
            ulimits=ulimits,
            ipc_mode=self.ipc_mode,
            user=self.user,
            # tini as PID 1: forwards signals to the kit and reaps the arms' children.
            init=True,
        )

    def __enter__(self) -> ContainerRun:
        self._trap_signals()
        try:
            self.container = self.client.containers.create(self.image, **self.create_kwargs())
            self.container.start()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            if self.container is not None:
                remove_container(self.container)
        finally:
            self._restore_signals()

    # -- while it runs --

    def stream(self, sink: TextIO, echo: TextIO | None, timeout_s: float) -> Outcome:
        """Copy the container's output to ``sink`` and ``echo`` until it stops; kill it after
        ``timeout_s`` seconds."""
        started = time.monotonic()
        timed_out = threading.Event()

        def kill_on_timeout() -> None:
            timed_out.set()
            self.kill()

        timer = threading.Timer(timeout_s, kill_on_timeout)
        timer.daemon = True
        timer.start()
        try:
            pending = ""
            for chunk in self.container.logs(stream=True, follow=True):
                pending += chunk.decode("utf-8", errors="replace")
                *lines, pending = pending.split("\n")
                for line in lines:
                    _emit(line + "\n", sink, echo)
            if pending:
                _emit(pending, sink, echo)
            status = self.container.wait()
        finally:
            timer.cancel()
        self.container.reload()
        state = self.container.attrs.get("State", {})
        return Outcome(
            exit_code=status.get("StatusCode"),
            timed_out=timed_out.is_set(),
            oom_killed=bool(state.get("OOMKilled")),
            seconds=time.monotonic() - started,
        )

    def kill(self) -> None:
        # lazy: docker-py, needed only where a Docker daemon is used
        import docker

        try:
            self.container.kill()
        except docker.errors.APIError:
            pass  # already stopped

    def _trap_signals(self) -> None:
        """SIGTERM and SIGHUP end Python without running `finally`; make them exceptions so
        that the container is removed (Ctrl-C already raises KeyboardInterrupt)."""
        if threading.current_thread() is not threading.main_thread():
            return

        def stop(signum, _frame):
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, stop)

    def _restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()


def _emit(line: str, sink: TextIO, echo: TextIO | None) -> None:
    line = redaction.redact(line)
    sink.write(line)
    sink.flush()
    if echo is not None:
        echo.write(line)
        echo.flush()


def remove_container(container) -> None:
    # lazy: docker-py, needed only where a Docker daemon is used
    import docker

    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass


def sweep_leftovers(client, log=print) -> int:
    """Remove stopped containers of earlier runs (their host process died without cleanup)."""
    removed = 0
    for container in client.containers.list(
        all=True, filters={"label": label_keys.RUN, "status": "exited"}
    ):
        log(f"[repro] removing container {container.short_id} left by an earlier run")
        remove_container(container)
        removed += 1
    return removed


def _user() -> str | None:
    """Run as the caller's uid:gid so that /out's files are theirs (root keeps the default)."""
    uid, gid = os.getuid(), os.getgid()
    return None if uid == 0 else f"{uid}:{gid}"


# --- a profile's arms in a container ---------------------------------------------------------


@dataclass(frozen=True)
class RunRequest:
    """What a run in a container is asked for: ``profile``'s ``arms``, their records in
    ``out_dir``. A run that never gets a container records the same request in its arms'
    `error` records as one whose container died."""

    profile: Profile
    arms: list[str]
    out_dir: Path
    run_id: str  # the folder's, the records' and the container label's
    overrides: dict[str, Any]
    fault_kind: str | None
    command: list[str]  # the host's command line, as the records quote it
    # `python -m repro run` options other than profile, model and output (the same settings
    # as ``overrides`` and ``fault_kind``, as the command inside the container takes them).
    run_args: list[str]
    arm_timeout_s: float
    connector: Connector | None = None

    def context(self, run_id: str, arm: str, model_path: str) -> RunContext:
        """``arm``'s context in run ``run_id``, with the model at ``model_path``."""
        return RunContext.new(
            run_id=run_id,
            arm=arm,
            command=self.command,
            profile=self.profile,
            model_path=model_path,
            overrides=self.overrides,
            fault_kind=self.fault_kind,
            connector=self.connector.to_json() if self.connector else None,
        )


def run_profile_in_container(
    request: RunRequest,
    *,
    client,
    image: ImageFacts,
    model_dir: Path,
    model_subpath: str | None = None,
    weights_pin: dict[str, Any] | None = None,
    echo: TextIO | None = sys.stdout,
) -> dict[str, dict[str, Any]]:
    """Run the request's arms in ``image``; return one record per arm (written in its
    ``out_dir``).

    The model folder ``model_dir`` is mounted at /model (``model_subpath`` inside it is the
    model, for a Hub cache whose snapshots link into blobs/). ``weights_pin`` is the host's
    check of those weights (`repro.cli.models.check_weights_pin`), handed to the run inside.
    """
    # Docker mounts absolute paths; the error records go to the same folder.
    request = replace(request, out_dir=Path(request.out_dir).resolve())
    arms, out_dir = request.arms, request.out_dir
    host_log = open_run_log(out_dir)
    run_id = request.run_id
    # Records from an earlier run in the same folder must not pass for this run's.
    for arm in arms:
        (out_dir / f"{arm}.json").unlink(missing_ok=True)
    (out_dir / FACTS_FILE).unlink(missing_ok=True)
    launch = profile_launch(
        request,
        image=image.id,
        image_env=json.dumps(image.as_record()),
        model_dir=Path(model_dir).resolve(),
        model_subpath=model_subpath,
        weights_pin=weights_pin,
        host_env=os.environ,
    )
    model_path, timeout_s = launch.model_path, launch.timeout_s
    started = time.monotonic()
    outcome: Outcome | None = None
    failure: str | None = None
    with host_log:
        _emit(f"[repro] image {image.name} {image.id}\n", host_log, echo)
        _emit(f"[repro] container command: {' '.join(launch.command)}\n", host_log, echo)
        try:
            sweep_leftovers(client, log=lambda m: _emit(m + "\n", host_log, echo))
            with ContainerRun.from_launch(
                launch, client=client, user=_user(), labels={label_keys.RUN: run_id}
            ) as ctr:
                _emit(f"[repro] container {ctr.container.short_id} started\n", host_log, echo)
                outcome = ctr.stream(host_log, echo, timeout_s)
                _emit(f"[repro] container {outcome.describe()}\n", host_log, echo)
        except ReproError:
            raise
        except Exception as exc:  # noqa: BLE001 - docker API errors become records
            failure = f"the container could not run: {type(exc).__name__}: {exc}"
            _emit(f"[repro] {failure}\n", host_log, echo)
        except KeyboardInterrupt as exc:
            failure = f"the run was interrupted ({exc or 'Ctrl-C'}) and its container removed"
            _emit(f"[repro] {failure}\n", host_log, echo)
    seconds = time.monotonic() - started

    own = {arm: _own_record(out_dir, arm, image) for arm in arms}
    missing = [arm for arm in arms if own[arm] is None]
    if failure is None:
        ran = f"the container {outcome.describe() if outcome else 'did not run'}"
        whats = {arm: f"{ran} before the {arm} arm wrote its record" for arm in missing}
    else:
        whats = dict.fromkeys(missing, failure)
    errors = _error_records(
        request,
        whats,
        run_id=run_id,
        model_path=model_path,
        logs=lambda arm: [f"logs/{arm}.log", CONTAINER_LOG],
        environment=_container_environment(out_dir, image),
        error_type="ContainerRunFailed",
        duration_s=seconds,
    )
    documents = {**own, **errors}  # in the arms' order, an error record where none came
    (out_dir / FACTS_FILE).unlink(missing_ok=True)
    if failure and failure.startswith("the run was interrupted"):
        raise KeyboardInterrupt
    return documents


def get_profile_device(profile: Profile) -> str:
    return get_profile(profile.name).device


def open_run_log(out_dir: Path) -> TextIO:
    """Check ``out_dir`` is writable (or say what to do) and open its container log."""
    runner.check_writable(out_dir)
    (out_dir / "logs").mkdir(exist_ok=True)
    return open(out_dir / CONTAINER_LOG, "a", encoding="utf-8")


def _own_record(out_dir: Path, arm: str, image: ImageFacts) -> dict[str, Any] | None:
    """The record the container wrote for ``arm``, if it is there, valid and from ``image``."""
    path = out_dir / f"{arm}.json"
    try:
        doc = json.loads(path.read_text())
        validate_artifact(doc)
    except (OSError, json.JSONDecodeError, ArtifactInvalid):
        return None
    location = doc["run"]["location"]
    if location["kind"] != "container" or (location["image"] or {}).get("id") != image.id:
        return None
    return doc


def _container_environment(out_dir: Path, image: ImageFacts) -> EngineFacts:
    """The image environment's facts (written by the run inside before its first arm); where
    the container died before that, this host's hardware and the image's labels only."""
    try:
        written = EngineFacts.from_json((out_dir / FACTS_FILE).read_text())
        return written.in_container(image.as_record())
    except (OSError, ValueError, ReproError):
        pass  # not written (or cut short): what the host knows, below

    labels = image.labels
    vllm = labels.get(label_keys.VLLM_REF) or None
    distribution = labels.get(label_keys.VLLM_DISTRIBUTION) or None
    torch = labels.get(label_keys.TORCH)
    return EngineFacts(
        hardware=machine_facts.collect_hardware(),
        # The image never reported its own environment: only what its labels pin is known.
        software={
            "python": labels.get(label_keys.PYTHON) or "not reported (container died first)",
            "packages": {"vllm": vllm, "torch": torch if torch not in (None, "unpinned") else None},
            "distributions": {"vllm": distribution, "torch": "torch" if torch else None},
        },
        location=machine_facts.run_location(None),
        environment=redact_env({"HF_HUB_OFFLINE": "1", "REPRO_IN_CONTAINER": "1"}),
        vllm_version=vllm or "not reported",
        vllm_distribution=distribution or "vllm",
        vllm_commit=None,
        patches=[],
    ).in_container(image.as_record())


def no_container_records(request: RunRequest, *, error: ReproError) -> dict[str, dict[str, Any]]:
    """`error` records for a run that never got a container (no daemon, no image, a failed
    build): the message in ``logs/container.log``, the facts of this host."""
    with open_run_log(request.out_dir) as log:
        log.write(f"[repro] {type(error).__name__}: {error}\n")
    return _error_records(
        request,
        {arm: f"no container ran: {error}" for arm in request.arms},
        run_id=request.run_id,
        model_path=CONTAINER_MODEL,  # where the model would have been mounted
        logs=lambda _arm: [CONTAINER_LOG],
        # This host's facts, in the container that never started.
        environment=EngineFacts.here().in_container(None),
        error_type=type(error).__name__,
    )


def _error_records(
    request: RunRequest,
    whats: dict[str, str],
    *,
    run_id: str,
    model_path: str,
    logs: Callable[[str], list[str]],
    environment: EngineFacts,
    error_type: str,
    duration_s: float = 0.0,
) -> dict[str, dict[str, Any]]:
    """The `error` record (phase "container") of each arm in ``whats``, saying what happened
    to it; ``logs(arm)`` are the logs it keeps."""
    return {
        arm: runner.write_error_record(
            arm=arm,
            context=request.context(run_id, arm, model_path),
            what=what,
            out_dir=request.out_dir,
            logs=logs(arm),
            environment=environment,
            error_type=error_type,
            phase="container",
            duration_s=duration_s,
        )
        for arm, what in whats.items()
    }


# --- the tiny model, built in the image when this host cannot ---------------------------------


def build_tiny_model_in_image(
    client, image: ImageFacts, cache_dir: Path, *, family: str = "qwen3-next", log=print
) -> Path:
    """Build the tiny model with the image's torch and transformers into ``cache_dir`` (mounted
    read-write) when this host has no engine environment; return its folder on the host."""
    cache_dir = Path(cache_dir).resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = tinymodel.tiny_model_dir(cache_dir, recipe=tinymodel.recipe_for(family))
    log(f"[repro] building the tiny model in {image.name} (this host has no torch)")
    with ContainerRun(
        client=client,
        image=image.id,
        command=["tiny-model", "--cache", CONTAINER_CACHE, "--family", family],
        mounts=[Mount(cache_dir, CONTAINER_CACHE, read_only=False)],
        environment={"HOME": "/tmp", "PYTHONUNBUFFERED": "1"},
        user=_user(),
        labels={label_keys.RUN: "tiny-model"},
    ) as ctr:
        outcome = ctr.stream(_NullSink(), sys.stderr, STARTUP_GRACE_S)
    if outcome.exit_code != 0 or not (target / "config.json").is_file():
        raise ContainerRunError(
            f"building the tiny model in {image.name} failed: the container "
            f"{outcome.describe()}; expected {target}. Its output is above; build it on a host "
            f"with torch instead: python -m repro tiny-model"
        )
    return target


class _NullSink:
    def write(self, _text: str) -> None:
        pass

    def flush(self) -> None:
        pass


__all__ = [
    "CONTAINER_LOG",
    "ContainerRun",
    "ContainerRunError",
    "Mount",
    "Outcome",
    "RunRequest",
    "build_tiny_model_in_image",
    "no_container_records",
    "run_profile_in_container",
    "sweep_leftovers",
]
