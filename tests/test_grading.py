"""Grading: gates in upstream's order, margin-graded one-sided flips, both signals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro import grading
from repro.grading import Engagement, Liveness, RequestResult, Wave

ENGAGED = Engagement(prefix_cache_queries=1000, prefix_cache_hits=500, spec_decode_num_drafts=80)
LIVE = Liveness(prompt_tokens=896, hits=768, queries=896)


def needle_wave(forward: int, reverse: int, agree: int = 10, name="wave2", **kw) -> Wave:
    """`forward` requests the APC run missed and the control answered, `reverse` the opposite."""
    requests = (
        [RequestResult(0, 256, apc_miss=True, control_miss=False)] * forward
        + [RequestResult(0, 256, apc_miss=False, control_miss=True)] * reverse
        + [RequestResult(0, 256, apc_miss=False, control_miss=False)] * agree
    )
    requests = tuple(
        RequestResult(i, r.num_cached_tokens, None, r.apc_miss, r.control_miss)
        for i, r in enumerate(requests)
    )
    return Wave(name, requests, 1, 1, **kw)


def logprob_wave(hit: list[float], cold: list[float], name="wave1") -> Wave:
    requests = [RequestResult(0, 256, divergence=d) for d in hit]
    requests += [RequestResult(0, 0, divergence=d) for d in cold]
    return Wave(
        name,
        tuple(RequestResult(i, r.num_cached_tokens, r.divergence) for i, r in enumerate(requests)),
        1,
        1,
    )


# The rules the kit runs; the kit's older rules (LEGACY) only where an old artifact needs them.
LEGACY = grading.RULES_KIT


def grade_needle(
    *waves,
    engagement=ENGAGED,
    liveness=LIVE,
    rules=grading.RULES_UPSTREAM,
    require_hits=True,
    **options,
):
    return grading.grade(
        signal="needle",
        waves=list(waves),
        engagement=engagement,
        liveness=liveness,
        rules=rules,
        require_hits=require_hits,
        **options,
    )


@given(
    reverse=st.integers(0, 10), excess=st.integers(0, grading.FLIP_MARGIN), agree=st.integers(6, 20)
)
def test_flips_within_margin_are_never_corrupted(reverse, excess, agree):
    verdict = grade_needle(needle_wave(reverse + excess, reverse, agree=agree + 2 * reverse))
    assert verdict.status == "clean", verdict.reason


@given(reverse=st.integers(0, 5), excess=st.integers(grading.FLIP_MARGIN + 1, 16))
def test_one_sided_flips_past_margin_are_always_corrupted(reverse, excess):
    forward = reverse + excess
    verdict = grade_needle(needle_wave(forward, reverse, agree=forward + reverse))
    assert verdict.status == "corrupted"
    assert f"{forward} forward flips vs {reverse} reverse" in verdict.reason


def test_weak_control_is_inconclusive_before_corruption_is_looked_at():
    # The control misses most answers: even a wave full of forward flips is no evidence.
    wave = needle_wave(forward=0, reverse=12, agree=2)
    verdict = grade_needle(wave)
    assert (verdict.status, verdict.gate) == ("inconclusive", "control_quality")


def test_engagement_gate_names_what_is_missing():
    no_drafts = Engagement(prefix_cache_queries=10, prefix_cache_hits=5, spec_decode_num_drafts=0)
    verdict = grade_needle(needle_wave(8, 0, agree=12), engagement=no_drafts)
    assert (verdict.status, verdict.gate) == ("inconclusive", "engagement")
    assert "zero speculative drafts" in verdict.reason
    no_hits = Engagement(prefix_cache_queries=10, prefix_cache_hits=0, spec_decode_num_drafts=9)
    verdict = grade_needle(needle_wave(0, 0), engagement=no_hits)
    assert verdict.gate == "engagement" and "zero prefix-cache hits" in verdict.reason


def test_liveness_only_blocks_a_clean_verdict():
    dead = Liveness(prompt_tokens=896, hits=0, queries=896)
    assert grade_needle(needle_wave(0, 0), liveness=dead).gate == "liveness"
    # Corruption found is evidence even when the cache went quiet afterwards.
    assert grade_needle(needle_wave(9, 0), liveness=dead).status == "corrupted"


def test_cold_race_distinct_outputs_rule():
    wave = Wave(
        "wave1",
        tuple(RequestResult(i, 256, None, False, False) for i in range(16)),
        apc_distinct_outputs=3,
        control_distinct_outputs=1,
        distinct_rule=True,
    )
    verdict = grade_needle(wave)
    assert verdict.status == "corrupted"
    assert "16 identical prompts gave 3 distinct outputs; control: 1" in verdict.reason
    ok = Wave(
        "wave1",
        wave.requests,
        apc_distinct_outputs=2,
        control_distinct_outputs=1,
        distinct_rule=True,
    )
    assert grade_needle(ok).status == "clean"


def test_ungraded_waves_do_not_count_as_corruption():
    assert grade_needle(needle_wave(9, 0, graded=False), needle_wave(0, 0)).status == "clean"


def grade_logprob(*waves, extra_noise=(), control_spread_gate=True):
    return grading.grade(
        signal="logprob",
        waves=list(waves),
        engagement=ENGAGED,
        liveness=None,
        extra_noise=extra_noise,
        control_spread_gate=control_spread_gate,
        rules=grading.RULES_UPSTREAM,
        require_hits=True,
    )


def test_logprob_clean_when_cache_hits_look_like_noise():
    wave = logprob_wave(hit=[0.004, 0.01, 0.003, 0.02], cold=[0.005, 0.012, 0.002, 0.004])
    verdict = grade_logprob(wave)
    assert verdict.status == "clean"
    # Noise floor: the 90th percentile (nearest rank) of the four cold divergences.
    assert verdict.threshold.noise_floor == 0.012
    assert verdict.threshold.value == max(grading.THRESHOLD_MIN, grading.NOISE_MULTIPLIER * 0.012)


def test_one_benign_outlier_does_not_blind_the_logprob_signal():
    cold = [0.008] * 30 + [0.016, 0.077]
    verdict = grade_logprob(logprob_wave(hit=[0.2] * 10, cold=cold))
    assert verdict.threshold.noise_floor == 0.008
    assert verdict.status == "corrupted"


def test_logprob_corrupted_when_only_cache_hits_diverge():
    wave = logprob_wave(hit=[0.1, 0.12, 0.09, 0.2, 0.11], cold=[0.004, 0.003, 0.005, 0.004])
    verdict = grade_logprob(wave)
    assert verdict.status == "corrupted"
    assert "5 forward flips vs 0 reverse" in verdict.reason


def test_logprob_noise_in_both_groups_is_benign():
    # Large divergences on both sides of the cache split: symmetric, so not corruption,
    # and the threshold rises with the noise it is measured from.
    wave = logprob_wave(hit=[0.015, 0.016, 0.014], cold=[0.015, 0.016, 0.014, 0.013])
    assert grade_logprob(wave).status == "clean"


def test_logprob_too_noisy_or_too_few_samples_is_control_quality():
    noisy = logprob_wave(hit=[0.3], cold=[0.3, 0.2, 0.25, 0.04])
    assert grade_logprob(noisy).gate == "control_quality"
    sparse = logprob_wave(hit=[0.5, 0.5, 0.5], cold=[0.001])
    verdict = grade_logprob(sparse)
    assert verdict.gate == "control_quality" and "only 1 benign samples" in verdict.reason
    # Benign samples measured beside the waves (the control's own spread) count.
    assert grade_logprob(sparse, extra_noise=[0.001, 0.002, 0.001]).status == "corrupted"


def test_divergence_uses_the_controls_greedy_token():
    control = {5: -0.1, 7: -2.5}
    assert abs(grading.divergence({5: -0.15, 7: -2.0}, control) - 0.05) < 1e-12
    # The control's token missing from the APC run's top-k is the largest divergence.
    assert grading.divergence({7: -0.1}, control) == grading.DIVERGENCE_CAP
    assert grading.divergence({}, {}) == grading.DIVERGENCE_CAP


def test_unknown_signal_is_refused():
    import pytest

    with pytest.raises(ValueError, match="expected 'needle' or 'logprob'"):
        grading.grade(
            signal="vibes", waves=[], engagement=ENGAGED, liveness=None, rules=UP, require_hits=True
        )


def test_hits_reported_by_requests_count_when_the_counters_miss_them():
    # vLLM 0.26.0 drops the scheduler stats of prefill-only steps: counters read zero while
    # the requests themselves report cached tokens.
    counted_nothing = Engagement(
        prefix_cache_queries=0,
        prefix_cache_hits=0,
        spec_decode_num_drafts=9,
        cached_prompt_tokens=480,
    )
    clean = grade_needle(needle_wave(0, 0), engagement=counted_nothing)
    assert clean.status == "clean"
    # The reason says where the evidence of engagement came from, not "0 hits".
    assert "0 hits of 0 queries (480 cached prompt tokens in request outputs), 9 drafts" in (
        clean.reason
    )
    assert "cached prompt tokens" not in grade_needle(needle_wave(0, 0)).reason
    nothing_at_all = Engagement(
        prefix_cache_queries=0, prefix_cache_hits=0, spec_decode_num_drafts=9
    )
    v = grade_needle(needle_wave(0, 0), engagement=nothing_at_all)
    assert (v.status, v.gate) == ("inconclusive", "engagement")
    assert "cached prompt tokens in request outputs 0" in v.reason


def test_liveness_passes_on_a_hit_the_request_reports():
    quiet_counters = Liveness(prompt_tokens=602, hits=0, queries=0, cached_tokens=480)
    assert quiet_counters.passed
    assert grade_needle(needle_wave(0, 0), liveness=quiet_counters).status == "clean"
    assert not Liveness(prompt_tokens=602, hits=0, queries=0, cached_tokens=0).passed


def test_self_spread_measures_against_the_medoid_not_an_outlier():
    token = 7
    answers = [{token: -1.0}] + [{token: -2.0 + 0.001 * i} for i in range(15)]
    spread = grading.self_spread(answers)
    assert len(spread) == 15
    # The outlier shows up once, the others sit close to their medoid.
    assert sorted(spread)[-1] == pytest.approx(1.0, abs=0.02)
    assert sorted(spread)[-2] < 0.02
    assert grading.self_spread([{token: -1.0}]) == []


def test_control_that_disagrees_with_itself_cannot_grade_the_cache():
    # Shaped like the H200's cold race (artifacts/examples/h200-vllm-0.26.0-investigation,
    # run 15): cold requests quiet, every hit 0.069 off the control, and the control's own
    # answers to the identical prompts two at 0.068 from their medoid, the rest at 0.
    wave = logprob_wave(hit=[0.069] * 14, cold=[0.001, 0.006] + [0.0] * 5)
    spread = [0.068, 0.063] + [0.0] * 13
    verdict = grade_logprob(wave, extra_noise=spread)
    assert (verdict.status, verdict.gate) == ("inconclusive", "control_quality")
    assert "spread up to 0.0680" in verdict.reason and "disagrees with itself" in verdict.reason
    # Without the gate (artifacts graded before it) the same figures read as corruption.
    assert grade_logprob(wave, extra_noise=spread, control_spread_gate=False).status == (
        "corrupted"
    )
    # A spread within the threshold (the CPU's one bf16 step) leaves the verdict to the flips.
    assert grade_logprob(wave, extra_noise=[0.008] * 15).status == "corrupted"


def test_the_one_sided_split_decides_when_both_groups_pass_the_threshold():
    """Flagged cache hits are forward flips and flagged cold requests reverse ones: a wave
    where both groups cross the threshold is clean within the margin, and one where the
    hits outnumber the cold ones past it is corrupted. (Counting every flagged request as a
    forward flip, or as a reverse one, turns one of these verdicts around.)"""
    quiet = [0.001] * 40  # benign spread measured beside the wave: sets the floor low
    cold = [0.001] * 17 + [0.05] * 3  # 3 cold requests cross the threshold
    balanced = logprob_wave(hit=[0.001] * 6 + [0.05] * 4, cold=cold)
    verdict = grade_logprob(balanced, extra_noise=quiet)
    assert verdict.threshold.value == grading.THRESHOLD_MIN  # both groups' 0.05 are flagged
    (grade,) = verdict.waves
    assert (grade.forward_flips, grade.reverse_flips) == (4, 3)
    assert grade.flagged == (False,) * 6 + (True,) * 4 + (False,) * 17 + (True,) * 3
    assert verdict.status == "clean", verdict.reason

    one_sided = logprob_wave(hit=[0.001] * 4 + [0.05] * 6, cold=cold)
    verdict = grade_logprob(one_sided, extra_noise=quiet)
    (grade,) = verdict.waves
    assert (grade.forward_flips, grade.reverse_flips) == (6, 3)
    assert verdict.status == "corrupted" and "6 forward flips vs 3 reverse" in verdict.reason


# -- upstream's rules (RULES_UPSTREAM) ---------------------------------------------------

UP = grading.RULES_UPSTREAM


def control_wave(n: int, control_misses: int, *, name: str, identical: bool = False) -> Wave:
    """`n` requests whose control missed `control_misses` (the APC run misses the same)."""
    requests = tuple(
        RequestResult(i, 256, apc_miss=i < control_misses, control_miss=i < control_misses)
        for i in range(n)
    )
    return Wave(name, requests, 1, 1, distinct_rule=identical)


def grade_up(*waves, **options):
    """A needle verdict under upstream's rules."""
    return grade_needle(*waves, rules=UP, **options)


