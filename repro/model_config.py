"""What a model's `config.json` says about the two things the arms need: recurrent layers and
an MTP head. Read before anything starts (`python -m repro run --model REPO_OR_PATH`).

The bug the arms look for lives where prefix caching restores a Mamba / linear-attention
state and MTP speculative decoding drafts ahead, so a model without either cannot show it:
the preflight refuses it and says what it found.

Recurrent layers are read from the keys hybrid configs use for their layer pattern:
`layer_types` (Qwen3-Next, Qwen3.5, Granite hybrids: "linear_attention", "mamba"),
`hybrid_override_pattern` (NemotronH: "M" for a Mamba2 layer), `layers_block_type` (older
NemotronH, Zamba: "mamba"), and `full_attention_interval` (Qwen3-Next without an explicit
pattern: every layer but each interval-th is linear attention).

The MTP head is read as vLLM's speculative config reads it (vllm/config/speculative.py,
`hf_config_override`): `num_nextn_predict_layers` (NemotronH, Qwen3-Next, DeepSeek-style) or
`mtp_num_hidden_layers` (Qwen3.5), above zero. Where the config declares none, the weights
are asked too: a local checkpoint whose tensor names start with `mtp.` carries a head.
Multimodal configs nest the language model's keys under `text_config` (Qwen3.5); both levels
are read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.errors import ReproError
from repro.jsonread import JSONUnreadable, parse_json_bytes, read_json

RECURRENT_LAYER_NAMES = ("linear_attention", "mamba", "mamba2", "gated_deltanet")
MTP_COUNT_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
NESTED_CONFIG_KEYS = ("text_config", "language_config", "llm_config")
MTP_TENSOR_PREFIXES = ("mtp.", "model.mtp.", "language_model.mtp.")
SAFETENSORS_HEADER_MAX = 100 << 20  # the format's own bound on its JSON header


class ModelUnsupported(ReproError):
    """The model cannot show the bug: no recurrent layers, or no MTP head."""


class ModelConfigUnavailable(ReproError):
    """The model's config.json could not be read."""


@dataclass(frozen=True)
class ModelShape:
    model_type: str | None
    architectures: tuple[str, ...]
    recurrent_layers: int
    recurrent_source: str | None  # the key the count came from
    mtp_layers: int
    mtp_source: str | None

    def describe(self) -> str:
        arch = ", ".join(self.architectures) or "no architectures"
        layers = (
            f"{self.recurrent_layers} Mamba/linear-attention layers (from {self.recurrent_source})"
            if self.recurrent_layers
            else "no Mamba or linear-attention layers"
        )
        mtp = (
            f"an MTP head of {self.mtp_layers} layer(s) (from {self.mtp_source})"
            if self.mtp_layers
            else "no MTP head"
        )
        return f"model_type {self.model_type!r} ({arch}): {layers}; {mtp}"


def config_path(model: str) -> Path:
    """The config.json of a local model directory, or of a Hub repo already in the HF cache.

    The kit never downloads here: a repo that is not cached locally is refused with the
    command that fetches it.
    """
    local = Path(model).expanduser()
    if local.is_dir():
        path = local / "config.json"
        if not path.is_file():
            raise ModelConfigUnavailable(
                f"{local} has no config.json; pass the directory of a Hugging Face checkpoint"
            )
        return path
    if local.exists() or model.count("/") != 1:
        raise ModelConfigUnavailable(
            f"--model {model!r} is neither a model directory nor a Hub repo id (owner/name)"
        )
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency of the kit
        try_to_load_from_cache = None
    cached = try_to_load_from_cache(model, "config.json") if try_to_load_from_cache else None
    if isinstance(cached, str) and Path(cached).is_file():
        return Path(cached)
    raise ModelConfigUnavailable(
        f"the config.json of {model} is not in the local Hugging Face cache; fetch the model "
        f"first (`python -m repro fetch-weights --repo {model}`) and pass its snapshot folder, "
        f"or any local checkpoint folder, to --model"
    )


def read_config(model: str) -> tuple[dict[str, Any], Path]:
    path = config_path(model)
    try:
        config = read_json(path)
    except JSONUnreadable as exc:
        raise ModelConfigUnavailable(f"cannot read the model's config: {exc}") from None
    if not isinstance(config, dict):
        raise ModelConfigUnavailable(
            f"{path}: a JSON {type(config).__name__}; expected the model's config object"
        )
    return config, path


