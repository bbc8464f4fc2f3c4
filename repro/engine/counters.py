"""The engine's counters: prefix-cache and speculative-decoding totals, one type.

The same fields vLLM's Prometheus counters sum (`COUNTER_NAMES`: field -> metric), whether
they are read from vLLM's metrics (`repro.engine.llm`) or summed step by step by the kit's tap
(`repro.engine.stats_tap`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

COUNTER_NAMES = {
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
    "spec_decode_num_drafts": "vllm:spec_decode_num_drafts",
    "spec_decode_num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    # What an attached KV connector was asked for and supplied (0 without one).
    "external_prefix_cache_queries": "vllm:external_prefix_cache_queries",
    "external_prefix_cache_hits": "vllm:external_prefix_cache_hits",
}


@dataclass(frozen=True)
class Counters:
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            **{
                f.name: getattr(self, f.name) - getattr(other, f.name)
                for f in dataclasses.fields(self)
            }
        )

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            **{
                f.name: getattr(self, f.name) + getattr(other, f.name)
                for f in dataclasses.fields(self)
            }
        )

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)
