"""Verdicts from recorded figures: the gates, in upstream's order, and the corruption test.

Grading is pure: it reads only the figures an artifact records (per-request results, counters,
the liveness probe), so anyone holding an artifact can re-derive its verdict.

Gates, in order:
  1. control quality: a control that cannot answer (needle), whose benign noise is too
     high to measure against, or whose answers to identical prompts disagree beyond the
     threshold (logprob) is no yardstick;
  2. engagement: the APC run must have prefix-cache queries and speculative drafts, and
     hits where the arm needs them (multi-turn; under upstream's rules not cold-race, whose
     liveness probe proves the cache instead);
  3. corruption: margin-graded and one-sided. Benign batch nondeterminism moves requests
     both ways; corruption moves only requests that read the cache (logprob) or only turns
     correct answers into misses (needle);
  4. liveness (cold-race): the cache must still produce hits afterwards, or a quiet cache
     could pass for a cure.
Geometry is checked before any wave runs (see `repro.arms.geometry`).

Rules. `RULES_UPSTREAM` grades as upstream's test does (needle control quality, no hits
required in the cold-race trigger waves, outcomes kept apart: `OUTCOMES`); `RULES_KIT` is
how the kit graded before it, kept so that older artifacts (which do not record their rules)
re-derive the verdicts they were given. `docs/fidelity.md` lists every rule.

Signals:
  - needle: a request "misses" when its code is not in the output. A forward flip is a
    request the control answered and the APC run missed; a reverse flip the opposite.
  - logprob (random weights, where recall means nothing): per request, the divergence is
    |logprob_apc(t) - logprob_control(t)| for t the control's greedy first token. A request is
    flagged when its divergence exceeds a threshold set from the benign noise measured in
    the same run. Flagged requests that read the prefix cache are forward flips; flagged
    requests that did not are reverse flips (benign noise hits both groups alike).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from repro.core.vocabulary import Gate, Signal, Status

# Upstream's margin: benign flips up to this many past the other direction are tolerated.
FLIP_MARGIN = 2
# Cold-race wave 1 (needle): distinct outputs of 16 identical prompts may exceed the
# control's by this many.
DISTINCT_MARGIN = 1
# Needle control quality under RULES_KIT: the control must answer at least this share of each
# graded wave. Under RULES_UPSTREAM: the control fails only if it misses every answer of a
# wave of identical prompts, or more than half of any other graded wave (upstream: all 16
# cold-race wave-1 answers; more than n // 2 of wave 2; more than 16 of the 32 second turns).
CONTROL_MIN_RECALL = 0.5

RULES_KIT = "kit-2026-11"
RULES_UPSTREAM = "upstream-pr48361"
RULES = (RULES_KIT, RULES_UPSTREAM)

# Upstream's cold-race outcomes, kept apart in the verdict (`Verdict.outcome`):
OUTCOMES = (
    "corrupted",  # a corruption check fired
    "clean-engaged",  # clean, and the trigger waves hit the cache
    "clean-zero-trigger-hits",  # clean, trigger waves at zero hits, liveness probe hit
    "zero-hit",  # liveness probe got no hits: caching effectively disabled (inconclusive)
)

# Logprob signal. Measured on the CPU build with MTP: benign divergences come in steps of
# bf16 rounding (0.0002, 0.008, 0.016, 0.023, 0.031) with rare outliers (0.077 once in 32
# cold requests); the real cold-race bug on an H200 moved cache-hit requests by ~0.1
# (docs/measured.md, §Benign noise on the CPU). The noise floor is the NOISE_QUANTILE of the benign
# divergences measured in the same run (a quantile, so one outlier cannot blind the arm); the
# threshold is NOISE_MULTIPLIER times that floor, never below THRESHOLD_MIN.
NOISE_QUANTILE = 0.9
NOISE_MULTIPLIER = 3.0
THRESHOLD_MIN = 0.02
# Above this, benign noise would hide the ~0.1 effect of real corruption: control too weak.
THRESHOLD_MAX = 0.1
MIN_NOISE_SAMPLES = 4
# Cold-race: the control's own answers to identical prompts must agree to within the
# threshold. On an H200 the APC-off control answered 16 identical prompts with 2-4 distinct
# outputs, two of them 0.07-0.09 from the rest, while the 90th percentile of the noise sample
# stayed low; every correct cache hit then "diverged" by that gap (artifacts/examples/
# h200-vllm-0.26.0-investigation/, runs 3-15). A control that disagrees with itself beyond
# the threshold cannot grade the cache. Artifacts record whether they were graded with this
# gate (signal.control_spread_gate), so older ones re-grade as they were graded.
CONTROL_SPREAD_GATE = True
# The control's first token missing from the APC run's top-k counts as this divergence.
DIVERGENCE_CAP = 10.0


@dataclass(frozen=True)
class RequestResult:
    index: int
    num_cached_tokens: int
    divergence: float | None = None  # logprob signal
    apc_miss: bool | None = None  # needle signal
    control_miss: bool | None = None
    # Needle signal: the code asked for and both answers, kept so a report can say what a
    # needle was corrupted to and anyone can re-check each miss. Not read by the grading.
    code: str | None = None
    apc_answer: str | None = None
    control_answer: str | None = None
    # What the engine restored for the APC request (`repro.witness`); not read by the grading.
    restores: tuple[dict, ...] | None = ()
    # What the kit's probe connector saw the scheduler do (`repro.ladder`); not graded.
    connector: dict | None = None
    # Every answer token's divergence (`repro.answer_logprob`): the needle profiles' second
    # line, graded as `divergence` on a view of the record; not read by this grading.
    answer_divergence: float | None = None

    @property
    def read_cache(self) -> bool:
        return self.num_cached_tokens > 0


@dataclass(frozen=True)
class Wave:
    """One wave's paired results. `graded` waves enter the corruption test."""

    name: str
    requests: tuple[RequestResult, ...]
    apc_distinct_outputs: int
    control_distinct_outputs: int
    graded: bool = True
    # Cold-race wave 1 (needle): 16 identical prompts must not fan out into many outputs.
    distinct_rule: bool = False


