"""Checks on a record's restore witness and answer log-prob line, shared by the test files
that run reverted trees and the trained needle model on the real engine."""

from __future__ import annotations

from repro.evidence import verdicts


def restores(doc: dict) -> list[dict]:
    return [
        restore
        for wave in doc["figures"]["waves"]
        for row in wave["per_request"]
        for restore in row.get("restores", [])
    ]


def judged_every_restore(doc: dict) -> dict:
    section = doc["witness"]
    assert section["status"] == "live", section
    assert section["unwitnessed"] == 0 and section["unjudged_hits"] == 0, section
    return section


def answer_line(doc: dict, record_property, label: str) -> dict:
    """The needle record's answer log-prob line: re-derived as recorded, recall its verdict,
    every request measured; its figures go to the test report."""
    line = doc["answer_logprob"]
    assert verdicts.check_verdict(doc).problems == []
    assert verdicts.answer_line(doc) == line
    assert line["decided_by"] == "recall"
    rows = [r for w in doc["figures"]["waves"] for r in w["per_request"]]
    hits = [r["answer_divergence"] for r in rows if r["num_cached_tokens"]]
    cold = [r["answer_divergence"] for r in rows if not r["num_cached_tokens"]]
    assert all(d is not None for d in hits + cold)
    record_property(
        "answer_logprob",
        f"{label}: {line['line']}; noise floor {line['noise_floor']} "
        f"({line['noise_samples']} samples); {len(hits)} cache-hit requests, largest answer "
        f"divergence {max(hits, default=None)}; cold {max(cold, default=None)}; "
        f"{doc['witness']['line']}",
    )
    return line
