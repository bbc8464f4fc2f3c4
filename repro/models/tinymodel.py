"""Tiny hybrid models with MTP weights, made offline (Qwen3-Next here; NemotronH in
`repro.models.tiny_nemotron_h`).

The tiny profile needs a model that vLLM serves with prefix caching and MTP speculative
decoding on the CPU, that downloads nothing, and in which a wrong cached Mamba state is
*visible* at the output. Random weights at transformers' defaults forget their recurrent
state within a token (decay ~0.002 per token, docs/measured.md §Tiny models), so a corrupted
cached state hardly moves the logits. The recipe below therefore sets a slow decay and a loud
linear-attention output, and `tests/test_vllm_plugin.py` checks that a perturbed state
changes the output.

The model is built once per recipe and cached under a directory named by the recipe's hash,
so a changed recipe can never be served from a stale cache.

Heavy imports (torch, transformers, tokenizers) happen inside functions: the host-side kit
imports this module without an engine environment.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
from pathlib import Path

from repro.arms import prompts
from repro.core.atomicio import publish_folder
from repro.models import needle_train, tiny_needle, tiny_nemotron_h
from repro.models.qwen3_next_layout import checkpoint_layout, config_for, write_config

# Bump when the builder's output changes for an unchanged recipe.
BUILDER_VERSION = 3

RECIPE: dict = {
    "model_type": "qwen3_next",
    "seed": 43559,
    "hidden_size": 128,
    "intermediate_size": 256,
    # vLLM's Qwen3-Next needs at least one mixture-of-experts layer; keep the experts few.
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    # Alternating Gated-DeltaNet (linear attention) and full attention, as Qwen3-Next does.
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    # 64, not 32: the CPU gated-delta-net kernel rejects a head dim of 32
    # (docs/measured.md, §Tiny models).
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 16384,
    "initializer_range": 0.05,
    "dtype": "bfloat16",
    # State sensitivity (see module docstring). Per-token decay is
    # exp(-exp(A_log) * softplus(dt_bias)): ~0.999 at A_log=-7. Under MTP vLLM stops a hit one
    # Mamba block short, so at least B+1 tokens are prefilled after a restored state; at
    # A_log=-4 (decay ~0.977) only ~2 % of the restored state survived that and even a
    # destroyed state barely moved the first token (measured by the plugin tests).
    "a_log": -7.0,
    "linear_out_proj_scale": 4.0,
    # MTP drafts must sometimes be accepted, or the accepted-token paths of the Mamba state
    # copies never run. A pass-through MTP layer (fc = [I 0], attention and MLP outputs
    # zeroed) drafts the next token from the embedding, and an embedding gain makes the main
    # model's prediction embedding-dominated often enough to agree with it.
    "mtp_pass_through": True,
    "embedding_gain": 20.0,
}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def recipe_digest(recipe: dict = RECIPE) -> str:
    """Hash of the recipe and builder version: the cache key of the built model."""
    canonical = json.dumps({"builder": BUILDER_VERSION, "recipe": recipe}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def default_cache_dir() -> Path:
    root = os.environ.get("REPRO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "repro-kit"
    )
    return Path(root) / "models"


#: The tiny model families the kit builds (`Profile.tiny_model`, `tiny-model --family`).
# The "-needle" ones are trained, not built: their checkpoints are committed
# (`repro.models.tiny_needle`).
# "nemotron-h-tp4" is the NemotronH recipe with heads and groups that divide by 4 (issue 19).
FAMILIES = ("qwen3-next", "nemotron-h", "nemotron-h-tp4", "nemotron-h-needle", "qwen3-next-needle")


def recipe_for(family: str) -> dict:
    """The recipe of a tiny model family."""
    recipes = {
        "qwen3-next": RECIPE,
        "nemotron-h": tiny_nemotron_h.RECIPE,
        "nemotron-h-tp4": tiny_nemotron_h.recipe_for_tp(4),
        **needle_train.RECIPES,
    }
    try:
        return recipes[family]
    except KeyError:
        raise ValueError(
            f"unknown tiny model family {family!r}; expected one of: {', '.join(FAMILIES)}"
        ) from None


def tiny_model_dir(cache_dir: Path | None = None, recipe: dict = RECIPE) -> Path:
    """Where the tiny model of `recipe` lives (built or not)."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    trained = tiny_needle.family_of(recipe)
    if trained is not None:
        return cache_dir / f"tiny-{trained}-{needle_train.recipe_digest(recipe)[:16]}"
    family = recipe["model_type"].replace("_", "-")
    return cache_dir / f"tiny-{family}-{recipe_digest(recipe)[:16]}"


def is_built(target: Path) -> bool:
    return (target / "config.json").is_file() and (target / "recipe.json").is_file()


