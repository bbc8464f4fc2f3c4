"""The tiny profile on the real vLLM CPU engine where a gate fires or the engine process dies.

An inconclusive gate (no drafts: engagement), upstream's zero-hit lane (clean with the
liveness probe live), an arm past its time limit, and a real crash: the engine process that
runs the arms killed with SIGKILL mid-arm, as the kernel's OOM killer would. One run serves
both the crash and the no-drafts gate: the arm after the crash runs without MTP.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from tiny_runs import load, run_tiny

from repro import evidence
from repro.core.atomicio import sha256_file

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parent.parent


def _cmdline(pid: int) -> str:
    """A process's command line; empty once it has gone (a short-lived child may exit
    between being listed and being read)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended while being listed
    return found


@pytest.fixture(scope="module")
def killed_then_no_drafts(engine_python, tmp_path_factory):
    """multi-turn, then cold-race, without MTP; the engine process is killed in multi-turn."""
    out = tmp_path_factory.mktemp("killed")
    env = {**os.environ, "PYTHONPATH": str(REPO), "REPRO_KIT_CHECKOUT": str(REPO)}
    cmd = [engine_python, "-m", "repro", "run", "--profile", "tiny", "--out", str(out)]
    proc = subprocess.Popen(
        [*cmd, "--arms", "multi-turn", "cold-race", "--override", "speculative_config=null"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log = out / "logs" / "multi-turn.log"
    deadline = time.monotonic() + 600
    killed = None
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        engine = [c for c in _children(proc.pid) if "arms" in _cmdline(c)]
        # Once the engine process has printed something: it is inside the first arm.
        if engine and log.is_file() and log.stat().st_size > 0:
            os.kill(engine[0], signal.SIGKILL)
            killed = engine[0]
        time.sleep(0.2)
    output, _ = proc.communicate(timeout=3600)
    assert killed is not None, output[-4000:]
    return out, proc.returncode, output


def test_a_killed_engine_process_leaves_the_arms_record_and_the_next_arm_runs(
    killed_then_no_drafts,
):
    out, returncode, output = killed_then_no_drafts
    assert returncode == 1, output[-4000:]

    crashed = load(out, "multi-turn")
    assert crashed["verdict"]["status"] == "error"
    assert "was killed by SIGKILL (status -9)" in crashed["verdict"]["reason"], crashed["verdict"]
    (entry,) = crashed["logs"]
    assert entry["path"] == "logs/multi-turn.log"
    assert sha256_file(out / entry["path"]) == entry["sha256"]

    after = load(out, "cold-race")
    assert after["verdict"]["status"] != "error", after["verdict"]["reason"]
    # It ran in a process of its own: that process imported vLLM for it.
    assert after["run"]["phases_s"]["import"] > 0
    assert [e["path"] for e in after["logs"]] == ["logs/cold-race.log"]
    assert not list(out.glob(".*.partial.json"))


def test_no_drafts_is_inconclusive_engagement(killed_then_no_drafts):
    out, _, _ = killed_then_no_drafts
    doc = load(out, "cold-race")
    assert doc["engine"]["overrides"] == {"speculative_config": None}
    verdict = doc["verdict"]
    assert (verdict["status"], verdict["gate"]) == ("inconclusive", "engagement")
    assert "zero speculative drafts" in verdict["reason"]


def test_zero_trigger_hits_with_a_live_probe_is_clean_as_upstream(run_kit, tmp_path):
    # Without sub-block hit granularity, vLLM 0.32.0 drops the last block of every hit under
    # MTP, so 1.35-block cold-race prompts never hit: the state of a fixed tree. Upstream's
    # engagement gate does not require those hits; its 3 B + 128 liveness probe must hit.
    docs = run_tiny(run_kit, tmp_path, "--override", "prefix_match_unit=null", arms=["cold-race"])
    doc = docs["cold-race"]
    verdict = doc["verdict"]
    assert (verdict["status"], verdict["outcome"]) == ("clean", "clean-zero-trigger-hits")
    assert "trigger waves at zero hits while the liveness probe hit" in verdict["reason"]
    apc = doc["counters"]["apc"]
    assert apc["wave1"]["prefix_cache_hits"] == apc["wave2"]["prefix_cache_hits"] == 0
    assert apc["wave1"]["prefix_cache_queries"] > 0
    assert doc["figures"]["liveness"]["hits"] > 0 and doc["figures"]["liveness"]["passed"]
    # Under the kit's earlier rules the same figures were "not engaged".
    old = evidence.regrade({**doc, "signal": {**doc["signal"], "rules": "kit-2026-11"}})
    assert (old.status, old.gate) == ("inconclusive", "engagement")


def test_killed_arm_leaves_an_error_record_with_its_log(run_kit, tmp_path):
    proc = run_kit(
        "run",
        "--profile",
        "tiny",
        "--out",
        str(tmp_path),
        "--arms",
        "cold-race",
        "--arm-timeout",
        "3",
    )
    assert proc.returncode == 1
    doc = load(tmp_path, "cold-race")
    assert doc["verdict"]["status"] == "error"
    assert "timed out after 3 s" in doc["verdict"]["reason"]
    assert doc["error"]["phase"] == "arm"
    (log,) = doc["logs"]
    assert (tmp_path / log["path"]).is_file()
