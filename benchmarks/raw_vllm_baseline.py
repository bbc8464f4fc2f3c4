"""The `tiny` profile's two arms straight through vLLM, without the kit (a benchmark baseline).

Run with an engine environment's python (`bench_repro_tiny.py` does). It sends what the
kit's arms send, in the same order per engine: the same engine settings (the profile's own
`engine_settings`), the same prompts (the kit's prompt builders, sized with the engine's
tokenizer), the same sampling and the same waves, each through one `LLM.generate` call, on
four engines (APC run and control of each arm) in one process with one vLLM import (the
prompt builders are the kit's own pure functions: `repro.arms.prompts`,
`repro.arms.geometry` and the arms' manual choice, so the baseline follows the arms when
they change). It reads no counters, grades nothing and writes no artifact:
whatever the kit spends beyond this is its own overhead.

The multi-turn arm runs first here so that B can be read from its booted APC engine, as
upstream's test reads it, for the cold-race budget of 1.25 B; the kit derives B from vLLM's
configuration before it boots instead.

Prints one JSON object: wall time and the seconds in import, boot and generate, and boots.
`MODEL --warm-only` builds one engine configuration and exits (fills vLLM's caches).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

STARTED = time.perf_counter()
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

import vllm  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402

from repro.arms import geometry, prompts  # noqa: E402
from repro.arms.common import answer_sampling, fixed_sampling  # noqa: E402
from repro.arms.multi_turn import first_turn_manuals  # noqa: E402
from repro.engine.llm import Sampling, resolve_settings  # noqa: E402
from repro.profiles import get_profile  # noqa: E402

IMPORT_S = time.perf_counter() - STARTED
TIMES = {"import": IMPORT_S, "boot": 0.0, "generate": 0.0}
BOOTS = 0


def params(sampling: Sampling) -> SamplingParams:
    return SamplingParams(
        temperature=0.0,
        max_tokens=sampling.max_tokens,
        min_tokens=sampling.min_tokens,
        ignore_eos=sampling.ignore_eos,
        logprobs=8,
        stop=list(sampling.stop) or None,
    )


def boot(profile, model: str, **settings_args) -> LLM:
    global BOOTS
    settings, _ = resolve_settings(
        profile.engine_settings(**settings_args), profile.optional_settings, EngineArgs
    )
    started = time.perf_counter()
    llm = LLM(model=model, **settings)
    TIMES["boot"] += time.perf_counter() - started
    BOOTS += 1
    return llm


def generate(llm: LLM, batch: list, sampling: Sampling) -> list:
    batch = [p if isinstance(p, str) else {"prompt_token_ids": list(p)} for p in batch]
    started = time.perf_counter()
    outputs = llm.generate(batch, params(sampling), use_tqdm=False)
    TIMES["generate"] += time.perf_counter() - started
    return outputs


def shut_down(llm: LLM) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def multi_turn(profile, model: str) -> int:
    """Both runs of the multi-turn arm; returns B as the APC engine booted with it."""
    llm = boot(profile, model, arm="multi-turn", prefix_caching=True)
    b = llm.llm_engine.vllm_config.cache_config.mamba_block_size
    tokenizer = llm.get_tokenizer()
    sizes = geometry.multi_turn_sizes(b, max_model_len=profile.max_model_len)
    manuals, manual_tokens = first_turn_manuals(
        profile, sizes, lambda text: len(tokenizer.encode(text))
    )
    low, high = sizes.first_turn_tokens(b, min(manual_tokens))
    wave1 = prompts.multi_turn_first(manuals)
    vaults = [prompts.second_turn_vault(i, manuals[0].num_needles) for i in range(len(wave1))]
    turn_one = Sampling(
        max_tokens=low if profile.ignore_eos else high,
        min_tokens=low,
        ignore_eos=profile.ignore_eos,
    )
    turn_two = answer_sampling(profile)
    first = generate(llm, wave1, turn_one)
    wave2 = [
        list(out.prompt_token_ids)
        + list(out.outputs[0].token_ids)
        + list(tokenizer.encode(prompts.second_turn_suffix(v), add_special_tokens=False))
        for out, v in zip(first, vaults, strict=True)
    ]
    generate(llm, wave2, turn_two)
    shut_down(llm)
    llm = boot(profile, model, arm="multi-turn", prefix_caching=False)
    generate(llm, wave1, turn_one)
    generate(llm, wave2, turn_two)
    shut_down(llm)
    return b


def cold_race(profile, model: str, b: int) -> None:
    llm = boot(profile, model, arm="cold-race", prefix_caching=True, mamba_block_size=b)
    tokenizer = llm.get_tokenizer()

    def count(text: str) -> int:
        return len(tokenizer.encode(text))

    budget = llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    sizes = geometry.cold_race_sizes(
        b, max_num_batched_tokens=budget, max_model_len=profile.max_model_len
    )
    manual, _ = prompts.sized_manual(target_tokens=sizes.manual_tokens, count_tokens=count)
    probe, _ = prompts.sized_manual(target_tokens=sizes.liveness_manual_tokens, count_tokens=count)
    waves = prompts.cold_race_waves(manual, geometry.COLD_RACE_IDENTICAL_PROMPTS)
    sampling = answer_sampling(profile)
    probe_answer = fixed_sampling(profile, geometry.LIVENESS_ANSWER_TOKENS)
    probe_decode = fixed_sampling(profile, geometry.LIVENESS_DECODE_TOKENS)
    generate(llm, waves.wave1, sampling)
    generate(llm, waves.wave2, sampling)
    generate(llm, [probe.prompt(0)], probe_answer)
    generate(llm, [probe.prompt(1)], probe_answer)
    generate(llm, [manual.prompt(0)] * geometry.LIVENESS_DECODE_COPIES, probe_decode)
    shut_down(llm)
    llm = boot(profile, model, arm="cold-race", prefix_caching=False, mamba_block_size=b)
    generate(llm, waves.wave1, sampling)
    generate(llm, waves.wave2, sampling)
    shut_down(llm)


def main() -> int:
    model = sys.argv[1]
    profile = get_profile("tiny")
    if sys.argv[2:] == ["--warm-only"]:
        # vLLM's per-model-class cache (VLLM_CACHE_ROOT), filled before anything is timed.
        settings, _ = resolve_settings(
            profile.engine_settings(arm="multi-turn", prefix_caching=True),
            profile.optional_settings,
            EngineArgs,
        )
        EngineArgs(model=model, **settings).create_engine_config()
        return 0
    b = multi_turn(profile, model)
    cold_race(profile, model, b)
    result = {
        "vllm": vllm.__version__,
        "mamba_block_size": b,
        "boots": BOOTS,
        "wall_s": round(time.perf_counter() - STARTED, 3),
        **{f"{name}_s": round(seconds, 3) for name, seconds in TIMES.items()},
    }
    print("BASELINE " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
