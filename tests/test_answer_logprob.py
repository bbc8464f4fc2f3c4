"""The needle profiles' answer log-prob line: the per-request figure on hand-made log-prob
sequences, and the line re-derived from a record as the runner derives it."""

from __future__ import annotations

import copy

import pytest

from repro import answer_logprob, grading
from repro.evidence import verdicts

CAP = grading.DIVERGENCE_CAP


def positions(*rows: dict[int, float]) -> tuple[dict[int, float], ...]:
    return tuple(rows)


# A three-token answer 7, 8, 9, each position's top-k holding the greedy token and another.
CONTROL_TOKENS = (7, 8, 9)
CONTROL = positions({7: -0.10, 1: -2.5}, {8: -0.20, 2: -1.9}, {9: -0.05, 3: -3.0})


def test_equal_answers_diverge_by_nothing():
    assert answer_logprob.divergence(CONTROL_TOKENS, CONTROL, CONTROL_TOKENS, CONTROL) == 0.0


def test_the_largest_difference_of_a_shared_answer_counts():
    apc = positions({7: -0.11, 1: -2.5}, {8: -0.26, 2: -1.9}, {9: -0.07, 3: -3.0})
    assert answer_logprob.divergence(CONTROL_TOKENS, apc, CONTROL_TOKENS, CONTROL) == (
        pytest.approx(0.06)
    )


def test_positions_after_the_first_differing_token_say_nothing():
    # The APC output leaves the control's at token 1 (2 instead of 8); its position 2 then
    # follows another context, so its large difference there is not counted.
    apc_tokens = (7, 2, 4)
    apc = positions({7: -0.12, 1: -2.5}, {2: -0.5, 8: -0.9}, {4: -0.1, 9: -9.0})
    got = answer_logprob.divergence(apc_tokens, apc, CONTROL_TOKENS, CONTROL)
    # Position 1 itself counts: the control's token 8 at -0.20 against the APC's -0.9.
    assert got == pytest.approx(0.7)


def test_a_difference_at_the_first_differing_token_is_included_not_past_it():
    apc_tokens = (7, 8, 3)
    apc = positions({7: -0.10, 1: -2.5}, {8: -0.20, 2: -1.9}, {3: -0.4, 9: -0.45})
    assert answer_logprob.divergence(apc_tokens, apc, CONTROL_TOKENS, CONTROL) == (
        pytest.approx(0.40)
    )


def test_the_control_token_missing_from_the_apc_top_k_is_the_cap():
    apc_tokens = (7, 2, 9)
    apc = positions({7: -0.10, 1: -2.5}, {2: -0.1, 5: -3.0}, {9: -0.05, 3: -3.0})
    assert answer_logprob.divergence(apc_tokens, apc, CONTROL_TOKENS, CONTROL) == CAP


def test_an_apc_answer_that_ends_early_compares_what_it_has():
    apc = positions({7: -0.13, 1: -2.5})
    assert answer_logprob.divergence((7,), apc, CONTROL_TOKENS, CONTROL) == pytest.approx(0.03)


def test_an_empty_control_is_the_cap_as_for_the_first_token():
    assert answer_logprob.divergence((7,), CONTROL[:1], (), ()) == CAP
    assert grading.divergence(CONTROL[0], {}) == CAP


@pytest.mark.parametrize(
    "apc_first",
    [{7: -0.10, 1: -2.5}, {7: -0.17, 1: -2.0}, {1: -0.3, 7: -1.4}, {1: -0.3, 4: -1.0}],
    ids=["equal", "moved", "other-token-on-top", "absent"],
)
def test_a_one_token_answer_is_the_first_token_divergence(apc_first):
    control_first = CONTROL[0]
    apc_token = max(apc_first, key=apc_first.get)
    got = answer_logprob.divergence((apc_token,), (apc_first,), (7,), (control_first,))
    assert got == grading.divergence(apc_first, control_first)


# --- the line on a record ------------------------------------------------------------------


def request(index: int, cached: int, answer: float, miss: bool = False) -> dict:
    return {
        "index": index,
        "num_cached_tokens": cached,
        "divergence": 0.0,
        "apc_miss": miss,
        "control_miss": False,
        "flagged": miss,
        "answer_divergence": answer,
    }


