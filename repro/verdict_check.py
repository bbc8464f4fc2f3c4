"""Does an artifact's recorded verdict follow from its recorded figures?

`repro.evidence.regrade` re-derives the verdict from the per-request figures, counters and
liveness probe with the kit's grading code. This module compares that with what the artifact
says: the verdict's status and gate, the signal's threshold, and each wave's forward/reverse
flips and per-request `flagged` marks. A hand-edited verdict (or figures edited to fit a
verdict) shows up here even when every hash in a bundle is consistent.

Error records and geometry-gated records carry no figures (they stopped before any wave ran):
there is nothing to re-derive, and the check says so instead of passing them silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from repro import evidence


@dataclass
class VerdictCheck:
    """The outcome for one artifact. ``problems`` empty means the verdict follows."""

    rederived: bool
    status: str | None = None  # the re-derived status (None when not re-derivable)
    gate: str | None = None
    problems: list[str] = field(default_factory=list)
    note: str = ""


def check_verdict(doc: dict[str, Any]) -> VerdictCheck:
    recorded = doc["verdict"]
    if recorded["status"] == "error":
        return VerdictCheck(False, note="error record: no figures to re-derive a verdict from")
    if recorded["status"] == "inconclusive" and recorded["gate"] == "geometry":
        return VerdictCheck(False, note="geometry-gated: stopped before any wave ran")
    try:
        verdict = evidence.regrade(doc)
    except (KeyError, TypeError, ValueError, AssertionError) as exc:
        return VerdictCheck(
            True,
            problems=[f"figures cannot be re-graded ({type(exc).__name__}: {exc})"],
        )
    check = VerdictCheck(True, status=verdict.status, gate=verdict.gate)
    if (verdict.status, verdict.gate) != (recorded["status"], recorded["gate"]):
        check.problems.append(
            f"recorded verdict {_show(recorded['status'], recorded['gate'])} does not follow "
            f"from its figures: re-graded {_show(verdict.status, verdict.gate)} "
            f"({verdict.reason})"
        )
    elif verdict.reason != recorded["reason"]:
        check.note = f"same verdict; reason worded differently by this kit: {verdict.reason}"

    signal = doc.get("signal") or {}
    if verdict.threshold is not None and verdict.threshold.value is not None:
        recorded_threshold = signal.get("threshold")
        if recorded_threshold is None or not math.isclose(
            recorded_threshold, verdict.threshold.value, rel_tol=1e-9, abs_tol=1e-12
        ):
            check.problems.append(
                f"signal.threshold {recorded_threshold} does not follow from the benign noise: "
                f"re-derived {verdict.threshold.value}"
            )
    grades = {g.name: g for g in verdict.waves}
    for wave in doc["figures"]["waves"]:
        grade = grades.get(wave["name"])
        if grade is None:
            continue  # the grading stopped at a gate before judging waves
        for key, value in (
            ("forward_flips", grade.forward_flips),
            ("reverse_flips", grade.reverse_flips),
        ):
            if wave[key] != value:
                check.problems.append(
                    f"{wave['name']}.{key} recorded {wave[key]}, re-derived {value} from its "
                    f"per-request figures"
                )
        flagged = [bool(r["flagged"]) for r in wave["per_request"]]
        if flagged != list(grade.flagged):
            changed = [
                r["index"]
                for r, f in zip(wave["per_request"], grade.flagged, strict=False)
                if bool(r["flagged"]) != f
            ]
            check.problems.append(
                f"{wave['name']}: per-request 'flagged' marks disagree with the re-derived ones "
                f"for request(s) {changed}"
            )
    return check


def _show(status: str, gate: str | None) -> str:
    return f"{status} ({gate})" if gate else status


__all__ = ["VerdictCheck", "check_verdict"]
