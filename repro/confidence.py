"""How sure a verdict is: an exact one-sided p-value, and whether one request decides it.

Upstream's verdict counts one-sided flips past a margin; it says nothing of how likely the
same counts are from benign noise alone, and the seed's own caveat is "single run per arm".
Computed from the figures an artifact records (per-request flags, cache reads, misses), so
any reader re-derives it, and pooled over repeats of the same arm:

- needle signal: each request is a pair (APC answer, control answer). Benign noise turns a
  right answer wrong as often in either run, so the discordant pairs split evenly under the
  null: McNemar's exact test, forward flips out of all discordant pairs, p = P(X >= forward)
  for X ~ Binomial(forward + reverse, 1/2);
- log-prob signal: benign noise flags a request whether or not it read the cache; corruption
  flags only requests that did. Fisher's exact test, one-sided (more flagged among the
  hits): the graded waves' cache hits against every benign sample the verdict's threshold
  was measured on (requests of any wave that read no cache, and the control's own spread),
  flagged when above the same threshold. The hypergeometric tail.

Standard library only (`math.comb`): exact tails of small tables need nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from math import comb
from typing import Any

from repro.core.vocabulary import Signal


@dataclass(frozen=True)
class Evidence:
    """One arm's flips, pooled over its graded waves (and repeats)."""

    signal: Signal
    forward: int = 0  # needle: control right, APC wrong; logprob: flagged cache hits
    reverse: int = 0  # needle: APC right, control wrong; logprob: flagged benign samples
    hits: int = 0  # logprob: graded requests that read the cache
    cold: int = 0  # logprob: benign samples (no cache read, or the control's spread)

    def __add__(self, other: Evidence) -> Evidence:
        if other.signal != self.signal:
            raise ValueError(f"cannot pool {self.signal} with {other.signal} evidence")
        return Evidence(
            self.signal,
            self.forward + other.forward,
            self.reverse + other.reverse,
            self.hits + other.hits,
            self.cold + other.cold,
        )

    @property
    def test(self) -> str:
        return "mcnemar-exact" if self.signal == "needle" else "fisher-exact"

    @property
    def p_value(self) -> float:
        if self.signal == "needle":
            return binomial_upper_tail(self.forward, self.forward + self.reverse)
        return fisher_upper_tail(self.forward, self.hits, self.reverse, self.cold)


def binomial_upper_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2); 1.0 for n = 0."""
    if n <= 0 or k <= 0:
        return 1.0
    return sum(comb(n, i) for i in range(k, n + 1)) / 2**n


def fisher_upper_tail(a: int, hits: int, c: int, cold: int) -> float:
    """P(at least `a` of the flagged requests are cache hits), given `a + c` flagged among
    `hits` hits and `cold` cold requests (the hypergeometric tail)."""
    flagged, total = a + c, hits + cold
    if flagged == 0 or hits == 0 or cold == 0:
        # Nothing flagged, or no hit or no cold request to compare with: no evidence.
        return 1.0
    denominator = comb(total, flagged)
    top = min(flagged, hits)
    return sum(comb(hits, x) * comb(cold, flagged - x) for x in range(a, top + 1)) / denominator


def from_waves(
    signal: Signal, waves: Iterable[Mapping[str, Any]], threshold: float | None = None
) -> Evidence:
    """Evidence of an artifact's waves (`figures.waves`; `threshold`: the log-prob one)."""
    waves = list(waves)
    graded = [w for w in waves if (w.get("extra") or {}).get("graded", True)]
    if signal == "needle":
        return Evidence(
            signal,
            forward=sum(int(w.get("forward_flips", 0)) for w in graded),
            reverse=sum(int(w.get("reverse_flips", 0)) for w in graded),
        )
    rows = [r for w in graded for r in w.get("per_request") or []]
    noise = [
        r["divergence"]
        for w in waves
        for r in w.get("per_request") or []
        if r.get("num_cached_tokens", 0) == 0 and r.get("divergence") is not None
    ]
    noise += [d for w in waves for d in (w.get("extra") or {}).get("benign_noise") or []]
    above = sum(1 for d in noise if threshold is not None and d > threshold)
    return Evidence(
        signal,
        forward=sum(int(w.get("forward_flips", 0)) for w in graded),
        reverse=above,
        hits=sum(1 for r in rows if r.get("num_cached_tokens", 0) > 0),
        cold=len(noise),
    )


def knife_edge(status: str, waves: Iterable[Mapping[str, Any]]) -> bool:
    """Whether one request moving the other way changes the verdict of record.

    Clean with a graded wave exactly at the margin (one more forward flip corrupts), or
    corrupted by the flip rule in one wave only, one past the margin. Verdicts decided by a
    gate, or by another rule (distinct outputs, misses), are not knife-edged by a flip.
    """
    if status not in ("clean", "corrupted"):
        return False
    excess = [
        int(w.get("forward_flips", 0)) - int(w.get("reverse_flips", 0)) - int(w.get("margin", 0))
        for w in waves
        if (w.get("extra") or {}).get("graded", True)
    ]
    if status == "clean":
        return any(e == 0 for e in excess)
    over = [e for e in excess if e > 0]
    return len(over) == 1 and over[0] == 1


def of_document(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The p-value and knife-edge flag of one artifact; None where it has no figures."""
    figures = doc.get("figures") or {}
    waves = figures.get("waves") or []
    signal = (doc.get("signal") or {}).get("kind") or (doc.get("profile") or {}).get("signal")
    if not waves or signal not in ("needle", "logprob"):
        return None
    evidence = from_waves(signal, waves, (doc.get("signal") or {}).get("threshold"))
    return {
        "p_value": float(f"{evidence.p_value:.3g}"),
        "test": evidence.test,
        "knife_edge": knife_edge(doc["verdict"]["status"], waves),
    }