@dataclass(frozen=True)
class Liveness:
    prompt_tokens: int
    hits: int
    queries: int
    # Tokens the probe's second send read from the cache, as its RequestOutput reports
    # (num_cached_tokens). Evidence of a hit even where the counters miss it (see Engagement).
    cached_tokens: int = 0

    @property
    def passed(self) -> bool:
        return self.hits > 0 or self.cached_tokens > 0


@dataclass(frozen=True)
class Engagement:
    """Whether the APC run exercised the cache and the drafter.

    Hits are seen two ways: the engine's counters, and the cached-token count each request
    reports in its RequestOutput. Either is evidence. The second exists because the counters
    can miss hits: vLLM before 0.28.0 records scheduler stats only for steps that return
    request outputs, so the prefix-cache lookup of a request whose first chunk is a
    prefill-only step never reaches vLLM's own counters (measured: a lone 602-token probe
    re-sent with 480 tokens served from the cache moved neither). The kit now sums every
    step's statistics itself (`repro.engine.stats_tap`); the cached tokens stay a second witness.
    """

    prefix_cache_queries: int
    prefix_cache_hits: int
    spec_decode_num_drafts: int
    cached_prompt_tokens: int = 0

    @property
    def hits_seen(self) -> int:
        return max(self.prefix_cache_hits, self.cached_prompt_tokens)

    @property
    def queries_seen(self) -> int:
        # A request that read cached tokens was looked up, counted or not.
        return max(self.prefix_cache_queries, self.cached_prompt_tokens)


def engagement_of(
    apc_counters: Mapping[str, Mapping[str, int]], waves: Sequence[Wave], rules: str
) -> Engagement:
    """The engagement gate's figures: one rule for the live grade and every re-grade.

    `apc_counters` are the APC run's counter deltas by wave name, as the artifact records
    them. Queries and hits are summed over the arm's waves; drafts over every APC entry under
    upstream's rules (upstream reads them after the liveness probe's long decode, since short
    stop-bounded answers may legitimately draft nothing), over the waves under the kit's
    older rules. Cached tokens are what the waves' requests report.
    """
    names = [w.name for w in waves]
    draft_runs = list(apc_counters) if rules == RULES_UPSTREAM else names
    return Engagement(
        prefix_cache_queries=sum(apc_counters[n]["prefix_cache_queries"] for n in names),
        prefix_cache_hits=sum(apc_counters[n]["prefix_cache_hits"] for n in names),
        spec_decode_num_drafts=sum(apc_counters[n]["spec_decode_num_drafts"] for n in draft_runs),
        cached_prompt_tokens=sum(r.num_cached_tokens or 0 for w in waves for r in w.requests),
    )


