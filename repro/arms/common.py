"""What both arms share: the paired-run record, timing, and per-request comparison."""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from repro import answer_logprob, grading
from repro.arms import geometry, prompts
from repro.connectors import Connector
from repro.engine.config import derived_mamba_block_size
from repro.engine.llm import Completion, Counters, Engine, Geometry, Sampling
from repro.profiles import Profile


@dataclass
class RunRecord:
    """One engine run (APC or control): what it was started with and what it counted."""

    settings: dict[str, Any]
    dropped_settings: list[str] = field(default_factory=list)
    boot_seconds: float | None = None
    counters: dict[str, Counters] = field(default_factory=dict)
    # The restore witness as the engine's workers reported it (`Engine.witness_status`).
    witness: dict[str, Any] = field(default_factory=dict)
    # Where the counters came from (`Engine.counter_read`: the engine updates it in place).
    counter_read: dict[str, Any] = field(default_factory=dict)
    # The injected fault's count in this engine (`Engine.fault_count`, filled at shutdown).
    fault_count: dict[str, Any] = field(default_factory=dict)


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
    phases: dict[str, float]
    # The same on every answer token (`repro.answer_logprob`), for the needle line.
    answer_noise: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # With a connector attached: this result is the APC run with it, and `reference` the
    # APC run without it, graded against the same control (the connector ladder).
    reference: ArmResult | None = None


def ladder_rungs(connector: Connector | None) -> list[Connector | None]:
    """The APC runs of an arm: one, or the reference without the connector and then the run
    with it (the control, APC off, never has one: vLLM's connectors need the prefix cache's
    block hashes, and the control is the run that reads nothing from any cache)."""
    return [None] if connector is None else [None, connector]


def fault_counts(result: ArmResult) -> tuple[int, int]:
    """Restored states the injected fault perturbed over every engine of an arm (each rung
    of a ladder, and the control), and how many engines' counts could not be read."""
    records = {id(r): r for r in (result.apc, result.control)}
    if result.reference is not None:
        records.update({id(r): r for r in (result.reference.apc, result.reference.control)})
    applied = sum(int(r.fault_count.get("applied", 0)) for r in records.values())
    unreadable = sum(1 for r in records.values() if r.fault_count.get("unreadable"))
    return applied, unreadable


def with_reference(results: list[ArmResult]) -> ArmResult:
    """The result of record (the last rung), carrying the reference rung where there is one."""
    if len(results) == 1:
        return results[0]
    return dataclasses.replace(results[-1], reference=results[0])


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


def prepare_once(engine, timer, prepared: dict, prepare) -> None:
    """The first APC run sizes the prompts (``prepare(geometry)`` into ``prepared``); a later
    one (the connector rung) must boot the same geometry, or its figures cannot be compared."""
    timer.add("boot", engine.boot_seconds)
    with timer.phase("prepare"):
        geo = engine.geometry()
        if not prepared:
            prepared.update(prepare(geo), geometry=geo)
        elif geo != prepared["geometry"]:
            raise RuntimeError(
                f"the APC run with the connector booted another geometry ({geo}) than "
                f"the one without it ({prepared['geometry']}); the rungs cannot be compared"
            )


def start_engine(
    profile: Profile,
    model_path: str,
    *,
    arm: str,
    prefix_caching: bool,
    mamba_block_size: int | None = None,
    connector: Connector | None = None,
) -> Engine:
    """An engine for one run of an arm; `mamba_block_size` is B as derived before boot
    (`derive_block_size`), which sizes the budget and which the booted engine must confirm;
    `connector` is attached to it (APC runs only)."""
    settings = profile.engine_settings(
        arm=arm, prefix_caching=prefix_caching, mamba_block_size=mamba_block_size
    )
    if connector is not None:
        settings.update(connector.engine_settings())
    return Engine(
        model=model_path,
        settings=settings,
        optional_settings=profile.optional_settings,
        env=profile.engine_variables(),
        expected_mamba_block_size=mamba_block_size,
    )


def derive_block_size(profile: Profile, model_path: str, timer: PhaseTimer) -> int | None:
    """Mamba block size B of this model on this engine, for budgets given in blocks.

    Derived from vLLM's configuration for an APC engine with the multi-turn settings (an
    absolute budget), without loading weights (`repro.engine.config`); the booted cold-race
    engine confirms it. None for profiles whose budgets are absolute.
    """
    if profile.cold_race_budget_blocks is None:
        return None

    block_size, seconds = derived_mamba_block_size(
        model=model_path,
        settings=profile.engine_settings(arm="multi-turn", prefix_caching=True),
        optional_settings=profile.optional_settings,
        env=profile.engine_variables(),
    )
    timer.add("derive", seconds)
    return block_size


