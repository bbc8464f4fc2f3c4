"""One run's settings, typed, and the one place they become `run`'s command line.

`tiny` and `run` read their flags once into `RunSettings` (repro/cli/run.py); the engine
environment's `run`, a container's and a matrix cell's get them back through `run_argv()` or
`flags()`, never spelled out by hand.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path

from repro import connectors, runner
from repro.core.errors import ReproError
from repro.profiles import parse_overrides

# Each field that travels, in the order of the command line, and its flag.
FLAG_OF = {
    "run_id": "--run-id",
    "out": "--out",
    "model_path": "--model-path",
    "device": "--device",
    "arms": "--arms",
    "inject_fault": "--inject-fault",
    "override": "--override",
    "arm_timeout": "--arm-timeout",
    "connector": "--connector",
    "connector_config": "--connector-config",
    "repeat": "--repeat",
    "verbose": "--verbose",
    "allow_unpinned": "--allow-unpinned",
}
# Fields that say where a run happens (an image, the vLLM an environment or image is made
# for): the host acts on them; the process that runs the arms never gets them.
HOST_ONLY = ("profile", "container", "image", "vllm", "base", "cuda", "lock", "wheelhouse")


@dataclass(frozen=True)
class RunSettings:
    """One run's settings as `tiny` and `run` give them, read once from their flags (a flag
    the command lacks keeps its default here)."""

    profile: str
    run_id: str = ""  # one id for the folder, the records and the container: from_args sets it
    out: Path | None = None
    arms: list[str] | None = None
    inject_fault: bool = False
    override: list[str] = field(default_factory=list)  # KEY=JSON items, passed on as given
    arm_timeout: float | None = None
    repeat: int = 1
    verbose: bool = False
    connector: str | None = None
    connector_config: str | None = None
    container: bool = False
    image: str | None = None
    vllm: str | None = None
    base: str | None = None
    device: str | None = None
    cuda: str | None = None
    lock: Path | None = None
    wheelhouse: Path | None = None
    model_path: str | None = None
    allow_unpinned: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunSettings:
        given = vars(args) | {"run_id": getattr(args, "run_id", None) or runner.new_run_id()}
        return cls(**{f.name: given[f.name] for f in fields(cls) if f.name in given})

    @property
    def out_dir(self) -> Path:
        return self.out or runner.default_out_dir(self.run_id)

    def arms_of(self, profile) -> list[str]:
        return self.arms or list(profile.arms)

    @property
    def fault_kind(self) -> str | None:
        return runner.DEFAULT_FAULT_KIND if self.inject_fault else None

    def parsed_connector(self, device: str | None = None):
        """The connector these settings attach (`repro.connectors`), its syntax and device
        checked (nothing imported), or None."""
        connector = connectors.parse(self.connector, self.connector_config)
        connectors.check_device(connector, device or self.device or "cpu")
        overrides = parse_overrides(self.override)
        attached = sorted(set(overrides) & set(connectors.CONNECTOR_SETTINGS))
        if attached:
            raise ReproError(
                f"--override {', '.join(attached)} would attach a connector to the APC-off "
                "control as well as the APC run; use --connector (MODULE:CLASS or PATH.py:CLASS, "
                "with --connector-config JSON), which runs the ladder"
            )
        return connector

    @property
    def arm_timeout_s(self) -> float:
        return self.arm_timeout or runner.DEFAULT_ARM_TIMEOUT_S

    def run_argv(self) -> list[str]:
        """`run` with these settings, as `python -m repro` takes it."""
        return ["run", "--profile", self.profile, *self.flags()]

    def flags(self, only: Iterable[str] | None = None) -> list[str]:
        """These settings as `run`'s flags (those of ``only``, by field name): the one place a
        run's settings become a command line. Parsed back by `run`'s parser they give these
        settings again (tests/test_run_argv.py, over every flag); the fields of HOST_ONLY pick
        where the run happens and stay with the process that starts it."""
        keep = set(FLAG_OF) if only is None else set(only)
        out: list[str] = []
        for name, flag in FLAG_OF.items():
            value = getattr(self, name)
            if (
                name not in keep
                or value in (None, False, "", [])
                or (name == "repeat" and value == 1)
            ):
                continue
            if value is True:
                out.append(flag)
            elif name == "override":
                for item in value:
                    out += [flag, item]
            elif name == "arms":
                out += [flag, *value]
            else:
                out += [flag, str(value)]
        return out
