"""Prompt and decode sizes of each arm, in multiples of the Mamba block size B.

Upstream's arms are defined against B: the cold-race manual must straddle exactly one block
boundary, the multi-turn first turn must decode across the second. The kit measures B on the
booted engine (`engine.Engine.geometry`) and derives every size here, so the same arm runs on
a 120B model with B in the thousands and on the tiny models with B of a hundred or so.

The constants are upstream's (`docs/fidelity.md` lists them). One rule is scaled: the
multi-turn offsets (192, 48, 96, 64 tokens) assume B of several hundred; below
`MULTI_TURN_FULL_SCALE_BLOCK` they shrink in proportion to B, so that the first turn still
ends inside the second block.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.core.errors import GeometryUnsupported

# Cold-race: a manual of int(1.35 B) tokens (question excluded), strictly within
# 1.05 B .. 1.95 B, so its prefill spans the first block boundary and the racing requests can
# cache (or wrongly cache) the state there.
COLD_RACE_PROMPT_FACTOR = 1.35
COLD_RACE_MIN_FACTOR = 1.05
COLD_RACE_MAX_FACTOR = 1.95
COLD_RACE_IDENTICAL_PROMPTS = 16
# Answers: greedy, at most 24 tokens, stopped at the first newline.
ANSWER_MAX_TOKENS = 24
ANSWER_STOP = ("\n",)
# Log-prob profiles (random weights) answer in exactly this many tokens instead (the signal is
# the first token; see `repro.arms.common.answer_sampling`).
LOGPROB_ANSWER_TOKENS = 8

# Liveness probe: a manual of 3 B + 128 tokens, asked about fact 0 and then fact 1 with
# 8-token answers; then the cold-race prompt of fact 0, four times, with a 128-token decode
# (it proves drafts and flushes the counters). Needs 3 B + 512 <= max_model_len.
LIVENESS_EXTRA_TOKENS = 128
LIVENESS_HEADROOM_TOKENS = 512
LIVENESS_ANSWER_TOKENS = 8
LIVENESS_DECODE_COPIES = 4
LIVENESS_DECODE_TOKENS = 128

# Multi-turn: one manual of m ~ 2 B - 192 tokens with B < m < 2 B - 48; the first turn decodes
# at least 2 B - m + 96 tokens (at most that + 64), so it crosses the 2 B boundary under MTP;
# the second turn must fit: m + min + 64 + 128 <= max_model_len.
MULTI_TURN_PROMPTS = 32
MULTI_TURN_RESERVE = 192
MULTI_TURN_UPPER_MARGIN = 48
MULTI_TURN_OVERSHOOT = 96
MULTI_TURN_SLACK = 64
MULTI_TURN_SECOND_TURN_ROOM = 128
# Below this block size 2 B - 192 would not even reach the second block; the offsets scale.
MULTI_TURN_FULL_SCALE_BLOCK = 384


@dataclass(frozen=True)
class ColdRaceSizes:
    manual_tokens: int  # the target; the built manual is checked by `check_cold_race_manual`
    liveness_manual_tokens: int


@dataclass(frozen=True)
class MultiTurnSizes:
    manual_tokens: int  # the target
    lower_bound: int  # the built manual must lie strictly between these
    upper_bound: int
    overshoot: int
    slack: int

    def first_turn_tokens(self, mamba_block_size: int, built_manual_tokens: int) -> tuple[int, int]:
        """(min_tokens, max_tokens) of the first turn for the manual actually built."""
        low = 2 * mamba_block_size - built_manual_tokens + self.overshoot
        return low, low + self.slack


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
    if 3 * b + LIVENESS_HEADROOM_TOKENS > max_model_len:
        raise GeometryUnsupported(
            f"the liveness probe needs 3 B + {LIVENESS_HEADROOM_TOKENS} = "
            f"{3 * b + LIVENESS_HEADROOM_TOKENS} tokens with B={b}, but "
            f"max_model_len={max_model_len}; without it a clean result could not be told "
            f"from a disabled cache"
        )
    return ColdRaceSizes(
        manual_tokens=int(COLD_RACE_PROMPT_FACTOR * b),
        liveness_manual_tokens=3 * b + LIVENESS_EXTRA_TOKENS,
    )


def check_cold_race_manual(manual_tokens: int, mamba_block_size: int) -> None:
    """The built manual must lie strictly between 1.05 B and 1.95 B."""
    low = COLD_RACE_MIN_FACTOR * mamba_block_size
    high = COLD_RACE_MAX_FACTOR * mamba_block_size
    if not low < manual_tokens < high:
        raise GeometryUnsupported(
            f"the cold-race manual has {manual_tokens} tokens; it must lie strictly between "
            f"{low:.1f} and {high:.1f} (1.05 B and 1.95 B with B={mamba_block_size})"
        )


def multi_turn_sizes(mamba_block_size: int, *, max_model_len: int) -> MultiTurnSizes:
    b = mamba_block_size
    scale = min(1.0, b / MULTI_TURN_FULL_SCALE_BLOCK)
    sizes = MultiTurnSizes(
        manual_tokens=2 * b - round(MULTI_TURN_RESERVE * scale),
        lower_bound=b,
        upper_bound=2 * b - round(MULTI_TURN_UPPER_MARGIN * scale),
        overshoot=round(MULTI_TURN_OVERSHOOT * scale),
        slack=round(MULTI_TURN_SLACK * scale),
    )
    low, high = sizes.first_turn_tokens(b, sizes.manual_tokens)
    needed = sizes.manual_tokens + high + MULTI_TURN_SECOND_TURN_ROOM
    if needed > max_model_len:
        raise GeometryUnsupported(
            f"the multi-turn second turn needs about {needed} tokens with B={b} "
            f"(manual {sizes.manual_tokens}, first turn up to {high}, question room "
            f"{MULTI_TURN_SECOND_TURN_ROOM}), but max_model_len={max_model_len}"
        )
    return sizes


def check_multi_turn_manual(sizes: MultiTurnSizes, manual_tokens: int, b: int) -> None:
    """The built manual must end inside the second block, short of its end."""
    if not sizes.lower_bound < manual_tokens < sizes.upper_bound:
        raise GeometryUnsupported(
            f"the multi-turn manual has {manual_tokens} tokens; it must lie strictly between "
            f"{sizes.lower_bound} and {sizes.upper_bound} (B and 2 B - "
            f"{2 * b - sizes.upper_bound} with B={b}) so the first turn decodes across 2 B"
        )
