"""The restore witness's second line beside the verdict: what the engine really restored.

The engine-side witness (`repro.vllm_plugin.restore_witness`) judges every restore of a
Mamba/GDN state from the prefix cache and the artifact keeps its judgement per request.
This module reads those records back, so the line is re-derived from an artifact by anyone,
as the verdict is. It never changes the verdict of record (upstream's output gates): a
clean run whose engine restored invalid states is `clean`, with this line saying the
model or geometry did not show them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Kinds of restore, as the engine-side witness names them, and the lane each invalid kind
# belongs to.
VALID = "valid"
UNWITNESSED = "unwitnessed"
LANE_OF_KIND = {
    "stale-position": "cold-race",  # a state computed up to a chunk end, cached as a boundary
    "rejected-drafts": "multi-turn",  # a state written over rejected draft tokens
    "foreign-tokens": "foreign-state",  # a state of another sequence (no state restored)
    "attention-short": "hit-length",  # resumed past the tokens attention's blocks hold
}
KINDS = (VALID, *LANE_OF_KIND, UNWITNESSED)
LANES = tuple(LANE_OF_KIND.values())

# What the line says of each lane.
_LANE_WORDS = {
    "cold-race": "mid-block states (cold-race lane)",
    "multi-turn": "states over rejected drafts (multi-turn lane)",
    "foreign-state": "states of other sequences (foreign state)",
    "hit-length": "hits past attention's verified blocks (hit-length lane)",
}

LIVE = "live"


@dataclass(frozen=True)
class Summary:
    """The witness's figures for one run (the APC run's recorded requests)."""

    status: str  # "live", or why no witness could judge: "unsupported: ...", "unreadable"
    restores: int = 0
    by_lane: dict[str, int] = field(default_factory=dict)
    unwitnessed: int = 0
    # Requests that read the cache although the witness judged no restore for them.
    unjudged_hits: int = 0

    @property
    def invalid(self) -> int:
        return sum(self.by_lane.values())

    @property
    def complete(self) -> bool:
        """Whether every restore was judged: only then is zero invalid a figure."""
        return self.status == LIVE and not self.unwitnessed and not self.unjudged_hits

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "restores": self.restores,
            "invalid": self.invalid,
            "by_lane": {lane: self.by_lane.get(lane, 0) for lane in LANES},
            "unwitnessed": self.unwitnessed,
            "unjudged_hits": self.unjudged_hits,
            "line": line(self),
        }


def engine_status(reported: Mapping[str, Any] | None) -> str:
    """`live`, or why the engine's witness could not judge (from `Engine.witness_status`)."""
    if not reported:
        return "unreadable: the workers did not report a witness"
    broken = reported.get("broken") or []
    if broken:
        return f"broken: {broken[0]}"
    installed = reported.get("installed") or []
    if "preprocess_mamba" in installed:
        return LIVE
    reason = next((h for h in installed if str(h).startswith("unsupported")), None)
    return reason or "unsupported: the kit's plugin installed no witness in this vLLM"


def summarize(status: str, requests: Iterable[Mapping[str, Any]]) -> Summary:
    """The figures from per-request records (`num_cached_tokens`, `restores`)."""
    if status != LIVE:
        return Summary(status=status)
    kinds: Counter[str] = Counter()
    unjudged = 0
    for request in requests:
        restores = request.get("restores")
        if not restores:
            unjudged += 1 if request.get("num_cached_tokens", 0) > 0 else 0
            continue
        kinds.update(r.get("kind", UNWITNESSED) for r in restores)
    return Summary(
        status=status,
        restores=sum(kinds.values()),
        by_lane={lane: kinds[kind] for kind, lane in LANE_OF_KIND.items() if kinds[kind]},
        unwitnessed=kinds[UNWITNESSED] + sum(n for k, n in kinds.items() if k not in KINDS),
        unjudged_hits=unjudged,
    )


def line(summary: Summary) -> str:
    """``witness: 14 restores of mid-block states (cold-race lane)`` and the like."""
    if summary.status != LIVE:
        return f"witness: none ({summary.status}); the record cannot say what was restored"
    parts = [f"{n} restores of {_LANE_WORDS[lane]}" for lane, n in summary.by_lane.items() if n]
    text = "; ".join(parts) if parts else f"0 invalid of {summary.restores} restores"
    gaps = []
    if summary.unwitnessed:
        gaps.append(f"{summary.unwitnessed} restores of states it never saw written")
    if summary.unjudged_hits:
        gaps.append(f"{summary.unjudged_hits} cache hits with no restore judged")
    if gaps:
        text += " (not judged: " + ", ".join(gaps) + ")"
    return f"witness: {text}"


def headline(status: str, summary: Summary | None) -> str:
    """The verdict as the user reads it: plain, or `clean, but ...` where the witness saw
    invalid restores the outputs did not show."""
    if status == "clean" and summary is not None and summary.invalid:
        return (
            f"clean, but the engine restored {summary.invalid} invalid states: "
            "this model/geometry does not show them"
        )
    return status


def from_document(doc: Mapping[str, Any]) -> Summary | None:
    """Re-derive the summary from a run artifact; None for artifacts from before the witness."""
    section = doc.get("witness")
    if not isinstance(section, Mapping):
        return None
    figures = doc.get("figures") or {}
    requests = [
        request for wave in figures.get("waves") or [] for request in wave.get("per_request") or []
    ]
    return summarize(str(section.get("status", "")), requests)
