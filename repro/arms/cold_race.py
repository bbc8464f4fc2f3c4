"""Cold-race arm: identical prompts prefilled cold and concurrently under a small budget.

Mechanism (upstream #45477 lane, fixed upstream by PR #51113): when chunked prefill splits a
prompt mid-block, the engine can cache the Mamba state of a chunk end as if it were the
state at a block boundary. Sixteen identical cold prompts of ~1.35 B tokens, sharing a token
budget, make exactly those splits, and the later requests of the same wave read the
wrongly-cached state. Wave 2 asks about each vault of the same haystack and so resumes from
wave 1's cached blocks. A liveness probe afterwards proves the cache still produces hits.
"""

from __future__ import annotations

from repro import geometry, grading, prompts
from repro.arms.common import (
    ArmResult,
    PhaseTimer,
    answer_sampling,
    compare_wave,
    engagement_of,
    measure_block_size,
    record,
    run_wave,
    start_engine,
)
from repro.profiles import Profile

HAYSTACK_SEED = 824568
LIVENESS_SEED = 3


def run_cold_race(profile: Profile, model_path: str, timer: PhaseTimer | None = None) -> ArmResult:
    timer = timer or PhaseTimer()
    arm = "cold-race"
    block_size = measure_block_size(profile, model_path, timer)
    with start_engine(
        profile, model_path, arm=arm, prefix_caching=True, mamba_block_size=block_size
    ) as engine:
        timer.add("boot", engine.boot_seconds)
        with timer.phase("prepare"):
            geo = engine.geometry()
            sizes = geometry.cold_race_sizes(
                geo.mamba_block_size,
                max_num_batched_tokens=geo.max_num_batched_tokens,
                max_model_len=profile.max_model_len,
            )
            haystack, prompt_tokens = prompts.fitted_haystack(
                seed=HAYSTACK_SEED,
                max_vaults=geometry.COLD_RACE_VAULTS,
                target_tokens=sizes.prompt_tokens,
                count_tokens=engine.count_tokens,
            )
            geometry.check_cold_race_prompt(prompt_tokens, geo.mamba_block_size)
            probe, probe_tokens = prompts.sized_haystack(
                seed=LIVENESS_SEED,
                vaults=geometry.COLD_RACE_VAULTS,
                target_tokens=sizes.liveness_prompt_tokens,
                count_tokens=engine.count_tokens,
            )
            wave1 = [haystack.prompt(0)] * geometry.COLD_RACE_IDENTICAL_PROMPTS
            wave2 = [haystack.prompt(v) for v in range(len(haystack.codes))]
            sampling = answer_sampling(profile, sizes.output_tokens)
        apc = record(engine)
        apc_w1, apc.counters["wave1"] = run_wave(engine, wave1, sampling, timer)
        apc_w2, apc.counters["wave2"] = run_wave(engine, wave2, sampling, timer)
        # Twice, one after the other: the second send must be served from the cache.
        run_wave(engine, [probe.prompt(0)], sampling, timer)
        probe_again, apc.counters["liveness"] = run_wave(engine, [probe.prompt(0)], sampling, timer)

    with start_engine(
        profile, model_path, arm=arm, prefix_caching=False, mamba_block_size=block_size
    ) as engine:
        timer.add("boot", engine.boot_seconds)
        control = record(engine)
        ctl_w1, control.counters["wave1"] = run_wave(engine, wave1, sampling, timer)
        ctl_w2, control.counters["wave2"] = run_wave(engine, wave2, sampling, timer)

    codes_w1 = [haystack.codes[0]] * len(wave1) if profile.signal == "needle" else None
    codes_w2 = list(haystack.codes) if profile.signal == "needle" else None
    waves = [
        compare_wave("wave1", apc_w1, ctl_w1, codes=codes_w1, distinct_rule=True),
        compare_wave("wave2", apc_w2, ctl_w2, codes=codes_w2),
    ]
    # Benign noise beside the waves: the control's answers to 16 identical prompts differ
    # only through batch shape, the same noise that touches the APC run.
    control_spread = grading.self_spread([c.first_logprobs for c in ctl_w1])
    live = apc.counters["liveness"]
    return ArmResult(
        arm=arm,
        geometry=geo,
        prompt_tokens={
            "wave1": [c.num_prompt_tokens for c in apc_w1],
            "wave2": [c.num_prompt_tokens for c in apc_w2],
            "liveness": [probe_tokens],
        },
        waves=waves,
        apc=apc,
        control=control,
        liveness=grading.Liveness(
            prompt_tokens=probe_tokens,
            hits=live.prefix_cache_hits,
            queries=live.prefix_cache_queries,
            cached_tokens=probe_again[0].num_cached_tokens or 0,
        ),
        extra_noise=control_spread,
        engagement=engagement_of(apc.counters, ["wave1", "wave2"], apc_w1 + apc_w2),
        phases=timer.seconds,
        extra={"control_spread": control_spread},
    )
