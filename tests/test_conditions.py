"""Conditions files: tables, typos named by line, content hashes."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.fanout import conditions
from repro.fanout.conditions import BadCondition, Condition, ConditionsFileError

REPO = Path(__file__).resolve().parent.parent
PATCH = "containers/patches/vllm-0.26.0-pr51113-mamba-chunk-split.diff"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "conditions.toml"
    path.write_text(text)
    return path


def test_tables_become_conditions_in_file_order(tmp_path):
    (tmp_path / "p.diff").write_bytes((REPO / PATCH).read_bytes())
    items = conditions.load(
        write(
            tmp_path,
            '[[condition]]\nname = "stock"\nvllm = "0.26.0"\n\n'
            '[[condition]]\nname = "fixed"\nvllm = "0.26.0"\npatches = ["p.diff"]\n'
            'overrides = { async_scheduling = false }\narms = ["cold-race"]\n',
        )
    )
    assert [type(i) for i in items] == [Condition, Condition]
    stock, fixed = items
    assert stock.profile == "tiny" and stock.arms == ("cold-race", "multi-turn")
    assert fixed.patches == ((tmp_path / "p.diff").resolve(),)  # relative to the file
    assert fixed.overrides == {"async_scheduling": False} and fixed.arms == ("cold-race",)
    assert (stock.line, fixed.line) == (1, 5)
    assert stock.env_key() != fixed.env_key()


def test_a_typo_names_its_key_and_line_and_spares_the_other_tables(tmp_path):
    items = conditions.load(
        write(
            tmp_path,
            '[[condition]]\nname = "ok"\nvllm = "0.32.0"\n\n'
            '[[condition]]\nname = "typo"\nvllm = "0.32.0"\noverides = { seed = 1 }\n',
        )
    )
    assert isinstance(items[0], Condition)
    bad = items[1]
    assert isinstance(bad, BadCondition) and bad.name == "typo" and bad.line == 8
    assert "'overides'" in bad.problem and "did you mean 'overrides'" in bad.problem


def test_duplicate_names_and_wrong_types_are_bad_conditions(tmp_path):
    items = conditions.load(
        write(
            tmp_path,
            '[[condition]]\nname = "a"\nvllm = "0.32.0"\n'
            '[[condition]]\nname = "a"\nvllm = "0.31.0"\n'
            '[[condition]]\nname = "b"\nvllm = 0.32\n'
            '[[condition]]\nname = "c"\nvllm = "0.32.0"\nprofile = "tinyy"\n',
        )
    )
    assert isinstance(items[0], Condition)
    assert isinstance(items[1], BadCondition) and "second condition named 'a'" in items[1].problem
    assert isinstance(items[2], BadCondition) and items[2].line == 9
    assert isinstance(items[3], BadCondition) and "unknown profile 'tinyy'" in items[3].problem


def test_a_file_that_is_not_toml_stops_with_its_line(tmp_path):
    with pytest.raises(ConditionsFileError, match="line 3"):
        conditions.load(write(tmp_path, '[[condition]]\nname = "a"\nvllm = 0.32.0\n'))
    with pytest.raises(ConditionsFileError, match="no \\[\\[condition\\]\\] tables"):
        conditions.load(write(tmp_path, "# empty\n"))
    with pytest.raises(ConditionsFileError, match="'conditon' \\(line 1\\)"):
        conditions.load(write(tmp_path, '[[conditon]]\nname = "a"\n'))


def test_the_content_hash_covers_what_runs_not_the_name(tmp_path):
    patch = tmp_path / "p.diff"
    patch.write_bytes((REPO / PATCH).read_bytes())
    one = Condition(name="x", vllm="0.26.0", patches=(patch,), arms=("cold-race",))
    renamed = Condition(name="y", vllm="0.26.0", patches=(patch,), arms=("cold-race",), line=9)
    assert one.content_hash == renamed.content_hash
    for other in (
        Condition(name="x", vllm="0.27.0", patches=(patch,), arms=("cold-race",)),
        Condition(name="x", vllm="0.26.0", arms=("cold-race",)),
        Condition(name="x", vllm="0.26.0", patches=(patch,), arms=("multi-turn",)),
        Condition(
            name="x", vllm="0.26.0", patches=(patch,), arms=("cold-race",), overrides={"a": 1}
        ),
        Condition(
            name="x", vllm="0.26.0", patches=(patch,), arms=("cold-race",), inject_fault=True
        ),
    ):
        assert other.content_hash != one.content_hash
    before = one.content_hash
    patch.write_text(patch.read_text() + "\n")  # the patch's bytes count, not its name
    assert one.content_hash != before


def test_flags_make_one_condition_per_release():
    items = conditions.from_flags(
        vllm=["0.28.0", "0.32.0"], patches=[], overrides={"seed": 1}, profile="tiny", fault=True
    )
    assert [i.name for i in items] == ["0.28.0+fault", "0.32.0+fault"]
    assert all(i.inject_fault and i.overrides == {"seed": 1} for i in items)


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            '[[condition]]\nname = "a"\nvllm = "0.32.0"\nprofile = ["tiny"]\n',
            "line 4: unknown profile",
        ),
        (
            '[[condition]]\nname = "a"\nvllm = "0.32.0"\noverrides = { seed = 1979-05-27 }\n',
            "line 4: overrides.seed must be a JSON value",
        ),
    ],
)
def test_values_of_the_wrong_kind_are_bad_conditions_naming_their_line(tmp_path, body, expected):
    path = tmp_path / "c.toml"
    path.write_text(body)
    (item,) = conditions.load(path)
    assert isinstance(item, BadCondition) and expected in item.problem


def test_a_file_that_is_not_conditions_or_not_utf8_stops_with_its_line(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("condition = [1, 2]\n")
    with pytest.raises(ConditionsFileError, match="line 1.*must be \\[\\[condition\\]\\] tables"):
        conditions.load(path)
    path.write_bytes(b'[[condition]]\nname = "caf\xe9"\n')
    with pytest.raises(ConditionsFileError, match="line 2 is not UTF-8 text"):
        conditions.load(path)


def test_arms_are_those_of_the_profile_on_the_conditions_device(tmp_path):
    """The tiny NemotronH runs the multi-turn arm on CUDA only: a condition that names the
    device gets it, one on the profile's CPU is told which arms there are."""
    body = '[[condition]]\nname = "n"\nvllm = "0.26.0"\nprofile = "tiny-nemotron-h"\n'
    (on_gpu,) = conditions.load(write(tmp_path, body + 'device = "cuda"\narms = ["multi-turn"]\n'))
    assert isinstance(on_gpu, Condition) and list(on_gpu.arms) == ["multi-turn"]
    (on_cpu,) = conditions.load(write(tmp_path, body + 'arms = ["multi-turn"]\n'))
    assert isinstance(on_cpu, BadCondition)
    assert "arms must be a list out of ['cold-race']" in on_cpu.problem
    (typo,) = conditions.load(write(tmp_path, body + 'device = "gpu"\narms = ["multi-turn"]\n'))
    assert isinstance(typo, BadCondition)
    assert "device must be 'cpu' or 'cuda', got 'gpu'" in typo.problem, "the device, not the arms"


@pytest.mark.parametrize(
    "path", sorted((REPO / "containers").rglob("*.toml")), ids=lambda p: p.name
)
def test_the_conditions_files_the_kit_ships_load_without_a_bad_condition(path):
    items = conditions.load(path)
    assert items and all(isinstance(i, Condition) for i in items), [
        getattr(i, "problem", None) for i in items
    ]
