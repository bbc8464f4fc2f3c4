"""Deterministic needle prompts, built by upstream's rules and sized in tokens.

Every arm asks questions about one *manual*: a header, filler sentences with "security fact"
lines spread through them, and a footer. The rules are those of upstream's reproducer
(`tests/v1/e2e/test_hybrid_mamba_prefix_cache_correctness.py`, upstream PR #48361); the
wording is the kit's own. `docs/prompts.md` describes the format with an example.

- A manual of `target` tokens carries `max(8, min(40, target // 70))` facts (`needle_count`).
- The filler count is searched so that the manual (without the question) lands as close to
  the target as one filler sentence allows, and is spread over the facts' slots: fact *i*
  ends slot *i*, the first slots taking one sentence more when the count does not divide.
  Filler sentences are used in order, cycling.
- The codes are six digits, zero-padded, drawn in order from one RNG seeded with
  `CODE_SEED`, so a manual with more facts extends the codes of a shorter one.
- A question follows the manual: `Question: ...\\nAnswer:`. A miss is an answer that does not
  contain the asked code as a substring (`is_miss`).

The arms' uses (upstream's): cold-race asks fact `num_needles - 2` sixteen times, then every
fact once (`cold_race_waves`); its liveness probe is a second, longer manual; multi-turn
asks for "the procedure" of vault *i* (`procedure_question`), then sends the first turn's
prompt, its output, a blank line and a question about vault `(7 i + 3) mod num_needles`
(`second_turn`, `second_turn_vault`).

Sizes are searched with the engine's own tokenizer (`CountTokens`): the arms are defined in
multiples of the Mamba block size, and a few tokens move a prompt across a block boundary.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

HEADER = (
    "You are a careful assistant. Below is a long record of facts. "
    "Read it and answer the question at the end."
)
FOOTER = "End of the record. Answer from the codes written above and nothing else."

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

# Upstream's constants for the number of facts in a manual of `target` tokens.
MIN_NEEDLES = 8
MAX_NEEDLES = 40
TOKENS_PER_NEEDLE = 70
# Upstream's code seed: the kit asks for the same codes upstream's test does.
CODE_SEED = 20260709
# The filler search stops doubling here (upstream's bound); a target beyond it is refused.
MAX_FILLER = 4096

CountTokens = Callable[[str], int]


def fact_line(vault: int, code: str) -> str:
    return f"Security fact {vault:02d}: the access code for vault-{vault:02d} is {code}."


def question_line(vault: int) -> str:
    return f"What is the access code for vault-{vault:02d}? Reply with only the code."


def needle_question(vault: int) -> str:
    """The recall question that follows a manual (or a first turn and its answer)."""
    return f"Question: {question_line(vault)}\nAnswer:"


def procedure_line(vault: int) -> str:
    return f"Describe, step by step, the procedure for opening vault-{vault:02d}."


def procedure_question(vault: int) -> str:
    """Multi-turn's first question: an open answer, long enough to decode past a boundary."""
    return f"Question: {procedure_line(vault)}\nAnswer:"


