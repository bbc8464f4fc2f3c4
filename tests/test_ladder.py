"""The connector ladder read together (repro.ladder), and its forgeries caught by the readers.

The forged records start from a real H200 ladder record (artifacts/examples/).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from repro import ladder
from repro.evidence.verdicts import check_verdict

EXAMPLE = (
    Path(__file__).resolve().parent.parent
    / "artifacts/examples/h200-connector-lane-vllm-0.26.0/stock-probe/cold-race.json"
)


@pytest.mark.parametrize(
    "reference, connector, finding",
    [
        ("clean", "corrupted", "corrupted-only-with-connector"),
        ("corrupted", "corrupted", "corrupted-with-and-without-connector"),
        ("corrupted", "clean", "corrupted-only-without-connector"),
        ("clean", "clean", "clean-on-every-rung"),
        ("inconclusive", "corrupted", "inconclusive"),
        ("clean", "error", "inconclusive"),
    ],
)
def test_the_finding_reads_both_rungs(reference, connector, finding):
    assert ladder.finding(reference, connector) == finding


def test_a_resume_past_a_groups_own_hit_is_named_by_the_group():
    record = {"offered": 144, "supplied": 0, "resumed": 144, "group_hits": {"attention": 144}}
    assert ladder.lagging_groups({**record, "group_hits": {"attention": 144, "mamba": 0}}) == [
        "mamba"
    ]
    assert ladder.lagging_groups({**record, "resumed": 160, "group_hits": {"mamba": 160}}) == []
    # What the connector supplied covers the rest: not a lag.
    assert ladder.lagging_groups({**record, "supplied": 144, "group_hits": {"mamba": 0}}) == []
    # No per-group lookup, or never scheduled: nothing to judge.
    assert ladder.lagging_groups({**record, "group_hits": {}}) == []
    assert ladder.lagging_groups({**record, "resumed": None, "group_hits": {"mamba": 0}}) == []


def test_the_real_ladder_record_follows_from_its_figures():
    doc = json.loads(EXAMPLE.read_text())
    assert doc["ladder"]["finding"] == "corrupted-with-and-without-connector"
    assert check_verdict(doc).problems == []


def forged(change) -> list[str]:
    doc = json.loads(EXAMPLE.read_text())
    change(doc)
    return check_verdict(copy.deepcopy(doc)).problems


def test_a_finding_that_does_not_follow_is_named():
    problems = forged(lambda d: d["ladder"].update(finding="corrupted-only-with-connector"))
    assert any("ladder.finding recorded" in p for p in problems), problems


def test_a_relabelled_reference_verdict_is_named():
    def relabel(doc):
        doc["ladder"]["reference"]["verdict"]["status"] = "clean"
        doc["ladder"]["finding"] = "corrupted-only-with-connector"

    problems = forged(relabel)
    assert any(p.startswith("ladder reference (APC on, no connector)") for p in problems)


def test_external_counters_that_disagree_with_the_waves_are_named():
    problems = forged(lambda d: d["ladder"]["external"].update(hits=208))
    assert any("ladder.external" in p for p in problems), problems
