"""The report: GitHub-flavoured Markdown that pastes into an issue unchanged.

For each run: a result table in the shape of the upstream PR's (arm, model and tensor
parallelism, the verdict with the numbers behind it), an engagement table (prefix-cache
queries, hits, hit ratio, speculative drafts, liveness probe) and the environment (hardware,
vLLM version and commit, patches, image, kit, fault injection). Where the runs span several
conditions (vLLM versions or commits, patch overlays, an injected fault), a cross-verification
matrix follows: one row per condition, one column per arm, as in the upstream PR's second table.

Everything here is a pure function of the artifacts (no clock, no paths of this machine), so
a bundle's SUMMARY.md can be re-rendered and compared by `verify`.
"""

from __future__ import annotations

from typing import Any

from repro import __version__, answer_logprob, confidence, ladder, witness
from repro.core.vocabulary import ARMS
from repro.evidence.runs import Run
from repro.evidence.verdicts import answer_line

ARM_TITLES = {"cold-race": "Cold-race", "multi-turn": "Multi-turn"}
MARK = {"corrupted": "🔴", "clean": "✅", "inconclusive": "⚠️", "error": "❌"}


# --- figures -------------------------------------------------------------------------------


# What the queries, hits and drafts of a run's table count (the report's and the CLI's).
ENGAGEMENT_LEGEND = (
    "Queries, hits and drafts: the APC run's own waves, not the liveness probe's; under "
    "upstream's rules a verdict's reason counts the probe's drafts too."
)


def engagement(doc: dict[str, Any]) -> dict[str, int] | None:
    """APC-run counters summed over the arm's waves (the liveness probe is reported apart)."""
    counters = (doc.get("counters") or {}).get("apc")
    if not counters:
        return None
    # The probe's entries ("liveness", and "liveness_baseline" under upstream's rules).
    waves = [c for name, c in counters.items() if not name.startswith("liveness")]
    return {
        "queries": sum(c["prefix_cache_queries"] for c in waves),
        "hits": sum(c["prefix_cache_hits"] for c in waves),
        "drafts": sum(c["spec_decode_num_drafts"] for c in waves),
        "accepted": sum(c["spec_decode_num_accepted_tokens"] for c in waves),
    }


def hit_ratio(figures: dict[str, int] | None) -> str:
    if not figures or not figures["queries"]:
        return "—"
    return f"{figures['hits'] / figures['queries']:.3f}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def wave_numbers(doc: dict[str, Any]) -> list[str]:
    """The seed's phrases for each graded wave: distinct outputs, one-sided flips, misses."""
    figures = doc.get("figures") or {}
    waves = [w for w in figures.get("waves", []) if (w.get("extra") or {}).get("graded", True)]
    signal = (doc.get("signal") or {}).get("kind")
    phrases = []
    for wave in waves:
        extra = wave.get("extra") or {}
        n = wave["requests"]
        parts = []
        if extra.get("distinct_rule"):
            outputs = _plural(wave["apc"]["distinct_outputs"], "distinct output")
            corrupted = _corrupted_needle(wave)
            parts.append(
                f"{n} identical prompts → {outputs}{corrupted}; "
                f"control: {wave['control']['distinct_outputs']}"
            )
        parts.append(
            f"{wave['forward_flips']}/{n} one-sided flips vs control, "
            f"{wave['reverse_flips']} in the benign direction"
        )
        if signal == "needle" and wave["apc"]["misses"] is not None:
            parts.append(f"misses {wave['apc']['misses']} vs control {wave['control']['misses']}")
        prefix = f"{wave['name']}: " if len(waves) > 1 else ""
        phrases.append(prefix + "; ".join(parts))
    return phrases


# How many wrong answers the seed-shaped phrase names before it says "…".
MAX_WRONG_ANSWERS_SHOWN = 3


def _corrupted_needle(wave: dict[str, Any]) -> str:
    """ " (needle X corrupted to Y / Z)", from the answers a needle artifact keeps; "" when it
    keeps none (log-prob signal, older artifacts) or no APC answer missed."""
    wrong: list[str] = []
    code = None
    for request in wave.get("per_request", []):
        if request.get("apc_miss") and "apc_answer" in request:
            code = request["code"]
            answer = request["apc_answer"].strip() or "(empty)"
            if answer not in wrong:
                wrong.append(answer)
    if not wrong:
        return ""
    shown = " / ".join(wrong[:MAX_WRONG_ANSWERS_SHOWN])
    more = " / …" if len(wrong) > MAX_WRONG_ANSWERS_SHOWN else ""
    return f" (needle {code} corrupted to {shown}{more})"


