"""The table printed at the end of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def print_summary(documents: dict[str, dict[str, Any]], out_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"repro results ({out_dir})")
    for column in ("arm", "verdict", "hits / queries", "drafts", "reason"):
        table.add_column(column, overflow="fold")
    for arm, doc in documents.items():
        verdict = doc["verdict"]
        status = verdict["status"] + (f" ({verdict['gate']})" if verdict["gate"] else "")
        # The arm's waves only: the liveness probe is reported by its own gate.
        apc = {
            name: c
            for name, c in ((doc.get("counters") or {}).get("apc") or {}).items()
            if name != "liveness"
        }
        hits = sum(c["prefix_cache_hits"] for c in apc.values())
        queries = sum(c["prefix_cache_queries"] for c in apc.values())
        drafts = sum(c["spec_decode_num_drafts"] for c in apc.values())
        table.add_row(arm, status, f"{hits} / {queries}", str(drafts), verdict["reason"])
    Console().print(table)
