"""Compare two labs' runs: same image, model and settings? Do the verdicts agree?

`python -m repro compare A B` (run directories or one-run bundles) prints Markdown: what each
side ran (image, model and its revision, vLLM, patches, engine settings, fault injection,
hardware side by side), then per arm both verdicts and how the figures differ, the needle
profiles' answer log-prob line among them (in the report's words). The exit status
is 1 when a verdict disagrees (or an arm ran on one side only): two labs that reach different
verdicts on the same arm have something to explain.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro import answer_logprob, witness
from repro.core.vocabulary import ARMS
from repro.evidence import report
from repro.evidence.runs import EvidenceError, Run
from repro.evidence.verdicts import answer_line
from repro.evidence.verify import load_runs

# Environment entries that differ by construction (the run's own context, this checkout).
_UNCOMPARED_ENV = frozenset({"REPRO_RUN_CONTEXT", "REPRO_KIT_CHECKOUT"})
# Said where a record has no answer log-prob line, rather than an empty cell.
NOT_RECORDED = "not recorded"


@dataclass
class Comparison:
    markdown: str
    disagreements: list[str]

    @property
    def agree(self) -> bool:
        return not self.disagreements


def load_one(path: Path) -> Run:
    runs = load_runs([path])
    if len(runs) != 1:
        labels = ", ".join(r.label for r in runs)
        raise EvidenceError(
            f"{path}: holds {len(runs)} runs ({labels}); compare takes one run a side. "
            "Give the run directories, or a bundle of one run each"
        )
    return runs[0]


def _image(run: Run) -> str:
    return report.image_text(run)


def _model(run: Run) -> str:
    profile = run.first["profile"]
    files = Path(profile["model_path"]).name if profile.get("model_path") else "?"
    return f"{profile['model']} ({files})"


def _weights(run: Run) -> str:
    manifest = run.weights_manifest
    if not manifest:
        return "no manifest"
    listing = sorted((f["path"], f["sha256"]) for f in manifest["files"])
    digest = hashlib.sha256(repr(listing).encode()).hexdigest()[:16]
    return f"{len(listing)} files, {manifest['total_bytes']} bytes, listing {digest}"


def _settings_diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    keys = sorted(set(a) | set(b))
    changed = [k for k in keys if a.get(k, "<unset>") != b.get(k, "<unset>")]
    if not changed:
        return "identical"
    return "differ: " + "; ".join(
        f"{k} {a.get(k, '<unset>')!r} → {b.get(k, '<unset>')!r}" for k in changed
    )


def _plural(n: int, word: str) -> str:
    return f"{n} {word if n == 1 else word[:-1] + 'ies' if word.endswith('y') else word + 's'}"


def _engine(doc: dict[str, Any], key: str) -> dict[str, Any]:
    section = (doc.get("engine") or {}).get(key) or {}
    if key == "environment":
        return {k: v for k, v in section.items() if k not in _UNCOMPARED_ENV}
    return section


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _delta(a: Any, b: Any) -> str:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        diff = b - a
        if diff == 0:
            return "="
        return f"{diff:+.4f}" if isinstance(diff, float) else f"{diff:+d}"
    return "=" if a == b else "differs"


def arm_figures(doc: dict[str, Any]) -> dict[str, Any]:
    """The figures compared per arm, by name (None where the record has none)."""
    figures: dict[str, Any] = {}
    counts = report.engagement(doc)
    figures["prefix-cache queries"] = counts["queries"] if counts else None
    figures["prefix-cache hits"] = counts["hits"] if counts else None
    figures["hit ratio"] = (
        round(counts["hits"] / counts["queries"], 4) if counts and counts["queries"] else None
    )
    figures["drafts"] = counts["drafts"] if counts else None
    signal = doc.get("signal") or {}
    figures["threshold"] = signal.get("threshold")
    figures["noise floor"] = signal.get("noise_floor")
    for wave in (doc.get("figures") or {}).get("waves", []):
        if not (wave.get("extra") or {}).get("graded", True):
            continue
        name = wave["name"]
        figures[f"{name} forward flips"] = wave["forward_flips"]
        figures[f"{name} reverse flips"] = wave["reverse_flips"]
        figures[f"{name} distinct outputs (APC / control)"] = (
            f"{wave['apc']['distinct_outputs']} / {wave['control']['distinct_outputs']}"
        )
        median = (wave.get("extra") or {}).get("median_divergence_cache_hit")
        if median is not None:
            figures[f"{name} median divergence, cache hits"] = median
    live = (doc.get("figures") or {}).get("liveness")
    if live:
        figures["liveness hits"] = live["hits"]
    section = doc.get("ladder")
    if isinstance(section, dict):
        figures["connector"] = (doc.get("connector") or {}).get("spec")
        figures["ladder finding"] = section.get("finding")
        figures["without the connector"] = (section["reference"].get("verdict") or {}).get("status")
        external = section.get("external") or {}
        figures["connector supplied / asked (tokens)"] = (
            f"{external.get('hits')} / {external.get('queries')}"
        )
        probe = section.get("probe") or {}
        figures["probe: resumed past the Mamba hit"] = probe.get("resumed_past_mamba")
        figures["probe: resumed past attention's hit"] = probe.get("resumed_past_attention")
    seen = witness.from_document(doc)
    if seen is not None:
        figures["witness: restores judged"] = seen.restores if seen.status == witness.LIVE else None
        for lane in witness.LANES:
            figures[f"witness: invalid restores, {lane} lane"] = (
                seen.by_lane.get(lane, 0) if seen.status == witness.LIVE else None
            )
    figures.update(answer_figures(doc))
    return figures


def answer_figures(doc: dict[str, Any]) -> dict[str, str]:
    """The needle profiles' answer log-prob line in the report's words, and the signal the
    record says decided the verdict; `not recorded` where it has no line. Re-derived, as the
    report does: the loader has refused any record whose line does not follow."""
    answers = answer_line(doc)
    if answers is None:
        kind = (doc.get("signal") or {}).get("kind", "")
        # On the log-prob signal the log-probs are the verdict itself: no second line.
        why = "" if answer_logprob.applies(kind) else " (log-prob signal: it is the verdict)"
        return {"answer log-prob line": NOT_RECORDED + why, "verdict decided by": NOT_RECORDED}
    return {
        "answer log-prob line": answer_logprob.note(answers),
        "verdict decided by": answers["decided_by"],
    }


def compare(a: Run, b: Run, *, names: tuple[str, str] = ("A", "B")) -> Comparison:
    na, nb = names
    fa, fb = a.first, b.first
    lines = [
        f"## repro-kit comparison: {na} `{a.label}` vs {nb} `{b.label}`",
        "",
        f"| | {na} | {nb} | Same? |",
        "|---|---|---|---|",
    ]

    def row(what: str, va: str, vb: str, verdict: str | None = None) -> None:
        verdict = verdict or ("yes" if va == vb else "**no**")
        cells = [what, va, vb, verdict]
        lines.append("| " + " | ".join(report._cell(c) for c in cells) + " |")

    row("Image", _image(a), _image(b))
    row("Model", _model(a), _model(b))
    row("Model revision", report.model_revision_text(fa), report.model_revision_text(fb))
    row("Weights manifest", _weights(a), _weights(b))
    row("vLLM", report.vllm_text(fa), report.vllm_text(fb))
    row("Patches", report.patches_text(fa), report.patches_text(fb))
    row("Fault injection", report.fault_text(a), report.fault_text(b))
    arms = [arm for arm in ARMS if arm in a.documents or arm in b.documents]
    arms += sorted((set(a.documents) | set(b.documents)) - set(arms))
    for key, title in (
        ("apc_run", "APC-run settings"),
        ("control_run", "control settings"),
        ("overrides", "overrides"),
        ("environment", "engine environment"),
    ):
        for arm in arms:
            if arm in a.documents and arm in b.documents:
                sa, sb = _engine(a.documents[arm], key), _engine(b.documents[arm], key)
                diff = _settings_diff(sa, sb)
                row(
                    f"{report.ARM_TITLES.get(arm, arm)} {title}",
                    _plural(len(sa), "entry"),
                    _plural(len(sb), "entry"),
                    "yes" if diff == "identical" else f"**no**: {diff}",
                )
    row("Hardware", report.hardware_text(fa), report.hardware_text(fb))
    row("Kit", report.kit_text(fa), report.kit_text(fb))
    lines.append("")

    disagreements: list[str] = []
    lines += ["| Arm | " + na + " verdict | " + nb + " verdict | Agree? |", "|---|---|---|---|"]
    for arm in arms:
        da, db = a.documents.get(arm), b.documents.get(arm)
        title = report.ARM_TITLES.get(arm, arm)
        va = _verdict(da)
        vb = _verdict(db)
        agree = da is not None and db is not None and _key(da) == _key(db)
        if not agree:
            disagreements.append(f"{arm}: {va} vs {vb}")
        cells = [title, va, vb, "yes" if agree else "**NO**"]
        lines.append("| " + " | ".join(report._cell(c) for c in cells) + " |")
    lines.append("")

    for arm in arms:
        da, db = a.documents.get(arm), b.documents.get(arm)
        if da is None or db is None:
            continue
        xa, xb = arm_figures(da), arm_figures(db)
        lines += [
            f"{report.ARM_TITLES.get(arm, arm)} figures:",
            "",
            f"| Figure | {na} | {nb} | Δ ({nb} − {na}) |",
            "|---|---|---|---|",
        ]
        for name in list(dict.fromkeys([*xa, *xb])):
            va, vb = xa.get(name), xb.get(name)
            cells = [name, _fmt(va), _fmt(vb), _delta(va, vb)]
            lines.append("| " + " | ".join(report._cell(c) for c in cells) + " |")
        lines.append("")
    if disagreements:
        lines.append("**Verdicts disagree** on " + "; ".join(disagreements) + ".")
    else:
        lines.append(f"Verdicts agree on all {len(arms)} arm(s).")
    return Comparison("\n".join(lines) + "\n", disagreements)


def _key(doc: dict[str, Any]) -> tuple[str, str | None]:
    return doc["verdict"]["status"], doc["verdict"]["gate"]


def _verdict(doc: dict[str, Any] | None) -> str:
    if doc is None:
        return "not run"
    status, gate = _key(doc)
    text = witness.headline(status, witness.from_document(doc))
    return text + (f" ({gate})" if gate else "")


__all__ = ["NOT_RECORDED", "Comparison", "answer_figures", "arm_figures", "compare", "load_one"]