def result_text(doc: dict[str, Any]) -> str:
    verdict = doc["verdict"]
    status = verdict["status"]
    mark = MARK[status]
    if status in ("corrupted", "clean"):
        text = " · ".join(wave_numbers(doc))
        signal = doc.get("signal") or {}
        if signal.get("kind") == "logprob" and signal.get("threshold") is not None:
            text += f" (log-prob threshold {signal['threshold']:.4f})"
        if verdict.get("outcome") == "clean-zero-trigger-hits":
            text += f" · {_zero_trigger_hits(doc)}"
        # Shown for records that carry one (older ones keep their seed-shaped line), always
        # re-derived from the figures, never read from the record.
        sure = confidence.of_document(doc) if "confidence" in verdict else None
        if sure is not None:
            text += f" · {confidence_text(sure)}"
        seen = witness.from_document(doc)
        if seen is not None:
            text += f" · {witness.line(seen)}"
        answers = answer_line(doc)  # re-derived, as the verdict is
        if answers is not None:
            text += f" · {answer_logprob.note(answers)}"
        rungs = ladder.line(doc)
        if rungs is not None:
            text += f" · ladder: {rungs}"
        return f"{mark} **{witness.headline(status, seen)}**: {text}"
    if status == "inconclusive":
        return f"{mark} **inconclusive ({verdict['gate']})**: {verdict['reason']}"
    return f"{mark} **error**: {verdict['reason']}"


def confidence_text(sure: dict[str, Any]) -> str:
    """``p = 0.0083 (Fisher's exact test, one-sided)``, and the knife edge where there is one."""
    test = {"mcnemar-exact": "McNemar's exact test", "fisher-exact": "Fisher's exact test"}
    text = f"p = {sure['p_value']:.2g} ({test[sure['test']]}, one-sided)"
    if sure["knife_edge"]:
        text += ", knife-edge: one request decides the verdict"
    return text


def _zero_trigger_hits(doc: dict[str, Any]) -> str:
    """Upstream's cured-by-design cold-race state, said as such (not as "engaged")."""
    live = (doc.get("figures") or {}).get("liveness") or {}
    return (
        f"trigger waves at zero hits while the liveness probe hit "
        f"({live.get('hits', 0)} hits, {live.get('cached_tokens', 0)} cached tokens)"
    )


def model_text(doc: dict[str, Any]) -> str:
    profile = doc["profile"]
    return f"{profile['model']} TP{profile['tensor_parallel_size']} ({profile['device']})"


# --- environment ---------------------------------------------------------------------------


def hardware_text(doc: dict[str, Any]) -> str:
    hw = doc["hardware"]
    cpu = hw["cpu"]
    cores = f"{cpu['physical_cores']} cores" if cpu.get("physical_cores") else "cores unknown"
    text = (
        f"{cpu['model']}, {cores} / {cpu['logical_cpus']} CPUs, "
        f"{hw['memory_bytes'] / 1024**3:.1f} GiB RAM"
    )
    gpus = hw.get("gpus") or []
    if not gpus:
        return text + "; no GPU"
    names: dict[str, int] = {}
    for gpu in gpus:
        memory = f"{gpu['memory_bytes'] / 1024**3:.0f} GiB" if gpu.get("memory_bytes") else "?"
        cc = f", CC {gpu['compute_capability']}" if gpu.get("compute_capability") else ""
        key = f"{gpu['name']} ({memory}{cc})"
        names[key] = names.get(key, 0) + 1
    listed = ", ".join(f"{n}× {name}" for name, n in names.items())
    driver = gpus[0]["driver_version"]
    cuda = f", CUDA {hw['cuda_version']}" if hw.get("cuda_version") else ""
    return f"{listed}, driver {driver}{cuda}; {text}"


def vllm_text(doc: dict[str, Any]) -> str:
    engine = doc.get("engine") or {}
    version = engine.get("vllm_version") or doc["software"]["packages"].get("vllm") or "unknown"
    dist = engine.get("vllm_distribution") or doc["software"]["distributions"].get("vllm")
    commit = engine.get("vllm_commit")
    text = f"{version}" + (f" ({dist})" if dist else "")
    return text + (f", commit {commit}" if commit else ", commit not recorded (release build)")


