"""Values of command-line options that argparse's own types do not check."""

from __future__ import annotations


def positive_int(text: str) -> int | None:
    """`text` as a whole number of 1 or more, or None (the caller names what it expected)."""
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 1 else None