@dataclass(frozen=True)
class Threshold:
    value: float | None
    noise_floor: float | None
    noise_samples: int


@dataclass(frozen=True)
class WaveGrade:
    name: str
    forward_flips: int
    reverse_flips: int
    flagged: tuple[bool, ...]
    apc_misses: int | None
    control_misses: int | None
    violations: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    status: Status
    gate: Gate | None
    reason: str
    threshold: Threshold | None = None
    waves: tuple[WaveGrade, ...] = field(default_factory=tuple)
    # One of OUTCOMES where the arm reached the corruption test; None at the earlier gates.
    outcome: str | None = None


def divergence(apc_first: dict[int, float], control_first: dict[int, float]) -> float:
    """|logprob_apc(t) - logprob_control(t)| for t the control's greedy first token."""
    if not control_first:
        return DIVERGENCE_CAP
    token = max(control_first, key=lambda t: (control_first[t], -t))
    if token not in apc_first:
        return DIVERGENCE_CAP
    return min(DIVERGENCE_CAP, abs(apc_first[token] - control_first[token]))


def self_spread(first_logprobs: list, measure=None) -> list[float]:
    """Divergences of identical prompts' answers from their medoid: benign self-noise.

    `measure(answer, reference)` is the divergence between two answers: `divergence` on
    first-token log-probabilities by default (the answer log-prob line passes its own,
    `repro.answer_logprob`).

    The reference is the answer closest to all others (the medoid), not the first one: on a
    GPU the first request of a batch of identical prompts can run in a batch shape of its own
    and stand apart, and measuring against it would charge its offset to every other answer
    (measured on an H200: spreads of 0.06-0.27 against the first request). The medoid's own
    zero is left out.
    """
    measure = measure or divergence
    if len(first_logprobs) < 2:
        return []
    totals = [sum(measure(other, ref) for other in first_logprobs) for ref in first_logprobs]
    medoid = min(range(len(first_logprobs)), key=lambda i: (totals[i], i))
    reference = first_logprobs[medoid]
    return [measure(c, reference) for i, c in enumerate(first_logprobs) if i != medoid]


def logprob_threshold(noise: Iterable[float]) -> Threshold:
    samples = sorted(noise)
    if not samples:
        return Threshold(value=None, noise_floor=None, noise_samples=0)
    # Nearest-rank quantile: a value that was actually measured.
    floor = samples[max(0, math.ceil(NOISE_QUANTILE * len(samples)) - 1)]
    return Threshold(
        value=max(THRESHOLD_MIN, NOISE_MULTIPLIER * floor),
        noise_floor=floor,
        noise_samples=len(samples),
    )


def noise_sample(waves: Iterable[Wave], extra_noise: Iterable[float] = ()) -> list[float]:
    """Benign divergences: requests that did not read the cache, plus `extra_noise`.

    `extra_noise` carries other benign figures measured in the same run, such as the spread
    of the control's own answers to identical prompts (batch shape alone moves them).
    """
    values = [
        r.divergence
        for wave in waves
        for r in wave.requests
        if not r.read_cache and r.divergence is not None
    ]
    return values + list(extra_noise)


def grade_wave(wave: Wave, signal: str, threshold: Threshold | None) -> WaveGrade:
    if signal == "needle":
        forward = sum(1 for r in wave.requests if r.apc_miss and not r.control_miss)
        reverse = sum(1 for r in wave.requests if r.control_miss and not r.apc_miss)
        flagged = tuple(bool(r.apc_miss) != bool(r.control_miss) for r in wave.requests)
        apc_misses = sum(1 for r in wave.requests if r.apc_miss)
        control_misses = sum(1 for r in wave.requests if r.control_miss)
    else:
        assert threshold is not None and threshold.value is not None
        flagged = tuple(
            r.divergence is not None and r.divergence > threshold.value for r in wave.requests
        )
        forward = sum(1 for r, f in zip(wave.requests, flagged, strict=False) if f and r.read_cache)
        reverse = sum(
            1 for r, f in zip(wave.requests, flagged, strict=False) if f and not r.read_cache
        )
        apc_misses = control_misses = None

    violations = []
    if wave.graded and forward > reverse + FLIP_MARGIN:
        violations.append(
            f"{wave.name}: {forward} forward flips vs {reverse} reverse (margin {FLIP_MARGIN})"
        )
    if wave.graded and wave.distinct_rule and signal == "needle":
        if wave.apc_distinct_outputs > max(wave.control_distinct_outputs, 1) + DISTINCT_MARGIN:
            violations.append(
                f"{wave.name}: {len(wave.requests)} identical prompts gave "
                f"{wave.apc_distinct_outputs} distinct outputs; control: "
                f"{wave.control_distinct_outputs}"
            )
        if apc_misses is not None and apc_misses > (control_misses or 0) + FLIP_MARGIN:
            violations.append(
                f"{wave.name}: {apc_misses} misses vs control {control_misses} "
                f"(margin {FLIP_MARGIN})"
            )
    return WaveGrade(
        name=wave.name,
        forward_flips=forward,
        reverse_flips=reverse,
        flagged=flagged,
        apc_misses=apc_misses,
        control_misses=control_misses,
        violations=tuple(violations),
    )


