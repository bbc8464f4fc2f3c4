"""`python -m repro train-tiny`: train the tiny NemotronH needle model from its recipe.

The run is fixed by `RECIPE` (seed, shapes, data, steps, learning rate): the tokenizer is
learnt from `needle_data.tokenizer_corpus`, the weights start from a seeded init, and every
batch is drawn from a `random.Random` seeded by the recipe's seed and the step. It writes a
model directory vLLM loads (config.json, model.safetensors with the ``mtp.*`` tensors,
tokenizer files, recipe.json, metrics.json) and a JSON-lines training log.

What "answers well enough" means is measured, not assumed: held-out prompts in upstream's
exact shape (cold-race manuals of 1.35 B tokens, multi-turn transcripts, liveness-probe
manuals of 3 B + 128), exact recall of every code (the greedy answer token by token), with
the weights rounded to bf16 as they are shipped; and the same with every Mamba mixer's output
zeroed, which must hurt recall, since the bug the arms look for corrupts restored Mamba state.

Needs torch (CUDA for minutes rather than hours), tokenizers, transformers (to save the
tokenizer in its format) and safetensors; none of them is imported by the host-side kit.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import multiprocessing
import os
import random
import sys
import time
from pathlib import Path

from repro.core.atomicio import sha256_file
from repro.models import needle_data, qwen3_next_layout, tiny_nemotron_h

# Bump when the trainer's output changes for an unchanged recipe.
TRAINER_VERSION = 2

RECIPE: dict = {
    "model_type": "nemotron_h",
    "seed": 1455,
    # Shapes. B (vLLM's Mamba block size) follows from them: the attention page of B tokens
    # must hold one Mamba state. Attention page per token: 2 (k, v) x 2 KV heads x 64 x 2 B
    # = 512 B; Mamba state: 16 x 32 x 64 float32 (SSM) + 640 x 3 bf16 (conv) = 134,912 B, so
    # B = 32 x ceil(134,912 / (32 x 512)) = 288 at block_size 32. Upstream's multi-turn rule
    # needs B < 2 B - 192, i.e. B > 192.
    "hidden_size": 256,
    "hybrid_override_pattern": "M*M*M*",
    "mtp_hybrid_override_pattern": "*",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "mamba_num_heads": 16,
    "mamba_head_dim": 32,
    "mamba_n_groups": 1,
    "ssm_state_size": 64,
    "mamba_d_conv": 4,
    "mamba_chunk_size": 128,
    "layer_norm_epsilon": 1e-5,
    "vocab_size": 1024,
    "max_position_embeddings": 16384,
    "initializer_range": 0.02,
    "a_init_range": [1.0, 16.0],
    "dt_init_range": [0.001, 0.1],
    "dtype": "bfloat16",
    # Training.
    "train_chunk": 128,
    "steps": 3000,
    "batch_size": 48,
    "max_tokens": 1536,
    "lr": 2e-3,
    "min_lr_ratio": 0.05,
    "warmup_steps": 200,
    "weight_decay": 0.01,
    "grad_clip": 1.0,
    "lm_weight": 0.1,
    "mtp_weight": 0.3,
    # Curriculum: needles and filler grow from these to the full range over this share.
    "curriculum": {"start_needles": 4, "start_fillers": 8, "share": 0.4},
    "full_difficulty": {"max_needles": 16, "max_fillers": 48, "max_turns": 5},
    "eval_every": 500,
    "eval_block_size": 288,
}


# The same data, tokenizer and training on a Qwen3-Next: two Gated DeltaNet layers alternating
# with two gated full-attention layers, as Qwen3-Next alternates them, and its MTP layer. B
# follows as for the NemotronH: attention page per token 2 (k, v) x 1 KV head x 64 x 2 B =
# 256 B; Gated DeltaNet state 4 value heads x 64 x 64 float32 + 512 x 3 bf16 (conv) = 68,608 B,
# so B = 32 x ceil(68,608 / (32 x 256)) = 288 at block_size 32. vLLM's Qwen3-Next wants a
# mixture-of-experts layer in the model and in the MTP module, which it builds as layer 0 (it
# refuses one without: "No Qwen3Next layer found"); so layer 0 has experts and the other
# layers a dense MLP (`mlp_only_layers`).
QWEN3_NEXT_RECIPE: dict = {
    **{k: v for k, v in RECIPE.items() if not k.startswith(("mamba_", "hybrid_", "mtp_hybrid"))},
    "model_type": "qwen3_next",
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "mlp_only_layers": [1, 2, 3],
    "intermediate_size": 256,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "rms_norm_eps": 1e-6,
    # A slow decay, kept (docs/tiny-needle.md, "Memory length"): trained freely, the Gated
    # DeltaNet's state halves within 0.2-27 tokens, so a state the injected fault spoils at a
    # cache hit 18 tokens before the answer has decayed before it is read. Real models' states
    # last hundreds of tokens; with A in [1e-4, 1e-3] and A and dt's bias frozen, so does this.
    "a_init_range": [1e-4, 1e-3],
    "frozen": ["A_log", "dt_bias"],
    "steps": 1500,
}
for _key in ("ssm_state_size", "layer_norm_epsilon"):
    QWEN3_NEXT_RECIPE.pop(_key)

# The same Qwen3-Next with every layer a Gated DeltaNet: no attention layer can read a fact
# back from the prompt, so recall would have to run through the recurrent state alone, the
# state the prefix cache restores. It does not learn exact recall at this size
# (docs/tiny-needle.md, "Recall through the recurrent state alone"), so it has no committed
# checkpoint and no profile; it stays trainable so that figure can be checked.
QWEN3_NEXT_RECURRENT_RECIPE: dict = {
    **QWEN3_NEXT_RECIPE,
    "layer_types": ["linear_attention"] * 4,
}

#: The trained needle models, by the tiny model family that names them (each committed).
RECIPES: dict[str, dict] = {
    "nemotron-h-needle": RECIPE,
    "qwen3-next-needle": QWEN3_NEXT_RECIPE,
}
#: Recipes tried and not kept: `--family` trains them; nothing else knows them.
TRIED_RECIPES: dict[str, dict] = {
    "qwen3-next-needle-recurrent": QWEN3_NEXT_RECURRENT_RECIPE,
}


def recipe_digest(recipe: dict = RECIPE) -> str:
    canonical = json.dumps({"trainer": TRAINER_VERSION, "recipe": recipe}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- tokenizer ---------------------------------------------------------------------------


def build_tokenizer(out_dir: Path, recipe: dict):
    """A byte-level BPE whose digits are always single tokens (a code is six tokens)."""
    # lazy: tokenizers, found only where models are built
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe["vocab_size"],
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(needle_data.tokenizer_corpus(recipe["seed"]), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    fast.save_pretrained(str(out_dir))
    return Tokenizer.from_file(str(Path(out_dir) / "tokenizer.json")), fast


# --- batches -----------------------------------------------------------------------------


def difficulty_at(step: int, recipe: dict) -> needle_data.Difficulty:
    full = recipe["full_difficulty"]
    cur = recipe["curriculum"]
    frac = min(1.0, step / max(1, cur["share"] * recipe["steps"]))
    needles = round(cur["start_needles"] + frac * (full["max_needles"] - cur["start_needles"]))
    fillers = round(cur["start_fillers"] + frac * (full["max_fillers"] - cur["start_fillers"]))
    return needle_data.Difficulty(needles, fillers, full["max_turns"])


_WORKER: dict = {}


def _worker_init(recipe: dict, tokenizer_path: str) -> None:
    # lazy: tokenizers, found only where models are built
    from tokenizers import Tokenizer

    _WORKER["recipe"], _WORKER["tokenizer"] = recipe, Tokenizer.from_file(tokenizer_path)


def _worker_batch(step: int):
    return training_batch(step, _WORKER["recipe"], _WORKER["tokenizer"])


def batches(recipe: dict, tokenizer_path: Path, workers: int):
    """Every step's batch in order, made ahead by `workers` processes (the data is Python
    string work; the GPU step is faster than one process can make batches)."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, _worker_init, (recipe, str(tokenizer_path))) as pool:
        yield from pool.imap(_worker_batch, range(recipe["steps"]), chunksize=4)


