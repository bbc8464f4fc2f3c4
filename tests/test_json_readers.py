"""Every reader of JSON from outside the kit refuses what `repro.core.jsonread` refuses, by name.

`tests/test_fuzz_inputs.py` fuzzes the loader itself; here each reader that goes through it
is given the inputs issue 31 measured (bottomless nesting, NaN, duplicate keys, a list where
an object belongs, a FIFO) and must answer with its own refusal naming the file.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from repro import connectors, model_config, weights
from repro.cli import main
from repro.containers import handoff
from repro.core.jsonread import JSONUnreadable
from repro.evidence import contents
from repro.evidence.bundle import MANIFEST_NAME

DEEP = b"[" * 100_000
EXAMPLES = Path(__file__).parent.parent / "artifacts" / "examples"
HYBRID = {"layer_types": ["linear_attention", "full_attention"], "model_type": "qwen3_next"}


@pytest.mark.parametrize(
    "data, found",
    [
        (DEEP, "nested deeper than can be read"),
        (b'{"kit": {"source_sha256": NaN}}', "NaN, which is not a JSON number"),
        (b'{"kit": {}, "kit": {}}', "the key 'kit' twice"),
        ('{"a": 1}'.encode("utf-16"), "UTF-16 byte-order mark"),
        (b'{"kit": {"source_sha256": 5}}', "expected a sha256 hex string"),
    ],
)
def test_kit_digest_names_each_unreadable_artifact(tmp_path, capsys, data, found):
    path = tmp_path / "a.json"
    path.write_bytes(data)
    assert main(["kit-digest", str(path)]) == 1
    out = capsys.readouterr().out
    assert found in out and str(path) in out


def test_validate_refuses_nan_infinity_and_duplicate_keys(tmp_path, capsys):
    good = json.loads(next(EXAMPLES.rglob("cold-race.json")).read_text())
    text = json.dumps(good)
    cases = {
        "nan.json": text[:-1] + ', "y": NaN}',
        "inf.json": text[:-1] + ', "x": Infinity}',
        "dup.json": text[:-1] + ', "arm": "cold-race"}',
    }
    for name, body in cases.items():
        (tmp_path / name).write_text(body)
    assert main(["validate", *(str(tmp_path / n) for n in cases)]) == 1
    out = capsys.readouterr().out
    assert out.count("INVALID") == 3
    assert "NaN, which is not a JSON number" in out and "Infinity, which is not" in out
    assert "the key 'arm' twice" in out


def test_validate_does_not_block_on_a_fifo(tmp_path, capsys):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    assert main(["validate", str(fifo)]) == 1
    assert "a FIFO (named pipe)" in capsys.readouterr().out


def _model(tmp_path: Path, config, index=None, shard: bytes | None = None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_bytes(
        config if isinstance(config, bytes) else json.dumps(config).encode()
    )
    if index is not None:
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    if shard is not None:
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(shard)) + shard)
    return folder


@pytest.mark.parametrize(
    "config, index, shard, error, found",
    [
        (DEEP, None, None, JSONUnreadable, "config.json: JSON nested deeper"),
        (b'{"a": 1, "a": 2}', None, None, JSONUnreadable, "config.json: the key 'a' twice"),
        (b"[1]", None, None, model_config.ModelConfigUnavailable, "found a JSON list"),
        (HYBRID, [1, 2], None, model_config.ModelFilesInvalid, "weight_map object"),
        (HYBRID, {"weight_map": [1]}, None, model_config.ModelFilesInvalid, "no weight_map"),
        (HYBRID, None, b'["mtp.x"]', model_config.ModelFilesInvalid, "header is a JSON list"),
        (HYBRID, None, DEEP, JSONUnreadable, r"safetensors header\): JSON nested deeper"),
        (
            {**HYBRID, "num_nextn_predict_layers": True},
            None,
            None,
            model_config.ModelFilesInvalid,
            "num_nextn_predict_layers is true; expected a whole number",
        ),
    ],
)
def test_a_model_folder_that_cannot_be_read_is_refused_by_name(
    tmp_path, config, index, shard, error, found
):
    folder = _model(tmp_path, config, index, shard)
    with pytest.raises(error, match=found):
        model_config.check_model(str(folder))


def test_an_import_record_that_is_bottomless_is_refused_by_name(tmp_path):
    archive = tmp_path / "image.tar"
    record = tmp_path / "image.tar.json"
    record.write_bytes(DEEP)
    with pytest.raises(handoff.HandoffError, match=f"{record}: JSON nested deeper"):
        handoff.read_archive_record(archive)


@pytest.mark.parametrize("which", [0, 1])
def test_lock_compare_refuses_a_record_or_manifest_of_the_wrong_shape(tmp_path, capsys, which):
    folder = EXAMPLES / "cuda-images" / "vllm-0.26.0"
    files = [folder / "image-record-cold.json", folder / "installset-manifest.json"]
    files[which] = tmp_path / "list.json"
    files[which].write_text("[1, 2]")
    assert main(["lock-compare", *map(str, files)]) == 2
    err = capsys.readouterr().err
    assert f"{files[which]}: does not match schemas/" in err and "Traceback" not in err


def test_lock_compare_still_compares_the_committed_records(capsys):
    folder = EXAMPLES / "cuda-images" / "vllm-0.26.0"
    files = [folder / "image-record-cold.json", folder / "installset-manifest.json"]
    assert main(["lock-compare", *map(str, files)]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(
        (folder / "lock-compare.json").read_text()
    )


@pytest.mark.parametrize(
    "config, found",
    [('{"a": NaN}', "NaN"), ('{"a": 1, "a": 2}', "twice"), ("[" * 100_000, "nested deeper")],
)
def test_connector_config_is_read_by_the_one_loader(config, found):
    with pytest.raises(connectors.ConnectorRefused, match=found):
        connectors.parse("probe", config)


def test_a_weights_lock_with_duplicate_models_is_refused(tmp_path):
    lock = tmp_path / "weights.lock.json"
    lock.write_text('{"models": {}, "models": {}}')
    with pytest.raises(weights.WeightsError, match="twice"):
        weights.lock_revision("org/model", lock)


@pytest.mark.parametrize(
    "data, found",
    [(DEEP, "nested deeper"), (b'{"files": [], "files": []}', "twice"), (b"\xff", "UTF-8")],
)
def test_verify_names_a_bundle_manifest_or_artifact_it_cannot_read(data, found):
    result = contents.VerifyResult(Path("b.tar.gz"))
    assert contents.check_manifest({MANIFEST_NAME: data}, result) is None
    assert any(MANIFEST_NAME in p and found in p for p in result.problems), result.problems
    manifest = {"files": [{"kind": "run-artifact", "path": "runs/a/cold-race.json"}]}
    result = contents.VerifyResult(Path("b.tar.gz"))
    assert contents.check_json(manifest, {"runs/a/cold-race.json": data}, result) == {}
    assert any(found in p for p in result.problems), result.problems
