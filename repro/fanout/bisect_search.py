"""A bisect's search: K probes a round, narrowing to the first ref whose verdict changed.

The refs run from the bad end (index 0) to the good end. The first round probes the bad end
beside K-1 refs that split the range in K; each later round probes K untried refs that split
the range left into K+1 parts (`split_points`) and narrows it to the first probed ref whose
verdict differs from the bad end's and the last unchanged one before it (`narrow`). A probe
without a verdict is skipped (git bisect skip); the good end is trusted, and probed when the
search ends on it or a round has a slot to spare for it. `repro.fanout.bisect` orders the refs
and writes the result; `repro.fanout.bisect_probes` runs a round's probes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from repro.core.errors import ReproError

SKIPPED = ("inconclusive", "error")


class BisectError(ReproError):
    """The refs cannot be ordered, or the bad end gives no verdict to compare with."""


@dataclass
class Probe:
    ref: str
    status: str
    gate: str | None
    run_dir: str
    reason: str
    slurm_job: str | None = None  # the array task that ran it ("JOB_TASK"), if one did
    round: int | None = None  # set by the search
    kept: bool = False  # finished earlier with the same content hash: not run again

    @property
    def skipped(self) -> bool:
        return self.status in SKIPPED

    def record(self) -> dict[str, Any]:
        record = {
            "ref": self.ref,
            "verdict": self.status,
            "gate": self.gate,
            "run_dir": self.run_dir,
            "skipped": self.skipped,
            "reason": self.reason,
            "round": self.round,
            "kept": self.kept,
        }
        if self.slurm_job is not None:
            record["slurm_job"] = self.slurm_job
        return record


def split_points(lo: int, hi: int, count: int, untried: list[int]) -> list[int]:
    """``count`` untried indices between ``lo`` and ``hi`` that split the range into
    ``count + 1`` parts: each the nearest untried one to its even split point (the lower one
    on a tie); fewer where fewer are untried."""
    chosen: list[int] = []
    for j in range(1, count + 1):
        left = [k for k in untried if k not in chosen]
        if not left:
            break
        point = lo + ((hi - lo) * j) // (count + 1)
        chosen.append(min(left, key=lambda x: (abs(x - point), x)))
    return sorted(chosen)


def narrow(lo: int, hi: int, at: dict[int, Probe], bad_status: str) -> tuple[int, int]:
    """The range after a round: the first probed ref within it whose verdict changed, and the
    last unchanged one before that."""
    changed = [k for k, p in at.items() if lo < k <= hi and p.status != bad_status]
    hi = min(changed, default=hi)
    lo = max(k for k, p in at.items() if lo <= k < hi and p.status == bad_status)
    return lo, hi


def search(
    refs: list[str],
    probe_round: Callable[[list[str]], list[Probe]],
    *,
    probes_at_once: int = 1,
    log=print,
) -> dict[str, Any]:
    """K-way search (K = ``probes_at_once``) for the first ref, from the bad end, whose
    verdict differs from the bad end's; ``probe_round`` probes a round's refs together."""
    k_way = max(1, probes_at_once)
    probes: list[Probe] = []
    rounds: list[dict[str, Any]] = []
    good = len(refs) - 1
    lo, hi = 0, good
    at: dict[int, Probe] = {}
    skipped: set[int] = set()

    def run(indices: list[int]) -> dict[int, Probe]:
        number = len(rounds) + 1
        started = time.monotonic()
        results = probe_round([refs[k] for k in indices])
        for k, result in zip(indices, results, strict=True):
            result.round = number
            probes.append(result)
            note = " - skipped (no verdict)" if result.skipped else ""
            log(f"[bisect] round {number}: {refs[k]} -> {result.status}{note}")
        rounds.append(
            {
                "round": number,
                "refs": [refs[k] for k in indices],
                "range_before": [refs[lo], refs[hi]],
                "seconds": round(time.monotonic() - started, 3),
                "slurm_job": next(
                    (p.slurm_job.split("_")[0] for p in results if p.slurm_job), None
                ),
            }
        )
        return dict(zip(indices, results, strict=True))

    def untried() -> list[int]:
        return [k for k in range(lo + 1, hi) if k not in at and k not in skipped]

    first = run([0, *split_points(0, good, k_way - 1, untried())])
    bad = first.pop(0)
    if bad.skipped:
        raise BisectError(
            f"the bad end {refs[0]} gave {bad.status} ({bad.reason}); bisect needs its verdict "
            f"to compare with: fix that run first (see {bad.run_dir})"
        )
    at[0] = bad
    results = first
    good_tried = False
    while True:
        for k, result in results.items():
            if not result.skipped:
                at[k] = result
            elif k != good:  # a skipped good end leaves the answer open (below)
                skipped.add(k)
            good_tried = good_tried or k == good
        lo, hi = narrow(lo, hi, at, bad.status)
        rounds[-1]["range_after"] = [refs[lo], refs[hi]]
        indices = split_points(lo, hi, k_way, untried())
        if not indices:
            break
        if len(indices) < k_way and hi == good and not good_tried:
            indices.append(good)  # a slot to spare: the good end, which the search may end on
        results = run(indices)
    if hi not in at and not good_tried:  # the good end, trusted so far: probe it for evidence
        results = run([hi])
        if not results[hi].skipped:
            at[hi] = results[hi]
        rounds[-1]["range_after"] = [refs[lo], refs[hi]]
    open_between = [refs[k] for k in range(lo + 1, hi) if k in skipped]
    changed = at.get(hi)
    candidates: list[str] = []
    if changed is not None and changed.status == bad.status:
        first_changed = None
        conclusion = (
            f"no change: the good end {refs[hi]} gives the bad end's verdict ({bad.status})"
        )
    elif changed is None or open_between:
        first_changed, candidates = None, [*open_between, refs[hi]]
        conclusion = (
            f"the change is in one of {', '.join(candidates)}: skipped probes "
            f"({', '.join(refs[k] for k in sorted(skipped))}) leave it open"
        )
    else:
        first_changed = refs[hi]
        conclusion = (
            f"{refs[hi]} is the first ref whose {changed.status} differs from the bad end's "
            f"{bad.status} (last {bad.status}: {refs[lo]})"
        )
    return {
        "refs": refs,
        "bad_verdict": bad.status,
        "first_changed": first_changed,
        "last_unchanged": refs[lo],
        "candidates": candidates,
        "probes_at_once": k_way,
        "rounds": rounds,
        "probes": [p.record() for p in probes],
        "skipped": [refs[k] for k in sorted(skipped)],
        "evidence": {
            "unchanged": at[lo].run_dir,
            "changed": changed.run_dir
            if changed is not None and first_changed is not None
            else None,
        },
        "conclusion": conclusion,
    }
