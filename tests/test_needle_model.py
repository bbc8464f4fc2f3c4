"""The trained tiny needle models: their checkpoints, their arithmetic, their recall, their
trainer.

Real parts throughout: the committed checkpoints, transformers' NemotronH and Qwen3-Next (the
engine env has them), the kit's own prompt builder. Training itself needs a GPU and is not
run here; the trainer's pieces that decide what it learns (batches, weights, tokenizer) are.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil

import pytest

from repro.arms import prompts
from repro.core.errors import ReproError
from repro.models import needle_data, needle_train, tiny_needle

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


FAMILIES = sorted(needle_train.RECIPES)


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


def test_checkpoint_is_small_verified_and_from_the_current_recipe(family):
    recipe = needle_train.RECIPES[family]
    record = tiny_needle.verify(family=family)
    size = sum(p.stat().st_size for p in tiny_needle.CHECKPOINTS[family].iterdir())
    assert size <= 8 * 2**20
    assert record["digest"] == needle_train.recipe_digest(recipe)
    assert record["metrics"]["stopped_early"] is False
    assert record["metrics"]["steps_done"] == recipe["steps"]


def test_no_committed_file_passes_5_mib_and_the_installed_weights_are_the_trained_ones(
    tmp_path, family
):
    committed = tiny_needle.CHECKPOINTS[family]
    assert all(p.stat().st_size <= 5 * 2**20 for p in committed.iterdir())
    installed = tiny_needle.install(tmp_path / "model", family=family)
    want = tiny_needle._sums(committed)["model.safetensors"]
    assert hashlib.sha256((installed / "model.safetensors").read_bytes()).hexdigest() == want
    assert not (installed / "model.safetensors.xz").exists()
    digest = needle_train.recipe_digest(needle_train.RECIPES[family])
    assert tiny_needle.verify(installed, family)["digest"] == digest


def test_one_familys_checkpoint_is_refused_as_the_other(tmp_path):
    with pytest.raises(ReproError, match="--family qwen3-next-needle --retrain"):
        tiny_needle.verify(tiny_needle.CHECKPOINTS["nemotron-h-needle"], "qwen3-next-needle")


def test_packing_a_retrained_checkpoint_keeps_the_weights_as_trained(tmp_path):
    """What `retrain` does to the checkpoint kept in git, on a plain copy of it."""
    plain = tiny_needle.install(tmp_path / "plain")
    trained = (plain / "model.safetensors").read_bytes()
    tiny_needle._pack(plain)
    assert not (plain / "model.safetensors").exists()
    assert (plain / "model.safetensors.xz").stat().st_size <= 5 * 2**20
    assert tiny_needle.read_bytes("model.safetensors", plain) == trained
    assert tiny_needle.verify(plain)["digest"] == needle_train.recipe_digest()


def test_changed_packed_weights_are_refused(tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(tiny_needle.CHECKPOINT, copy)
    packed = copy / "model.safetensors.xz"
    packed.write_bytes(packed.read_bytes()[:-100])
    with pytest.raises(ReproError, match="model.safetensors: sha256 unreadable"):
        tiny_needle.verify(copy)
    packed.unlink()
    with pytest.raises(ReproError, match="model.safetensors: sha256 missing"):
        tiny_needle.verify(copy)


def test_a_changed_file_or_recipe_is_refused(tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(tiny_needle.CHECKPOINT, copy)
    (copy / "config.json").write_text((copy / "config.json").read_text() + " ")
    with pytest.raises(ReproError, match="config.json: sha256"):
        tiny_needle.verify(copy)
    shutil.copyfile(tiny_needle.CHECKPOINT / "config.json", copy / "config.json")
    record = json.loads((copy / "recipe.json").read_text())
    record["digest"] = "0" * 64
    (copy / "recipe.json").write_text(json.dumps(record))
    with pytest.raises(ReproError, match="train-tiny --family nemotron-h-needle --retrain"):
        tiny_needle.verify(copy)


def test_tokenizer_is_rebuilt_identically_from_the_recipe(tmp_path, family):
    needle_train.build_tokenizer(tmp_path, needle_train.RECIPES[family])
    built = hashlib.sha256((tmp_path / "tokenizer.json").read_bytes()).hexdigest()
    committed = tiny_needle._sums(tiny_needle.CHECKPOINTS[family])["tokenizer.json"]
    assert built == committed


def _load(silence_mamba: bool = False):
    from safetensors.torch import load

    from repro.models.needle_model import NeedleNemotronH

    config = json.loads((tiny_needle.CHECKPOINT / "config.json").read_text())
    model = NeedleNemotronH(needle_train.RECIPE, config["vocab_size"]).float().eval()
    state = load(tiny_needle.read_bytes("model.safetensors"))
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    model.silence_mamba(silence_mamba)
    return model, config


def test_training_model_computes_what_transformers_nemotron_h_computes():
    from safetensors.torch import load
    from transformers import NemotronHConfig, NemotronHForCausalLM

    model, config = _load()
    reference = NemotronHForCausalLM(
        NemotronHConfig(**{k: v for k, v in config.items() if k != "architectures"})
    ).float()
    state = load(tiny_needle.read_bytes("model.safetensors"))
    # transformers 5 names the backbone `model.`; the MTP layer is vLLM's alone.
    renamed = {
        k.replace("backbone.", "model.", 1): v.float()
        for k, v in state.items()
        if not k.startswith("mtp.")
    }
    missing, unexpected = reference.load_state_dict(renamed, strict=False)
    assert not missing and not unexpected
    # vLLM's Mamba2 mixer clamps dt to (0, inf); transformers' to (0.001, inf), which the
    # trained model's slowest heads fall below.
    for module in reference.modules():
        if hasattr(module, "time_step_limit"):
            module.time_step_limit = (0.0, float("inf"))
    ids = torch.randint(
        0, config["vocab_size"], (1, 200), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        ours, _ = model(ids)
        theirs = reference.eval()(ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4 * theirs.abs().max().item()


def _greedy(model, tokenizer, prompt: str, steps: int = 8) -> str:
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits, _ = model(torch.tensor([ids + out]))
            out.append(int(logits[0, -1].argmax()))
            if tokenizer.decode(out).endswith("\n"):
                break
    return tokenizer.decode(out)


def test_recalls_the_kit_manual_and_needs_its_mamba_layers():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_needle.CHECKPOINT))
    manual, _ = prompts.sized_manual(
        target_tokens=round(1.35 * 288), count_tokens=lambda t: len(tokenizer.encode(t))
    )
    vaults = [0, 3, manual.num_needles - 2]
    model, _ = _load()
    answers = [_greedy(model, tokenizer, manual.prompt(v)) for v in vaults]
    assert all(manual.codes[v] in a for v, a in zip(vaults, answers, strict=True)), answers
    silenced, _ = _load(silence_mamba=True)
    answers = [_greedy(silenced, tokenizer, manual.prompt(v)) for v in vaults]
    assert not any(manual.codes[v] in a for v, a in zip(vaults, answers, strict=True)), answers


def _qwen3_next(tmp_path, silence_linear_attention: bool = False):
    """The committed Qwen3-Next checkpoint read by transformers' own loader (the per-expert
    tensors vLLM reads, fused by transformers), its MTP tensors left out."""
    from transformers import AutoModelForCausalLM

    folder = tiny_needle.install(tmp_path / "qwen", family="qwen3-next-needle")
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    if silence_linear_attention:
        for layer in model.model.layers:
            if layer.block_type == "linear_attention":
                layer.linear_attn.register_forward_hook(lambda _m, _i, out: out * 0)

    def forward(ids):
        return model(ids).logits, None

    return forward, folder


def test_qwen3_next_recalls_the_kit_manual_through_transformers_and_needs_its_deltanet(tmp_path):
    from transformers import AutoTokenizer

    model, folder = _qwen3_next(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    manual, _ = prompts.sized_manual(
        target_tokens=round(1.35 * 288), count_tokens=lambda t: len(tokenizer.encode(t))
    )
    vaults = [0, 3, manual.num_needles - 2]
    answers = [_greedy(model, tokenizer, manual.prompt(v)) for v in vaults]
    assert all(manual.codes[v] in a for v, a in zip(vaults, answers, strict=True)), answers
    silenced, _ = _qwen3_next(tmp_path / "silenced", silence_linear_attention=True)
    answers = [_greedy(silenced, tokenizer, manual.prompt(v)) for v in vaults]
    assert not any(manual.codes[v] in a for v, a in zip(vaults, answers, strict=True)), answers


def _trainer_qwen3_next(folder):
    """The trainer's model with the committed weights, in float32 (experts fused back, as
    transformers keeps them); the committed state dict; the model's tokenizer."""
    from safetensors.torch import load
    from transformers import AutoTokenizer

    recipe = needle_train.QWEN3_NEXT_RECIPE
    state = load(
        tiny_needle.read_bytes("model.safetensors", tiny_needle.CHECKPOINTS["qwen3-next-needle"])
    )
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model, _ = needle_train.new_model(recipe, tokenizer)
    fused = dict(state)
    for name in [n for n in state if ".mlp.experts.0.gate_proj" in n]:
        base = name.split("experts.0.")[0] + "experts."
        count = recipe["num_experts"]
        fused[base + "gate_up_proj"] = torch.stack(
            [
                torch.cat(
                    [state[f"{base}{e}.gate_proj.weight"], state[f"{base}{e}.up_proj.weight"]]
                )
                for e in range(count)
            ]
        )
        fused[base + "down_proj"] = torch.stack(
            [state[f"{base}{e}.down_proj.weight"] for e in range(count)]
        )
        for e in range(count):
            for part in ("gate_proj", "up_proj", "down_proj"):
                del fused[f"{base}{e}.{part}.weight"]
    model.load_state_dict({k: v.float() for k, v in fused.items()}, strict=True)
    return model.float().eval(), state, tokenizer


