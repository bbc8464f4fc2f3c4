"""The needle profiles' second line: every answer token's log-prob against the control.

A trained model's verdict of record is upstream's recall gates, and recall moves only once a
restored state is in effect replaced (docs/sensitivity.md). This line grades the same
requests with the log-prob signal's own machinery, unchanged (`repro.grading`: noise from
requests that did not read the cache plus the control's self-spread, its threshold, one-sided
flips past its margin), on every answer token the two runs share instead of the first. It is
the kit's addition, not upstream's (docs/fidelity.md): recorded beside the verdict as the
artifact's `answer_logprob` section, never the verdict.

Both the runner and `verify` derive the section from the recorded figures through
`repro.evidence.verdicts.answer_line`: this module gives the per-request figure, the view of
a needle record as a log-prob one, and the section's shape and words.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from repro import grading

# The verdict of record on the needle profiles; this line only stands beside it.
DECIDED_BY = "recall"
# Where the cold-race arm records the control's self-spread on this measure (wave 1's extra).
NOISE_KEY = "answer_benign_noise"


def applies(signal: str) -> bool:
    """Only trained models get the line: on random weights log-probs are the verdict."""
    return signal == "needle"


def divergence(
    apc_tokens: Sequence[int],
    apc_positions: Sequence[Mapping[int, float]],
    control_tokens: Sequence[int],
    control_positions: Sequence[Mapping[int, float]],
) -> float:
    """The largest |logprob_apc(t_i) - logprob_control(t_i)| over the control's greedy tokens
    t_i, up to and including the first position where the two outputs' tokens differ (past
    it the contexts differ, so later positions compare nothing); DIVERGENCE_CAP where t_i is
    not among the APC position's top-k. Stops where the APC output ends.

    With one answer token this is `grading.divergence` (the control's greedy token is the
    top of its own log-probabilities).
    """
    if not control_tokens or not control_positions:
        return grading.DIVERGENCE_CAP
    worst = 0.0
    for i, token in enumerate(control_tokens):
        if i >= len(apc_positions) or i >= len(control_positions):
            break
        apc, control = apc_positions[i], control_positions[i]
        if token not in apc or token not in control:
            return grading.DIVERGENCE_CAP
        worst = max(worst, abs(apc[token] - control[token]))
        if i >= len(apc_tokens) or apc_tokens[i] != token:
            break
    return min(grading.DIVERGENCE_CAP, worst)


def between(apc, control) -> float:
    """`divergence` of two completions (`repro.engine.llm.Completion`)."""
    return divergence(
        apc.token_ids, apc.answer_logprobs, control.token_ids, control.answer_logprobs
    )


def self_spread(completions: Sequence) -> list[float]:
    """The control's answers to identical prompts against their medoid, on this measure."""
    return grading.self_spread(list(completions), measure=between)


def logprob_view(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """A needle record as the log-prob signal would have recorded it: each request's
    divergence is its answer divergence and the benign noise the control's spread on it.
    None where the line does not apply or the figures lack the answer divergences (records
    from before it)."""
    signal = doc.get("signal") or {}
    waves = (doc.get("figures") or {}).get("waves") or []
    requests = [r for w in waves for r in w.get("per_request") or []]
    if not applies(signal.get("kind", "")) or not requests:
        return None
    if any("answer_divergence" not in r for r in requests):
        return None
    view = copy.deepcopy(dict(doc))
    view["signal"]["kind"] = "logprob"
    for wave in view["figures"]["waves"]:
        extra = wave.setdefault("extra", {})
        noise = extra.pop(NOISE_KEY, None)
        extra.pop("benign_noise", None)
        if noise:
            extra["benign_noise"] = noise
        for request in wave["per_request"]:
            request["divergence"] = request["answer_divergence"]
    return view


def disagrees(recall: str, answer: str) -> bool:
    """One line says corrupted where the other says clean."""
    return {recall, answer} == {"clean", "corrupted"}


def section(verdict: grading.Verdict, recall: str, graded: Sequence[str]) -> dict[str, Any]:
    """The artifact's `answer_logprob` section: this line's grade beside `recall`, the
    verdict of record's status; `graded` names the waves that enter the corruption test."""
    threshold = verdict.threshold
    waves = [
        {
            "name": g.name,
            "forward_flips": g.forward_flips,
            "reverse_flips": g.reverse_flips,
            "flagged": [i for i, f in enumerate(g.flagged) if f],
        }
        for g in verdict.waves
        if g.name in graded
    ]
    doc: dict[str, Any] = {
        "decided_by": DECIDED_BY,
        "status": verdict.status,
        "gate": verdict.gate,
        "reason": verdict.reason,
        "threshold": threshold.value if threshold else None,
        "noise_floor": threshold.noise_floor if threshold else None,
        "noise_samples": threshold.noise_samples if threshold else None,
        "waves": waves,
        "disagrees": disagrees(recall, verdict.status),
    }
    doc["line"] = f"recall: {recall} · {note(doc)}"
    return doc


def note(section: Mapping[str, Any]) -> str:
    """``answer log-prob: corrupted (wave2: 5 forward / 0 reverse flips, threshold 0.031)``."""
    status = section["status"]
    if section["gate"]:
        return f"answer log-prob: {status} ({section['gate']} gate)"
    flips = ", ".join(
        f"{w['name']}: {w['forward_flips']} forward / {w['reverse_flips']} reverse"
        for w in section["waves"]
    )
    threshold = section["threshold"]
    shown = f", threshold {threshold:.3g}" if threshold is not None else ""
    return f"answer log-prob: {status} ({flips} flips{shown})"


def short(section: Mapping[str, Any]) -> str:
    """The matrix cell's words: ``answer log-prob: corrupted (5 / 0 flips)``."""
    if section["gate"]:
        return f"answer log-prob: {section['status']} ({section['gate']} gate)"
    forward = sum(w["forward_flips"] for w in section["waves"])
    reverse = sum(w["reverse_flips"] for w in section["waves"])
    return f"answer log-prob: {section['status']} ({forward} / {reverse} flips)"
