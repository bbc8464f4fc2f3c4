"""The kit's one clock: UTC, whole seconds, written as RFC 3339 with ``Z``.

Every time the kit records (artifacts, records, manifests, locks) is written by `utc_text`,
so all of them read alike and sort as text; `utc_compact` is the same instant for file and
run names. Standard library only: the install-set installer on a bare host uses it too.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["utc_compact", "utc_now", "utc_text"]


def utc_now() -> datetime:
    """Now, in UTC, to the second."""
    return datetime.now(UTC).replace(microsecond=0)


def _instant(when: datetime | float | None) -> datetime:
    if when is None:
        return utc_now()
    if isinstance(when, datetime):
        return when.astimezone(UTC)
    return datetime.fromtimestamp(int(when), tz=UTC)


def utc_text(when: datetime | float | None = None) -> str:
    """``2026-12-01T05:00:00Z`` for ``when`` (an aware datetime or POSIX seconds; default now)."""
    return _instant(when).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc_compact(when: datetime | float | None = None) -> str:
    """``20261201T050000Z``: the same instant for a file or run name."""
    return _instant(when).strftime("%Y%m%dT%H%M%SZ")