def answer_sampling(profile: Profile) -> Sampling:
    """Greedy answers to a recall question.

    Needle profiles answer as upstream's test does: at most 24 tokens, stopped at the first
    newline, so a correct answer followed by more text still contains the code. Log-prob
    profiles (random weights) get exactly `LOGPROB_ANSWER_TOKENS` tokens with EOS ignored: a
    random model may emit EOS or a newline at any step, and outputs of one length keep the
    distinct-output counts comparable between the runs.
    """
    if profile.answers == "upstream":
        return Sampling(max_tokens=geometry.ANSWER_MAX_TOKENS, stop=geometry.ANSWER_STOP)
    return fixed_sampling(profile, geometry.LOGPROB_ANSWER_TOKENS)


def fixed_sampling(profile: Profile, tokens: int) -> Sampling:
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
        counter_read=engine.counter_read,
        fault_count=engine.fault_count,
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
    """Pair each APC completion with the control's answer to the same prompt.

    Distinct outputs are counted on texts where answers are graded by recall (upstream's
    rule), on token ids otherwise (random weights: ids are the finer record).
    """
    requests = []
    for index, (a, c) in enumerate(zip(apc, control, strict=True)):
        requests.append(
            grading.RequestResult(
                index=index,
                num_cached_tokens=a.num_cached_tokens,
                divergence=grading.divergence(a.first_logprobs, c.first_logprobs),
                apc_miss=prompts.is_miss(a.text, codes[index]) if codes else None,
                control_miss=prompts.is_miss(c.text, codes[index]) if codes else None,
                code=codes[index] if codes else None,
                apc_answer=a.text if codes else None,
                control_answer=c.text if codes else None,
                restores=a.restores,
                connector=a.connector,
                answer_divergence=answer_logprob.between(a, c),
            )
        )
    return grading.Wave(
        name=name,
        requests=tuple(requests),
        apc_distinct_outputs=_distinct(apc, by_text=codes is not None),
        control_distinct_outputs=_distinct(control, by_text=codes is not None),
        graded=graded,
        distinct_rule=distinct_rule,
    )


def _distinct(completions: list[Completion], *, by_text: bool) -> int:
    return len({c.text if by_text else c.token_ids for c in completions})


def sampling_plan(profile: Profile) -> dict[str, dict[str, dict[str, Any]]]:
    """Each arm's requests and how they are sampled, for the run plan (`repro.plan`).

    Sizes that depend on the Mamba block size B (measured at boot) are given as their rule.
    """

    def shown(sampling: Sampling, requests: Any, **extra: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {"requests": requests, "temperature": 0.0}
        doc.update(
            max_tokens=sampling.max_tokens,
            min_tokens=sampling.min_tokens,
            stop=list(sampling.stop),
            ignore_eos=sampling.ignore_eos,
        )
        doc.update(extra)
        return doc

    answer = answer_sampling(profile)
    probe = fixed_sampling(profile, geometry.LIVENESS_ANSWER_TOKENS)
    decode = fixed_sampling(profile, geometry.LIVENESS_DECODE_TOKENS)
    plan: dict[str, dict[str, dict[str, Any]]] = {}
    if "cold-race" in profile.arms:
        plan["cold-race"] = {
            "wave1": shown(answer, geometry.COLD_RACE_IDENTICAL_PROMPTS, asks="fact n - 2"),
            "wave2": shown(answer, "one per fact", asks="every fact"),
            "liveness probe": shown(
                probe, "1 + 1", asks="facts 0, then 1, of a 3 B + 128-token manual"
            ),
            "liveness decode": shown(
                decode,
                geometry.LIVENESS_DECODE_COPIES,
                asks="fact 0 of the cold-race manual (drafts read after it)",
            ),
        }
    if "multi-turn" in profile.arms:
        first = {
            "requests": geometry.MULTI_TURN_PROMPTS,
            "temperature": 0.0,
            "max_tokens": "min_tokens + 64",
            "min_tokens": (
                "2 B - m + 96 (m: the manual's tokens; below B = "
                f"{geometry.MULTI_TURN_FULL_SCALE_BLOCK} the 96 and 64 scale with B)"
            ),
            "stop": [],
            "ignore_eos": profile.ignore_eos,
            "asks": "the procedure for vault i",
        }
        if profile.ignore_eos:
            first["max_tokens"] = "min_tokens (EOS ignored)"
        plan["multi-turn"] = {
            "turn 1": first,
            "turn 2": shown(
                answer,
                geometry.MULTI_TURN_PROMPTS,
                asks="fact (7 i + 3) mod n after turn 1's prompt and output",
            ),
        }
    return plan