def test_qwen3_next_training_model_is_transformers_plus_vllms_mtp_layer(tmp_path):
    """The trainer's model, loaded with the committed weights, computes transformers' logits;
    its checkpoint names are the committed file's, `mtp.*` included."""
    from repro.models import needle_qwen3_next

    reference, folder = _qwen3_next(tmp_path)
    model, state, tokenizer = _trainer_qwen3_next(folder)
    assert set(model.checkpoint_state(torch.bfloat16)) == set(state)
    assert any(name.startswith("mtp.layers.0.mlp.experts.") for name in state)
    assert isinstance(model, needle_qwen3_next.NeedleQwen3Next)
    vocab = len(tokenizer)
    ids = torch.randint(0, vocab, (1, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, drafts = model(ids)
        theirs, _ = reference(ids)
    assert (ours - theirs).abs().max().item() < 1e-4 * theirs.abs().max().item()
    assert drafts.shape == (1, 199, vocab)


def test_the_injected_fault_on_a_restored_state_moves_the_qwen3_next_answers(tmp_path):
    """The positive control can show on `tiny-needle`: the kit's fault on the Gated DeltaNet
    state 18 tokens before the answer (where the cold-race hits land) spoils recall, because
    the recipe keeps a slow decay (docs/tiny-needle.md, "Memory length"); a model whose state
    forgets within those tokens answers right through it."""
    from tokenizers import Tokenizer

    recipe = needle_train.QWEN3_NEXT_RECIPE
    folder = tiny_needle.install(tmp_path / "qwen", family="qwen3-next-needle")
    model, _, _ = _trainer_qwen3_next(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    examples = needle_train.eval_sets(recipe, tokenizer)["cold-race"][:8]
    pad_id = tokenizer.token_to_id("<|endoftext|>")
    clean = needle_train.exact_recall(
        model, tokenizer, examples, pad_id, "cpu", recipe["train_chunk"]
    )
    noisy = needle_train.noisy_recall(model, tokenizer, examples, "cpu")
    assert clean["recall"] == 1.0, clean
    assert noisy["tokens_after_state"] == needle_train.RESTORED_TAIL == 18
    assert noisy["recall"] <= 0.25, noisy


def test_kit_shaped_training_manuals_are_the_kit_builders_text():
    """The training distribution holds the arms' manuals exactly (codes aside)."""
    manual = prompts.Manual(prompts.make_codes(8), 13)
    example = needle_data.eval_example(
        random.Random(3), needles=8, fillers=13, asked=6, kind="cold-race"
    )
    asked = example.text[: example.answers[0][0]]
    assert re.sub(r"\d{6}", "CODE", asked) == re.sub(r"\d{6}", "CODE", manual.prompt(6))


def test_batches_are_deterministic_and_weight_answers():
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny_needle.CHECKPOINT / "tokenizer.json"))
    recipe = {**needle_train.RECIPE, "batch_size": 3}
    first = needle_train.training_batch(7, recipe, tokenizer)
    assert first == needle_train.training_batch(7, recipe, tokenizer)
    assert first != needle_train.training_batch(8, recipe, tokenizer)
    ids, weights = first[0]
    # Every answer is a space, six digits and a newline, all at full weight.
    answer = [tokenizer.id_to_token(i) for i, w in zip(ids, weights, strict=True) if w == 1.0]
    assert len(answer) % 8 == 0 and answer[:1] == ["Ġ"] and answer[7] == "Ċ"
    assert all(t.isdigit() for t in answer[1:7])
