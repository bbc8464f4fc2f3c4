"""The connector ladder: which rung of an arm corrupts, and what the connector did.

A run with a KV connector runs each arm's APC engine twice, against one APC-off control:
without the connector (the reference) and with it. Each rung is graded by the one grading
core (`repro.grading.grade`); this module only reads the two verdicts together, and the probe
connector's per-request records (`repro.vllm_plugin.probe_connector`) beside them.

"Corrupted only with the connector attached" is a finding about the connector path;
"corrupted with or without it" is the engine's own lane, which the connector does not change.
"""

from __future__ import annotations

from typing import Any

CONTROL = (
    "APC off, no connector: vLLM's connectors work on the prefix cache's blocks, and the "
    "control is the run that reads nothing from any cache"
)
# (reference status, connector status) -> finding
FINDINGS = {
    ("clean", "corrupted"): "corrupted-only-with-connector",
    ("corrupted", "corrupted"): "corrupted-with-and-without-connector",
    ("corrupted", "clean"): "corrupted-only-without-connector",
    ("clean", "clean"): "clean-on-every-rung",
}
WORDS = {
    "corrupted-only-with-connector": "corrupted only with the connector attached",
    "corrupted-with-and-without-connector": "corrupted with or without the connector",
    "corrupted-only-without-connector": "corrupted only without the connector",
    "clean-on-every-rung": "clean with and without the connector",
    "inconclusive": "a rung could not be graded",
}


def finding(reference: str, connector: str) -> str:
    """The ladder's finding from the two rungs' verdict statuses."""
    return FINDINGS.get((reference, connector), "inconclusive")


def rung_document(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The reference rung as a run document of its own (the same control), so every reader
    re-derives and shows it as it does a run; None without a ladder."""
    ladder = doc.get("ladder")
    if not isinstance(ladder, dict) or not isinstance(ladder.get("reference"), dict):
        return None
    rung = ladder["reference"]
    counters = doc.get("counters") or {}
    return {
        **doc,
        "counters": {"apc": rung.get("counters"), "control": counters.get("control")},
        "signal": rung.get("signal"),
        "figures": rung.get("figures"),
        "witness": rung.get("witness"),
        "verdict": rung.get("verdict"),
        "answer_logprob": rung.get("answer_logprob"),
        "connector": None,
        "ladder": None,
    }


def external(counters: dict[str, dict[str, int]] | None, waves: list[str]) -> dict[str, int]:
    """Tokens the connector was asked for and supplied over `waves` (vLLM's external
    prefix-cache counters)."""
    counters = counters or {}
    return {
        key: sum(int((counters.get(w) or {}).get(f"external_prefix_cache_{key}", 0)) for w in waves)
        for key in ("queries", "hits")
    }


def probe_summary(per_request: list[dict[str, Any]]) -> dict[str, Any]:
    """The probe's records over the graded requests: how many resumed past a group's own hit
    with nothing supplied to cover the rest, by the group that lagged, with an example."""
    records = [r["connector"] for r in per_request if isinstance(r.get("connector"), dict)]
    summary: dict[str, Any] = {
        "requests": len(records),
        "with_group_hits": sum(1 for r in records if "group_hits" in r),
        "supplied_tokens": sum(int(r.get("supplied") or 0) for r in records),
    }
    for kind in GROUP_KINDS:
        past = [r for r in records if kind in lagging_groups(r)]
        summary[f"resumed_past_{kind}"] = len(past)
        if past and "example" not in summary:
            summary["example"] = describe(past[0])
    return summary


# Group kinds as the probe records them; the Mamba group's lag is the lane the issue names.
GROUP_KINDS = ("mamba", "attention")


def lagging_groups(record: dict[str, Any]) -> list[str]:
    """The group kinds whose own hit, plus what the connector supplied, stops short of where
    the request resumed. For Mamba that is a state never restored there. For attention it is
    the scheduler's choice only: under MTP attention's own hit drops its last matched block,
    whose KV may still be held (docs/connector.md, "Measured")."""
    resumed = record.get("resumed")
    if resumed is None:
        return []
    supplied = int(record.get("supplied") or 0)
    hits = record.get("group_hits") or {}
    return [kind for kind in GROUP_KINDS if kind in hits and resumed > hits[kind] + supplied]


def describe(record: dict[str, Any]) -> str:
    hits = record.get("group_hits") or {}
    return (
        f"resumed at {record.get('resumed')} while the full-attention group's own hit was "
        f"{hits.get('attention')}, the Mamba group's {hits.get('mamba')}, and the connector "
        f"supplied {record.get('supplied', 0)}"
    )


def line(doc: dict[str, Any], reference_status: str | None = None) -> str | None:
    """One line for tables and reports: the finding, what the connector supplied, and the
    probe's witness; None for a run without a connector."""
    ladder = doc.get("ladder")
    if not isinstance(ladder, dict):
        return None
    status = (doc.get("verdict") or {}).get("status", "?")
    reference = reference_status or ((ladder.get("reference") or {}).get("verdict") or {}).get(
        "status", "?"
    )
    code = finding(reference, status)
    parts = [f"{WORDS[code]} (without: {reference}, with: {status})"]
    supplied = ladder.get("external") or {}
    if supplied:
        parts.append(
            f"the connector supplied {supplied.get('hits', 0)} of "
            f"{supplied.get('queries', 0)} tokens asked"
        )
    probe = ladder.get("probe") or {}
    if probe.get("requests"):
        parts.append(
            f"of {probe['requests']} requests, {probe.get('resumed_past_mamba', 0)} resumed "
            f"past the Mamba group's hit and {probe.get('resumed_past_attention', 0)} past "
            "attention's"
        )
    return "; ".join(parts)
