"""Every engine step's scheduler statistics, summed where the kit reads them.

vLLM's scheduler drains its prefix-cache, connector and speculative-decoding statistics at
every step and sends them with that step's outputs. Before vLLM 0.28.0 the offline engine
(`LLMEngine.step`, what `LLM.generate` runs) handed them to its metrics only when the step
also produced request outputs; a step without any dropped them for good (fixed upstream by
PR #48668). Under async scheduling the step that drains a request's cache hit is often one
without outputs: on an H200 (vLLM 0.26.0) the liveness probe's hits read 0 of 0 while its
requests reported 1,728 cached tokens. With chunked prefill a hit taken on a non-final
chunk is lost the same way, on any device.

`LLMEngine.step` passes every step's statistics to `OutputProcessor.update_scheduler_stats`
before that gate, on every release the kit supports. The tap wraps that call and sums the
same fields vLLM's Prometheus counters sum, so the kit's counters are what vLLM 0.28.0 and
later record, on every release. `missed_by_vllm_metrics` is how far vLLM's own counters fell
behind: a fact about the engine's metrics, kept in the record.
"""

from __future__ import annotations

from typing import Any

from repro.engine.counters import Counters


class SchedulerStatsTap:
    """Sums each `SchedulerStats` the engine's front-end receives."""

    def __init__(self) -> None:
        self.totals = Counters()
        # Steps that carried statistics (recorded beside the totals).
        self.steps = 0

    @classmethod
    def attach(cls, llm_engine: Any) -> SchedulerStatsTap | None:
        """A tap on `llm_engine`'s output processor, or None where this vLLM has no such
        call (the kit then reads vLLM's own metrics, and says so)."""
        processor = getattr(llm_engine, "output_processor", None)
        update = getattr(processor, "update_scheduler_stats", None)
        if update is None:
            return None
        tap = cls()

        def update_scheduler_stats(scheduler_stats, *args, **kwargs):
            tap.observe(scheduler_stats)
            return update(scheduler_stats, *args, **kwargs)

        processor.update_scheduler_stats = update_scheduler_stats
        return tap

    def observe(self, stats: Any) -> None:
        if stats is None:
            return
        self.steps += 1
        prefix = stats.prefix_cache_stats
        step = {"prefix_cache_queries": prefix.queries, "prefix_cache_hits": prefix.hits}
        external = getattr(stats, "connector_prefix_cache_stats", None)
        if external is not None:
            step["external_prefix_cache_queries"] = external.queries
            step["external_prefix_cache_hits"] = external.hits
        spec = getattr(stats, "spec_decoding_stats", None)
        if spec is not None:
            step["spec_decode_num_drafts"] = spec.num_drafts
            step["spec_decode_num_draft_tokens"] = spec.num_draft_tokens
            step["spec_decode_num_accepted_tokens"] = spec.num_accepted_tokens
        self.totals = self.totals + Counters(**step)
