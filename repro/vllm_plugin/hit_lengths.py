"""The scheduler's side of a restore: how far attention verified the hit it resumes from.

A hybrid model's prefix-cache hit is reconciled across KV-cache groups: attention's blocks
and the Mamba group's state must agree on one length. When a rule that keeps them equal is
missing (the EAGLE lookup margin given to the Mamba group, say), the engine resumes past
the tokens whose attention KV it found, and the missing KV is never computed. This hook
records, for every local prefix-cache lookup, the hit length the engine takes and the
tokens the attention groups' blocks cover, keyed by request id; the restore witness, in
the same process as the scheduler (vLLM's single-process executor), reads it back.
"""

from __future__ import annotations

import functools
from typing import Any

# request id -> (hit length the engine takes, tokens the attention groups' blocks cover)
HITS: dict[str, tuple[int, int | None]] = {}
# Whether a lookup was ever recorded in this process (else the scheduler lives elsewhere).
SEEN: list[bool] = []
_METHODS = ("get_computed_blocks", "get_computed_blocks_for_connector")


def attention_cover(manager: Any, blocks: Any) -> int | None:
    """Tokens the fewest-covering attention group's blocks hold (None: no attention group)."""
    # lazy: vllm, found only in an engine environment
    from vllm.v1.kv_cache_interface import MambaSpec

    covers = []
    groups = manager.kv_cache_config.kv_cache_groups
    for group, group_blocks in zip(groups, blocks.blocks, strict=False):
        spec = group.kv_cache_spec
        if isinstance(spec, MambaSpec):
            continue
        covers.append(len(group_blocks) * spec.block_size)
    return min(covers) if covers else None


def _wrap(original):
    @functools.wraps(original)
    def lookup(self, request, *args, **kwargs):
        result = original(self, request, *args, **kwargs)
        try:
            blocks, hit = result[0], int(result[1])
            if hit > 0:
                HITS[request.request_id] = (hit, attention_cover(self, blocks))
            if len(HITS) > 100_000:  # requests that never reached a worker here
                HITS.pop(next(iter(HITS)))
            SEEN[:] = [True]
        except Exception:  # noqa: BLE001 - a record missing is named by the reader
            pass
        return result

    lookup.repro_witness_wrapper = True  # type: ignore[attr-defined]
    return lookup


def install() -> list[str]:
    """Wrap the KV-cache manager's local lookups; returns the ones wrapped."""
    # lazy: vllm, found only in an engine environment
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    wrapped = []
    for name in _METHODS:
        method = getattr(KVCacheManager, name, None)
        if method is None:
            continue
        if not getattr(method, "repro_witness_wrapper", False):
            setattr(KVCacheManager, name, _wrap(method))
        wrapped.append(name)
    return wrapped
