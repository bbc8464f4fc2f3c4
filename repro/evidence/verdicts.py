"""Does an artifact's recorded verdict follow from its recorded figures?

`regrade` re-derives the verdict from the per-request figures, counters and liveness probe
with the kit's grading code (`waves_from_document` reads the graded inputs back).
`check_verdict` compares that with what the artifact says: the verdict's status and gate, the
signal's threshold, and each wave's forward/reverse flips and per-request `flagged` marks. A
hand-edited verdict (or figures edited to fit a verdict) shows up here even when every hash in
a bundle is consistent.

Every verdict whose figures exist is re-derived, with the kit's current rules (a gate the
artifact leaves out still applies). Error records and geometry-gated records normally carry no
figures (they stopped before any wave ran, or before grading): there is nothing to re-derive,
and the check says so. One that does carry figures is re-derived all the same: figures that
cannot be graded, or that grade as `corrupted`, are named (a corruption relabelled `error` or
`inconclusive (geometry)` is still a corruption), and a geometry-gated record carrying figures
is named too (the geometry gate stops a run before its first wave).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from repro import answer_logprob, grading, ladder
from repro.arms import prompts
from repro.evidence.runs import EvidenceError


def verdict_section(verdict: grading.Verdict) -> dict[str, Any]:
    """A verdict as the artifact records it (the runner writes it; readers rebuild it)."""
    section = {"status": verdict.status, "gate": verdict.gate, "reason": verdict.reason}
    if verdict.outcome is not None:
        section["outcome"] = verdict.outcome
    return section


def waves_from_document(doc: dict[str, Any]) -> tuple[list[grading.Wave], list[float]]:
    """The graded inputs as recorded: lets anyone re-derive a verdict from an artifact."""
    waves, noise = [], []
    for fig in doc["figures"]["waves"]:
        extra = fig.get("extra") or {}
        noise.extend(extra.get("benign_noise", []))
        waves.append(
            grading.Wave(
                name=fig["name"],
                requests=tuple(
                    grading.RequestResult(
                        index=r["index"],
                        num_cached_tokens=r["num_cached_tokens"],
                        divergence=r["divergence"],
                        apc_miss=r["apc_miss"],
                        control_miss=r["control_miss"],
                        code=r.get("code"),
                        apc_answer=r.get("apc_answer"),
                        control_answer=r.get("control_answer"),
                    )
                    for r in fig["per_request"]
                ),
                apc_distinct_outputs=fig["apc"]["distinct_outputs"],
                control_distinct_outputs=fig["control"]["distinct_outputs"],
                graded=extra.get("graded", True),
                distinct_rule=extra.get("distinct_rule", False),
            )
        )
    return waves, noise


def regrade(doc: dict[str, Any], *, as_recorded: bool = False) -> grading.Verdict:
    """Re-derive an artifact's verdict from its recorded figures and counters.

    With the current rules by default: every gate this kit has applies, whatever the artifact
    says, so an artifact cannot switch a gate off by leaving it out. ``as_recorded`` grades
    with the gates the artifact records instead (an artifact from before
    ``signal.control_spread_gate`` existed re-grades without it): how it was graded then,
    never what `verify` accepts."""
    waves, noise = waves_from_document(doc)
    live = doc["figures"].get("liveness")
    # Artifacts from before the rules were recorded were graded by the kit's own.
    rules = (doc.get("signal") or {}).get("rules") or grading.RULES_KIT
    return grading.grade(
        signal=doc["signal"]["kind"],
        waves=waves,
        engagement=grading.engagement_of(doc["counters"]["apc"], waves, rules),
        liveness=(
            grading.Liveness(
                live["prompt_tokens"],
                live["hits"],
                live["queries"],
                live.get("cached_tokens", 0),
            )
            if live
            else None
        ),
        extra_noise=noise,
        control_spread_gate=(
            bool((doc.get("signal") or {}).get("control_spread_gate"))
            if as_recorded
            else grading.CONTROL_SPREAD_GATE
        ),
        rules=rules,
        require_hits=grading.requires_hits(doc["arm"], rules),
    )


def answer_line(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The needle profiles' answer log-prob line (`repro.answer_logprob`), derived from the
    recorded figures by the re-grade itself: the runner records it with this call and
    `check_verdict` re-derives it with it. None where the line does not apply."""
    view = answer_logprob.logprob_view(doc)
    if view is None:
        return None
    graded = [
        w["name"] for w in doc["figures"]["waves"] if (w.get("extra") or {}).get("graded", True)
    ]
    return answer_logprob.section(regrade(view), doc["verdict"]["status"], graded)


@dataclass
class VerdictCheck:
    """The outcome for one artifact. ``problems`` empty means the verdict follows."""

    rederived: bool
    status: str | None = None  # the re-derived status (None when not re-derivable)
    gate: str | None = None
    problems: list[str] = field(default_factory=list)
    note: str = ""


def _carries_figures(doc: dict[str, Any]) -> bool:
    return any(doc.get(key) is not None for key in ("figures", "counters", "signal"))


def check_verdict(doc: dict[str, Any]) -> VerdictCheck:
    """The run's verdict, and with a connector ladder its reference rung's and its finding."""
    check = _check_one(doc)
    reference = ladder.rung_document(doc)
    if reference is None:
        return check
    rung = _check_one(reference)
    check.problems.extend(f"ladder reference (APC on, no connector): {p}" for p in rung.problems)
    if check.status is not None and rung.status is not None:
        follows = ladder.finding(rung.status, check.status)
        if doc["ladder"].get("finding") != follows:
            check.problems.append(
                f"ladder.finding recorded {doc['ladder'].get('finding')!r}, but the rungs "
                f"re-grade {rung.status} without the connector and {check.status} with it: "
                f"{follows!r}"
            )
    waves = [w["name"] for w in (doc.get("figures") or {}).get("waves") or []]
    counted = ladder.external((doc.get("counters") or {}).get("apc"), waves)
    if doc["ladder"].get("external") != counted:
        check.problems.append(
            f"ladder.external {doc['ladder'].get('external')} does not match the counters of "
            f"the waves: {counted}"
        )
    return check


