"""Comparing two labs' runs: what differs, whether the verdicts agree, and the exit status."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from repro.cli import main
from repro.evidence import bundle, compare, report
from repro.evidence.runs import EvidenceError

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
EXAMPLES = Path(__file__).resolve().parent.parent / "artifacts" / "examples"
# A needle record that carries the answer log-prob line, and one from before it.
WITH_LINE = EXAMPLES / "h100-bare-matrix-vllm-0.26.0" / "0.26.0"
BEFORE_LINE = EXAMPLES / "h200-tiny-needle-vllm-0.26.0-witness" / "stock"
# The committed record's line, as the report prints it (its REPORT.md).
H100_LINE = (
    "answer log-prob: corrupted (wave1: 3 forward / 0 reverse, "
    "wave2: 0 forward / 1 reverse flips, threshold 0.0449)"
)


@pytest.fixture
def dirs(tmp_path) -> dict[str, Path]:
    return {n: Path(shutil.copytree(FIXTURES / n, tmp_path / n)) for n in ("clean", "fault")}


def test_same_run_agrees_and_exits_zero(dirs, capsys):
    assert main(["compare", str(dirs["clean"]), str(dirs["clean"])]) == 0
    out = capsys.readouterr().out
    assert "Verdicts agree on all 2 arm(s)." in out
    assert "| Cold-race | clean | clean | yes |" in out
    assert "**no**" not in out and "**NO**" not in out


def test_clean_against_fault_disagrees_and_exits_one(dirs, tmp_path, capsys):
    md = tmp_path / "cmp.md"
    code = main(["compare", str(dirs["clean"]), str(dirs["fault"]), "--out", str(md)])
    assert code == 1
    out = capsys.readouterr().out
    assert md.read_text() == out
    assert "| Cold-race | clean | corrupted | **NO** |" in out
    assert "| Multi-turn | clean | corrupted | **NO** |" in out
    assert (
        "**Verdicts disagree** on cold-race: clean vs corrupted; multi-turn: clean vs corrupted."
        in out
    )
    # Same image (none), model, vLLM, hardware; the injected fault is the difference.
    assert "| Image | none (run on the host) | none (run on the host) | yes |" in out
    assert "| Hardware | AMD EPYC, 2 cores / 2 CPUs, 23.5 GiB RAM; no GPU |" in out
    assert "| Fault injection | none | positive control;" in out
    assert "| Cold-race APC-run settings | 16 entries | 16 entries | yes |" in out
    assert "REPRO_INJECT_FAULT '<unset>' → 'restored-state-noise'" in out
    # Figures side by side with their difference.
    assert "| wave1 forward flips | 0 | 14 | +14 |" in out
    assert "| wave2 forward flips | 0 | 30 | +30 |" in out
    assert "| prefix-cache hits | 2640 | 2640 | = |" in out


def test_settings_and_model_differences_are_named(dirs):
    doc_path = dirs["fault"] / "cold-race.json"
    doc = json.loads(doc_path.read_text())
    doc["engine"]["apc_run"]["max_num_batched_tokens"] = 256
    doc["profile"]["revision"] = "a" * 40
    doc_path.write_text(json.dumps(doc))
    result = compare.compare(compare.load_one(dirs["clean"]), compare.load_one(dirs["fault"]))
    assert "**no**: differ: max_num_batched_tokens 200 → 256" in result.markdown
    assert f"| Model revision | none pinned (built locally) | `{'a' * 40}` | **no** |" in (
        result.markdown
    )


def test_bundles_compare_like_directories(dirs, tmp_path):
    a = tmp_path / "a.tar.gz"
    b = tmp_path / "b.tar.gz"
    bundle.build_bundle([dirs["clean"]], a, images_dir=None, environ={})
    bundle.build_bundle([dirs["fault"]], b, images_dir=None, environ={})
    from_bundles = compare.compare(compare.load_one(a), compare.load_one(b))
    from_dirs = compare.compare(compare.load_one(dirs["clean"]), compare.load_one(dirs["fault"]))
    assert from_bundles.markdown == from_dirs.markdown
    assert (
        from_bundles.disagreements
        == from_dirs.disagreements
        == [
            "cold-race: clean vs corrupted",
            "multi-turn: clean vs corrupted",
        ]
    )


def test_a_bundle_of_two_runs_is_refused(dirs, tmp_path):
    both = tmp_path / "both.tar.gz"
    bundle.build_bundle(list(dirs.values()), both, images_dir=None, environ={})
    with pytest.raises(EvidenceError, match="holds 2 runs"):
        compare.load_one(both)
    assert main(["compare", str(both), str(dirs["clean"])]) == 2


def test_an_arm_on_one_side_only_is_a_disagreement(dirs):
    (dirs["fault"] / "multi-turn.json").unlink()
    result = compare.compare(compare.load_one(dirs["fault"]), compare.load_one(dirs["fault"]))
    assert result.agree
    result = compare.compare(compare.load_one(dirs["clean"]), compare.load_one(dirs["fault"]))
    assert "multi-turn: clean vs not run" in result.disagreements


def test_the_answer_logprob_line_sits_beside_a_record_without_one(capsys):
    assert main(["compare", str(WITH_LINE), str(BEFORE_LINE)]) == 0
    out = capsys.readouterr().out
    assert f"| answer log-prob line | {H100_LINE} | not recorded | differs |" in out
    assert "| verdict decided by | recall | not recorded | differs |" in out


def test_the_answer_logprob_line_uses_the_reports_words():
    run = compare.load_one(WITH_LINE)
    doc = run.documents["cold-race"]
    assert compare.answer_figures(doc) == {
        "answer log-prob line": H100_LINE,
        "verdict decided by": "recall",
    }
    assert f" · {H100_LINE}" in report.result_text(doc)
    result = compare.compare(run, run)
    assert f"| answer log-prob line | {H100_LINE} | {H100_LINE} | = |" in result.markdown
    assert "| verdict decided by | recall | recall | = |" in result.markdown


def test_a_record_stripped_of_the_line_says_not_recorded(tmp_path):
    # The same record as it would read from before the line: no section, no per-request
    # answer divergences (both optional in the schema; the loader validates it).
    older = Path(shutil.copytree(WITH_LINE, tmp_path / "older"))
    doc = json.loads((older / "cold-race.json").read_text())
    del doc["answer_logprob"]
    for wave in doc["figures"]["waves"]:
        wave.get("extra", {}).pop("answer_benign_noise", None)
        for request in wave["per_request"]:
            del request["answer_divergence"]
    (older / "cold-race.json").write_text(json.dumps(doc))
    result = compare.compare(compare.load_one(WITH_LINE), compare.load_one(older))
    assert result.agree
    assert f"| answer log-prob line | {H100_LINE} | not recorded | differs |" in result.markdown


def test_logprob_records_say_the_line_is_not_recorded(dirs):
    result = compare.compare(compare.load_one(dirs["clean"]), compare.load_one(dirs["fault"]))
    not_there = "not recorded (log-prob signal: it is the verdict)"
    assert f"| answer log-prob line | {not_there} | {not_there} | = |" in result.markdown
    assert "| verdict decided by | not recorded | not recorded | = |" in result.markdown