def patches_text(doc: dict[str, Any]) -> str:
    patches = (doc.get("engine") or {}).get("patches") or []
    if not patches:
        return "none"
    return ", ".join(
        f"`{p['path'].rsplit('/', 1)[-1]}` (sha256 {p['sha256'][:12]})" for p in patches
    )


def image_text(run: Run) -> str:
    image = run.first["run"]["location"].get("image")
    if not image:
        return "none (run on the host)"
    text = f"`{image['id']}`"
    archive = image.get("archive_sha256") or ((run.image_import or {}).get("archive") or {}).get(
        "sha256"
    )
    if archive:
        text += f", imported from archive sha256 `{archive}`"
    tags = (run.image_record or {}).get("image", {}).get("tags")
    if tags:
        text += f" ({', '.join(tags)})"
    return text


def kit_text(doc: dict[str, Any]) -> str:
    kit = doc["kit"]
    commit = kit.get("git_commit")
    # The source digest names the code that ran even where git metadata was stale or absent.
    source = f", source `{kit['source_sha256'][:12]}`" if kit.get("source_sha256") else ""
    if not commit:
        return f"{kit['version']} (not from a git checkout{source})"
    state = "dirty tree" if kit.get("dirty") else "clean tree"
    return f"{kit['version']} @ `{commit[:12]}` ({state}{source})"


def fault_text(run: Run) -> str:
    docs = run.documents
    if not any(doc["fault_injection"]["enabled"] for doc in docs.values()):
        return "none"
    parts = []
    for arm, doc in docs.items():
        fault = doc["fault_injection"]
        if not fault["enabled"]:
            parts.append(f"{arm}: none")
            continue
        applied = fault.get("applied")
        times = f" applied {applied}×" if applied is not None else ""
        parts.append(f"{arm}: **{fault['kind']}**{times}")
    return "positive control; " + ", ".join(parts)


def model_revision_text(doc: dict[str, Any]) -> str:
    revision = doc["profile"].get("revision")
    return f"`{revision}`" if revision else "none pinned (built locally)"


# --- tables --------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def liveness_text(live: dict | None) -> str:
    """The probe's counters, and the cached tokens its request reported where the counters
    missed them (vLLM 0.26.0 records no scheduler stats for prefill-only steps)."""
    if not live:
        return "—"
    text = f"{live['hits']}/{live['queries']} hits"
    cached = live.get("cached_tokens")
    if cached and not live["hits"]:
        text += f"; {cached} cached tokens reported by the request"
    return text


def render_run(run: Run) -> list[str]:
    first = run.first
    lines = [f"### Run `{run.label}`", ""]
    rows = [
        [ARM_TITLES.get(arm, arm), model_text(doc), result_text(doc)]
        for arm, doc in run.documents.items()
    ]
    lines += _table(["Arm", "Model / TP", "Result"], rows)
    lines.append("")
    rows = []
    for arm, doc in run.documents.items():
        figures = engagement(doc)
        live = (doc.get("figures") or {}).get("liveness")
        rows.append(
            [
                ARM_TITLES.get(arm, arm),
                str(figures["queries"]) if figures else "—",
                str(figures["hits"]) if figures else "—",
                hit_ratio(figures),
                str(figures["drafts"]) if figures else "—",
                liveness_text(live),
            ]
        )
    lines += _table(
        ["Arm", "Prefix-cache queries", "Hits", "Hit ratio", "Drafts", "Liveness probe"], rows
    )
    lines += ["", ENGAGEMENT_LEGEND, ""]
    run_ids = ", ".join(f"`{doc['run']['id']}`" for doc in run.documents.values())
    lines += [
        f"- Hardware: {hardware_text(first)}",
        *([f"- CPU threads: {cpu_threads_text(run)}"] if _on_cpu(run) else []),
        f"- vLLM: {vllm_text(first)}; patches: {patches_text(first)}",
        f"- Model revision: {model_revision_text(first)}",
        f"- Image: {image_text(run)}",
        f"- Fault injection: {fault_text(run)}",
        f"- KV connector: {connector_text(first)}",
        f"- Counters: {counters_source_text(run)}",
        f"- Kit: {kit_text(first)}; runs {run_ids}",
        "",
    ]
    lines += per_request_lines(run)
    return lines