def training_batch(step: int, recipe: dict, tokenizer):
    """The examples of one step, encoded: deterministic in (seed, step)."""
    rng = random.Random(f"{recipe['seed']}:{step}")
    difficulty = difficulty_at(step, recipe)
    rows = []
    while len(rows) < recipe["batch_size"]:
        ex = needle_data.training_example(rng, difficulty, lm_weight=recipe["lm_weight"])
        ((ids, weights, _),) = needle_data.encode(tokenizer, [ex])
        if len(ids) <= recipe["max_tokens"]:
            rows.append((ids, weights))
    return rows


def to_tensors(rows, pad_id: int, multiple: int, device):
    # lazy: torch, found only where models are built or engines run
    import torch

    length = max(len(ids) for ids, _ in rows)
    length = -(-length // multiple) * multiple
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    weights = torch.zeros((len(rows), length))
    for i, (row_ids, row_w) in enumerate(rows):
        ids[i, : len(row_ids)] = torch.tensor(row_ids)
        weights[i, : len(row_w)] = torch.tensor(row_w)
    return ids.to(device), weights.to(device)


# --- held-out recall ---------------------------------------------------------------------


def _fillers_for(target: int, tokenizer, needles: int, kind: str) -> int:
    """Upstream's search: the filler count whose prompt is closest to `target` tokens."""

    def size(fillers: int) -> int:
        ex = needle_data.eval_example(
            random.Random(0), needles=needles, fillers=fillers, asked=0, kind="cold-race"
        )
        return len(tokenizer.encode(ex.text[: ex.answers[0][0]]).ids)

    best = min(range(0, 200), key=lambda f: abs(size(f) - target))
    return best


def eval_sets(recipe: dict, tokenizer) -> dict[str, list[needle_data.Example]]:
    """Held-out prompts shaped like each arm's, at the recipe's block size."""
    b = recipe["eval_block_size"]
    shapes = {
        # name: (manual tokens, needles, kind)
        "cold-race": (round(1.35 * b), 8, "cold-race"),
        "multi-turn": (2 * b - 192, 8, "multi-turn"),
        "liveness": (3 * b + 128, max(8, min(40, (3 * b + 128) // 70)), "cold-race"),
    }
    sets = {}
    for name, (target, needles, kind) in shapes.items():
        fillers = _fillers_for(target, tokenizer, needles, kind)
        rng = random.Random(f"eval:{name}")
        sets[name] = [
            needle_data.eval_example(
                rng, needles=needles, fillers=fillers, asked=v % needles, kind=kind
            )
            for v in range(48)
        ]
    return sets


def exact_recall(model, tokenizer, examples, pad_id: int, device, chunk: int) -> dict:
    """Share of examples whose greedy answer is the code (every answer token the argmax)."""
    # lazy: torch, found only where models are built or engines run
    import torch

    encoded = needle_data.encode(tokenizer, examples)
    hits, lengths = 0, []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(encoded), 16):
            part = encoded[start : start + 16]
            ids, weights = to_tensors([(i, w) for i, w, _ in part], pad_id, chunk, device)
            logits, _ = model(ids)
            predicted = logits.argmax(-1)
            for row, (_ids, row_w, answers) in enumerate(part):
                a = answers[0]
                # Answer tokens: from the first answer token through the newline.
                end = max(t for t, w in enumerate(row_w) if w > 0) + 1
                want = ids[row, a:end]
                got = predicted[row, a - 1 : end - 1]
                hits += bool(torch.equal(want, got))
                lengths.append(a)
    model.train()
    return {
        "recall": hits / len(encoded),
        "n": len(encoded),
        "prompt_tokens": [min(lengths), max(lengths)],
    }


#: Tokens between the restored state and the answer in `noisy_recall`: the tiny profiles'
#: cold-race hits land at 400 of 418 prompt tokens (prefix_match_unit 16), so the question's
#: last 18 tokens run on the restored state before the answer.
RESTORED_TAIL = 18


def noisy_recall(model, tokenizer, examples, device, tail: int = RESTORED_TAIL) -> dict:
    """Exact recall with the kit's injected fault on the recurrent state `tail` tokens before
    the answer (`restored_state_noise`): whether the fault can move this model's answers."""
    # lazy: torch, found only where models are built or engines run
    import torch

    hits = 0
    model.eval()
    with torch.no_grad():
        for ids, weights, answers in needle_data.encode(tokenizer, examples):
            a = answers[0]
            end = max(t for t, w in enumerate(weights) if w > 0) + 1
            row = torch.tensor([ids[:end]], device=device)
            with model.restored_state_noise(a - tail):
                logits, _ = model(row)
            hits += bool(torch.equal(row[0, a:end], logits[0, a - 1 : end - 1].argmax(-1)))
    model.train()
    return {"recall": hits / len(examples), "n": len(examples), "tokens_after_state": tail}


def evaluate(model, tokenizer, sets, pad_id, device, chunk) -> dict:
    return {
        name: exact_recall(model, tokenizer, exs, pad_id, device, chunk)
        for name, exs in sets.items()
    }


# --- export ------------------------------------------------------------------------------


def new_model(recipe: dict, fast_tokenizer):
    """The untrained model of `recipe`'s family, and its `initialise(model, recipe, generator)`."""
    vocab = len(fast_tokenizer)
    if recipe["model_type"] == "qwen3_next":
        from repro.models import needle_qwen3_next  # lazy: imports torch and transformers

        model = needle_qwen3_next.NeedleQwen3Next(
            recipe,
            vocab,
            eos_token_id=fast_tokenizer.eos_token_id,
            pad_token_id=fast_tokenizer.pad_token_id,
        )
        return model, needle_qwen3_next.initialise
    from repro.models import needle_model  # lazy: imports torch

    return needle_model.NeedleNemotronH(recipe, vocab), needle_model.initialise


def export(model, recipe: dict, out_dir: Path, fast_tokenizer) -> dict:
    """config.json + model.safetensors (bf16, checkpoint names) in `out_dir`; their sha256."""
    # lazy: torch, found only where models are built or engines run
    import torch
    from safetensors.torch import save_file

    dtype = getattr(torch, recipe["dtype"])
    if recipe["model_type"] == "qwen3_next":
        state = model.checkpoint_state(dtype)
        qwen3_next_layout.write_config(model.config, recipe, out_dir)
    else:
        state = {k: v.detach().to("cpu", dtype) for k, v in model.state_dict().items()}
        config = tiny_nemotron_h._config(recipe, len(fast_tokenizer), fast_tokenizer)
        config["layer_norm_epsilon"] = recipe["layer_norm_epsilon"]
        (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    state = {k: v.contiguous() for k, v in state.items()}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return {
        name: sha256_file(out_dir / name)
        for name in sorted(os.listdir(out_dir))
        if (out_dir / name).is_file()
    }


def bf16_copy(model, recipe, vocab):
    # lazy: torch, found only where models are built or engines run
    import torch

    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.copy_(p.to(getattr(torch, recipe["dtype"])).float())
    return twin


# --- training ----------------------------------------------------------------------------


def lr_at(step: int, recipe: dict) -> float:
    if step < recipe["warmup_steps"]:
        return recipe["lr"] * (step + 1) / recipe["warmup_steps"]
    progress = (step - recipe["warmup_steps"]) / max(1, recipe["steps"] - recipe["warmup_steps"])
    floor = recipe["min_lr_ratio"]
    return recipe["lr"] * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    recipe: dict,
    out_dir: Path,
    *,
    log_path: Path,
    max_seconds: float | None,
    device: str,
    workers: int = 4,
) -> dict:
    # lazy: torch, found only where models are built or engines run
    import torch
    import torch.nn.functional as F

    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer, fast = build_tokenizer(out_dir, recipe)
    pad_id = fast.pad_token_id
    vocab = len(fast)
    torch.manual_seed(recipe["seed"])
    generator = torch.Generator().manual_seed(recipe["seed"])
    model, initialise = new_model(recipe, fast)
    initialise(model, recipe, generator)
    model.to(device)
    # Parameters the recipe keeps at their initial values (`frozen`: name endings).
    for name, p in model.named_parameters():
        if name.endswith(tuple(recipe.get("frozen", ()))):
            p.requires_grad_(False)
    no_decay = ("norm", "A_log", "dt_bias", ".D", "bias")
    groups = [
        {
            "params": [
                p
                for n, p in model.named_parameters()
                if p.requires_grad and not any(k in n for k in no_decay)
            ],
            "weight_decay": recipe["weight_decay"],
        },
        {
            "params": [
                p
                for n, p in model.named_parameters()
                if p.requires_grad and any(k in n for k in no_decay)
            ],
            "weight_decay": 0.0,
        },
    ]
    optimizer = torch.optim.AdamW(groups, lr=recipe["lr"], betas=(0.9, 0.95))
    sets = eval_sets(recipe, tokenizer)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else None
    log = log_path.open("a")

    def note(record: dict) -> None:
        record["elapsed_s"] = round(time.monotonic() - started, 1)
        log.write(json.dumps(record) + "\n")
        log.flush()
        print(json.dumps(record), flush=True)

    note(
        {
            "event": "start",
            "digest": recipe_digest(recipe),
            "vocab": vocab,
            "params": sum(p.numel() for p in model.parameters()),
            "device": device,
        }
    )
    step, stopped_early = 0, False
    stream = batches(recipe, out_dir / "tokenizer.json", workers)
    for step, rows in enumerate(stream):
        if max_seconds is not None and time.monotonic() - started > max_seconds:
            stopped_early = True
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, recipe)
        ids, weights = to_tensors(rows, pad_id, recipe["train_chunk"], device)
        with autocast if autocast is not None else _null():
            logits, mtp_logits = model(ids)
        ce = F.cross_entropy(
            logits[:, :-1].float().reshape(-1, vocab), ids[:, 1:].reshape(-1), reduction="none"
        )
        w = weights[:, 1:].reshape(-1)
        loss_main = (ce * w).sum() / w.sum()
        ce2 = F.cross_entropy(
            mtp_logits[:, :-1].float().reshape(-1, vocab),
            ids[:, 2:].reshape(-1),
            reduction="none",
        )
        w2 = (weights[:, 2:] > 0).float().reshape(-1)
        loss_mtp = (ce2 * w2).sum() / w2.sum()
        loss = loss_main + recipe["mtp_weight"] * loss_mtp
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["grad_clip"])
        optimizer.step()
        if step % 50 == 0:
            answer_w = (weights[:, 1:] == 1.0).reshape(-1).float()
            note(
                {
                    "step": step,
                    "loss": round(loss_main.item(), 4),
                    "answer_loss": round(((ce * answer_w).sum() / answer_w.sum()).item(), 4),
                    "mtp_loss": round(loss_mtp.item(), 4),
                    "lr": lr_at(step, recipe),
                    "tokens": int(ids.numel()),
                }
            )
        if step and step % recipe["eval_every"] == 0:
            note(
                {
                    "step": step,
                    "eval": evaluate(model, tokenizer, sets, pad_id, device, recipe["train_chunk"]),
                }
            )
    shipped = bf16_copy(model, recipe, vocab)
    metrics = {
        "steps_done": step + (0 if stopped_early else 1),
        "stopped_early": stopped_early,
        "train_seconds": round(time.monotonic() - started, 1),
    }
    metrics["recall_bf16"] = evaluate(
        shipped, tokenizer, sets, pad_id, device, recipe["train_chunk"]
    )
    if hasattr(shipped, "restored_state_noise"):
        metrics["recall_bf16_restored_state_noise"] = {
            name: noisy_recall(shipped, tokenizer, exs, device) for name, exs in sets.items()
        }
    shipped.silence_mamba(True)
    metrics["recall_bf16_mamba_silenced"] = evaluate(
        shipped, tokenizer, sets, pad_id, device, recipe["train_chunk"]
    )
    note({"event": "done", **metrics})
    files = export(model, recipe, out_dir, fast)
    record = {
        "trainer": TRAINER_VERSION,
        "digest": recipe_digest(recipe),
        "recipe": recipe,
        "metrics": metrics,
        "environment": _environment(device),
    }
    (out_dir / "recipe.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    files = {n: h for n, h in files.items() if n != "recipe.json"}
    (out_dir / "SHA256SUMS").write_text("".join(f"{h}  {n}\n" for n, h in sorted(files.items())))
    return record


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _environment(device: str) -> dict:
    # lazy: torch, found only where models are built or engines run
    import torch

    env = {"torch": torch.__version__, "python": sys.version.split()[0], "device": device}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def default_device() -> str:
    # lazy: torch, found only where models are built or engines run
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro.models.needle_train")
    parser.add_argument(
        "--family", choices=sorted(RECIPES | TRIED_RECIPES), default="nemotron-h-needle"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--log", type=Path, default=None)
    parser.add_argument("--max-seconds", type=float, default=None)
    parser.add_argument("--steps", type=int, default=None, help="override (smoke runs only)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--batch-size", type=int, default=None, help="override (smoke runs)")
    args = parser.parse_args(argv)
    # lazy: torch, found only where models are built or engines run
    import torch

    recipe = dict((RECIPES | TRIED_RECIPES)[args.family])
    if args.steps is not None:
        recipe["steps"] = args.steps
    if args.batch_size is not None:
        recipe["batch_size"] = args.batch_size
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    train(
        recipe,
        args.out,
        log_path=args.log or args.out / "train_log.jsonl",
        max_seconds=args.max_seconds,
        device=device,
        workers=args.workers,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
