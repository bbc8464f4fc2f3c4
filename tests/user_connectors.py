"""Connectors as a user outside the kit writes them, for the connector-lane tests."""

# Attaches, declares hybrid-model support, moves nothing: the do-nothing connector.
USER_CONNECTOR = """
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA,
)


class _Meta(KVConnectorMetadata):
    pass


class NullConnector(KVConnectorBase_V1, SupportsHMA):
    def start_load_kv(self, forward_context, **kwargs): pass
    def wait_for_layer_load(self, layer_name): pass
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs): pass
    def wait_for_save(self): pass
    def get_num_new_matched_tokens(self, request, num_computed_tokens): return 0, False
    def update_state_after_alloc(self, request, blocks, num_external_tokens): pass
    def build_connector_meta(self, scheduler_output): return _Meta()
    def request_finished_all_groups(self, request, block_ids): return False, None
"""
