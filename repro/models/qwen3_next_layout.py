"""How a Qwen3-Next checkpoint is laid out for vLLM: its config and its tensor names.

Shared by the random tiny model (`repro.models.tinymodel`) and the trained one
(`repro.models.needle_qwen3_next`). transformers and torch are imported inside the functions: the
host-side kit imports this module without an engine environment.
"""

from __future__ import annotations

import json
from pathlib import Path

# Recipe entries the config takes under the same name, as they are.
_RECIPE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "max_position_embeddings",
    "initializer_range",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)


def config_for(recipe: dict, vocab: int, *, eos_token_id: int | None, pad_token_id: int | None):
    """The transformers config of `recipe` (also what config.json records)."""
    # lazy: transformers, found only where models are built
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        vocab_size=vocab,
        **{key: recipe[key] for key in _RECIPE_KEYS},
        num_hidden_layers=len(recipe["layer_types"]),
        layer_types=list(recipe["layer_types"]),
        mlp_only_layers=list(recipe.get("mlp_only_layers", [])),
        rms_norm_eps=recipe.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=False,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
    )


def write_config(config, recipe: dict, out_dir: Path) -> None:
    """config.json for vLLM: transformers' config plus the MTP layer count it does not know."""
    config.torch_dtype = recipe["dtype"]
    config.save_pretrained(str(out_dir))
    cfg_path = Path(out_dir) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["num_nextn_predict_layers"] = 1
    cfg["architectures"] = ["Qwen3NextForCausalLM"]
    cfg["dtype"] = recipe["dtype"]
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def checkpoint_layout(state_dict: dict, recipe: dict) -> dict:
    """Tensors named as Qwen3-Next checkpoints name them, which is what vLLM loads.

    transformers 5 keeps each layer's experts fused (`experts.gate_up_proj` [E, 2I, H],
    `experts.down_proj` [E, H, I]); published checkpoints, and vLLM's loader, use one
    `experts.{e}.{gate,up,down}_proj.weight` per expert.
    """
    inner = recipe["moe_intermediate_size"]
    state = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach()
        if name.endswith(".mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            for e in range(tensor.shape[0]):
                state[f"{base}{e}.gate_proj.weight"] = tensor[e, :inner].clone().contiguous()
                state[f"{base}{e}.up_proj.weight"] = tensor[e, inner:].clone().contiguous()
        elif name.endswith(".mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(tensor.shape[0]):
                state[f"{base}{e}.down_proj.weight"] = tensor[e].clone().contiguous()
        else:
            state[name] = tensor.clone().contiguous()
    return state
