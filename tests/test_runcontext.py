"""The run context's JSON: what the host sends the engine process, and what a container
leaves for the host, read back as the same typed values."""

from __future__ import annotations

import json

import pytest

from repro.core.errors import ReproError
from repro.profiles import get_profile
from repro.runcontext import EngineFacts, RunContext


def _context() -> RunContext:
    return RunContext.new(
        run_id="r",
        arm="cold-race",
        command=["python", "-m", "repro", "tiny"],
        profile=get_profile("tiny"),
        model_path="/models/tiny",
        overrides={"max_num_seqs": 4},
        fault_kind=None,
    )


def test_a_context_and_its_environment_survive_the_json_hand_off():
    context = _context()
    assert context.run_id == "r-cold-race" and context.kit["name"] == "repro-kit"
    assert RunContext.from_json(context.to_json()) == context
    placed = context.with_environment(EngineFacts.here()).started("2026-12-02T00:00:00Z")
    back = RunContext.from_json(placed.to_json())
    assert back == placed and isinstance(back.environment, EngineFacts)
    assert back.started_at == "2026-12-02T00:00:00Z"
    assert back.resolve_profile().name == "tiny"


def test_an_environment_moved_into_a_container_keeps_its_facts():
    here = EngineFacts.here()
    moved = EngineFacts.from_json(here.to_json()).in_container({"id": "sha256:" + "a" * 64})
    assert moved.location["kind"] == "container" and moved.location["image"]["id"].endswith("a")
    assert moved.hardware == here.hardware and moved.software == here.software


def test_the_variables_can_be_read_after_the_machine(monkeypatch):
    # The arms' process reads the machine while vLLM imports and the variables after, since
    # the import sets some: a variable set in between is recorded.
    monkeypatch.delenv("VLLM_SET_BY_THE_IMPORT", raising=False)
    machine = EngineFacts.here(variables=False)
    assert machine.environment == {}
    monkeypatch.setenv("VLLM_SET_BY_THE_IMPORT", "1")
    facts = machine.with_variables_now()
    assert facts.environment["VLLM_SET_BY_THE_IMPORT"] == "1"
    assert facts.hardware == machine.hardware and facts.software == machine.software


def test_json_from_another_kit_version_is_refused_by_name():
    data = json.loads(_context().to_json())
    del data["model_path"]
    data["gpu_count"] = 1
    with pytest.raises(ReproError, match=r"missing \['model_path'\], unknown \['gpu_count'\]"):
        RunContext.from_json(json.dumps(data))
    with pytest.raises(ReproError, match="JSON object"):
        EngineFacts.from_json("[]")


def test_a_nested_environment_from_another_kit_version_is_refused_by_name():
    data = json.loads(_context().with_environment(EngineFacts.here()).to_json())
    data["environment"]["gpu_count"] = 1
    with pytest.raises(ReproError, match=r"EngineFacts JSON .* unknown \['gpu_count'\]"):
        RunContext.from_json(json.dumps(data))


def _settings(*argv: str):
    from repro import cli
    from repro.cli.run import RunSettings

    return RunSettings.from_args(cli.build_parser().parse_args(list(argv)))


def test_one_run_id_names_the_default_folder_and_goes_to_the_engine_process():
    settings = _settings("tiny")
    assert settings.run_id and settings.out_dir.name == settings.run_id
    assert settings.flags()[:2] == ["--run-id", settings.run_id]
    given = _settings("run", "--profile", "tiny", "--run-id", "cell-3.a_b", "--out", "x")
    assert (given.run_id, given.out_dir.name) == ("cell-3.a_b", "x")
    assert _settings("tiny").run_id != settings.run_id


@pytest.mark.parametrize("bad", ["../up", "", "-x", "a/b", "x" * 101])
def test_a_run_id_that_cannot_name_a_folder_is_refused(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        _settings("tiny", f"--run-id={bad}")
    assert exc.value.code == 2
    assert "is not a run id" in capsys.readouterr().err