def grade(
    *,
    signal: Signal,
    waves: list[Wave],
    engagement: Engagement,
    liveness: Liveness | None,
    extra_noise: Iterable[float] = (),
    control_spread_gate: bool = CONTROL_SPREAD_GATE,
    rules: str,
    require_hits: bool,
) -> Verdict:
    """The verdict of one arm, from its recorded figures, gates in upstream's order.

    `extra_noise` is the spread of the control's answers to identical prompts (cold-race);
    with `control_spread_gate`, any of it above the threshold makes the control too weak.
    `require_hits` says whether the engagement gate needs hits; upstream's rules do not for
    cold-race, whose liveness probe separates a cure (trigger waves at zero hits, probe hits)
    from a disabled cache.
    """
    if signal not in ("needle", "logprob"):
        raise ValueError(f"unknown signal {signal!r}; expected 'needle' or 'logprob'")
    if rules not in RULES:
        raise ValueError(f"unknown grading rules {rules!r}; expected one of {RULES}")
    graded = [w for w in waves if w.graded]
    extra_noise = list(extra_noise)

    # 1. Control quality.
    threshold: Threshold | None = None
    if signal == "needle":
        weak = _weak_needle_control(graded, rules)
        if weak:
            return Verdict("inconclusive", "control_quality", weak)
    else:
        threshold = logprob_threshold(noise_sample(waves, extra_noise))
        if threshold.noise_samples < MIN_NOISE_SAMPLES:
            return Verdict(
                "inconclusive",
                "control_quality",
                f"only {threshold.noise_samples} benign samples to measure the noise floor "
                f"(needs {MIN_NOISE_SAMPLES})",
                threshold=threshold,
            )
        if threshold.value > THRESHOLD_MAX:
            return Verdict(
                "inconclusive",
                "control_quality",
                f"benign noise floor {threshold.noise_floor:.4f} sets the threshold at "
                f"{threshold.value:.4f}, above {THRESHOLD_MAX}: the control is too noisy "
                f"to grade the cache",
                threshold=threshold,
            )
        spread = max(extra_noise, default=None)
        if control_spread_gate and spread is not None and spread > threshold.value:
            return Verdict(
                "inconclusive",
                "control_quality",
                f"the control's answers to identical prompts spread up to {spread:.4f} from "
                f"their medoid, above the threshold {threshold.value:.4f}: the control "
                f"disagrees with itself, so it cannot grade the cache",
                threshold=threshold,
            )

    # 2. Engagement.
    missing = [
        name
        for name, value, needed in (
            ("prefix-cache queries", engagement.queries_seen, True),
            ("prefix-cache hits", engagement.hits_seen, require_hits),
            ("speculative drafts", engagement.spec_decode_num_drafts, True),
        )
        if needed and value <= 0
    ]
    if missing:
        return Verdict(
            "inconclusive",
            "engagement",
            f"not engaged: zero {', zero '.join(missing)} in the APC run "
            f"(queries {engagement.prefix_cache_queries}, hits "
            f"{engagement.prefix_cache_hits}, drafts {engagement.spec_decode_num_drafts}, "
            f"cached prompt tokens in request outputs {engagement.cached_prompt_tokens})",
            threshold=threshold,
        )

    # 3. Corruption.
    wave_grades = tuple(grade_wave(w, signal, threshold) for w in waves)
    violations = [v for g in wave_grades for v in g.violations]
    if violations:
        return Verdict(
            "corrupted",
            None,
            "; ".join(violations),
            threshold=threshold,
            waves=wave_grades,
            outcome=_outcome("corrupted", rules),
        )

    # 4. Liveness: one verdict under either rules, in each rules' words.
    if liveness is not None and not liveness.passed:
        got = (
            f"{liveness.hits} hits of {liveness.queries} queries and "
            f"{liveness.cached_tokens} cached tokens"
        )
        if rules == RULES_KIT:
            reason = (
                f"liveness probe ({liveness.prompt_tokens} tokens sent twice) got {got} on the "
                f"second send: the cache went quiet"
            )
        else:
            reason = (
                f"zero-hit: the liveness probe (a {liveness.prompt_tokens}-token manual) got "
                f"{got}: caching is effectively disabled, so a clean trigger-wave result "
                f"would be vacuous"
            )
        return Verdict(
            "inconclusive",
            "liveness",
            reason,
            threshold=threshold,
            waves=wave_grades,
            outcome=_outcome("zero-hit", rules),
        )
    if engagement.hits_seen > 0:
        outcome, engaged = "clean-engaged", "engaged with "
    else:
        # Only reachable without require_hits (and so with a liveness probe that hit).
        outcome = "clean-zero-trigger-hits"
        engaged = (
            f"trigger waves at zero hits while the liveness probe hit "
            f"({liveness.hits if liveness else 0} hits, "
            f"{liveness.cached_tokens if liveness else 0} cached tokens): "
        )

    summary = ", ".join(
        f"{g.name} {g.forward_flips} forward / {g.reverse_flips} reverse"
        for g, w in zip(wave_grades, waves, strict=False)
        if w.graded
    )
    detail = (
        f"threshold {threshold.value:.4f} from noise floor {threshold.noise_floor:.4f} "
        f"({threshold.noise_samples} samples); "
        if threshold
        else ""
    )
    return Verdict(
        "clean",
        None,
        f"no one-sided flips past margin {FLIP_MARGIN}: {detail}{summary}; {engaged}"
        f"{engagement.prefix_cache_hits} hits of {engagement.prefix_cache_queries} queries"
        f"{_cached_tokens_note(engagement)}, {engagement.spec_decode_num_drafts} drafts",
        threshold=threshold,
        waves=wave_grades,
        outcome=_outcome(outcome, rules),
    )


