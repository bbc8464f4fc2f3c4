"""Prompt and decode sizes of each arm, in multiples of the Mamba block size B.

Upstream's arms are defined against B: the cold-race prompt must straddle exactly one block
boundary, the multi-turn decode must cross the second. The kit measures B on the booted
engine (`engine.Engine.geometry`) and derives every size here, so the same arm runs on a
120B model with B in the thousands and on the tiny model with B of a hundred or so.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.errors import GeometryUnsupported

# Cold-race: one prompt of ~1.35 B, so its prefill spans the first block boundary and the
# racing requests can cache (or wrongly cache) the state at that boundary.
COLD_RACE_PROMPT_FACTOR = 1.35
COLD_RACE_MIN_FACTOR = 1.05
COLD_RACE_MAX_FACTOR = 1.95
COLD_RACE_IDENTICAL_PROMPTS = 16
# Wave 2 asks about each vault of the same haystack: it resumes from wave 1's cached blocks.
COLD_RACE_VAULTS = 8
COLD_RACE_OUTPUT_TOKENS = 8

# Liveness probe: a prompt of 3 B + 128 tokens, sent twice; the second must hit the cache.
LIVENESS_EXTRA_TOKENS = 128

# Multi-turn: upstream sends prompts of 2 B - 192 and decodes past 2 B. For a small B the 192
# is scaled down to B/2 so the prompt still ends inside the second block.
MULTI_TURN_PROMPTS = 32
MULTI_TURN_DECODE_RESERVE = 192
MULTI_TURN_VAULTS = 2
MULTI_TURN_FOLLOW_UP_TOKENS = 8


@dataclass(frozen=True)
class ColdRaceSizes:
    prompt_tokens: int
    output_tokens: int
    liveness_prompt_tokens: int


@dataclass(frozen=True)
class MultiTurnSizes:
    prompt_tokens: int
    decode_tokens: int
    follow_up_tokens: int


def cold_race_sizes(
    mamba_block_size: int, *, max_num_batched_tokens: int, max_model_len: int
) -> ColdRaceSizes:
    b = mamba_block_size
    if b > max_num_batched_tokens:
        raise GeometryUnsupported(
            f"Mamba block size {b} exceeds the cold-race token budget "
            f"max_num_batched_tokens={max_num_batched_tokens}: a block can never be "
            f"scheduled whole; lower the block size or raise the budget"
        )
    liveness = 3 * b + LIVENESS_EXTRA_TOKENS
    if liveness + COLD_RACE_OUTPUT_TOKENS > max_model_len:
        raise GeometryUnsupported(
            f"liveness probe needs {liveness + COLD_RACE_OUTPUT_TOKENS} tokens "
            f"(3 B + {LIVENESS_EXTRA_TOKENS} with B={b}) but max_model_len={max_model_len}"
        )
    return ColdRaceSizes(
        prompt_tokens=round(COLD_RACE_PROMPT_FACTOR * b),
        output_tokens=COLD_RACE_OUTPUT_TOKENS,
        liveness_prompt_tokens=liveness,
    )


def check_cold_race_prompt(prompt_tokens: int, mamba_block_size: int) -> None:
    """The built prompt must straddle exactly one block boundary (1.05 B .. 1.95 B)."""
    low = COLD_RACE_MIN_FACTOR * mamba_block_size
    high = COLD_RACE_MAX_FACTOR * mamba_block_size
    if not low <= prompt_tokens <= high:
        raise GeometryUnsupported(
            f"cold-race prompt has {prompt_tokens} tokens; it must lie within "
            f"{low:.0f}..{high:.0f} (1.05 B .. 1.95 B with B={mamba_block_size})"
        )


def multi_turn_sizes(mamba_block_size: int, *, max_model_len: int) -> MultiTurnSizes:
    b = mamba_block_size
    reserve = min(MULTI_TURN_DECODE_RESERVE, b // 2)
    prompt = 2 * b - reserve
    # Decode past the 2 B boundary by an eighth of a block, so the second block fills during
    # speculative decode and its Mamba state is cached from there.
    decode = reserve + max(16, b // 8)
    turn_two = prompt + decode + MULTI_TURN_FOLLOW_UP_TOKENS + 64
    if turn_two > max_model_len:
        raise GeometryUnsupported(
            f"multi-turn second turn needs about {turn_two} tokens with B={b}, "
            f"but max_model_len={max_model_len}"
        )
    return MultiTurnSizes(
        prompt_tokens=prompt,
        decode_tokens=decode,
        follow_up_tokens=MULTI_TURN_FOLLOW_UP_TOKENS,
    )
