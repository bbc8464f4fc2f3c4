"""Deterministic needle-in-a-haystack prompts, sized in tokens.

A prompt is a fixed header, filler sentences with "security fact" lines spread among them, and
a question about one vault. The six-digit access codes come from a seeded RNG, so every run of
the kit sends byte-identical prompts. On a trained model the answer is graded by recall (is the
code in the output?); on the tiny random model only the prompt's size and sharing pattern
matter (see `repro.signals`).

Sizes are searched in tokens with the engine's own tokenizer: the arms are defined in multiples
of the Mamba block size, and a few tokens too many or too few move a prompt across a block
boundary.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

HEADER = (
    "You are a careful assistant. Below is a long record of facts. "
    "Read it and answer the question at the end."
)

FILLER_SENTENCES = [
    "The archive room was quiet that morning and the lamps hummed softly.",
    "A clerk sorted the ledgers by year and tied each bundle with string.",
    "Rain moved across the valley and the river rose a little by noon.",
    "The night guard wrote the same short note in the log every hour.",
    "Someone had left a cup of tea on the windowsill to go cold.",
    "The maps in the cabinet were older than anyone in the building.",
    "Two pigeons argued on the roof until the bell rang at midday.",
    "The inventory listed boxes, crates, folders and one broken chair.",
]

FOLLOW_UP = "Repeat the access code from the record once more. Reply with only the code."

CountTokens = Callable[[str], int]


def fact_line(vault: int, code: str) -> str:
    return f"Security fact {vault:02d}: the access code for vault-{vault:02d} is {code}."


def question_line(vault: int) -> str:
    return f"What is the access code for vault-{vault:02d}? Reply with only the code."


@dataclass(frozen=True)
class Haystack:
    """One record of facts: the shared context of every question asked about it."""

    seed: int
    codes: tuple[str, ...]
    filler_count: int

    def context(self) -> str:
        rng = random.Random(self.seed)
        filler = [rng.choice(FILLER_SENTENCES) for _ in range(self.filler_count)]
        facts = [fact_line(v, code) for v, code in enumerate(self.codes)]
        # Spread the facts evenly through the filler: fact k goes before filler sentence
        # round(k * len(filler) / len(facts)), so no fact sits only at an edge.
        slots: dict[int, list[str]] = {}
        for k, fact in enumerate(facts):
            slots.setdefault(round(k * len(filler) / len(facts)), []).append(fact)
        lines: list[str] = [HEADER]
        for i in range(len(filler) + 1):
            lines.extend(slots.get(i, []))
            if i < len(filler):
                lines.append(filler[i])
        return "\n".join(lines) + "\n"

    def prompt(self, vault: int) -> str:
        return self.context() + question_line(vault) + "\nAnswer:"


def make_codes(seed: int, count: int) -> tuple[str, ...]:
    rng = random.Random(seed)
    return tuple(f"{rng.randrange(100000, 1000000)}" for _ in range(count))


def sized_haystack(
    *, seed: int, vaults: int, target_tokens: int, count_tokens: CountTokens
) -> tuple[Haystack, int]:
    """The haystack whose prompt (asking about vault 0) is closest to `target_tokens`.

    Returns the haystack and its prompt's token count. Prompts for other vaults of the same
    haystack have the same length: vault numbers are always two digits.
    """
    codes = make_codes(seed, vaults)

    def size(filler_count: int) -> int:
        return count_tokens(Haystack(seed, codes, filler_count).prompt(0))

    low, high = 0, 1
    while size(high) < target_tokens:
        low, high = high, high * 2
        if high > 100_000:
            raise ValueError(f"cannot reach {target_tokens} tokens with filler sentences")
    # Smallest filler count whose prompt reaches the target, then pick the closer neighbour.
    while low < high:
        mid = (low + high) // 2
        if size(mid) < target_tokens:
            low = mid + 1
        else:
            high = mid
    best = min({max(0, low - 1), low}, key=lambda n: (abs(size(n) - target_tokens), n))
    haystack = Haystack(seed, codes, best)
    return haystack, size(best)


def fitted_haystack(
    *, seed: int, max_vaults: int, target_tokens: int, count_tokens: CountTokens
) -> tuple[Haystack, int]:
    """Like `sized_haystack`, with as many vaults (up to `max_vaults`) as fit the target.

    A small Mamba block (the tiny model's B is ~100-160) leaves room for only a few fact
    lines; at full scale every vault fits.
    """
    for vaults in range(max_vaults, 0, -1):
        haystack, tokens = sized_haystack(
            seed=seed, vaults=vaults, target_tokens=target_tokens, count_tokens=count_tokens
        )
        if tokens <= target_tokens or vaults == 1:
            return haystack, tokens
    raise AssertionError("unreachable")


def is_miss(output_text: str, code: str) -> bool:
    """Upstream's recall test: the needle is missed when its code is not in the output."""
    return code not in output_text