def cpu_threads_text(run: Run) -> str:
    """Each arm's CPU engine pool (`engine.cpu_threads`) and why it was chosen."""
    texts = []
    for arm, doc in run.documents.items():
        choice = (doc.get("engine") or {}).get("cpu_threads")
        if not choice:
            continue  # a GPU run, an error record, or a record from before the choice
        if choice["chosen_by"] == "kit":
            busy = ", ".join(str(cpu) for cpu in choice["busy_cpus"]) or "none"
            cap = choice.get("share_cap")
            share = f"; its share: {cap}" if cap else ""
            what = (
                f"{choice['threads']} of {len(choice['allowed_cpus'])} "
                f"(busy at start: {busy}{share})"
            )
        elif choice["chosen_by"] == "matrix":
            what = f"{choice['threads']} of {len(choice['allowed_cpus'])} (its share of a matrix)"
        elif choice["chosen_by"] == "default":
            what = f"OpenMP's default ({choice['threads']}: every core free at start)"
        elif choice["chosen_by"] == "user":
            what = "the user's " + ", ".join(f"{k}={v}" for k, v in choice["variables"].items())
        else:
            what = "OpenMP's default (the cores' load could not be read)"
        texts.append(f"{arm}: {what}")
    return "; ".join(texts) or "not recorded (the record predates the kit's choice)"


def _on_cpu(run: Run) -> bool:
    return any((doc.get("profile") or {}).get("device") == "cpu" for doc in run.documents.values())


def counters_source_text(run: Run) -> str:
    """Where the APC runs' counters came from, and how far vLLM's own metrics fell behind
    them (`repro.engine.stats_tap`: before 0.28.0 vLLM drops the statistics of steps without
    outputs)."""
    reads = {
        arm: (doc.get("counters") or {}).get("read", {}).get("apc")
        for arm, doc in run.documents.items()
    }
    if not any(reads.values()):
        return "vLLM's own metrics (this record predates the kit's step-by-step sums)"
    if any((read or {}).get("source") != "scheduler-stats" for read in reads.values()):
        return "vLLM's own metrics (this vLLM has no per-step statistics call to sum)"
    missed = {
        arm: (read.get("missed_by_vllm_metrics") or {}).get("prefix_cache_hits", 0)
        for arm, read in reads.items()
    }
    text = "every engine step's scheduler statistics, summed"
    if any(missed.values()):
        gaps = ", ".join(f"{ARM_TITLES.get(arm, arm)} {n}" for arm, n in missed.items() if n)
        text += f"; vLLM's own counters missed hits (tokens) the kit counts: {gaps}"
    return text


def connector_text(doc: dict[str, Any]) -> str:
    """Which connector the APC run had (and the ladder's reference did not), by its code."""
    connector = doc.get("connector")
    if not connector:
        return "none"
    where = (
        f"{connector['module']}:{connector['class']}" if connector["module"] else connector["class"]
    )
    text = f"`{connector['spec']}` ({where}"
    if connector.get("source_sha256"):
        text += f", source sha256 {connector['source_sha256'][:12]}"
    if connector.get("distribution"):
        dist = connector["distribution"]
        text += f", from {dist['name']} {dist['version']}"
    return text + "); each arm also ran without it against the same APC-off control"


def _request_figure(request: dict[str, Any]) -> str:
    """A request's graded figure: its log-prob divergence, or its needle misses."""
    if request.get("divergence") is not None:
        return f"{request['divergence']:.4f}"
    apc, control = request.get("apc_miss"), request.get("control_miss")
    if apc is None and control is None:
        return "—"
    return f"needle: APC {_recall(apc)}, control {_recall(control)}"


def _recall(missed: bool | None) -> str:
    return "—" if missed is None else ("missed" if missed else "recalled")


def per_request_lines(run: Run) -> list[str]:
    """Every request of every wave, folded: which ones read the cache and which were flagged.

    A verdict says how many requests flipped; telling a uniform shift of every cache hit from
    a few outliers needs the requests themselves.
    """
    rows = []
    for arm, doc in run.documents.items():
        for wave in (doc.get("figures") or {}).get("waves", []):
            for request in wave.get("per_request", []):
                rows.append(
                    [
                        ARM_TITLES.get(arm, arm),
                        wave["name"],
                        str(request["index"]),
                        str(request["num_cached_tokens"]),
                        _request_figure(request),
                        "yes" if request.get("flagged") else "",
                    ]
                )
    if not rows:
        return []
    header = ["Arm", "Wave", "Request", "Cached prompt tokens", "Divergence / misses", "Flagged"]
    return [
        "<details><summary>Per-request figures</summary>",
        "",
        *_table(header, rows),
        "",
        "</details>",
        "",
    ]


