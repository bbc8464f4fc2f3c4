"""What both arms share: the paired-run record, timing, and per-request comparison."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from repro import grading, prompts
from repro.engine import Completion, Counters, Engine, Geometry, Sampling
from repro.profiles import Profile


@dataclass
class RunRecord:
    """One engine run (APC or control): what it was started with and what it counted."""

    settings: dict[str, Any]
    dropped_settings: list[str] = field(default_factory=list)
    boot_seconds: float | None = None
    counters: dict[str, Counters] = field(default_factory=dict)


@dataclass
class ArmResult:
    arm: str
    geometry: Geometry
    prompt_tokens: dict[str, list[int]]
    waves: list[grading.Wave]
    apc: RunRecord
    control: RunRecord
    liveness: grading.Liveness | None
    # Benign divergences measured beside the waves (e.g. the control's own spread).
    extra_noise: list[float]
    engagement: grading.Engagement
    phases: dict[str, float]
    extra: dict[str, Any] = field(default_factory=dict)


class PhaseTimer:
    """Wall time per named phase, for the artifact and the benchmark script."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float | None) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + (seconds or 0.0)


def start_engine(
    profile: Profile,
    model_path: str,
    *,
    arm: str,
    prefix_caching: bool,
    mamba_block_size: int | None = None,
) -> Engine:
    return Engine(
        model=model_path,
        settings=profile.engine_settings(
            arm=arm, prefix_caching=prefix_caching, mamba_block_size=mamba_block_size
        ),
        optional_settings=profile.optional_settings,
        env=profile.engine_env(),
    )


def measure_block_size(profile: Profile, model_path: str, timer: PhaseTimer) -> int | None:
    """Mamba block size B of this model on this engine, for budgets given in blocks.

    Boots an APC engine once with the multi-turn settings (an absolute budget) and reads its
    geometry; costs one extra engine start, only for profiles that need it.
    """
    if profile.cold_race_budget_blocks is None:
        return None
    with start_engine(profile, model_path, arm="multi-turn", prefix_caching=True) as engine:
        timer.add("boot", engine.boot_seconds)
        return engine.geometry().mamba_block_size


def answer_sampling(profile: Profile, tokens: int) -> Sampling:
    """Greedy outputs of `tokens` tokens; exactly that many where the profile ignores EOS
    (a random model may emit EOS at any step)."""
    return Sampling(
        max_tokens=tokens,
        min_tokens=tokens if profile.ignore_eos else 0,
        ignore_eos=profile.ignore_eos,
    )


def run_wave(
    engine: Engine, batch: list, sampling, timer: PhaseTimer
) -> tuple[list[Completion], Counters]:
    """Generate one wave and return its completions and settled counter deltas."""
    with timer.phase("counters"):
        before = engine.counters()
    with timer.phase("generate"):
        completions = engine.generate(batch, sampling)
    with timer.phase("counters"):
        after = engine.counters()
    return completions, after - before


def record(engine: Engine) -> RunRecord:
    return RunRecord(
        settings=dict(engine.applied_settings),
        dropped_settings=list(engine.dropped_settings),
        boot_seconds=engine.boot_seconds,
    )


def compare_wave(
    name: str,
    apc: list[Completion],
    control: list[Completion],
    *,
    codes: list[str] | None,
    graded: bool = True,
    distinct_rule: bool = False,
) -> grading.Wave:
    """Pair each APC completion with the control's answer to the same prompt."""
    requests = []
    for index, (a, c) in enumerate(zip(apc, control, strict=True)):
        requests.append(
            grading.RequestResult(
                index=index,
                num_cached_tokens=a.num_cached_tokens,
                divergence=grading.divergence(a.first_logprobs, c.first_logprobs),
                apc_miss=prompts.is_miss(a.text, codes[index]) if codes else None,
                control_miss=prompts.is_miss(c.text, codes[index]) if codes else None,
            )
        )
    return grading.Wave(
        name=name,
        requests=tuple(requests),
        apc_distinct_outputs=len({a.token_ids for a in apc}),
        control_distinct_outputs=len({c.token_ids for c in control}),
        graded=graded,
        distinct_rule=distinct_rule,
    )


def engagement_of(
    counters: dict[str, Counters], waves: list[str], completions: list[Completion]
) -> grading.Engagement:
    """Counter deltas of the APC run's waves, plus the cached tokens its requests report."""
    total = Counters()
    for name in waves:
        total = total + counters[name]
    return grading.Engagement(
        prefix_cache_queries=total.prefix_cache_queries,
        prefix_cache_hits=total.prefix_cache_hits,
        spec_decode_num_drafts=total.spec_decode_num_drafts,
        cached_prompt_tokens=sum(c.num_cached_tokens or 0 for c in completions),
    )
