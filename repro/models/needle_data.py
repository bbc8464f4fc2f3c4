"""Training and held-out examples for the tiny needle model: vault manuals, questions, answers.

The model must answer the arms' questions on prompts it has never seen, so it is trained on a
distribution wider than the arms' prompts, not on the prompts themselves:
- manuals in upstream's shape and in the kit's (`repro.arms.prompts`): a header, filler lines,
  "Security fact NN: the access code for vault-NN is CODE." lines spread through them, a
  footer; and in looser shapes: other headers and footers, filler made up from a word list,
  needles anywhere, shuffled or numbered out of order;
- 2 to 16 needles, manuals of about 60 to 1,100 tokens (the liveness probe's 3 B + 128 with
  B = 288 is 992);
- after the manual, several turns: a code question answered with the code and a newline
  (upstream stops at the newline), or a "describe the procedure" question answered with filler
  text cut at any point, as the multi-turn arm's first turn is, then the next question.

Codes are drawn at random per example, so no code can be memorised: an answer must come from
the manual. Each example is text plus character spans that say which characters are trained
on, and how strongly; `encode` turns that into token ids and per-token loss weights.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from repro.arms import prompts

UPSTREAM_HEADER = (
    "You are the security auditor for the Meridian facility. Below is the facility manual. "
    "Memorize every access code exactly as written; you will be quizzed on them.\n\n"
)
UPSTREAM_FOOTER = (
    "\nEnd of manual. Answer each question using ONLY the codes from the manual above.\n\n"
)
UPSTREAM_FILLERS = [
    "Routine inspections of the corridor systems must be logged in the master ledger before "
    "the end of each shift without exception.",
    "All personnel are reminded that badge access records are audited weekly by the "
    "compliance office and discrepancies are escalated.",
    "Environmental sensors in every wing report temperature and humidity readings to the "
    "central monitoring desk on an hourly schedule.",
    "Maintenance requests for lighting, ventilation, or plumbing should be filed through the "
    "standard facilities portal before noon.",
    "Emergency assembly points are marked on the floor plans posted beside every stairwell "
    "entrance in the main building.",
    "Contractors must be escorted at all times and their equipment must be inventoried upon "
    "both entry and exit from the site.",
]
# The kit's manual shape is `repro.arms.prompts`' own, with the spacing the examples join it with.
KIT_HEADER = prompts.HEADER + "\n\n"
KIT_FOOTER = f"\n{prompts.FOOTER}\n\n"
KIT_FILLERS = prompts.FILLER_SENTENCES
OTHER_HEADERS = [
    "Facility handbook, restricted copy. Read every section before the quiz.\n\n",
    "Below is the operations manual of the north depot. Keep the access codes in mind.\n",
    "Security briefing for new staff. The manual follows.\n\n",
]
_SUBJECTS = [
    "The duty officer",
    "Every visitor",
    "The night shift",
    "The compliance office",
    "A senior engineer",
    "The front desk",
    "Each contractor",
    "The records team",
    "The facilities crew",
    "The auditor",
    "The control room",
    "All staff",
]
_VERBS = [
    "checks",
    "records",
    "reviews",
    "reports",
    "inspects",
    "files",
    "updates",
    "signs",
    "seals",
    "escorts",
    "confirms",
    "logs",
]
_OBJECTS = [
    "the badge readers",
    "the corridor lights",
    "the supply ledger",
    "the loading dock",
    "the humidity readings",
    "the visitor list",
    "the stairwell doors",
    "the alarm panel",
    "the weekly report",
    "the server room",
    "the fire exits",
    "the key cabinet",
]
_TAILS = [
    "before the end of each shift.",
    "every morning without exception.",
    "on an hourly schedule.",
    "when the bell rings at noon.",
    "after every inspection.",
    "and escalates any discrepancy.",
    "as the handbook requires.",
    "twice a week.",
    "before any contractor enters.",
    "at the close of business.",
]


def code_question(vault: int, style: int = 0) -> str:
    """Upstream's question, which the arms ask (style 0), or the kit's earlier wording: the
    same line without "Question: " (style 1)."""
    if style == 0:
        return prompts.needle_question(vault)
    return f"{prompts.question_line(vault)}\nAnswer:"


def procedure_question(vault: int, style: int = 0) -> str:
    """Upstream's multi-turn first-turn question (style 0) or the kit's, which the arms ask
    (style 1)."""
    if style == 0:
        return (
            f"Question: Describe the audit and escalation procedure for vault-{vault:02d} "
            f"in detail.\nAnswer:"
        )
    return prompts.procedure_question(vault)


def made_up_sentence(rng: random.Random) -> str:
    return " ".join(
        [rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS), rng.choice(_TAILS)]
    )


def tokenizer_corpus(seed: int = 0) -> list[str]:
    """Text the tokenizer's merges are learnt from: every fixed sentence and many made-up
    ones; digits are split by the tokenizer itself, so codes never become merges."""
    rng = random.Random(seed)
    lines = [UPSTREAM_HEADER, UPSTREAM_FOOTER, KIT_HEADER, KIT_FOOTER, *OTHER_HEADERS]
    lines += UPSTREAM_FILLERS + KIT_FILLERS
    lines += [made_up_sentence(rng) for _ in range(400)]
    for vault in range(40):
        code = f"{rng.randint(0, 999999):06d}"
        lines += [prompts.fact_line(vault, code), code_question(vault, 0), code_question(vault, 1)]
        lines += [procedure_question(vault, 0), procedure_question(vault, 1)]
    return lines * 3


@dataclass
class Example:
    """Text with weighted character spans: (start, end, weight)."""

    text: str = ""
    spans: list[tuple[int, int, float]] = field(default_factory=list)
    # (char offset of the answer, code) per code question, for exact-recall checks.
    answers: list[tuple[int, str]] = field(default_factory=list)

    def add(self, piece: str, weight: float) -> None:
        start = len(self.text)
        self.text += piece
        if weight and piece:
            self.spans.append((start, len(self.text), weight))


@dataclass(frozen=True)
class Difficulty:
    """How hard examples are: the curriculum raises these over training."""

    max_needles: int = 16
    max_fillers: int = 48
    max_turns: int = 5


def manual(
    ex: Example, rng: random.Random, *, needles: int, fillers: int, lm_weight: float, style: str
) -> dict[int, str]:
    """Append a manual to `ex`; return vault -> code."""
    if style in ("upstream", "kit") or rng.random() < 0.5:
        vaults = list(range(needles))
    else:
        vaults = rng.sample(range(100), needles)
        if rng.random() < 0.5:
            vaults.sort()
    codes = {v: f"{rng.randint(0, 999999):06d}" for v in vaults}
    pool = {
        "upstream": UPSTREAM_FILLERS,
        "kit": KIT_FILLERS,
    }.get(style)
    header = {
        "upstream": UPSTREAM_HEADER,
        "kit": KIT_HEADER,
    }.get(style) or rng.choice([UPSTREAM_HEADER, KIT_HEADER, *OTHER_HEADERS, ""])

    def filler(index: int) -> str:
        if pool is not None:
            return pool[index % len(pool)]
        choice = rng.random()
        if choice < 0.3:
            return rng.choice(UPSTREAM_FILLERS)
        if choice < 0.5:
            return rng.choice(KIT_FILLERS)
        return made_up_sentence(rng)

    ex.add(header, lm_weight)
    # Slot sizes: upstream's (fillers split evenly, the remainder to the first slots, each
    # fact at the end of its slot) or random, so a needle can sit anywhere.
    if style in ("upstream", "kit") or rng.random() < 0.5:
        base, extra = divmod(fillers, needles)
        slots = [base + (1 if i < extra else 0) for i in range(needles)]
    else:
        cuts = sorted(rng.randint(0, fillers) for _ in range(needles - 1))
        slots = [b - a for a, b in zip([0, *cuts], [*cuts, fillers], strict=True)]
    used = 0
    for vault, size in zip(vaults, slots, strict=True):
        for _ in range(size):
            ex.add(filler(used) + "\n", lm_weight)
            used += 1
        # The code's digits are random: nothing to learn from predicting them.
        ex.add(f"Security fact {vault:02d}: the access code for vault-{vault:02d} is ", lm_weight)
        ex.add(codes[vault], 0.0)
        ex.add(".\n", lm_weight)
    if style == "upstream":
        ex.add(UPSTREAM_FOOTER, lm_weight)
    elif style == "kit":
        ex.add(KIT_FOOTER, lm_weight)
    else:
        ex.add(rng.choice([UPSTREAM_FOOTER, KIT_FOOTER, "", "\n"]), lm_weight)
    return codes


def training_example(
    rng: random.Random, difficulty: Difficulty, *, lm_weight: float = 0.1
) -> Example:
    ex = Example()
    needles = rng.randint(2, max(2, difficulty.max_needles))
    fillers = rng.randint(0, difficulty.max_fillers)
    style = rng.choice(["upstream", "kit", "kit", "mixed", "mixed"])
    codes = manual(ex, rng, needles=needles, fillers=fillers, lm_weight=lm_weight, style=style)
    vaults = list(codes)
    for turn in range(rng.randint(1, difficulty.max_turns)):
        if turn:
            ex.add(rng.choice(["\n", "\n\n", ""]), lm_weight)
        if rng.random() < 0.2:
            # The multi-turn arm's first turn: a procedure question, answered at length with
            # filler (what the model then says), cut wherever min/max_tokens cut it.
            ex.add(procedure_question(rng.randrange(100), rng.randrange(2)), lm_weight)
            text = " " + " ".join(made_up_sentence(rng) for _ in range(rng.randint(1, 25)))
            text = text[: rng.randint(1, len(text))]
            ex.add(text, lm_weight)
            ex.add("\n\n", 0.0)
        vault = rng.choice(vaults)
        ex.add(code_question(vault, 0 if rng.random() < 0.8 else 1), lm_weight)
        ex.answers.append((len(ex.text), codes[vault]))
        ex.add(" " + codes[vault] + "\n", 1.0)
    return ex


def eval_example(
    rng: random.Random, *, needles: int, fillers: int, asked: int, kind: str
) -> Example:
    """A held-out prompt in the kit's manual shape (`repro.arms.prompts`), asking about `asked`.

    kind "cold-race": manual + question; "multi-turn": manual + procedure question + a
    made-up answer of ~300 characters + "\\n\\n" + question.
    """
    ex = Example()
    codes = manual(ex, rng, needles=needles, fillers=fillers, lm_weight=0.0, style="kit")
    if kind == "multi-turn":
        ex.add(procedure_question(rng.randrange(needles), 1), 0.0)
        text = " " + " ".join(made_up_sentence(rng) for _ in range(60))
        ex.add(text[: rng.randint(800, 1400)], 0.0)
        ex.add("\n\n", 0.0)
    ex.add(code_question(asked, 0), 0.0)
    ex.answers.append((len(ex.text), codes[asked]))
    ex.add(" " + codes[asked] + "\n", 1.0)
    return ex


def encode(tokenizer, examples: list[Example]) -> list[tuple[list[int], list[float], list[int]]]:
    """Token ids, per-token loss weights, and the token index where each answer starts.

    The weight of token t is the weight of the span holding the token's first character:
    the loss at position t-1 is for predicting token t.
    """
    encoded = tokenizer.encode_batch([ex.text for ex in examples], add_special_tokens=False)
    out = []
    for ex, enc in zip(examples, encoded, strict=True):
        weights = [0.0] * len(enc.ids)
        starts = [s for s, _ in enc.offsets]
        span_index = 0
        spans = ex.spans
        for t, start in enumerate(starts):
            while span_index < len(spans) and spans[span_index][1] <= start:
                span_index += 1
            if span_index < len(spans) and spans[span_index][0] <= start:
                weights[t] = spans[span_index][2]
        answer_tokens = [_first_token_at(starts, offset) for offset, _ in ex.answers]
        out.append((list(enc.ids), weights, answer_tokens))
    return out


def _first_token_at(starts: list[int], offset: int) -> int:
    for t, start in enumerate(starts):
        if start >= offset:
            return t
    raise ValueError(f"no token starts at or after character {offset}")
