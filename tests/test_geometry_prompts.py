"""Prompt sizing in Mamba blocks, and the needle manuals, by upstream's rules."""

from __future__ import annotations

import random

import pytest

from repro import profiles
from repro.arms import geometry, prompts
from repro.core.errors import GeometryUnsupported


def count_words(text: str) -> int:
    """A stand-in tokenizer for sizing logic: one token per whitespace-separated word."""
    return len(text.split())


@pytest.mark.parametrize("b", [64, 160, 256, 1024, 2048])
def test_cold_race_targets_are_upstreams(b):
    sizes = geometry.cold_race_sizes(b, max_num_batched_tokens=4096, max_model_len=10240)
    assert sizes.manual_tokens == int(1.35 * b)
    assert sizes.liveness_manual_tokens == 3 * b + 128
    geometry.check_cold_race_manual(sizes.manual_tokens, b)


def test_cold_race_refuses_block_larger_than_budget():
    with pytest.raises(GeometryUnsupported, match="exceeds the cold-race token budget"):
        geometry.cold_race_sizes(512, max_num_batched_tokens=320, max_model_len=4096)


def test_liveness_probe_needs_3b_plus_512():
    geometry.cold_race_sizes(1024, max_num_batched_tokens=4096, max_model_len=3 * 1024 + 512)
    with pytest.raises(GeometryUnsupported, match="3 B \\+ 512 = 3584"):
        geometry.cold_race_sizes(1024, max_num_batched_tokens=4096, max_model_len=3583)


def test_cold_race_window_is_strict():
    geometry.check_cold_race_manual(106, 100)
    for outside in (105, 195, 200):
        with pytest.raises(GeometryUnsupported, match="strictly between 105.0 and 195.0"):
            geometry.check_cold_race_manual(outside, 100)


@pytest.mark.parametrize("b", [1024, 2048, 3000])
def test_multi_turn_at_full_scale_is_upstreams(b):
    sizes = geometry.multi_turn_sizes(b, max_model_len=100_000)
    assert sizes.manual_tokens == 2 * b - 192
    assert (sizes.lower_bound, sizes.upper_bound) == (b, 2 * b - 48)
    m = sizes.manual_tokens + 5  # a built manual near the target
    assert sizes.first_turn_tokens(b, m) == (2 * b - m + 96, 2 * b - m + 96 + 64)


@pytest.mark.parametrize("b", [128, 160, 256, 383])
def test_multi_turn_small_blocks_scale_the_offsets(b):
    sizes = geometry.multi_turn_sizes(b, max_model_len=100_000)
    assert sizes.lower_bound < sizes.manual_tokens < sizes.upper_bound < 2 * b
    low, high = sizes.first_turn_tokens(b, sizes.manual_tokens)
    assert sizes.manual_tokens + low > 2 * b  # the first turn decodes across 2 B
    assert high > low


def test_multi_turn_refuses_when_second_turn_does_not_fit():
    # Upstream: m + min_tokens + 64 + 128 = 2 B + 96 + 64 + 128 must fit.
    geometry.multi_turn_sizes(1024, max_model_len=2 * 1024 + 288)
    with pytest.raises(GeometryUnsupported, match="max_model_len=2335"):
        geometry.multi_turn_sizes(1024, max_model_len=2335)


def test_multi_turn_manual_window():
    sizes = geometry.multi_turn_sizes(1024, max_model_len=10240)
    geometry.check_multi_turn_manual(sizes, 1900, 1024)
    with pytest.raises(GeometryUnsupported, match="strictly between 1024 and 2000"):
        geometry.check_multi_turn_manual(sizes, 2000, 1024)


@pytest.mark.parametrize(
    ("target", "needles"), [(100, 8), (560, 8), (700, 10), (2691, 38), (9000, 40)]
)
def test_needle_count_is_upstreams(target, needles):
    assert prompts.needle_count(target) == needles


def test_codes_are_six_digits_from_one_seeded_rng():
    rng = random.Random(20260709)
    expected = tuple(f"{rng.randint(0, 999999):06d}" for _ in range(40))
    assert prompts.make_codes(40) == expected
    assert prompts.make_codes(8) == expected[:8]  # more facts extend the same codes
    assert all(len(c) == 6 and c.isdigit() for c in expected)