def ensure_tiny_model(cache_dir: Path | None = None, recipe: dict = RECIPE) -> Path:
    """Return the directory of the tiny model for `recipe`, building it if it is missing."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    target = tiny_model_dir(cache_dir, recipe)
    trained = tiny_needle.family_of(recipe)
    if trained is not None:
        # Trained weights are copied from the committed checkpoint, never built here; a
        # cached copy is re-hashed, since nothing else would notice it changed.
        if is_built(target):
            tiny_needle.verify(target, trained)
            return target
        return tiny_needle.install(target, family=trained)
    if is_built(target):
        return target
    # Build beside the target and rename: a crashed build never looks like a finished one.
    with publish_folder(target, prefix=".building-", complete="config.json") as staging:
        build_tiny_model(staging, recipe)
    return target


def training_corpus(seed: int) -> list[str]:
    """Text the tokenizer is trained on: the same vocabulary the prompts use."""
    rng = random.Random(seed)
    lines = [prompts.HEADER, prompts.FOOTER]
    lines += prompts.FILLER_SENTENCES
    for vault in range(64):
        code = f"{rng.randint(0, 999_999):06d}"
        lines.append(prompts.fact_line(vault, code))
        lines.append(prompts.needle_question(vault))
        lines.append(prompts.procedure_question(vault))
    return lines * 4


def build_tokenizer(out_dir: Path, recipe: dict) -> None:
    # lazy: tokenizers, found only where models are built
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe["vocab_size"],
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_corpus(recipe["seed"]), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.save_pretrained(str(out_dir))


def build_tiny_model(out_dir: Path, recipe: dict = RECIPE) -> Path:
    """Write config, weights (with `mtp.*`) and tokenizer for `recipe` into `out_dir`."""
    # lazy: transformers, found only where models are built
    from transformers import AutoTokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out_dir, recipe)
    tokenizer = AutoTokenizer.from_pretrained(str(out_dir))
    if recipe["model_type"] == "nemotron_h":
        tiny_nemotron_h.build(out_dir, recipe, tokenizer)
    else:
        _build_qwen3_next(out_dir, recipe, tokenizer)
    (out_dir / "recipe.json").write_text(
        json.dumps(
            {"builder": BUILDER_VERSION, "digest": recipe_digest(recipe), "recipe": recipe},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    return out_dir


def _build_qwen3_next(out_dir: Path, recipe: dict, tokenizer) -> None:
    # lazy: torch, found only where models are built or engines run
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3NextForCausalLM

    torch.manual_seed(recipe["seed"])
    config = config_for(
        recipe,
        len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    dtype = getattr(torch, recipe["dtype"])
    model = Qwen3NextForCausalLM(config).to(dtype)
    state = checkpoint_layout(model.state_dict(), recipe)

    for index, kind in enumerate(recipe["layer_types"]):
        if kind != "linear_attention":
            continue
        prefix = f"model.layers.{index}.linear_attn."
        state[prefix + "A_log"] = torch.full_like(state[prefix + "A_log"], recipe["a_log"])
        state[prefix + "out_proj.weight"] = (
            state[prefix + "out_proj.weight"].float() * recipe["linear_out_proj_scale"]
        ).to(dtype)

    embed = state["model.embed_tokens.weight"]
    state["model.embed_tokens.weight"] = (embed.float() * recipe["embedding_gain"]).to(dtype)
    state.update(_mtp_weights(state, recipe, dtype))
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    write_config(config, recipe, out_dir)


def _mtp_weights(state: dict, recipe: dict, dtype) -> dict:
    """The `mtp.*` tensors vLLM's Qwen3NextMTP loads and transformers does not save.

    The MTP layer is a copy of the last full-attention layer; `mtp.fc` maps the concatenated
    [embedding; hidden] back to the hidden size.
    """
    # lazy: torch, found only where models are built or engines run
    import torch

    hidden = recipe["hidden_size"]
    source = max(i for i, k in enumerate(recipe["layer_types"]) if k == "full_attention")
    prefix = f"model.layers.{source}."
    mtp = {
        "mtp.layers.0." + name[len(prefix) :]: tensor.clone()
        for name, tensor in state.items()
        if name.startswith(prefix)
    }
    if recipe["mtp_pass_through"]:
        fc = torch.zeros(hidden, 2 * hidden)
        fc[:, :hidden] = torch.eye(hidden)  # draft from the next token's embedding alone
        for name in mtp:
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                mtp[name] = torch.zeros_like(mtp[name])  # the MTP layer adds nothing
    else:
        generator = torch.Generator().manual_seed(recipe["seed"] + 1)
        fc = torch.randn(hidden, 2 * hidden, generator=generator) * recipe["initializer_range"]
    mtp["mtp.fc.weight"] = fc.to(dtype)
    # Zero-centred RMSNorm weights (Qwen3-Next scales by 1 + weight): identity scale.
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{norm}.weight"] = torch.zeros(hidden, dtype=dtype)
    return mtp


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build (or find) the tiny hybrid model.")
    parser.add_argument("--cache", type=Path, default=None, help="model cache directory")
    args = parser.parse_args(argv)
    print(ensure_tiny_model(args.cache))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
