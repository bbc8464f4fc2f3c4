"""Exact fingerprints of Mamba state blocks, computed where the state lives.

The restore witness tells states apart by content. A fingerprint is an integer hash of a
fixed random sample of a block's words: integer arithmetic with wrapping sums, so it is
exact and independent of the order the device adds in, and a byte copy of a block has the
fingerprint of its source. Two different states agreeing on the sampled words at random
places does not happen. Only the fingerprints leave the device (one read per step).
"""

from __future__ import annotations

from typing import Any

# The fingerprint of a block of zeros, whatever its size: every sampled word is 0.
ZEROS = 0

# Words of a block sampled into its fingerprint.
SAMPLED_WORDS = 2048
_SEED = 43559


class BlockFingerprints:
    """Fingerprints of blocks of one state tensor (`[num_blocks, ...]`)."""

    def __init__(self) -> None:
        self._sampling: dict[tuple[int, str], tuple[Any, Any]] = {}

    def of(self, state, block_ids: list[int]) -> list[int]:
        if not block_ids:
            return []
        return self.sample(state, block_ids).tolist()

    def sample(self, state, block_ids: list[int]):
        """The fingerprints as a tensor on the state's device (nothing read back yet: the
        device computes them in stream order, before any later kernel writes the blocks)."""
        # lazy: torch, found only where models are built or engines run
        import torch

        ids = torch.tensor(block_ids, dtype=torch.long, device=state.device)
        words = state.index_select(0, ids).reshape(len(block_ids), -1).view(torch.uint8)
        if words.shape[1] % 4 == 0:
            words = words.view(torch.int32)
        idx, weights = self._sample(words.shape[1], state.device)
        sample = words.index_select(1, idx).to(torch.int64)
        return (sample * weights).sum(dim=1)

    def _sample(self, width: int, device) -> tuple[Any, Any]:
        key = (width, str(device))
        if key not in self._sampling:
            # lazy: torch, found only where models are built or engines run
            import torch

            gen = torch.Generator().manual_seed(_SEED)
            count = min(width, SAMPLED_WORDS)
            idx = torch.randperm(width, generator=gen)[:count].sort().values
            # Odd weights: no word's contribution vanishes modulo 2**64.
            weights = torch.randint(1, 2**62, (count,), generator=gen, dtype=torch.int64) | 1
            self._sampling[key] = (idx.to(device), weights.to(device))
        return self._sampling[key]