def _outcome(outcome: str, rules: str) -> str | None:
    """Outcomes are recorded under upstream's rules; older artifacts carry none."""
    return outcome if rules == RULES_UPSTREAM else None


def requires_hits(arm: str, rules: str) -> bool:
    """Whether the engagement gate needs prefix-cache hits in `arm`'s graded waves.

    Upstream's cold-race does not (`require_hits=False`): with the fix in, a prompt under two
    blocks legitimately gets none under MTP, and the liveness probe proves the cache alive.
    """
    return not (rules == RULES_UPSTREAM and arm == "cold-race")


def _weak_needle_control(graded: list[Wave], rules: str) -> str | None:
    """Why the control's recall cannot grade the cache, or None when it can."""
    for wave in graded:
        n = len(wave.requests)
        misses = sum(1 for r in wave.requests if r.control_miss)
        if rules == RULES_KIT:
            if n - misses < CONTROL_MIN_RECALL * n:
                return (
                    f"control answered {n - misses}/{n} of {wave.name}; "
                    f"needs at least {CONTROL_MIN_RECALL:.0%} to grade the cache"
                )
        elif wave.distinct_rule and misses == n:
            return (
                f"control (APC off) missed all {n} answers of {wave.name}: the model cannot "
                f"recall this fact, so the APC run's answers cannot be graded"
            )
        elif not wave.distinct_rule and misses > n // 2:
            return (
                f"control (APC off) missed {misses}/{n} of {wave.name}, more than {n // 2}: "
                f"the model recalls too little for the APC run's answers to be graded"
            )
    return None


def _cached_tokens_note(engagement: Engagement) -> str:
    """Where the counters missed hits the requests reported (vLLM 0.26.0), say so."""
    if engagement.cached_prompt_tokens > engagement.prefix_cache_hits:
        return f" ({engagement.cached_prompt_tokens} cached prompt tokens in request outputs)"
    return ""


def median(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None
