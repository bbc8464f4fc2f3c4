"""Running the `tiny` profile on the real engine, for the test files that check its records."""

from __future__ import annotations

import json
from pathlib import Path

from repro.artifact import validate_artifact

ARMS = ("cold-race", "multi-turn")


def load(out: Path, arm: str) -> dict:
    doc = json.loads((out / f"{arm}.json").read_text())
    validate_artifact(doc)
    return doc


def run_tiny(run_kit, out: Path, *args: str, arms=ARMS, profile: str = "tiny") -> dict[str, dict]:
    # A generous guard, not a speed check (benchmarks/ measures speed): both arms took
    # 10-20 min while four other jobs shared this machine's two cores.
    proc = run_kit(
        "run", "--profile", profile, "--out", str(out), "--arms", *arms, *args, timeout=3600
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return {arm: load(out, arm) for arm in arms}