def test_upstream_cold_race_control_fails_only_when_every_wave1_answer_misses():
    wave2 = control_wave(35, 0, name="wave2")
    # 15 of 16 misses would fail the kit's old 50 % rule; upstream grades it.
    assert grade_up(control_wave(16, 15, name="wave1", identical=True), wave2).status == "clean"
    verdict = grade_up(control_wave(16, 16, name="wave1", identical=True), wave2)
    assert (verdict.status, verdict.gate) == ("inconclusive", "control_quality")
    assert "missed all 16 answers of wave1" in verdict.reason


@pytest.mark.parametrize(
    ("n", "misses", "weak"), [(35, 17, False), (35, 18, True), (32, 16, False), (32, 17, True)]
)
def test_upstream_control_fails_past_half_of_a_wave(n, misses, weak):
    # Cold-race wave 2 (n // 2 of the facts) and multi-turn (16 of 32) alike.
    verdict = grade_up(control_wave(n, misses, name="wave2"))
    assert (verdict.gate == "control_quality") is weak, verdict.reason
    if weak:
        assert f"missed {misses}/{n} of wave2, more than {n // 2}" in verdict.reason


def test_kit_rules_keep_the_old_control_gate_for_old_artifacts():
    verdict = grading.grade(
        signal="needle",
        waves=[control_wave(16, 9, name="wave1", identical=True)],
        engagement=ENGAGED,
        liveness=LIVE,
        rules=LEGACY,
        require_hits=True,
    )
    assert verdict.gate == "control_quality" and "needs at least 50%" in verdict.reason


