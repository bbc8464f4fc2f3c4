"""Every committed example artifact is valid evidence: it passes the schema and its recorded
verdict is the one its own figures give (so a reader can trust the tables built from them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro import evidence
from repro.artifact import validate_artifact

EXAMPLES = Path(__file__).resolve().parent.parent / "artifacts" / "examples"
ARTIFACTS = sorted(
    p for p in EXAMPLES.rglob("*.json") if p.name in ("cold-race.json", "multi-turn.json")
)


def test_there_are_examples():
    assert len(ARTIFACTS) >= 10


def measured(doc: dict) -> bool:
    """Whether an artifact holds figures to re-derive a verdict from (not an error record)."""
    return doc["verdict"]["status"] != "error" and bool(doc["figures"].get("waves"))


@pytest.mark.parametrize("path", ARTIFACTS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_validates_and_regrades_to_its_verdict(path):
    doc = json.loads(path.read_text())
    validate_artifact(doc)
    if not measured(doc):
        return  # nothing measured to re-derive
    regraded = evidence.regrade(doc, as_recorded=True)  # with the gates it was graded with
    assert (regraded.status, regraded.gate) == (doc["verdict"]["status"], doc["verdict"]["gate"])


@pytest.mark.parametrize("path", ARTIFACTS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_logs_that_were_kept_match_their_recorded_hash(path):
    # Some H200 logs could not be brought back (8 files per call); the artifacts still hold
    # each log's size and sha256, and every log that is here must match them.
    from repro.core.atomicio import sha256_file

    for log in json.loads(path.read_text())["logs"]:
        kept = path.parent / log["path"]
        if kept.is_file():
            assert (kept.stat().st_size, sha256_file(kept)) == (log["bytes"], log["sha256"])


# Cold-race verdicts an H200 run recorded as `corrupted` although its APC-off control answered
# the identical prompts inconsistently (README of h200-vllm-0.26.0-investigation).
H200 = EXAMPLES / "h200-vllm-0.26.0-investigation"
FALSE_CORRUPTED_ON_THE_H200 = [
    "3-fp16-patched",
    "4-fp16-stock-budget408",
    "7-top4-fp16-patched",
    "11-salted-control-patched",
    "14-batch-invariant-kernels-patched",
    "14-batch-invariant-kernels-patched-fa3",
    "15-max-num-seqs-2-patched",
]


def regraded_with_the_control_spread_gate(path: Path):
    doc = json.loads(path.read_text())
    doc["signal"]["control_spread_gate"] = True
    return evidence.regrade(doc)


@pytest.mark.parametrize("run", FALSE_CORRUPTED_ON_THE_H200)
def test_control_spread_gate_turns_the_h200_false_positives_inconclusive(run):
    path = H200 / run / "cold-race.json"
    assert json.loads(path.read_text())["verdict"]["status"] == "corrupted"
    verdict = regraded_with_the_control_spread_gate(path)
    assert (verdict.status, verdict.gate) == ("inconclusive", "control_quality")


@pytest.mark.parametrize(
    "path",
    [p for p in ARTIFACTS if not p.is_relative_to(H200)],
    ids=lambda p: str(p.relative_to(EXAMPLES)),
)
def test_control_spread_gate_leaves_the_cpu_examples_as_they_were(path):
    doc = json.loads(path.read_text())
    if not measured(doc):
        return
    verdict = regraded_with_the_control_spread_gate(path)
    assert (verdict.status, verdict.gate) == (doc["verdict"]["status"], doc["verdict"]["gate"])


# The red/green on the H200 (issue #43559's cold-race lane on stock vLLM 0.26.0, cured by the
# PR #51113 port): what the committed artifacts must say, read from the artifacts themselves.
RED_GREEN = EXAMPLES / "h200-vllm-0.26.0"
RED_GREEN_VERDICTS = {
    "stock/cold-race.json": "corrupted",
    "stock/multi-turn.json": "clean",
    "patched/cold-race.json": "clean",
    "patched/multi-turn.json": "clean",
    "repeat-stock/cold-race.json": "corrupted",
    "repeat-patched/cold-race.json": "clean",
    "patched-inject-fault/cold-race.json": "corrupted",  # the positive control
}
PR51113_PORT_SHA256 = "edd0193fda2868e41bb3f1c8c951238ced70fea9f933153fb51e27b064cfe1e2"


@pytest.mark.parametrize("name", sorted(RED_GREEN_VERDICTS))
def test_h200_red_green_artifacts_say_what_the_issue_needs(name):
    doc = json.loads((RED_GREEN / name).read_text())
    validate_artifact(doc)
    assert doc["verdict"]["status"] == RED_GREEN_VERDICTS[name], doc["verdict"]["reason"]
    assert [g["name"] for g in doc["hardware"]["gpus"]] == ["NVIDIA H200"]
    assert doc["software"]["packages"]["vllm"] == "0.26.0"
    patches = [p["sha256"] for p in doc["engine"].get("patches") or []]
    assert patches == ([PR51113_PORT_SHA256] if "patched" in name else [])
    assert doc["fault_injection"]["enabled"] is ("inject-fault" in name)
    # Engaged: the APC run read the cache and drafted, whatever the verdict.
    apc = doc["counters"]["apc"]
    assert sum(w["prefix_cache_hits"] for w in apc.values()) > 0
    assert sum(w["spec_decode_num_drafts"] for w in apc.values()) > 0
    if doc["verdict"]["status"] == "corrupted":
        flagged = [r for w in doc["figures"]["waves"] for r in w["per_request"] if r["flagged"]]
        assert flagged and all(r["num_cached_tokens"] > 0 for r in flagged)


# --- CUDA images built here (artifacts/examples/cuda-images) -----------------------------------

CUDA_IMAGES = EXAMPLES / "cuda-images"
CUDA_RECORDS = sorted(CUDA_IMAGES.glob("vllm-*/image-record*.json"))


def test_there_are_cuda_image_records_for_both_releases():
    assert {p.parent.name for p in CUDA_RECORDS} >= {"vllm-0.26.0", "vllm-0.32.0"}


@pytest.mark.parametrize("path", CUDA_RECORDS, ids=lambda p: str(p.relative_to(CUDA_IMAGES)))
def test_cuda_image_record_validates_and_its_check_agrees_with_its_labels(path):
    from repro.containers.build import validate_image_record
    from repro.containers.imagecheck import compare_with_labels

    record = json.loads(path.read_text())
    validate_image_record(record)
    labels, check = record["labels"], record["check"]
    version = path.parent.name.removeprefix("vllm-")
    assert labels["io.repro-kit.vllm.version"] == check["vllm"]["version"] == version
    assert labels["io.repro-kit.torch"] == check["torch"]["version"]
    assert check["torch"]["cuda"] and check["torch"]["build"].endswith("+cu130")
    assert compare_with_labels(check, labels) == [] and check["repro_help_runs"]
    assert check["lock"]["mismatched"] == [] and check["lock"]["packages"] == len(
        record["lock"]["wheels"]
    )
    assert labels["io.repro-kit.lock.sha256"] == record["lock"]["sha256"]
    # The build's whole log is kept beside its record (image-record-cold.json: build-cold.log).
    from repro.core.atomicio import sha256_file

    log = path.parent / path.name.replace("image-record", "build").replace(".json", ".log")
    assert sha256_file(log) == record["build"]["log"]["sha256"]


def test_the_0_26_0_lock_comparison_follows_from_the_committed_records():
    from repro.artifact import schema_violations
    from repro.containers.cuda import compare_records

    folder = CUDA_IMAGES / "vllm-0.26.0"
    manifest = json.loads((folder / "installset-manifest.json").read_text())
    # The set was built before the install-set format 2 (the wheels as the index serves them);
    # its manifest is format 1, whose schema stays for the records that hold one.
    assert manifest["format_version"] == 1
    assert schema_violations(manifest, "install-set", 1) == []
    record = json.loads((folder / "image-record-cold.json").read_text())
    result = compare_records(record, manifest)
    assert result == json.loads((folder / "lock-compare.json").read_text())
    assert result["equal"] and result["wheels_in_both"] == len(manifest["wheels"])


def test_the_0_26_0_round_trip_records_name_one_image():
    from repro.artifact import schema_violations

    folder = CUDA_IMAGES / "vllm-0.26.0"
    exported = json.loads((folder / "export-record.json").read_text())
    imported = json.loads((folder / "import-record.json").read_text())
    assert schema_violations(exported, "image-archive") == []
    assert schema_violations(imported, "image-import") == []
    built = json.loads((folder / "image-record-cold.json").read_text())
    assert exported["image"]["id"] == imported["image"]["id"] == built["image"]["id"]
    listed = (folder / "export.sha256").read_text().split()
    assert listed[0] == exported["archive"]["sha256"] == imported["archive"]["sha256"]


LADDERS = [p for p in ARTIFACTS if json.loads(p.read_text()).get("ladder")]


def test_there_are_connector_ladder_examples():
    assert len(LADDERS) >= 10


@pytest.mark.parametrize("path", LADDERS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_ladder_example_rederives_both_rungs_and_its_finding(path):
    check = evidence.verdicts.check_verdict(json.loads(path.read_text()))
    assert check.problems == [], check.problems