# --- cross-verification --------------------------------------------------------------------


def condition(doc: dict[str, Any]) -> str:
    """What was run: vLLM version and commit, patch overlays, injected fault."""
    engine = doc.get("engine") or {}
    version = engine.get("vllm_version") or doc["software"]["packages"].get("vllm") or "?"
    text = f"vLLM {version}"
    if engine.get("vllm_commit"):
        text += f" @ {engine['vllm_commit'][:12]}"
    for patch in engine.get("patches") or []:
        text += f" + {patch['path'].rsplit('/', 1)[-1]}"
    fault = doc["fault_injection"]
    if fault["enabled"]:
        text += f" + injected fault ({fault['kind']})"
    connector = doc.get("connector")
    if connector:
        text += f" + connector {connector['spec']}"
    return text


def matrix_cell(doc: dict[str, Any], cured: bool, *, seed_figures: bool = False) -> str:
    """One cell of the cross-verification table. ``seed_figures``: as the seed's table has
    them, a red cell's one-sided flips per wave and a green one's wave-2 hit ratio too."""
    verdict = doc["verdict"]
    figures = engagement(doc)
    status, gate = verdict["status"], verdict["gate"]
    notes = f"{_witness_note(doc)}{_answer_note(doc)}{_ladder_note(doc)}"
    if status == "corrupted":
        hits = f", {figures['hits']} hits" if figures else ""
        hits += _flips(doc) if seed_figures else ""
        return f"🔴 corrupts (cache engaged{hits}){notes}"
    if status == "clean":
        word = "cured" if cured else "clean"
        seen = witness.from_document(doc)
        if seen is not None and seen.invalid:
            # Clean outputs over invalid restores: this model did not show what the engine did,
            # which is neither cured nor plain clean (witness.headline).
            wave2 = _wave_hit_ratio(doc, "wave2") if seed_figures else ""
            return (
                f"🟡 {witness.headline(status, seen)} (hit ratio {hit_ratio(figures)}{wave2})"
                f"{notes}"
            )
        if verdict.get("outcome") == "clean-zero-trigger-hits":
            return f"✅ {word}, {_zero_trigger_hits(doc)}{notes}"
        wave2 = _wave_hit_ratio(doc, "wave2") if seed_figures else ""
        return f"✅ {word}, engaged (hit ratio {hit_ratio(figures)}{wave2}){notes}"
    if status == "inconclusive":
        if gate == "engagement" and figures and figures["queries"] > 0 and figures["hits"] == 0:
            return f"⚠️ zero-hit: {figures['queries']} queries, 0 hits (engagement gate)"
        if gate == "liveness":
            live = (doc.get("figures") or {}).get("liveness") or {}
            if verdict.get("outcome") == "zero-hit":
                return (
                    f"⚠️ zero-hit: the liveness probe got {live.get('hits', 0)} hits, caching "
                    f"effectively disabled (liveness gate)"
                )
            return f"⚠️ zero-hit after the arm: liveness {live.get('hits', 0)} hits (liveness gate)"
        return f"⚠️ inconclusive ({gate} gate)"
    return "❌ error (no verdict)"


def _flips(doc: dict[str, Any]) -> str:
    """The graded waves' one-sided flips."""
    waves = [
        w
        for w in (doc.get("figures") or {}).get("waves", [])
        if (w.get("extra") or {}).get("graded", True) and w.get("forward_flips") is not None
    ]
    if not waves:
        return ""
    shown = ", ".join(f"{w['name']} {w['forward_flips']}/{w['reverse_flips']}" for w in waves)
    return f"; flips forward/reverse {shown}"


def _wave_hit_ratio(doc: dict[str, Any], wave: str) -> str:
    """One wave's own hit ratio, where its counters were kept."""
    counters = ((doc.get("counters") or {}).get("apc") or {}).get(wave)
    if not counters or not counters["prefix_cache_queries"]:
        return ""
    ratio = counters["prefix_cache_hits"] / counters["prefix_cache_queries"]
    return f", {wave.replace('wave', 'wave ')} {ratio:.3f}"