def test_requires_hits_everywhere_but_upstreams_cold_race():
    assert grading.requires_hits("multi-turn", UP)
    assert not grading.requires_hits("cold-race", UP)
    assert grading.requires_hits("cold-race", grading.RULES_KIT)


NO_TRIGGER_HITS = Engagement(
    prefix_cache_queries=1000, prefix_cache_hits=0, spec_decode_num_drafts=80
)


def test_cold_race_outcomes_are_kept_apart():
    wave = needle_wave(0, 0)
    engaged = grade_up(wave, require_hits=False)
    assert (engaged.status, engaged.outcome) == ("clean", "clean-engaged")
    cured = grade_up(wave, engagement=NO_TRIGGER_HITS, require_hits=False)
    assert (cured.status, cured.outcome) == ("clean", "clean-zero-trigger-hits")
    assert "trigger waves at zero hits while the liveness probe hit (768 hits" in cured.reason
    quiet = Liveness(prompt_tokens=896, hits=0, queries=896, cached_tokens=0)
    zero = grade_up(wave, engagement=NO_TRIGGER_HITS, liveness=quiet, require_hits=False)
    assert (zero.status, zero.gate, zero.outcome) == ("inconclusive", "liveness", "zero-hit")
    assert "caching is effectively disabled" in zero.reason
    bad = grade_up(
        needle_wave(5, 0), engagement=NO_TRIGGER_HITS, liveness=quiet, require_hits=False
    )
    # Corruption is judged before liveness, as upstream does.
    assert (bad.status, bad.outcome) == ("corrupted", "corrupted")


