"""One argv builder: `RunSettings` → `run`'s command line → `run`'s own parser gives the same
settings back, over every flag (`repro.run_settings`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from repro import cli
from repro.run_settings import FLAG_OF, HOST_ONLY, RunSettings

# A value other than the default for each field that travels.
EVERY_FLAG = RunSettings(
    profile="tiny-needle",
    run_id="20261205T120000Z-abc123",
    out=Path("/tmp/some run"),
    model_path="/model/snapshots/x",
    device="cuda",
    arms=["cold-race", "multi-turn"],
    inject_fault=True,
    override=["async_scheduling=false", 'speculative_config={"num_speculative_tokens": 2}'],
    arm_timeout=123.5,
    connector="probe",
    connector_config='{"k": 1}',
    repeat=3,
    verbose=True,
    allow_unpinned=True,
)


def parsed(argv: list[str]) -> RunSettings:
    return RunSettings.from_args(cli.build_parser().parse_args(argv))


def test_every_field_either_travels_or_stays_with_the_host():
    names = {f.name for f in dataclasses.fields(RunSettings)}
    assert set(FLAG_OF) | set(HOST_ONLY) == names and not set(FLAG_OF) & set(HOST_ONLY)


def test_every_run_option_is_a_field():
    """A flag added to `run` without a place in RunSettings is caught here."""
    parser = cli.build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]  # argparse keeps them here
    dests = {a.dest for a in run._actions if a.dest not in ("help", "debug")}
    # --model and --tp run a model without a profile: a path of its own (cli.run).
    assert dests - {"model", "tp"} <= {f.name for f in dataclasses.fields(RunSettings)}


def test_parse_of_build_is_the_identity_over_every_flag():
    argv = EVERY_FLAG.run_argv()
    assert parsed(argv) == EVERY_FLAG
    for name in FLAG_OF:  # and each flag alone
        default = RunSettings(profile="tiny", run_id="r1")
        one = dataclasses.replace(default, **{name: getattr(EVERY_FLAG, name)})
        assert parsed(one.run_argv()) == one, name


@pytest.mark.parametrize("only", [("inject_fault", "verbose", "override"), ("arms",)])
def test_a_subset_of_flags_is_that_subset(only):
    flags = EVERY_FLAG.flags(only=only)
    back = parsed(["run", "--profile", "tiny-needle", "--run-id", "r", *flags])
    for name in FLAG_OF:
        if name == "run_id":
            continue
        expected = (
            getattr(EVERY_FLAG, name) if name in only else getattr(RunSettings(profile="x"), name)
        )
        assert getattr(back, name) == expected, name