def needle_count(target_tokens: int) -> int:
    """Upstream's number of facts for a manual of `target_tokens`."""
    return max(MIN_NEEDLES, min(MAX_NEEDLES, target_tokens // TOKENS_PER_NEEDLE))


def make_codes(count: int, seed: int = CODE_SEED) -> tuple[str, ...]:
    rng = random.Random(seed)
    return tuple(f"{rng.randint(0, 999_999):06d}" for _ in range(count))


@dataclass(frozen=True)
class Manual:
    """One manual: the shared prefix of every question an arm asks about it."""

    codes: tuple[str, ...]
    filler_count: int

    @property
    def num_needles(self) -> int:
        return len(self.codes)

    def text(self) -> str:
        base, extra = divmod(self.filler_count, self.num_needles)
        lines = [HEADER, ""]
        used = 0
        for vault, code in enumerate(self.codes):
            for _ in range(base + (1 if vault < extra else 0)):
                lines.append(FILLER_SENTENCES[used % len(FILLER_SENTENCES)])
                used += 1
            lines.append(fact_line(vault, code))
        lines += ["", FOOTER, "", ""]
        return "\n".join(lines)

    def prompt(self, vault: int) -> str:
        """The manual and a recall question about `vault`."""
        return self.text() + needle_question(vault)

    def procedure_prompt(self, vault: int) -> str:
        """The manual and multi-turn's first question about `vault`."""
        return self.text() + procedure_question(vault)


def sized_manual(
    *,
    target_tokens: int,
    count_tokens: CountTokens,
    num_needles: int | None = None,
    code_seed: int = CODE_SEED,
) -> tuple[Manual, int]:
    """The manual closest to `target_tokens` (question excluded), and its token count.

    `num_needles` defaults to upstream's `needle_count(target_tokens)`; a profile whose block
    is too small for that many facts passes fewer (and says so in `docs/fidelity.md`).
    Token counts grow with the filler count, so it is searched: doubled until the target is
    reached, then bisected; of the two neighbours the closer wins, the shorter on a tie.
    `code_seed` draws other codes: a manual that shares no block with upstream's.
    """
    count = needle_count(target_tokens) if num_needles is None else num_needles
    if count < 1:
        raise ValueError(f"a manual needs at least one fact; got num_needles={count}")
    codes = make_codes(count, code_seed)
    sizes: dict[int, int] = {}

    def size(filler: int) -> int:
        if filler not in sizes:
            sizes[filler] = count_tokens(Manual(codes, filler).text())
        return sizes[filler]

    low, high = 0, 8
    while size(high) < target_tokens:
        if high >= MAX_FILLER:
            raise ValueError(
                f"cannot reach a {target_tokens}-token manual with {MAX_FILLER} filler "
                f"sentences ({size(high)} tokens); the target is larger than any arm needs"
            )
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        if size(mid) < target_tokens:
            low = mid
        else:
            high = mid
    best = min((low, high), key=lambda n: abs(size(n) - target_tokens))
    return Manual(codes, best), size(best)


# -- the arms' questions ------------------------------------------------------------------


@dataclass(frozen=True)
class ColdRaceWaves:
    """Wave 1: the same near-end question, `copies` times; wave 2: one question per fact."""

    wave1_vault: int
    wave1: list[str]
    wave2_vaults: list[int]
    wave2: list[str]


def cold_race_waves(manual: Manual, copies: int) -> ColdRaceWaves:
    # A fact near the end of the prefix (upstream: recall there is reliable even on models
    # that recall distant facts poorly; a wrong state garbles it wherever it sits).
    wave1_vault = max(0, manual.num_needles - 2)
    vaults = list(range(manual.num_needles))
    return ColdRaceWaves(
        wave1_vault=wave1_vault,
        wave1=[manual.prompt(wave1_vault)] * copies,
        wave2_vaults=vaults,
        wave2=[manual.prompt(v) for v in vaults],
    )


def multi_turn_first(manuals: list[Manual]) -> list[str]:
    """First turns: request i asks its manual for the procedure of vault i (numbers past the
    manual's last fact are asked too, as upstream does: the answer is decoded, never graded)."""
    return [manual.procedure_prompt(i) for i, manual in enumerate(manuals)]


def second_turn_vault(index: int, num_needles: int) -> int:
    """The vault the second turn of request `index` asks about: a different one."""
    return (7 * index + 3) % num_needles


SECOND_TURN_SEPARATOR = "\n\n"


def second_turn(first_prompt: str, first_output: str, vault: int) -> str:
    """The second turn as text (re-tokenized by the engine, as upstream sends it)."""
    return first_prompt + first_output + second_turn_suffix(vault)


def second_turn_suffix(vault: int) -> str:
    """What the second turn appends after the first turn's output."""
    return SECOND_TURN_SEPARATOR + needle_question(vault)


def is_miss(output_text: str, code: str) -> bool:
    """Upstream's recall test: the needle is missed when its code is not in the output."""
    return code not in output_text
