"""The table printed at the end of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repro import answer_logprob, ladder, witness
from repro.evidence.report import ENGAGEMENT_LEGEND, engagement
from repro.evidence.verdicts import answer_line


def print_summary(documents: dict[str, dict[str, Any]], out_dir: Path) -> None:
    """One row per arm; with a connector ladder, one row per rung (the reference without the
    connector, then the run of record with it) and the ladder's finding below them."""
    # lazy: rich is slow to import; only output that draws needs it
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"repro results ({out_dir})", caption=ENGAGEMENT_LEGEND)
    columns = ("arm", "verdict", "hits / queries", "drafts", "reason", "witness", "answer log-prob")
    for column in columns:
        table.add_column(column, overflow="fold")
    findings = []
    for arm, doc in documents.items():
        reference = ladder.rung_document(doc)
        if reference is None:
            _add_row(table, arm, doc)
            continue
        spec = (doc.get("connector") or {}).get("spec", "?")
        _add_row(table, f"{arm}, no connector", reference)
        _add_row(table, f"{arm}, + {spec}", doc)
        findings.append(f"{arm}: {ladder.line(doc)}")
    console = Console()
    console.print(table)
    for text in findings:
        console.print(f"ladder, against the APC-off control: {text}")


def _add_row(table, arm: str, doc: dict[str, Any]) -> None:
    verdict = doc["verdict"]
    seen = witness.from_document(doc)
    status = witness.headline(verdict["status"], seen)
    status += f" ({verdict['gate']})" if verdict["gate"] else ""
    # The report's figures, so that one run shows one drafts figure wherever it is read.
    figures = engagement(doc) or {"hits": 0, "queries": 0, "drafts": 0}
    hits_text = f"{figures['hits']} / {figures['queries']}"
    seen_text = witness.line(seen).removeprefix("witness: ") if seen else "–"
    # Needle profiles only: the second line beside recall (`repro.answer_logprob`).
    answers = answer_line(doc)
    answers_text = (
        answer_logprob.note(answers).removeprefix("answer log-prob: ") if answers else "–"
    )
    table.add_row(
        arm, status, hits_text, str(figures["drafts"]), verdict["reason"], seen_text, answers_text
    )
