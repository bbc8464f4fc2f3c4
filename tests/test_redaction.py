"""One scanner and one redactor (repro.core.redaction) for logs, environment capture, records and
bundles: what the scanner finds the redactor masks, in every place the kit writes."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pytest

from repro import runner
from repro.artifact import redact_env
from repro.containers import build
from repro.core import redaction
from repro.core.redaction import scan_document
from repro.evidence import bundle
from repro.evidence.runs import EvidenceError
from repro.profiles import get_profile
from repro.runcontext import RunContext
from repro.venv import pip_settings

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
# Made-up credentials in each format the scanner knows (none of them is real).
SECRETS = {
    "Hugging Face token": "hf_" + "a1B2c3D4e5" * 4,
    "GitHub token": "ghp_" + "Z9y8X7w6V5" * 4,
    "AWS access key id": "AKIA" + "IOSFODNN7EXAMPLE",
    "Bearer credential": "Bearer " + "eyJhbGciOiJIUzI1NiJ9.e30.c2lnbmF0dXJl",
    "credentials in a URL": "https://builder:s3cr3t-Pa55@pypi.example.org/simple",
    "secret-named variable": "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "secret-named option": "--hf-token qwertyuiopasdfghjkl",
}


@pytest.mark.parametrize("kind", sorted(SECRETS))
def test_what_the_scanner_finds_the_redactor_masks(kind):
    line = f"INFO 12:00 starting with {SECRETS[kind]} now\n"
    found = redaction.scan(line)
    assert any(kind in f for f in found), found
    masked = redaction.redact(line)
    assert redaction.scan(masked) == [], masked
    assert redaction.MASK in masked and masked.startswith("INFO 12:00 starting with ")
    assert masked.endswith(" now\n")


def test_the_redactor_keeps_the_url_and_the_name_of_what_it_masks():
    assert redaction.redact("pip from https://u:pw@idx.example/simple") == (
        f"pip from https://u:{redaction.MASK}@idx.example/simple"
    )
    assert redaction.redact("HF_TOKEN=hf_x and --api-key=abcdef") == (
        f"HF_TOKEN={redaction.MASK} and --api-key={redaction.MASK}"
    )
    ordinary = "max_num_batched_tokens=2048 TOKENIZERS_PARALLELISM=false https://pypi.org/simple"
    assert redaction.redact(ordinary) == ordinary and redaction.scan(ordinary) == []


def test_logs_are_masked_as_they_are_written(tmp_path):
    # What the engine process prints reaches the arm's log only through this reader.
    from repro.display import RunDisplay

    stream = io.StringIO("".join(f"{v}\n" for v in SECRETS.values()))
    (tmp_path / "logs").mkdir()
    runner._EngineOutput(stream, ["cold-race"], tmp_path, RunDisplay(["cold-race"])).run()
    log = (tmp_path / "logs" / "cold-race.log").read_text()
    assert redaction.scan(log) == [], log
    assert log.count(redaction.MASK) >= len(SECRETS)


def test_recorded_environment_drops_every_name_the_scanner_calls_secret():
    env = {
        "VLLM_PASSWD_FILE": "x",
        "REPRO_CREDENTIALS": "x",
        "VLLM_API_KEY": "x",
        "VLLM_ATTENTION_BACKEND": "FLASH_ATTN",
    }
    assert redact_env(env) == {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}


def _crash_context(tmp_path: Path, arm: str) -> RunContext:
    """The context of a tiny run's ``arm`` whose engine crashed."""
    return RunContext.new(
        run_id="crash",
        arm=arm,
        command=["repro", "run"],
        profile=get_profile("tiny"),
        model_path=str(tmp_path / "model"),
        overrides={},
        fault_kind=None,
    )