def test_manual_layout_fact_i_ends_slot_i():
    manual = prompts.Manual(prompts.make_codes(3), filler_count=7)
    lines = manual.text().split("\n")
    assert lines[0] == prompts.HEADER and lines[1] == ""
    body = lines[2:]
    fact_rows = [i for i, line in enumerate(body) if line.startswith("Security fact")]
    # 7 sentences over 3 slots: 3, 2, 2, each slot closed by its fact.
    assert fact_rows == [3, 6, 9]
    assert body[:3] == prompts.FILLER_SENTENCES[:3]  # in order, not drawn at random
    assert body[10:] == ["", prompts.FOOTER, "", ""]
    assert manual.text().endswith(prompts.FOOTER + "\n\n")
    assert manual.prompt(1) == manual.text() + (
        "Question: What is the access code for vault-01? Reply with only the code.\nAnswer:"
    )


def test_sized_manual_is_closest_to_target_question_excluded():
    manual, tokens = prompts.sized_manual(target_tokens=900, count_tokens=count_words)
    assert tokens == count_words(manual.text())
    assert manual.num_needles == prompts.needle_count(900) == 12
    neighbours = [
        count_words(prompts.Manual(manual.codes, manual.filler_count + d).text()) for d in (-1, 1)
    ]
    assert all(abs(tokens - 900) <= abs(n - 900) for n in neighbours)
    again = prompts.sized_manual(target_tokens=900, count_tokens=count_words)
    assert again == (manual, tokens)


def test_sized_manual_with_fewer_needles_for_small_blocks():
    manual, _ = prompts.sized_manual(target_tokens=900, count_tokens=count_words, num_needles=3)
    assert manual.codes == prompts.make_codes(3)


def test_sized_manual_refuses_unreachable_target():
    with pytest.raises(ValueError, match="cannot reach a 10000000-token manual"):
        prompts.sized_manual(target_tokens=10_000_000, count_tokens=count_words)


def test_cold_race_waves_ask_near_end_then_every_fact():
    manual = prompts.Manual(prompts.make_codes(10), filler_count=20)
    waves = prompts.cold_race_waves(manual, 16)
    assert waves.wave1_vault == 8
    assert waves.wave1 == [manual.prompt(8)] * 16
    assert waves.wave2_vaults == list(range(10))
    assert waves.wave2 == [manual.prompt(v) for v in range(10)]


def test_multi_turn_turns():
    manual = prompts.Manual(prompts.make_codes(26), filler_count=40)
    first = prompts.multi_turn_first([manual] * 32)
    assert len(first) == 32 and len(set(first)) == 32
    assert first[31] == manual.text() + (
        "Question: Describe, step by step, the procedure for opening vault-31.\nAnswer:"
    )
    vaults = [prompts.second_turn_vault(i, 26) for i in range(32)]
    assert vaults[:4] == [3, 10, 17, 24] and vaults[4] == 5
    assert all(v != i for i, v in enumerate(vaults) if i < 26)  # a different vault
    turn_two = prompts.second_turn(first[0], " Step one.", 3)
    assert turn_two == first[0] + " Step one.\n\n" + prompts.needle_question(3)


def test_multi_turn_manuals_shared_on_needle_profiles_one_per_turn_on_logprob():
    from repro.arms.multi_turn import first_turn_manuals

    sizes = geometry.multi_turn_sizes(1024, max_model_len=10240)
    shared, tokens = first_turn_manuals(profiles.NEMOTRON, sizes, count_words)
    assert len(shared) == 32 and set(shared) == {shared[0]} and len(set(tokens)) == 1
    assert shared[0].codes == prompts.make_codes(shared[0].num_needles)  # upstream's codes

    own, tokens = first_turn_manuals(profiles.TINY, sizes, count_words)
    assert len(own) == 32 and len(tokens) == 32
    assert all(abs(t - sizes.manual_tokens) <= 15 for t in tokens)
    # Each differs from every other by the first fact, a few sentences in: no shared block.
    first_facts = {m.text().split(prompts.fact_line(0, m.codes[0]))[0] + m.codes[0] for m in own}
    assert len(first_facts) == 32


def test_miss_is_code_not_in_output():
    assert prompts.is_miss("The code is 82423567", "824568")
    assert not prompts.is_miss(" 824568", "824568")
    assert not prompts.is_miss("009113 and more", "009113")  # zero-padded codes