def shape_of(config: dict[str, Any], model_dir: Path | None = None) -> ModelShape:
    levels = [("", config)] + [
        (f"{key}.", config[key]) for key in NESTED_CONFIG_KEYS if isinstance(config.get(key), dict)
    ]
    recurrent, recurrent_source = 0, None
    mtp, mtp_source = 0, None
    for prefix, level in levels:
        if not recurrent:
            count, key = _recurrent_layers(level)
            if count:
                recurrent, recurrent_source = count, prefix + key
        if not mtp:
            for key in MTP_COUNT_KEYS:
                value = level.get(key)
                if _count(value) > 0:
                    mtp, mtp_source = value, prefix + key
                    break
    if not mtp and model_dir is not None:
        tensors = _mtp_tensor_count(model_dir)
        if tensors:
            # A head is there; its layer count is not declared. One is what vLLM assumes.
            mtp, mtp_source = 1, f"{tensors} mtp.* tensors in the checkpoint"
    architectures = config.get("architectures")
    if not isinstance(architectures, list):  # a string would read as one name per letter
        architectures = []
    return ModelShape(
        model_type=config.get("model_type"),
        architectures=tuple(str(a) for a in architectures),
        recurrent_layers=recurrent,
        recurrent_source=recurrent_source,
        mtp_layers=mtp,
        mtp_source=mtp_source,
    )


def check_model(model: str) -> ModelShape:
    """Refuse a model that cannot show the bug, naming what its config says."""
    config, path = read_config(model)
    shape = shape_of(config, path.parent)
    missing = []
    if not shape.recurrent_layers:
        missing.append("Mamba or linear-attention layers")
    if not shape.mtp_layers:
        missing.append("MTP head")
    if missing:
        raise ModelUnsupported(
            f"{model} cannot show the hybrid prefix-cache bug: it has no "
            f"{' and no '.join(missing)}. Found in {path}: {shape.describe()}. The arms need "
            f"a hybrid model (a Mamba / linear-attention layer pattern in its config) with an "
            f"MTP head (num_nextn_predict_layers or mtp_num_hidden_layers > 0, or mtp.* "
            f"weights); nothing was started"
        )
    return shape


def _recurrent_layers(level: dict[str, Any]) -> tuple[int, str]:
    layer_types = level.get("layer_types")
    if isinstance(layer_types, list):
        count = sum(1 for t in layer_types if str(t).lower() in RECURRENT_LAYER_NAMES)
        if count:
            return count, "layer_types"
    pattern = level.get("hybrid_override_pattern")
    if isinstance(pattern, str) and "M" in pattern:
        return pattern.count("M"), "hybrid_override_pattern"
    blocks = level.get("layers_block_type")
    if isinstance(blocks, list):
        count = sum(1 for t in blocks if "mamba" in str(t).lower())
        if count:
            return count, "layers_block_type"
    interval = level.get("full_attention_interval")
    layers = level.get("num_hidden_layers")
    if _count(interval) > 1 and _count(layers) > 0:
        return layers - layers // interval, "full_attention_interval"
    return 0, ""


def _count(value: Any) -> int:
    """`value` if it is a whole number (JSON's `true` is not one), else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _mtp_tensor_count(model_dir: Path) -> int:
    """How many tensors of a local safetensors checkpoint belong to an MTP head."""
    names: list[str] = []
    index = model_dir / "model.safetensors.index.json"
    try:
        if index.exists() or index.is_symlink():
            names = _index_names(index)
        else:
            for shard in sorted(model_dir.glob("*.safetensors")):
                names += _safetensors_names(shard)
    except JSONUnreadable as exc:
        raise ModelConfigUnavailable(f"cannot read the model's weight names: {exc}") from None
    except (OSError, struct.error):
        return 0
    return sum(1 for n in names if n.startswith(MTP_TENSOR_PREFIXES))


def _index_names(index: Path) -> list[str]:
    doc = read_json(index)
    weight_map = doc.get("weight_map", {}) if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        raise ModelConfigUnavailable(
            f"{index}: expected an object with a weight_map object (tensor name -> shard), "
            f"found {_kind(doc if weight_map is None else weight_map)}"
        )
    return list(weight_map)


def _safetensors_names(path: Path) -> list[str]:
    """Tensor names from a safetensors header (8-byte length, then JSON), without torch."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > SAFETENSORS_HEADER_MAX:
            raise ModelConfigUnavailable(
                f"{path}: a safetensors header of {length} bytes; the format allows at most "
                f"{SAFETENSORS_HEADER_MAX}"
            )
        header = parse_json_bytes(
            handle.read(length), f"{path} (safetensors header)", max_bytes=SAFETENSORS_HEADER_MAX
        )
    if not isinstance(header, dict):
        raise ModelConfigUnavailable(
            f"{path}: a safetensors header that is {_kind(header)}; expected an object of "
            "tensor name -> dtype, shape and offsets"
        )
    return [name for name in header if name != "__metadata__"]


def _kind(value: Any) -> str:
    return f"a JSON {type(value).__name__}" if value is not None else "null"
