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

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.core.errors import ReproError
from repro.core.jsonread import parse_json_bytes, read_json

RECURRENT_LAYER_NAMES = ("linear_attention", "mamba", "mamba2", "gated_deltanet")
MTP_COUNT_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
NESTED_CONFIG_KEYS = ("text_config", "language_config", "llm_config")
MTP_TENSOR_PREFIXES = ("mtp.", "model.mtp.", "language_model.mtp.")


class ModelUnsupported(ReproError):
    """The model cannot show the bug: no recurrent layers, or no MTP head."""


class ModelConfigUnavailable(ReproError):
    """The model's config.json could not be read."""


class ModelFilesInvalid(ReproError):
    """A file of the checkpoint (config.json, the weights' index or header) is not of the shape
    its format has: refused, never read as an MTP head or as none."""


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
        # lazy: huggingface_hub is slow to import; only the Hub's users need it
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
    config = read_json(path)
    if not isinstance(config, dict):
        raise ModelConfigUnavailable(
            f"{path}: expected a JSON object (a Hugging Face model config), found "
            f"{_kind(config)}; pass the folder of a Hugging Face checkpoint"
        )
    return config, path


def shape_of(config: dict[str, Any], model_dir: Path | None = None) -> ModelShape:
    where = str(model_dir / "config.json") if model_dir is not None else "config.json"
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
                value = _layer_count(level.get(key), where, prefix + key)
                if value:
                    mtp, mtp_source = value, prefix + key
                    break
    if not mtp and model_dir is not None:
        tensors = _mtp_tensor_count(model_dir)
        if tensors:
            # A head is there; its layer count is not declared. One is what vLLM assumes.
            mtp, mtp_source = 1, f"{tensors} mtp.* tensors in the checkpoint"
    architectures = config.get("architectures") or []
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


def _layer_count(value: Any, where: str, key: str) -> int:
    """An MTP layer count as vLLM reads it: absent or null is none; else a whole number of 0
    or more. A bool is refused, not taken as 1 (`True > 0` in Python)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelFilesInvalid(
            f"{where}: {key} is {_kind(value)}; expected a whole number of MTP layers (0 for "
            "none), as vLLM reads it: fix the config.json (nothing was started)"
        )
    return value


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    """A JSON value as a refusal names it: "a JSON list", "true", "the string \"1\""."""
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, list):
        return "a JSON list"
    shown = json.dumps(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    if isinstance(value, str):
        return f"the string {shown}"
    if isinstance(value, bool) or value is None:
        return shown
    return f"the number {shown}"


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
    if _is_count(interval) and interval > 1 and _is_count(layers):
        return layers - layers // interval, "full_attention_interval"
    return 0, ""


def _mtp_tensor_count(model_dir: Path) -> int:
    """How many tensors of a local safetensors checkpoint belong to an MTP head.

    The index or a header that is not of its format's shape is refused by name: read as
    "no tensors" it would hide a broken checkpoint, read loosely it could find a head that
    is not there."""
    names: list[str] = []
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        doc = read_json(index)
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict):
            found = "no weight_map object in it" if isinstance(doc, dict) else _kind(doc)
            raise ModelFilesInvalid(
                f"{index}: expected a JSON object with a weight_map object (tensor name -> "
                f"shard file), found {found}; fix or remove the index (nothing was started)"
            )
        names = list(weight_map)
    else:
        for shard in sorted(model_dir.glob("*.safetensors")):
            names += _safetensors_names(shard)
    return sum(1 for n in names if n.startswith(MTP_TENSOR_PREFIXES))


# safetensors: an 8-byte little-endian header length, then that many bytes of JSON.
MAX_HEADER_BYTES = 100 << 20


def _safetensors_names(path: Path) -> list[str]:
    """Tensor names from a safetensors header (8-byte length, then JSON), without torch."""
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise ModelFilesInvalid(
                    f"{path}: {len(prefix)} bytes, shorter than a safetensors header's length "
                    "field (8 bytes); expected a safetensors file: re-fetch the weights"
                )
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise ModelFilesInvalid(
                    f"{path}: a safetensors header of {length} bytes (at most "
                    f"{MAX_HEADER_BYTES} are read); expected a safetensors file: re-fetch the "
                    "weights"
                )
            data = handle.read(length)
    except OSError as exc:
        raise ModelFilesInvalid(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(data) < length:
        raise ModelFilesInvalid(
            f"{path}: the header says {length} bytes, the file holds {len(data)}; expected a "
            "whole safetensors file: re-fetch the weights"
        )
    header = parse_json_bytes(data, f"{path} (safetensors header)")
    if not isinstance(header, dict):
        raise ModelFilesInvalid(
            f"{path}: the safetensors header is {_kind(header)}; expected a JSON object of "
            "tensor names: re-fetch the weights (nothing was started)"
        )
    return [name for name in header if name != "__metadata__"]