def test_zero_trigger_hits_still_fail_engagement_where_hits_are_required():
    verdict = grade_up(needle_wave(0, 0), engagement=NO_TRIGGER_HITS, require_hits=True)
    assert (verdict.status, verdict.gate, verdict.outcome) == ("inconclusive", "engagement", None)


def test_queries_and_drafts_are_required_even_without_hits():
    for engagement, missing in (
        (Engagement(0, 0, 80), "zero prefix-cache queries"),
        (Engagement(1000, 0, 0), "zero speculative drafts"),
    ):
        verdict = grade_up(needle_wave(0, 0), engagement=engagement, require_hits=False)
        assert verdict.gate == "engagement" and missing in verdict.reason
        assert "prefix-cache hits" not in verdict.reason.split("(")[0]


def test_distinct_rule_is_upstreams_max_ctl_1_plus_1():
    requests = tuple(RequestResult(i, 256, apc_miss=False, control_miss=False) for i in range(16))
    assert grade_up(Wave("wave1", requests, 3, 2, distinct_rule=True)).status == "clean"
    verdict = grade_up(Wave("wave1", requests, 4, 2, distinct_rule=True))
    assert verdict.status == "corrupted" and "gave 4 distinct outputs; control: 2" in verdict.reason


def test_unknown_rules_are_refused():
    with pytest.raises(ValueError, match="unknown grading rules 'mine'"):
        grading.grade(
            signal="needle",
            waves=[],
            engagement=ENGAGED,
            liveness=None,
            rules="mine",
            require_hits=True,
        )


def test_one_engagement_rule_for_the_live_grade_and_every_regrade():
    counters = {
        name: {"prefix_cache_queries": q, "prefix_cache_hits": h, "spec_decode_num_drafts": d}
        for name, q, h, d in [
            ("wave1", 400, 300, 0),
            ("wave2", 200, 100, 1),
            ("liveness_baseline", 50, 0, 2),
            ("liveness", 60, 40, 30),
        ]
    }
    waves = [needle_wave(1, 0, name="wave1"), needle_wave(0, 0, name="wave2")]
    up = grading.engagement_of(counters, waves, UP)
    # Hits and queries of the waves only; drafts of every entry (read after the probe's
    # long decode), under the rules the kit runs.
    assert (up.prefix_cache_queries, up.prefix_cache_hits) == (600, 400)
    assert up.spec_decode_num_drafts == 33
    assert up.cached_prompt_tokens == 256 * (11 + 10)
    # The kit's older rules (old artifacts): drafts of the waves only.
    assert grading.engagement_of(counters, waves, LEGACY).spec_decode_num_drafts == 1
