"""The kit's probe KV connector: attaches, moves nothing, and records what the scheduler did.

With any KV connector attached, vLLM's scheduler takes another path to a hybrid model's
prefix-cache hit: it looks each KV-cache group up on its own and, on some releases, resumes
from the full-attention group's hit, trusting the connector to restore the Mamba state
there (upstream PR #48425 and PR #50344 narrowed that). The probe supplies no tokens, so
any resume past the Mamba group's own hit is a resume without a valid state. Per request it
records, in this process (vLLM's single-process engine core, as the kit runs it):

- ``offered``: the local hit the scheduler passed to the connector;
- ``group_hits``: each group's own hit, where the release looks them up per group
  (``HybridKVCacheCoordinator.find_longest_cache_hit_per_group``), by kind;
- ``supplied``: the external tokens the connector returned (always 0);
- ``resumed``: where the request really started (``num_computed_tokens`` of the scheduled
  new request), after any fallback the scheduler made.

`ReproDivergentProbeConnector` also opts into ``supports_divergent_local_hybrid_hits`` (as
NIXL does), the path 0.28.0 and later still take for capable connectors.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)

# request id -> the probe's record of it (read and cleared by `take`).
RECORDS: dict[str, dict[str, Any]] = {}
# The per-group hits of the lookup the scheduler just made (one thread schedules).
_LAST_GROUP_HITS: list[dict[str, int] | None] = [None]
_MAX_RECORDS = 100_000


class _NoMetadata(KVConnectorMetadata):
    pass


class ReproProbeConnector(KVConnectorBase_V1, SupportsHMA):
    """Moves nothing; records each request's offered, per-group and resumed hit."""

    def __init__(self, vllm_config, role, kv_cache_config=None, *args, **kwargs):
        super().__init__(vllm_config, role, kv_cache_config, *args, **kwargs)
        _watch_group_lookups()

    # -- worker side: nothing to load or save ----------------------------------------------
    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    # -- scheduler side --------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        record = {"offered": int(num_computed_tokens), "supplied": 0, "resumed": None}
        group_hits, _LAST_GROUP_HITS[0] = _LAST_GROUP_HITS[0], None
        if group_hits is not None:
            record["group_hits"] = group_hits
        RECORDS[request.request_id] = record
        if len(RECORDS) > _MAX_RECORDS:  # requests nobody read back
            RECORDS.pop(next(iter(RECORDS)))
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        for new in getattr(scheduler_output, "scheduled_new_reqs", ()) or ():
            record = RECORDS.get(new.req_id)
            if record is not None and record["resumed"] is None:
                record["resumed"] = int(new.num_computed_tokens)
        return _NoMetadata()

    def request_finished(self, request, block_ids):
        return False, None

    def request_finished_all_groups(self, request, block_ids):
        return False, None


class ReproDivergentProbeConnector(ReproProbeConnector):
    """The probe, declaring it restores lagging recurrent state (it does not)."""

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return True


def take(request_id: str) -> dict[str, Any] | None:
    """The probe's record of ``request_id`` (vLLM may suffix the id the caller sees)."""
    record = RECORDS.pop(request_id, None)
    if record is None:
        for key in [k for k in RECORDS if k.startswith(f"{request_id}-")]:
            record = RECORDS.pop(key)
    return record


def _watch_group_lookups() -> None:
    """Record each group's own hit from the per-group lookup, by group kind."""
    try:
        # lazy: vllm, found only in an engine environment
        from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
    except ImportError:  # a release without the hybrid coordinator: no per-group hits
        return
    original = getattr(HybridKVCacheCoordinator, "find_longest_cache_hit_per_group", None)
    if original is None or getattr(original, "repro_probe_wrapper", False):
        return

    @functools.wraps(original)
    def lookup(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        try:
            _LAST_GROUP_HITS[0] = _by_kind(self, result[1])
        except Exception:  # noqa: BLE001 - a missing figure is named by the reader
            _LAST_GROUP_HITS[0] = None
        return result

    lookup.repro_probe_wrapper = True  # type: ignore[attr-defined]
    HybridKVCacheCoordinator.find_longest_cache_hit_per_group = lookup


def _by_kind(coordinator, hits) -> dict[str, int]:
    """The fewest tokens any group of a kind hit: `attention` or `mamba`."""
    # lazy: vllm, found only in an engine environment
    from vllm.v1.kv_cache_interface import MambaSpec

    kinds: dict[str, int] = {}
    for group, hit in zip(coordinator.kv_cache_config.kv_cache_groups, hits, strict=False):
        kind = "mamba" if isinstance(group.kv_cache_spec, MambaSpec) else "attention"
        kinds[kind] = min(kinds.get(kind, int(hit)), int(hit))
    return kinds
