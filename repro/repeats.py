"""Repeats of a run: each arm K times with fresh engines, and one verdict over them all.

One run per arm is the seed's own caveat: the H200 cold-race red/green rested on one
request at the margin. `--repeat K` runs the arms K times, each repeat a run directory of
its own (`repeat-1/`, ...), and writes `repeats.json` beside them: per arm, each repeat's
verdict, the flips pooled over the repeats with their exact one-sided p-value
(`repro.confidence`), how many repeats were knife-edged, and the witness's invalid
restores summed. The pooled line never replaces a repeat's verdict; it says how the
repeats agree and how likely their flips are from benign noise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from repro import confidence, witness

FORMAT = "repro-repeats"
FILE_NAME = "repeats.json"
MAX_REPEATS = 50


def repeat_dir(out_dir: Path, index: int) -> Path:
    return out_dir / f"repeat-{index}"


def summarize(runs: list[Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """`repeats.json`'s arms: `runs` holds each repeat's artifacts by arm, in order."""
    arms: dict[str, Any] = {}
    for arm in dict.fromkeys(a for run in runs for a in run):
        docs = [run.get(arm) for run in runs]
        verdicts = [d["verdict"]["status"] if d else "missing" for d in docs]
        graded = [d for d in docs if d and d["verdict"]["status"] in ("clean", "corrupted")]
        signal = _signal(graded[0]) if graded else None
        pooled = None
        if signal is not None:
            evidence = confidence.Evidence(signal)
            for d in graded:
                evidence = evidence + confidence.from_waves(
                    signal, d["figures"]["waves"], (d.get("signal") or {}).get("threshold")
                )
            pooled = {
                "forward_flips": evidence.forward,
                "reverse_flips": evidence.reverse,
                "p_value": float(f"{evidence.p_value:.3g}"),
                "test": evidence.test,
            }
        seen = [witness.from_document(d) for d in docs if d]
        arms[arm] = {
            "verdicts": verdicts,
            "counts": dict(Counter(verdicts)),
            "agree": len(set(verdicts)) == 1,
            "pooled": pooled,
            "knife_edge_repeats": sum(
                1 for d in graded if confidence.knife_edge(d["verdict"]["status"], _waves(d))
            ),
            "witness_invalid": [
                s.invalid if s and s.status == witness.LIVE else None for s in seen
            ],
        }
    return arms


def document(runs: list[Mapping[str, Mapping[str, Any]]], out_dir: Path) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "format_version": 1,
        "repeats": len(runs),
        "runs": [repeat_dir(out_dir, i + 1).name for i in range(len(runs))],
        "arms": summarize(runs),
    }


def line(arm: str, figures: Mapping[str, Any]) -> str:
    """``cold-race: corrupted 3/3, pooled 42 / 0 flips, p = 1.2e-13 (Fisher's exact test)``."""
    counts = ", ".join(
        f"{status} {n}/{len(figures['verdicts'])}" for status, n in figures["counts"].items()
    )
    text = f"{arm}: {counts}"
    pooled = figures.get("pooled")
    if pooled:
        text += (
            f"; pooled {pooled['forward_flips']} forward / {pooled['reverse_flips']} reverse "
            f"flips, p = {pooled['p_value']:.2g} ({pooled['test']}, one-sided)"
        )
    if figures["knife_edge_repeats"]:
        text += f"; {figures['knife_edge_repeats']} repeat(s) knife-edged"
    return text


def _signal(doc: Mapping[str, Any]) -> str | None:
    return (doc.get("signal") or {}).get("kind")


def _waves(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return (doc.get("figures") or {}).get("waves") or []


def versus(
    docs: list[Mapping[str, Any]], reference: list[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """One condition's runs of an arm against its reference condition's (stock against
    patched, say): their forward flips, pooled over repeats, out of their graded requests.
    Fisher's exact test, one-sided: more flips per request here than in the reference, as
    chance alone would give them. None where either side has no graded run (an error, a
    gate), which is no evidence either way."""
    mine, theirs = _flips(docs), _flips(reference)
    if mine is None or theirs is None:
        return None
    (forward, requests, runs), (ref_forward, ref_requests, ref_runs) = mine, theirs
    p = confidence.fisher_upper_tail(forward, requests, ref_forward, ref_requests)
    return {
        "runs": runs,
        "forward_flips": forward,
        "requests": requests,
        "reference_runs": ref_runs,
        "reference_forward_flips": ref_forward,
        "reference_requests": ref_requests,
        "p_value": float(f"{p:.3g}"),
        "test": "fisher-exact",
    }


def versus_line(figures: Mapping[str, Any]) -> str:
    """``cold-race: 42 of 48 requests flipped (3 runs) against 2 of 48 (3 runs), p = 1e-12``."""
    return (
        f"{figures['arm']}: {figures['forward_flips']} of {figures['requests']} graded requests "
        f"flipped ({figures['runs']} run(s)) against {figures['reference_forward_flips']} of "
        f"{figures['reference_requests']} ({figures['reference_runs']} run(s)), p = "
        f"{figures['p_value']:.2g} (Fisher's exact test, one-sided: more flips than the "
        f"reference)"
    )


def _flips(docs: list[Mapping[str, Any]]) -> tuple[int, int, int] | None:
    """Forward flips and graded requests summed over the graded runs (clean or corrupted)."""
    graded = [d for d in docs if d["verdict"]["status"] in ("clean", "corrupted")]
    if not graded:
        return None
    forward = requests = 0
    for doc in graded:
        for wave in _waves(doc):
            if (wave.get("extra") or {}).get("graded", True):
                forward += int(wave.get("forward_flips", 0))
                requests += len(wave.get("per_request") or [])
    return forward, requests, len(graded)
