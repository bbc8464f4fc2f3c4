"""Multi-turn arm: second turns that resume from Mamba blocks written during speculative decode.

Mechanism (upstream #47861 / #45614 / #46281 lane): under MTP the engine decodes a few tokens
ahead, and the Mamba hit length can overrun the attention-verified hit by that lookahead, so
a later request resumes from a state that includes unverified draft tokens. Turn 1 is a prompt
of about 2 B - 192 tokens decoded past the 2 B boundary; turn 2 resends the exact turn-1
tokens plus a follow-up question, so its prefix-cache hit covers the block completed during
speculative decode.
"""

from __future__ import annotations

from repro import geometry, prompts
from repro.arms.common import (
    ArmResult,
    PhaseTimer,
    answer_sampling,
    compare_wave,
    engagement_of,
    record,
    run_wave,
    start_engine,
)
from repro.engine import Sampling
from repro.profiles import Profile

FIRST_HAYSTACK_SEED = 1000


def run_multi_turn(profile: Profile, model_path: str, timer: PhaseTimer | None = None) -> ArmResult:
    timer = timer or PhaseTimer()
    arm = "multi-turn"
    with start_engine(profile, model_path, arm=arm, prefix_caching=True) as engine:
        timer.add("boot", engine.boot_seconds)
        with timer.phase("prepare"):
            geo = engine.geometry()
            sizes = geometry.multi_turn_sizes(
                geo.mamba_block_size, max_model_len=profile.max_model_len
            )
            haystacks = []
            for i in range(geometry.MULTI_TURN_PROMPTS):
                haystack, _ = prompts.fitted_haystack(
                    seed=FIRST_HAYSTACK_SEED + i,
                    max_vaults=geometry.MULTI_TURN_VAULTS,
                    target_tokens=sizes.prompt_tokens,
                    count_tokens=engine.count_tokens,
                )
                haystacks.append(haystack)
            # Each prompt asks about one of its haystack's vaults, alternating.
            vaults = [i % len(h.codes) for i, h in enumerate(haystacks)]
            wave1 = [h.prompt(v) for h, v in zip(haystacks, vaults, strict=False)]
            follow_up_ids = _encode(engine, "\n" + prompts.FOLLOW_UP + "\nAnswer:")
            turn_one = Sampling(
                max_tokens=sizes.decode_tokens,
                # min_tokens makes decoding cross the second block boundary (under MTP).
                min_tokens=sizes.decode_tokens,
                ignore_eos=profile.ignore_eos,
            )
            turn_two = answer_sampling(profile, sizes.follow_up_tokens)
        apc = record(engine)
        apc_w1, apc.counters["wave1"] = run_wave(engine, wave1, turn_one, timer)
        # Exact token ids of turn 1 (prompt + output), so turn 2's prefix matches the
        # blocks that were cached during decode; re-tokenized text might not.
        wave2 = [list(c.prompt_token_ids) + list(c.token_ids) + follow_up_ids for c in apc_w1]
        apc_w2, apc.counters["wave2"] = run_wave(engine, wave2, turn_two, timer)

    with start_engine(profile, model_path, arm=arm, prefix_caching=False) as engine:
        timer.add("boot", engine.boot_seconds)
        control = record(engine)
        ctl_w1, control.counters["wave1"] = run_wave(engine, wave1, turn_one, timer)
        # The control answers the APC run's own transcripts: identical inputs, so any
        # difference comes from reading cached state rather than recomputing it.
        ctl_w2, control.counters["wave2"] = run_wave(engine, wave2, turn_two, timer)

    codes = (
        [h.codes[v] for h, v in zip(haystacks, vaults, strict=False)]
        if profile.signal == "needle"
        else None
    )
    waves = [
        # Turn 1 reads no decode-written blocks; it is recorded (its cold requests give the
        # noise floor) but upstream grades turn 2.
        compare_wave("wave1", apc_w1, ctl_w1, codes=codes, graded=False),
        compare_wave("wave2", apc_w2, ctl_w2, codes=codes),
    ]
    return ArmResult(
        arm=arm,
        geometry=geo,
        prompt_tokens={
            "wave1": [c.num_prompt_tokens for c in apc_w1],
            "wave2": [c.num_prompt_tokens for c in apc_w2],
        },
        waves=waves,
        apc=apc,
        control=control,
        liveness=None,
        extra_noise=[],
        engagement=engagement_of(apc.counters, ["wave1", "wave2"], apc_w1 + apc_w2),
        phases=timer.seconds,
        extra={"decode_tokens": sizes.decode_tokens},
    )


def _encode(engine, text: str) -> list[int]:
    return list(engine.llm.get_tokenizer().encode(text, add_special_tokens=False))
