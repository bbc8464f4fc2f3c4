"""Exact p-values and the knife edge of a verdict, and the pooled line of repeats."""

from __future__ import annotations

import json
from math import comb
from pathlib import Path

import pytest

from repro import confidence, repeats
from repro.artifact import schema_violations

EXAMPLES = Path(__file__).resolve().parent.parent / "artifacts" / "examples"


def test_mcnemar_is_the_binomial_tail_of_the_discordant_pairs():
    assert confidence.binomial_upper_tail(3, 3) == 1 / 8
    assert confidence.binomial_upper_tail(2, 5) == sum(comb(5, i) for i in range(2, 6)) / 32
    assert confidence.binomial_upper_tail(0, 4) == 1.0
    assert confidence.binomial_upper_tail(0, 0) == 1.0


def test_fisher_is_the_hypergeometric_tail_of_flagged_hits():
    # 14 of 14 hits flagged, neither cold request: 1 / C(16, 14).
    assert confidence.fisher_upper_tail(14, 14, 0, 2) == pytest.approx(1 / comb(16, 14))
    # Flags spread like the groups: no evidence.
    assert confidence.fisher_upper_tail(1, 2, 1, 2) == pytest.approx(5 / 6)
    # Nothing flagged, or no cold request to compare with.
    assert confidence.fisher_upper_tail(0, 14, 0, 2) == 1.0
    assert confidence.fisher_upper_tail(5, 5, 0, 0) == 1.0


def wave(forward: int, reverse: int, hits: int, cold: int, margin: int = 2, graded=True):
    rows = [{"num_cached_tokens": 160}] * hits + [{"num_cached_tokens": 0}] * cold
    return {
        "forward_flips": forward,
        "reverse_flips": reverse,
        "margin": margin,
        "per_request": rows,
        "extra": {"graded": graded},
    }


def test_the_knife_edge_is_one_request_from_the_other_verdict():
    assert confidence.knife_edge("clean", [wave(2, 0, 5, 0)])  # one more flip corrupts
    assert not confidence.knife_edge("clean", [wave(1, 0, 5, 0)])
    assert confidence.knife_edge("corrupted", [wave(3, 0, 5, 0)])  # one fewer is clean
    assert not confidence.knife_edge("corrupted", [wave(3, 0, 5, 0), wave(3, 0, 5, 0)])
    assert not confidence.knife_edge("corrupted", [wave(14, 0, 14, 2)])
    assert not confidence.knife_edge("inconclusive", [wave(2, 0, 5, 0)])
    assert not confidence.knife_edge("clean", [wave(2, 0, 5, 0, graded=False)])


def doc(status: str, signal: str, *waves) -> dict:
    return {
        "verdict": {"status": status},
        "signal": {"kind": signal},
        "figures": {"waves": list(waves)},
    }


def test_repeats_pool_their_flips_and_say_whether_they_agree():
    runs = [
        {"cold-race": doc("corrupted", "needle", wave(3, 0, 16, 0))},
        {"cold-race": doc("clean", "needle", wave(2, 0, 16, 0))},
        {"cold-race": doc("corrupted", "needle", wave(3, 0, 16, 0))},
    ]
    out = repeats.document(runs, Path("/x"))
    assert schema_violations(out, "repeats") == []
    arm = out["arms"]["cold-race"]
    assert arm["verdicts"] == ["corrupted", "clean", "corrupted"] and not arm["agree"]
    assert arm["pooled"]["forward_flips"] == 8 and arm["pooled"]["reverse_flips"] == 0
    assert arm["pooled"]["p_value"] == pytest.approx(1 / 2**8, rel=1e-2)
    assert arm["knife_edge_repeats"] == 3
    assert repeats.line("cold-race", arm).startswith("cold-race: corrupted 2/3, clean 1/3")


def test_repeats_that_reached_no_verdict_pool_nothing():
    runs = [{"multi-turn": {"verdict": {"status": "inconclusive"}}}] * 2
    arm = repeats.document(runs, Path("/x"))["arms"]["multi-turn"]
    assert arm["pooled"] is None and arm["verdicts"] == ["inconclusive", "inconclusive"]


@pytest.mark.parametrize("path", sorted(EXAMPLES.rglob("cold-race.json"))[:3], ids=str)
def test_a_recorded_artifact_gives_a_p_value(path: Path):
    sure = confidence.of_document(json.loads(path.read_text()))
    assert sure is None or 0.0 <= sure["p_value"] <= 1.0