def needle_record(hit_divergence: float) -> dict:
    """A needle cold-race record: recall clean, four cache hits moved by `hit_divergence`
    on their answers, four cold requests and the control's spread as benign noise."""
    cold = [request(i, 0, 0.004 * i) for i in range(4)]
    hits = [request(4 + i, 288, hit_divergence) for i in range(4)]
    counters = {
        "prefix_cache_queries": 10,
        "prefix_cache_hits": 4,
        "spec_decode_num_drafts": 5,
        "spec_decode_num_accepted_tokens": 3,
    }
    doc = {
        "arm": "cold-race",
        "signal": {"kind": "needle", "rules": grading.RULES_UPSTREAM},
        "counters": {"apc": {"wave1": counters, "wave2": counters}},
        "figures": {
            "waves": [
                {
                    "name": "wave1",
                    "requests": 8,
                    "apc": {"distinct_outputs": 1, "misses": 0},
                    "control": {"distinct_outputs": 1, "misses": 0},
                    "forward_flips": 0,
                    "reverse_flips": 0,
                    "per_request": cold + hits,
                    "extra": {
                        "graded": True,
                        "distinct_rule": True,
                        "benign_noise": [0.5, 0.5],
                        answer_logprob.NOISE_KEY: [0.004, 0.008],
                    },
                }
            ],
            "liveness": {"prompt_tokens": 992, "hits": 1, "queries": 2, "cached_tokens": 864},
        },
        "verdict": {"status": "clean", "gate": None, "reason": "recall clean"},
    }
    doc["answer_logprob"] = verdicts.answer_line(doc)
    return doc


def test_cache_hits_moved_on_their_answers_say_corrupted_beside_recall():
    line = needle_record(0.2)["answer_logprob"]
    assert (line["status"], line["decided_by"], line["disagrees"]) == ("corrupted", "recall", True)
    assert line["waves"] == [
        {"name": "wave1", "forward_flips": 4, "reverse_flips": 0, "flagged": [4, 5, 6, 7]}
    ]
    # The noise is the answers' (cold requests, the control's answer spread), never the
    # first token's benign_noise: 0.012 at the 90th percentile, times 3.
    assert line["threshold"] == pytest.approx(grading.NOISE_MULTIPLIER * 0.012)
    assert line["line"] == (
        "recall: clean · answer log-prob: corrupted (wave1: 4 forward / 0 reverse flips, "
        "threshold 0.036)"
    )


def test_hits_within_the_noise_are_clean_and_agree_with_recall():
    line = needle_record(0.001)["answer_logprob"]
    assert (line["status"], line["disagrees"]) == ("clean", False)


def test_verify_rederives_the_line_and_names_an_edited_one():
    doc = needle_record(0.2)
    assert verdicts.check_verdict(doc).problems == []
    edited = copy.deepcopy(doc)
    edited["answer_logprob"]["status"] = "clean"
    assert any("answer_logprob.status" in p for p in verdicts.check_verdict(edited).problems)
    moved = copy.deepcopy(doc)
    for r in moved["figures"]["waves"][0]["per_request"]:
        r["answer_divergence"] = 0.001 if r["num_cached_tokens"] else r["answer_divergence"]
    assert any("answer_logprob" in p for p in verdicts.check_verdict(moved).problems)
    dropped = copy.deepcopy(doc)
    del dropped["answer_logprob"]
    assert verdicts.check_verdict(dropped).problems


def test_the_log_prob_signal_and_older_records_get_no_line():
    doc = needle_record(0.2)
    logprob = copy.deepcopy(doc)
    logprob["signal"]["kind"] = "logprob"
    assert verdicts.answer_line(logprob) is None
    older = copy.deepcopy(doc)
    for r in older["figures"]["waves"][0]["per_request"]:
        del r["answer_divergence"]
    assert verdicts.answer_line(older) is None


def test_a_ladder_reference_rung_keeps_its_own_line():
    from repro import ladder

    doc, reference = needle_record(0.2), needle_record(0.001)
    doc["ladder"] = {
        "reference": {
            "counters": reference["counters"]["apc"],
            "signal": reference["signal"],
            "figures": reference["figures"],
            "verdict": reference["verdict"],
            "answer_logprob": reference["answer_logprob"],
        },
        "finding": ladder.finding("clean", "clean"),
        "external": ladder.external(doc["counters"]["apc"], ["wave1"]),
    }
    assert ladder.rung_document(doc)["answer_logprob"]["status"] == "clean"
    assert verdicts.check_verdict(doc).problems == []
    doc["ladder"]["reference"]["answer_logprob"] = doc["answer_logprob"]
    problems = verdicts.check_verdict(doc).problems
    assert any(p.startswith("ladder reference") and "answer_logprob" in p for p in problems)