def test_a_crash_record_is_written_with_its_log_tail_masked(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "cold-race.log").write_text(
        "loading\n" + "".join(f"{v}\n" for v in SECRETS.values()) + "Killed\n"
    )
    context = _crash_context(tmp_path, "cold-race")
    doc = runner.write_error_record(
        arm="cold-race",
        context=context,
        what="the engine died",
        out_dir=tmp_path,
        logs=["logs/cold-race.log"],
    )
    written = json.loads((tmp_path / "cold-race.json").read_text())
    assert written == doc and written["verdict"]["status"] == "error"
    assert scan_document(written) == []
    assert "Killed" in written["error"]["message"] and redaction.MASK in written["error"]["message"]


def test_a_crash_record_whose_message_quotes_a_secret_is_masked_not_lost(tmp_path):
    context = _crash_context(tmp_path, "multi-turn")
    runner.write_error_record(
        arm="multi-turn",
        context=context,
        what=f"download failed from {SECRETS['credentials in a URL']}",
        out_dir=tmp_path,
        logs=[],
    )
    written = json.loads((tmp_path / "multi-turn.json").read_text())
    assert scan_document(written) == [] and "s3cr3t" not in json.dumps(written)


def test_pip_index_credentials_never_reach_the_image_or_its_record(tmp_path):
    settings = pip_settings.PipSettings(
        index_url="https://builder:s3cr3t-Pa55@pypi.example.org/simple",
        extra_index_urls=("https://ghp_" + "Z9y8X7w6V5" * 4 + "@wheels.example.org/simple",),
        find_links=("https://u:pw@links.example.org/",),
    )
    record = build.render_pip_context(settings, tmp_path / "ctx", python_tag="cp311")
    conf = (tmp_path / "ctx" / "pip.conf").read_text()
    for text in (conf, json.dumps(record)):
        assert "s3cr3t" not in text and "ghp_" not in text and "pw@" not in text
        assert redaction.scan(text) == []
    assert "index-url = https://pypi.example.org/simple" in conf
    assert record["index_url"] == "https://pypi.example.org/simple"
    assert sorted(d["setting"] for d in record["dropped"]) == [
        "extra-index-url",
        "find-links",
        "index-url",
    ]


def _run_dir(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / "clean", tmp_path / "in" / "clean"))


def test_a_log_holding_a_secret_is_not_bundled(tmp_path):
    run = _run_dir(tmp_path)
    log = run / "logs" / "cold-race.log"
    log.write_text(log.read_text() + SECRETS["GitHub token"] + "\n")
    doc = json.loads((run / "cold-race.json").read_text())
    from repro.core.atomicio import sha256_file

    entry = next(e for e in doc["logs"] if e["path"] == "logs/cold-race.log")
    entry["sha256"], entry["bytes"] = sha256_file(log), log.stat().st_size
    (run / "cold-race.json").write_text(json.dumps(doc))
    with pytest.raises(EvidenceError, match=r"logs/cold-race.log holds what looks like a secret"):
        bundle.build_bundle([run], tmp_path / "b.tar.gz", images_dir=None, environ={})
    assert not (tmp_path / "b.tar.gz").exists()


def test_an_image_record_is_never_read_through_a_link(tmp_path):
    run = _run_dir(tmp_path)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}")
    os.symlink(elsewhere, run / "image-record.json")
    with pytest.raises(EvidenceError, match="a link .*regular files only"):
        bundle.build_bundle([run], tmp_path / "b.tar.gz", images_dir=None, environ={})


def test_the_run_artifact_schema_refuses_the_names_the_scanner_drops():
    """One secret-name pattern: the schema's copy of it is
    `repro.core.redaction.SECRET_ENV_NAME`."""
    from repro.artifact import load_schema

    schema = load_schema("run-artifact", 1)
    names = schema["properties"]["engine"]["properties"]["environment"]["propertyNames"]
    assert names["not"]["pattern"] == redaction.SECRET_ENV_NAME.pattern
    for name in ("HF_TOKEN", "MY_APIKEY", "DB_PASSWD", "AWS_SECRET_ACCESS_KEY", "X_CREDENTIALS"):
        assert redaction.is_secret_env_name(name), name
    assert not redaction.is_secret_env_name("VLLM_CPU_KVCACHE_SPACE")