def _check_one(doc: dict[str, Any]) -> VerdictCheck:
    recorded = doc["verdict"]
    stopped = recorded["status"] == "error" or (
        recorded["status"] == "inconclusive" and recorded["gate"] == "geometry"
    )
    if stopped and not _carries_figures(doc):
        why = (
            "error record: no figures to re-derive a verdict from"
            if recorded["status"] == "error"
            else "geometry-gated: stopped before any wave ran"
        )
        return VerdictCheck(False, note=why)
    try:
        verdict = regrade(doc)
    except (KeyError, TypeError, ValueError, AssertionError, AttributeError) as exc:
        return VerdictCheck(
            True,
            problems=[f"figures cannot be re-graded ({type(exc).__name__}: {exc})"],
        )
    if stopped:
        return _check_stopped(doc, verdict)
    check = VerdictCheck(True, status=verdict.status, gate=verdict.gate)
    if (verdict.status, verdict.gate) != (recorded["status"], recorded["gate"]):
        check.problems.append(
            f"recorded verdict {_show(recorded['status'], recorded['gate'])} does not follow "
            f"from its figures: re-graded {_show(verdict.status, verdict.gate)} "
            f"({verdict.reason}){_older_rules(doc)}"
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
    for wave in doc["figures"]["waves"]:
        check.problems.extend(_misses_against_answers(wave))
    check.problems.extend(_answer_line_problems(doc))
    return check


def _answer_line_problems(doc: dict[str, Any]) -> list[str]:
    """The recorded answer log-prob line must be what its per-request figures grade to
    (its reason may be worded differently by another kit)."""
    recorded = doc.get("answer_logprob")
    try:
        derived = answer_line(doc)
    except (KeyError, TypeError, ValueError, AssertionError, AttributeError) as exc:
        return [f"answer_logprob cannot be re-derived ({type(exc).__name__}: {exc})"]
    if recorded is None and derived is None:
        return []
    if recorded is None:
        return ["the figures carry answer divergences but the answer_logprob section is missing"]
    if derived is None:
        return ["answer_logprob is recorded, but no figures it could follow from"]
    keys = (set(recorded) | set(derived)) - {"reason"}
    differ = sorted(k for k in keys if recorded.get(k) != derived.get(k))
    return [
        f"answer_logprob.{key} recorded {recorded.get(key)!r}, re-derived {derived.get(key)!r} "
        f"from the per-request answer divergences"
        for key in differ
    ]


def _misses_against_answers(wave: dict[str, Any]) -> list[str]:
    """Where a needle artifact keeps the answers, each miss must be what its answer says."""
    problems = []
    for r in wave["per_request"]:
        if "code" not in r:
            continue  # log-prob signal, or a needle artifact from before answers were kept
        for side in ("apc", "control"):
            miss = prompts.is_miss(r[f"{side}_answer"], r["code"])
            if r[f"{side}_miss"] != miss:
                problems.append(
                    f"{wave['name']} request {r['index']}: {side}_miss recorded "
                    f"{r[f'{side}_miss']}, but its answer {r[f'{side}_answer']!r} "
                    f"{'lacks' if miss else 'holds'} the code {r['code']}"
                )
    return problems


def _check_stopped(doc: dict[str, Any], verdict) -> VerdictCheck:
    """An error or geometry-gated record that carries figures anyway."""
    recorded = doc["verdict"]
    shown = _show(recorded["status"], recorded["gate"])
    check = VerdictCheck(True, status=verdict.status, gate=verdict.gate)
    if recorded["status"] == "inconclusive":
        check.problems.append(
            f"recorded {shown}, yet it carries figures (they grade "
            f"{_show(verdict.status, verdict.gate)}): the geometry gate stops a run before "
            "its first wave, so these figures were added or the verdict relabelled"
        )
    elif verdict.status == "corrupted":
        check.problems.append(
            f"recorded {shown}, yet its figures grade corrupted ({verdict.reason}): an error "
            "does not make a corruption go away; read this run as corrupted"
        )
    else:
        check.note = (
            f"error record carrying figures; they grade {_show(verdict.status, verdict.gate)}, "
            "the recorded error stands"
        )
    return check


def _older_rules(doc: dict[str, Any]) -> str:
    """Where the artifact was graded without a gate this kit applies, say so."""
    if (doc.get("signal") or {}).get("control_spread_gate") or not grading.CONTROL_SPREAD_GATE:
        return ""
    old = regrade(doc, as_recorded=True)
    if (old.status, old.gate) != (doc["verdict"]["status"], doc["verdict"]["gate"]):
        return ""
    return (
        "; it was graded without the control-spread gate (signal.control_spread_gate not "
        "recorded as true), which this kit always applies"
    )


def _show(status: str, gate: str | None) -> str:
    return f"{status} ({gate})" if gate else status


__all__ = ["VerdictCheck", "check_verdict"]


def require_verdict_follows(doc: dict[str, Any], where: str, advice: str) -> None:
    """Raise EvidenceError, naming `where` and saying `advice`, unless the recorded verdict
    follows from the recorded figures (what bundle, report and compare all require)."""
    problems = check_verdict(doc).problems
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise EvidenceError(
            f"{where}: its verdict does not follow from its figures:\n{lines}\n{advice}"
        )
