"""Prompt sizing in Mamba blocks, and the deterministic needle prompts."""

from __future__ import annotations

import pytest

from repro import geometry, prompts
from repro.errors import GeometryUnsupported


def count_words(text: str) -> int:
    """A stand-in tokenizer for sizing logic: one token per whitespace-separated word."""
    return len(text.split())


@pytest.mark.parametrize("b", [64, 160, 256, 1024, 2048])
def test_cold_race_prompt_straddles_one_boundary(b):
    sizes = geometry.cold_race_sizes(b, max_num_batched_tokens=4096, max_model_len=10240)
    assert b * 1.05 <= sizes.prompt_tokens <= b * 1.95
    assert sizes.liveness_prompt_tokens == 3 * b + 128
    geometry.check_cold_race_prompt(sizes.prompt_tokens, b)


def test_cold_race_refuses_block_larger_than_budget():
    with pytest.raises(GeometryUnsupported, match="exceeds the cold-race token budget"):
        geometry.cold_race_sizes(512, max_num_batched_tokens=320, max_model_len=4096)


def test_cold_race_refuses_prompt_outside_window():
    with pytest.raises(GeometryUnsupported, match=r"1.05 B .. 1.95 B with B=100"):
        geometry.check_cold_race_prompt(200, 100)


@pytest.mark.parametrize("b", [160, 256, 1024, 3000])
def test_multi_turn_decode_crosses_the_second_boundary(b):
    sizes = geometry.multi_turn_sizes(b, max_model_len=100_000)
    assert sizes.prompt_tokens < 2 * b < sizes.prompt_tokens + sizes.decode_tokens
    if b >= 384:  # upstream's 2 B - 192 at full scale
        assert sizes.prompt_tokens == 2 * b - 192


def test_multi_turn_refuses_when_second_turn_does_not_fit():
    with pytest.raises(GeometryUnsupported, match="max_model_len=1000"):
        geometry.multi_turn_sizes(1024, max_model_len=1000)


def test_prompts_are_deterministic_and_sized():
    a, n = prompts.sized_haystack(seed=7, vaults=4, target_tokens=300, count_tokens=count_words)
    b, m = prompts.sized_haystack(seed=7, vaults=4, target_tokens=300, count_tokens=count_words)
    assert a == b and n == m and a.prompt(2) == b.prompt(2)
    assert abs(n - 300) <= 12  # within one filler sentence of the target
    context = a.context()
    for vault, code in enumerate(a.codes):
        assert prompts.fact_line(vault, code) in context
        assert len(code) == 6 and code.isdigit()
    # Questions about other vaults share the context and the length.
    assert a.prompt(3).startswith(context)
    assert count_words(a.prompt(3)) == n


def test_different_seeds_give_different_haystacks():
    a, _ = prompts.sized_haystack(seed=1, vaults=2, target_tokens=200, count_tokens=count_words)
    b, _ = prompts.sized_haystack(seed=2, vaults=2, target_tokens=200, count_tokens=count_words)
    assert a.codes != b.codes


def test_miss_is_code_not_in_output():
    assert prompts.is_miss("The code is 82423567", "824568")
    assert not prompts.is_miss(" 824568", "824568")


def test_small_blocks_get_fewer_vaults_not_longer_prompts():
    big, n_big = prompts.fitted_haystack(
        seed=5, max_vaults=8, target_tokens=400, count_tokens=count_words
    )
    small, n_small = prompts.fitted_haystack(
        seed=5, max_vaults=8, target_tokens=60, count_tokens=count_words
    )
    assert len(big.codes) == 8 and n_big <= 412
    assert 1 <= len(small.codes) < 8 and n_small <= 60
