"""A run's context, typed: what an arm's record says about its run, and the facts of the
environment the engine ran in.

Both travel between processes as JSON: the host hands each arm's `RunContext` to the engine
process (on its stdin), and a run inside a container leaves its `EngineFacts` in
`FACTS_FILE` so that the host can still write an `error` record with the image's facts if
the container dies mid-run. `to_json` and `from_json` are the only encoding, on both sides.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from repro import machine_facts
from repro.artifact import redact_env
from repro.containers import labels as label_keys
from repro.core.clock import utc_text
from repro.core.errors import ReproError
from repro.core.vocabulary import Device
from repro.profiles import MODEL_PROFILE_NAME, Profile, for_model, get_profile
from repro.venv import patching

# Set by the host for a run in one of the kit's images (repro/containers/run.py): the image's
# id and labels as JSON. A process inside a container cannot see its own image.
IMAGE_ENV = "REPRO_IMAGE"
# Written by a run inside a container before its first arm: its `EngineFacts`, which the host
# needs for an `error` record if the container dies mid-run.
FACTS_FILE = ".container-facts.json"


@dataclass(frozen=True)
class EngineFacts:
    """The facts of the interpreter and machine an engine runs in (shared by every arm)."""

    hardware: dict[str, Any]
    software: dict[str, Any]
    location: dict[str, Any]
    environment: dict[str, str]
    vllm_version: str
    vllm_distribution: str
    vllm_commit: str | None
    patches: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def here(cls, *, variables: bool = True) -> EngineFacts:
        """This interpreter's environment and machine, read now. With ``variables=False`` the
        environment variables are left out, for `with_variables_now` to read later: the arms'
        process reads the rest while vLLM imports, and the variables after, since vLLM's
        import sets some of them."""
        software = machine_facts.collect_software()
        return cls(
            hardware=machine_facts.collect_hardware(),
            software=software,
            location=machine_facts.run_location(image_from_env()),
            environment=redact_env() if variables else {},
            vllm_version=software["packages"].get("vllm") or "not installed",
            vllm_distribution=software["distributions"].get("vllm") or "vllm",
            vllm_commit=machine_facts.vllm_commit(),
            patches=patching.applied_patches(),
        )

    def with_variables_now(self) -> EngineFacts:
        """The same facts with the environment variables as they are now."""
        return dataclasses.replace(self, environment=redact_env())

    def in_container(self, image: dict[str, Any] | None) -> EngineFacts:
        """The same facts, located in a container of ``image`` (None: none started)."""
        return dataclasses.replace(
            self, location={**self.location, "kind": "container", "image": image}
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> EngineFacts:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: Any) -> EngineFacts:
        """The decoded JSON object of `to_json` (also nested in a `RunContext`'s)."""
        return cls(**_fields(cls, data))


@dataclass(frozen=True)
class RunContext:
    """One arm's run: its id, command, kit, profile and settings; with ``environment`` once
    the process that runs (or records) it has read its own."""

    run_id: str
    started_at: str
    command: list[str]
    kit: dict[str, Any]
    profile: str
    device: Device
    # A model without a profile is rebuilt from these in the engine process.
    model: str
    tensor_parallel_size: int
    model_path: str
    overrides: dict[str, Any]
    fault_kind: str | None
    environment: EngineFacts | None = None
    # The KV connector of the APC run (`repro.connectors.Connector.to_json`), or None.
    connector: dict[str, Any] | None = None
    # The check of a GPU profile's weights against their pin (`repro.weights.model_pin`:
    # revision, pinned, ...), or None where none was made (tiny models, `run --model`).
    weights_pin: dict[str, Any] | None = None
    # A CPU engine's OpenMP pool and the sample behind it (`repro.engine.cpu_threads`), set by
    # the process that starts the engine; None on a GPU.
    cpu_threads: dict[str, Any] | None = None

    @classmethod
    def new(
        cls,
        *,
        run_id: str,
        arm: str,
        command: list[str],
        profile: Profile,
        model_path: str,
        overrides: dict[str, Any],
        fault_kind: str | None,
        connector: dict[str, Any] | None = None,
        weights_pin: dict[str, Any] | None = None,
    ) -> RunContext:
        """The context of ``arm`` in run ``run_id``, started now, with this kit's facts."""
        return cls(
            run_id=f"{run_id}-{arm}",
            started_at=utc_text(),
            command=list(command),
            kit=kit_facts(),
            profile=profile.name,
            device=profile.device,
            model=profile.model,
            tensor_parallel_size=profile.tensor_parallel_size,
            model_path=model_path,
            overrides=dict(overrides),
            fault_kind=fault_kind,
            connector=connector,
            weights_pin=weights_pin,
        )

    def started(self, at: str) -> RunContext:
        return dataclasses.replace(self, started_at=at)

    def with_environment(self, environment: EngineFacts) -> RunContext:
        return dataclasses.replace(self, environment=environment)

    def with_cpu_threads(self, choice: dict[str, Any]) -> RunContext:
        return dataclasses.replace(self, cpu_threads=choice)

    def resolve_profile(self) -> Profile:
        """The profile this context names (a model without one is rebuilt from its fields)."""
        if self.profile == MODEL_PROFILE_NAME:
            return for_model(self.model, tensor_parallel_size=self.tensor_parallel_size)
        return get_profile(self.profile).for_device(self.device)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunContext:
        data = json.loads(text)
        fields = _fields(cls, data, nested=("environment",))
        environment = data.get("environment")
        return cls(
            **fields, environment=EngineFacts.from_dict(environment) if environment else None
        )


def _fields(cls, data: Any, *, nested: tuple[str, ...] = ()) -> dict[str, Any]:
    """``data``'s fields for ``cls`` less the ``nested`` ones (the caller builds those); a
    missing or unknown field is named (a kit on one side of the hand-off newer than on the
    other)."""
    if not isinstance(data, dict):
        raise ReproError(f"a {cls.__name__} must be a JSON object, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    unknown, missing = set(data) - names, required - set(data)
    if unknown or missing:
        raise ReproError(
            f"{cls.__name__} JSON does not match this kit: "
            f"missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    return {k: v for k, v in data.items() if k not in nested}


def kit_facts() -> dict[str, Any]:
    """The kit's facts; inside an image, the commit its kit was copied from (its labels)."""
    kit = machine_facts.collect_kit(os.environ.get("REPRO_KIT_CHECKOUT"))
    image = image_from_env()
    if kit["git_commit"] is None and image is not None:
        labels = image["labels"]
        commit = labels.get(label_keys.OCI_REVISION, "")
        if re.fullmatch(r"[0-9a-f]{40}", commit):
            dirty = labels.get(label_keys.DIRTY)
            kit = {**kit, "git_commit": commit, "dirty": {"true": True, "false": False}.get(dirty)}
    return kit


def image_from_env() -> dict[str, Any] | None:
    """The image this run is in (id and labels), as the host passed it; None on a host.

    Only read inside one of the kit's images (REPRO_IN_CONTAINER=1): a stray REPRO_IMAGE on a
    host must not turn a host run into a claimed container run. Malformed values are refused
    by name, since a record with a wrong image id would be worse than none.
    """
    raw = os.environ.get(IMAGE_ENV)
    if os.environ.get("REPRO_IN_CONTAINER") != "1" or not raw:
        return None
    try:
        image = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ReproError(
            f"{IMAGE_ENV} is not JSON ({exc}); it is set by `--container` runs"
        ) from exc
    if (
        not isinstance(image, dict)
        or not re.fullmatch(r"sha256:[0-9a-f]{64}", str(image.get("id")))
        or not isinstance(image.get("labels"), dict)
    ):
        raise ReproError(
            f'{IMAGE_ENV} must be {{"id": "sha256:<64 hex>", "labels": {{...}}}}, got {raw[:200]!r}'
        )
    found = {"id": image["id"], "labels": {str(k): str(v) for k, v in image["labels"].items()}}
    if isinstance(image.get("tags"), list):
        found["tags"] = [str(t) for t in image["tags"]]
    if re.fullmatch(r"[0-9a-f]{64}", str(image.get("archive_sha256", ""))):
        found["archive_sha256"] = image["archive_sha256"]
    return found


__all__ = ["FACTS_FILE", "IMAGE_ENV", "EngineFacts", "RunContext", "image_from_env", "kit_facts"]
