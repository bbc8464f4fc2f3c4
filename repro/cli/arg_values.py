"""Values of command-line options that argparse's own types do not check."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive_int(text: str) -> int | None:
    """`text` as a whole number of 1 or more, or None (the caller names what it expected)."""
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 1 else None


def positive_int_type(message: str) -> Callable[[str], int]:
    """An argparse `type` for a whole number of 1 or more; anything else is refused with
    `message`, in which `{text!r}` is what was given."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value is None:
            raise argparse.ArgumentTypeError(message.format(text=text))
        return value

    return parse
