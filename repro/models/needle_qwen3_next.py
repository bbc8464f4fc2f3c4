"""A Qwen3-Next (Gated DeltaNet + gated attention) needle model with one MTP layer, for training.

The backbone is transformers' own `Qwen3NextModel` (its PyTorch fallbacks for the gated delta
rule and the causal convolution), so its arithmetic is the reference vLLM's Qwen3-Next layers
are tested against. What transformers lacks is the MTP layer; it is built here as vLLM's
`Qwen3NextMultiTokenPredictor` computes it:
``fc([pre_fc_norm_embedding(embed(x[t+1])); pre_fc_norm_hidden(h[t])])``, one full-attention
decoder layer at position t, ``norm``, the shared ``lm_head``. It predicts x[t+2] from the main
model's final hidden state h[t] (after the final norm, which is what vLLM hands the drafter).

vLLM builds its MTP layer with layer index 0 (the weights are named ``mtp.layers.0.*``), so
the layer's MLP is what layer 0's is (experts unless 0 is in ``mlp_only_layers``); the layer
here is built the same way, with a full-attention mixer.

`checkpoint_state` names the tensors as published Qwen3-Next checkpoints do (``model.*``,
``lm_head``, ``mtp.*``, one tensor per expert), which is what vLLM loads.
"""

from __future__ import annotations

import contextlib
import copy
import math

import torch
from torch import nn

from repro.models.qwen3_next_layout import checkpoint_layout, config_for
from repro.vllm_plugin import fault_injection as fault


class MTP(nn.Module):
    """vLLM's Qwen3NextMultiTokenPredictor, less the embedding it shares with the model."""

    def __init__(self, config) -> None:
        super().__init__()
        # lazy: transformers, found only where models are built
        from transformers.models.qwen3_next.modeling_qwen3_next import (
            Qwen3NextDecoderLayer,
            Qwen3NextRMSNorm,
        )

        hidden = config.hidden_size
        # Layer index 0 with a full-attention mixer, as vLLM builds `mtp.layers.0`.
        layer_config = copy.deepcopy(config)
        layer_config.layer_types = ["full_attention"] + list(config.layer_types[1:])
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([Qwen3NextDecoderLayer(layer_config, 0)])
        self.norm = Qwen3NextRMSNorm(hidden, eps=config.rms_norm_eps)
        self.pre_fc_norm_embedding = Qwen3NextRMSNorm(hidden, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3NextRMSNorm(hidden, eps=config.rms_norm_eps)

    def forward(self, embeds, hidden, position_embeddings) -> torch.Tensor:
        h = self.fc(
            torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], -1)
        )
        h = self.layers[0](h, position_embeddings=position_embeddings, attention_mask=None)
        return self.norm(h)


class NeedleQwen3Next(nn.Module):
    def __init__(self, recipe: dict, vocab: int, *, eos_token_id=None, pad_token_id=None) -> None:
        super().__init__()
        # lazy: transformers, found only where models are built
        from transformers import Qwen3NextModel

        self.recipe = recipe
        self.config = config_for(
            recipe, vocab, eos_token_id=eos_token_id, pad_token_id=pad_token_id
        )
        self.model = Qwen3NextModel(self.config)
        self.lm_head = nn.Linear(recipe["hidden_size"], vocab, bias=False)
        self.mtp = MTP(self.config)
        self._silenced: list = []

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits for x[t+1] at every t, and the MTP layer's logits for x[t+2] at t < T-1."""
        h = self.model(input_ids=ids, use_cache=False).last_hidden_state
        logits = self.lm_head(h)
        embeds = self.model.embed_tokens(ids[:, 1:])
        positions = torch.arange(ids.shape[1] - 1, device=ids.device)[None]
        rope = self.model.rotary_emb(embeds, positions)
        mtp_logits = self.lm_head(self.mtp(embeds, h[:, :-1], rope))
        return logits, mtp_logits

    def silence_mamba(self, silenced: bool = True) -> None:
        """Zero every Gated DeltaNet layer's output (the ablation check: the state the bug
        corrupts must matter to recall)."""
        for handle in self._silenced:
            handle.remove()
        self._silenced = []
        if silenced:
            for layer in self.model.layers:
                if layer.block_type == "linear_attention":
                    self._silenced.append(
                        layer.linear_attn.register_forward_hook(lambda _m, _i, out: out * 0)
                    )

    @contextlib.contextmanager
    def restored_state_noise(self, split_at: int):
        """Inside it, every Gated DeltaNet layer runs its delta rule over tokens [0, split_at),
        then resumes from that state with the kit's injected fault added
        (`fault_injection.perturb_block`: noise of `NOISE_SCALE` times the state's RMS), as a
        cache hit at `split_at` would resume. The check that the fault can move this model's
        answers at all."""
        # lazy: transformers, found only where models are built
        import transformers.models.qwen3_next.modeling_qwen3_next as modeling

        original = modeling.torch_chunk_gated_delta_rule
        layer = iter(range(len(self.model.layers)))

        def split(query, key, value, g, beta, initial_state=None, output_final_state=False, **kw):
            kw.pop("cu_seqlens", None)
            head = [t[:, :split_at] for t in (query, key, value, g, beta)]
            tail = [t[:, split_at:] for t in (query, key, value, g, beta)]
            out_head, state = original(*head, output_final_state=True, **kw)
            fault.perturb_block(state, key=next(layer))
            out_tail, final = original(
                *tail, initial_state=state, output_final_state=output_final_state, **kw
            )
            return torch.cat([out_head, out_tail], 1), final

        modeling.torch_chunk_gated_delta_rule = split
        try:
            yield
        finally:
            modeling.torch_chunk_gated_delta_rule = original

    def checkpoint_state(self, dtype) -> dict[str, torch.Tensor]:
        """The state dict under the names vLLM loads, in `dtype`, on the CPU."""
        state = {name: t.detach().to("cpu", dtype) for name, t in self.state_dict().items()}
        return checkpoint_layout(state, self.recipe)


def initialise(model: NeedleQwen3Next, recipe: dict, generator: torch.Generator) -> None:
    """Deterministic init from `generator`: normal(0, std) weights; Qwen3-Next's zero-centred
    norms at 0 (a scale of 1); the Gated DeltaNet's decay rate A and step dt drawn as Mamba2
    draws them (`a_init_range`, `dt_init_range`), so that at the start its state lasts tens
    to thousands of tokens rather than one (transformers' dt bias of 1 forgets it at once)."""
    std = recipe["initializer_range"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            module = name.split(".")[-2]
            if name.endswith("linear_attn.norm.weight"):
                p.fill_(1.0)  # the gated norm scales by its weight, not by 1 + weight
            elif "norm" in module:
                p.zero_()
            elif name.endswith("A_log"):
                low, high = recipe["a_init_range"]
                p.copy_(torch.log(low + (high - low) * torch.rand(p.shape, generator=generator)))
            elif name.endswith("dt_bias"):
                low, high = recipe["dt_init_range"]
                u = torch.rand(p.shape, generator=generator)
                dt = torch.exp(math.log(low) + (math.log(high) - math.log(low)) * u)
                p.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * std)