def _ladder_note(doc: dict[str, Any]) -> str:
    """The connector ladder beside a matrix cell: the rung without the connector."""
    reference = ladder.rung_document(doc)
    if reference is None:
        return ""
    supplied = (doc.get("ladder") or {}).get("external") or {}
    return (
        f" · without the connector: {reference['verdict']['status']}"
        f" · connector supplied {supplied.get('hits', 0)} tokens"
    )


def _answer_note(doc: dict[str, Any]) -> str:
    """The needle profiles' answer log-prob line beside a matrix cell, re-derived."""
    answers = answer_line(doc)
    return "" if answers is None else f" · {answer_logprob.short(answers)}"


def _witness_note(doc: dict[str, Any]) -> str:
    """The witness beside a matrix cell: its invalid restores by lane, or that it could not
    judge; nothing for artifacts from before it."""
    seen = witness.from_document(doc)
    if seen is None:
        return ""
    if seen.status != witness.LIVE:
        return " · witness: none"
    lanes = ", ".join(f"{n} {lane}" for lane, n in seen.by_lane.items() if n)
    text = f" · witness: {seen.invalid} invalid of {seen.restores}" + (
        f" ({lanes})" if lanes else ""
    )
    if not seen.complete:
        text += ", some not judged"
    return text


def render_matrix(runs: list[Run]) -> list[str]:
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for run in runs:
        for arm, doc in run.documents.items():
            rows.setdefault(condition(doc), {}).setdefault(arm, []).append(doc)
    if len(rows) < 2:
        return []
    return ["### Cross-verification", "", *matrix_table(rows), ""]


def matrix_table(
    rows: dict[str, dict[str, list[dict[str, Any]]]],
    *,
    columns: dict[str, dict[str, str]] | None = None,
    seed_figures: bool = False,
) -> list[str]:
    """The cross-verification table: one row per condition (its label -> arm -> artifacts),
    one column per arm, and the legend (`repro.fanout.matrix` renders MATRIX.md with it).
    ``columns``: label -> {title: text}, more columns after the condition's (the seed's
    caveats: which diff, how many runs)."""
    arms = [a for a in ARMS if any(a in r for r in rows.values())]
    arms += sorted({a for r in rows.values() for a in r} - set(arms))
    # "cured" only where the same arm corrupts under another condition without an injected
    # fault: a clean run beside a positive control is clean, not cured.
    corrupting = {
        arm
        for r in rows.values()
        for arm, docs in r.items()
        if any(
            d["verdict"]["status"] == "corrupted" and not d["fault_injection"]["enabled"]
            for d in docs
        )
    }
    titles = list(dict.fromkeys(t for c in (columns or {}).values() for t in c))
    table_rows = []
    for name, by_arm in rows.items():
        cells = [name, *((columns or {}).get(name, {}).get(t, "—") for t in titles)]
        for arm in arms:
            docs = by_arm.get(arm, [])
            texts = list(
                dict.fromkeys(
                    matrix_cell(d, arm in corrupting, seed_figures=seed_figures) for d in docs
                )
            )
            cells.append(" / ".join(texts) if texts else "—")
        table_rows.append(cells)
    lines = _table(["Condition", *titles, *(ARM_TITLES.get(a, a) for a in arms)], table_rows)
    lines += [
        "",
        "🔴 corrupts: the verdict is `corrupted` with the cache engaged; ✅ clean/cured: no "
        "one-sided flips past the margin with hits and drafts; 🟡 clean outputs while the "
        "restore witness saw invalid states: the model did not show them, so neither cured "
        "nor plain clean; ⚠️ zero-hit or inconclusive: "
        "the named gate stopped the arm, which is no evidence either way; one run per cell "
        "unless several are shown.",
    ]
    return lines


def render(runs: list[Run]) -> str:
    """The whole report for ``runs`` (run directories or bundles, see `repro.evidence.runs`)."""
    lines = [
        "## Hybrid-Mamba prefix-cache corruption: repro-kit results",
        "",
        f"{_plural(len(runs), 'run')}, rendered by repro-kit {__version__}. Arms and gates as "
        "in upstream issue #43559's reproducer: an APC-on run against an APC-off control, "
        "margin-graded and one-sided.",
        "",
    ]
    for run in runs:
        lines += render_run(run)
    lines += render_matrix(runs)
    return "\n".join(lines).rstrip("\n") + "\n"


__all__ = [
    "condition",
    "engagement",
    "matrix_cell",
    "matrix_table",
    "render",
    "result_text",
    "wave_numbers",
]
