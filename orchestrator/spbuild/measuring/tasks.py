"""Long-context tasks with a known answer, for `spbuild eval`: the kinds of the stress matrix in PR #27692 (single
needle, multi-key retrieval, multi-hop, distributed facts, temporal override, variable tracking), each hidden in one
of several fillers (prose, logs, code) at a chosen length and evidence depth.

A case is a completion prompt for a base model: the filler with the evidence lines among its lines, then a question
and the start of the answer ("Answer: The secret code is"), so that the first generated words are the answer; or, in
chat form, a user message that ends with the question, for the model's chat template to wrap. The
evidence lines are the ones the answer needs; they appear in the prompt exactly as recorded, so their tokens can be
found in the prompt's token pieces (`token_span`). Everything is drawn from `random.Random(seed)`: the same arguments
give the same case on every machine.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from spbuild.measuring import source_tasks
from spbuild.measuring.source_tasks import SOURCE_FILLER, SOURCE_KINDS

# generated kinds, hidden in generated filler; and the kinds of real text (source_tasks), which bring their own
KINDS = ("needle", "multikey", "multihop", "distributed", "temporal", "vartrack")
ALL_KINDS = KINDS + SOURCE_KINDS
FILLERS = ("prose", "logs", "code")
# characters per token of C and C++ source, about (Qwen2.5 and Gemma 3): only the first estimate of a length uses it
_SOURCE_CHARS_PER_TOKEN = 3.2


@dataclass(frozen=True)
class Case:
    id: str
    kind: str
    filler: str
    n_tokens: int  # the length asked for; the prompt's real token count is the tokenizer's
    depth: float  # where the primary evidence line sits, 0..1 of the way through the filler
    seed: int
    prompt: str
    question: str
    answer: str  # what a correct answer starts with
    evidence: tuple[str, ...]  # the lines the answer needs, as they appear in the prompt
    chat: bool = False  # the prompt is a user message, no answer prefix: the answer is anywhere in its first line


@dataclass(frozen=True)
class _Task:
    question: str
    answer_prefix: str  # written after "Answer:", so the model continues with the answer itself
    answer: str
    # (line, where): where is a depth in 0..1, or None for "anywhere"; `order` keeps the lines in the given order
    evidence: tuple[tuple[str, float | None], ...]
    distractors: tuple[str, ...] = ()
    ordered: bool = False


# ---------------------------------------------------------------------------------------------------------------
# fillers: each makes one line (a paragraph, a log line, a code block) from the random stream

_SUBJECTS = ("The committee", "A small team", "The old harbour", "Our neighbour", "The city council", "A local farmer",
             "The night train", "The museum guide", "A travelling merchant", "The school choir", "The weather station",
             "A young engineer", "The village baker", "The river ferry", "An elderly painter", "The county library")
_VERBS = ("discussed", "repaired", "painted", "described", "measured", "visited", "planned", "recorded", "cleaned",
          "photographed", "inspected", "celebrated", "replaced", "studied", "organised", "delivered")
_OBJECTS = ("the wooden bridge", "a long report", "the northern road", "the spring festival", "an old lighthouse",
            "the garden wall", "a set of maps", "the evening concert", "the harvest schedule", "a row of lanterns",
            "the stone chapel", "the market stalls", "a broken clock", "the winter supplies", "the water mill")
_TAILS = ("before the first snow", "after a long debate", "with great care", "during the summer months",
          "without much fuss", "for the third time this year", "in the early morning", "despite the rain",
          "as the sun went down", "while the town slept", "with help from friends", "at the end of the week")


def _prose(rng: random.Random, index: int) -> str:
    sentences = [f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}."
                 for _ in range(rng.randint(2, 4))]
    return " ".join(sentences)


_SERVICES = ("api-gateway", "auth", "billing", "scheduler", "indexer", "mailer", "storage", "search")
_EVENTS = ("request {n} served in {ms} ms", "cache hit ratio {pct}%", "worker {w} picked up job {n}",
           "connection pool at {w}/{cap}", "retrying upload {n} (attempt {w})", "flushed {n} rows to disk",
           "health check ok after {ms} ms", "rotated log segment {n}", "queue depth {w}, lag {ms} ms")


def _logs(rng: random.Random, index: int) -> str:
    seconds = 8 * 3600 + 7 * index + rng.randrange(7)
    stamp = f"{seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    level = rng.choices(("INFO", "DEBUG", "WARN"), weights=(6, 3, 1))[0]
    event = rng.choice(_EVENTS).format(n=rng.randrange(10000), ms=rng.randrange(1, 900), pct=rng.randrange(40, 100),
                                       w=rng.randrange(1, 32), cap=32)
    return f"[{stamp}] {level} {rng.choice(_SERVICES)}[{rng.randrange(100, 999)}]: {event}"


_NAMES = ("orders", "totals", "records", "events", "prices", "users", "samples", "items", "batches", "rows")
_FIELDS = ("amount", "weight", "count", "size", "score", "price", "length", "value")


def _code(rng: random.Random, index: int) -> str:
    name, field = rng.choice(_NAMES), rng.choice(_FIELDS)
    k, c = rng.randrange(2, 10), rng.randrange(1, 100)
    return (f"def sum_{name}_{index}({name}):\n"
            f"    total = {c}\n"
            f"    for entry in {name}:\n"
            f"        total += entry.{field} * {k}\n"
            f"    return total\n")


_FILLER_LINES: dict[str, Callable[[random.Random, int], str]] = {"prose": _prose, "logs": _logs, "code": _code}
# tokens per filler line, about (llama-bpe and Gemma 3 agree within 15%); only the first estimate of a length uses it
_TOKENS_PER_LINE = {"prose": 40.0, "logs": 22.0, "code": 45.0}

# ---------------------------------------------------------------------------------------------------------------
# kinds: the evidence, the question and the answer

_KEY_NAMES = ("amber", "cobalt", "crimson", "indigo", "jade", "ochre", "silver", "violet", "scarlet", "teal")
_PEOPLE = ("Marta Lindqvist", "Tomas Okafor", "Ingrid Halvorsen", "Rafael Moreau", "Yuki Tanabe", "Priya Raman",
           "Jonas Becker", "Elena Petrova", "Samuel Adeyemi", "Clara Nieminen")
_COMPANIES = ("Norrvik Instruments", "Bluefjord Logistics", "Kestrel Analytics", "Orrin Textiles", "Valemont Optics",
              "Hollis Marine", "Tessaly Foods", "Brightwater Labs")
_CITIES = ("Oslo", "Lisbon", "Krakow", "Tallinn", "Porto", "Ghent", "Bergen", "Turin", "Malmo", "Lyon")
_FACILITIES = ("North", "South", "East", "West", "Central", "Harbour")


def _code_number(rng: random.Random) -> str:
    return str(rng.randrange(10000, 100000))


def _needle(rng: random.Random, depth: float) -> _Task:
    code = _code_number(rng)
    return _Task("What is the secret code?", "The secret code is", code,
                 ((f"The secret code is {code}.", depth),))


def _multikey(rng: random.Random, depth: float) -> _Task:
    names = rng.sample(_KEY_NAMES, 4)
    codes = [_code_number(rng) for _ in names]
    asked = 0
    lines = [f"The access key for the {name} vault is {code}." for name, code in zip(names, codes, strict=True)]
    return _Task(f"What is the access key for the {names[asked]} vault?",
                 f"The access key for the {names[asked]} vault is", codes[asked],
                 ((lines[asked], depth),), distractors=tuple(lines[1:]))


def _multihop(rng: random.Random, depth: float) -> _Task:
    (person, other), (company, other_company) = rng.sample(_PEOPLE, 2), rng.sample(_COMPANIES, 2)
    city, other_city = rng.sample(_CITIES, 2)
    # the second clue shares no word with the question: only the company links it to the first
    return _Task(f"In which city does {person} work?", f"{person} works in the city of", city,
                 ((f"{person} works for {company}.", depth), (f"{company} has its headquarters located at {city}.", None)),
                 distractors=(f"{other} works for {other_company}.",
                              f"{other_company} has its headquarters located at {other_city}."))


def _distributed(rng: random.Random, depth: float) -> _Task:
    facilities = rng.sample(_FACILITIES, rng.randint(3, 5))
    counts = [rng.randrange(2, 30) for _ in facilities]
    lines = tuple((f"The {name} facility logged {count} incidents this quarter.", None)
                  for name, count in zip(facilities, counts, strict=True))
    return _Task("How many incidents did all the facilities log this quarter, in total?",
                 "In total, the facilities logged", str(sum(counts)), lines)


def _temporal(rng: random.Random, depth: float) -> _Task:
    old, new = f"ZETA-{rng.randrange(1000, 10000)}", f"ZETA-{rng.randrange(1000, 10000)}"
    # depth places the override; the notice it replaces comes anywhere before it
    return _Task("What is the current gate code?", "The current gate code is", new,
                 ((f"NOTICE: the gate code is {old}.", None),
                  (f"UPDATE: the earlier notice is withdrawn; the gate code is now {new}.", depth)), ordered=True)


def _variable_name(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(5))


def _vartrack(rng: random.Random, depth: float) -> _Task:
    names = [_variable_name(rng) for _ in range(4)]
    value = _code_number(rng)
    chain = [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in itertools.pairwise(names)]
    # depth places the last assignment, the others come before it in order
    evidence = tuple((line, None) for line in chain[:-1]) + ((chain[-1], depth),)
    decoy = f"VAR {_variable_name(rng)} = {_code_number(rng)}."
    return _Task(f"What is the value of VAR {names[-1]}?", f"The value of VAR {names[-1]} is", value, evidence,
                 distractors=(decoy,), ordered=True)


_KIND_TASKS: dict[str, Callable[[random.Random, float], _Task]] = {
    "needle": _needle, "multikey": _multikey, "multihop": _multihop, "distributed": _distributed,
    "temporal": _temporal, "vartrack": _vartrack,
}

# ---------------------------------------------------------------------------------------------------------------


def _slots(rng: random.Random, task: _Task, n_lines: int) -> list[tuple[int, str]]:
    """Where each evidence and distractor line goes: (index among the filler lines, line), sorted by index."""
    placed: list[tuple[int, str]] = []
    fixed = [(line, where) for line, where in task.evidence if where is not None]
    free = [line for line, where in task.evidence if where is None]
    taken: set[int] = set()
    for line, where in fixed:
        slot = min(n_lines, max(0, round(where * n_lines)))
        placed.append((slot, line))
        taken.add(slot)
    if task.ordered:
        # the free lines all come before the first fixed one, in order, spread over what precedes it (first in the
        # list, so that a shared slot keeps them ahead)
        limit = min((s for s, _ in placed), default=n_lines)
        chosen = sorted(rng.sample(range(limit), len(free))) if limit >= len(free) else [0] * len(free)
        placed = list(zip(chosen, free, strict=True)) + placed
    else:
        for line in free:
            candidates = [s for s in range(n_lines + 1) if s not in taken] or [n_lines]
            slot = rng.choice(candidates)
            taken.add(slot)
            placed.append((slot, line))
    for line in task.distractors:
        placed.append((rng.randrange(n_lines + 1), line))
    # stable: two lines on one slot keep the order they were placed in (the ordered evidence first)
    return sorted(placed, key=lambda item: item[0])


def _render(kind: str, filler: str, n_lines: int, depth: float, seed: int, chat: bool) -> tuple[str, _Task]:
    rng = random.Random(f"{kind}/{filler}/{seed}")
    task = _KIND_TASKS[kind](rng, depth)
    make_line = _FILLER_LINES[filler]
    lines = [make_line(rng, i) for i in range(n_lines)]
    for offset, (slot, line) in enumerate(_slots(rng, task, n_lines)):
        lines.insert(slot + offset, line)
    body = "\n".join(lines)
    if chat:
        return f"{body}\n\nQuestion: {task.question}\nAnswer in one short sentence.", task
    return f"{body}\n\nQuestion: {task.question}\nAnswer: {task.answer_prefix}", task


def _source_case(kind: str, n_tokens: int, depth: float, seed: int, count_tokens: Callable[[str], int] | None,
                 chat: bool, tree: Path) -> Case:
    def prompt_of(n_chars: int) -> tuple[str, source_tasks.Question]:
        rendered = source_tasks.render(tree, kind, n_chars, depth, seed)
        q = rendered.question
        if chat:
            return f"{rendered.body}\n\nQuestion: {q.question}\nAnswer in one short sentence.", q
        return f"{rendered.body}\n\nQuestion: {q.question}\nAnswer: {q.answer_prefix}", q

    n_chars = round(n_tokens * _SOURCE_CHARS_PER_TOKEN)
    prompt, q = prompt_of(n_chars)
    if count_tokens is not None:
        prompt, q = prompt_of(round(n_chars * n_tokens / max(1, count_tokens(prompt))))
    return Case(id=f"{kind}-{SOURCE_FILLER}-{n_tokens}-d{round(depth * 100):02d}-s{seed}" + ("-chat" if chat else ""),
                kind=kind, filler=SOURCE_FILLER, n_tokens=n_tokens, depth=depth, seed=seed, prompt=prompt,
                question=q.question, answer=q.answer, evidence=q.evidence, chat=chat)


def make_case(kind: str, filler: str, n_tokens: int, depth: float, seed: int = 0,
              count_tokens: Callable[[str], int] | None = None, chat: bool = False,
              source_tree: Path | None = None) -> Case:
    """A case of about n_tokens prompt tokens. With `count_tokens` (the model's tokenizer) the filler is sized in two
    steps, an estimate and one correction, so the prompt lands within a few percent of n_tokens; without it the length
    is the estimate's. `chat`: the prompt is a user message ending with the question (see the module's docstring).
    The kinds of real text (SOURCE_KINDS) need the llama.cpp tree they are drawn from, and ignore `filler`."""
    if kind not in _KIND_TASKS and kind not in SOURCE_KINDS:
        raise ValueError(f"unknown task kind {kind!r} (known: {', '.join(ALL_KINDS)})")
    if kind in SOURCE_KINDS and source_tree is None:
        raise ValueError(f"the {kind!r} kind is drawn from a llama.cpp tree: give its path (source_tree)")
    if kind in _KIND_TASKS and filler not in _FILLER_LINES:
        raise ValueError(f"unknown filler {filler!r} (known: {', '.join(FILLERS)})")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be within 0..1, got {depth}")
    if n_tokens < 64:
        raise ValueError(f"a case needs at least 64 tokens, got {n_tokens}")
    if kind in SOURCE_KINDS:
        return _source_case(kind, n_tokens, depth, seed, count_tokens, chat, source_tree)
    n_lines = max(4, round(n_tokens / _TOKENS_PER_LINE[filler]))
    prompt, task = _render(kind, filler, n_lines, depth, seed, chat)
    if count_tokens is not None:
        n_lines = max(4, round(n_lines * n_tokens / max(1, count_tokens(prompt))))
        prompt, task = _render(kind, filler, n_lines, depth, seed, chat)
    return Case(id=f"{kind}-{filler}-{n_tokens}-d{round(depth * 100):02d}-s{seed}" + ("-chat" if chat else ""),
                kind=kind, filler=filler, n_tokens=n_tokens, depth=depth, seed=seed, prompt=prompt,
                question=task.question, answer=task.answer, evidence=tuple(line for line, _ in task.evidence),
                chat=chat)


def suite(kinds: Sequence[str], fillers: Sequence[str], lengths: Sequence[int], depths: Sequence[float],
          seeds: int = 1, count_tokens: Callable[[str], int] | None = None, chat: bool = False,
          source_tree: Path | None = None) -> list[Case]:
    """Every kind at every length and depth, fillers taken in turn (a kind sees each filler across the depths; the
    kinds of real text bring their own)."""
    cases = []
    for n in lengths:
        for k, kind in enumerate(kinds):
            for d, depth in enumerate(depths):
                for seed in range(seeds):
                    filler = fillers[(k + d + seed) % len(fillers)]
                    cases.append(make_case(kind, filler, n, depth, seed, count_tokens, chat, source_tree))
    return cases


# the quality bar (tests/integration/test_quality_bar.py): the four kinds Gemma 3 270M answers with the full prefill,
# at 1K-2K tokens, a case each per length, depths and fillers in turn
QUALITY_BAR_KINDS = ("needle", "multikey", "multihop", "temporal")
QUALITY_BAR_LENGTHS = (1024, 1536, 2048)
QUALITY_BAR_DEPTHS = (0.2, 0.5, 0.8)


def quality_bar(count_tokens: Callable[[str], int] | None = None, chat: bool = False) -> list[Case]:
    """The quality bar's 12 cases, the same every run (each length has its own seed); `chat` as make_case's."""
    return [make_case(kind, FILLERS[(k + i) % len(FILLERS)], n, QUALITY_BAR_DEPTHS[(k + i) % len(QUALITY_BAR_DEPTHS)],
                      seed=i, count_tokens=count_tokens, chat=chat)
            for i, n in enumerate(QUALITY_BAR_LENGTHS) for k, kind in enumerate(QUALITY_BAR_KINDS)]


# ---------------------------------------------------------------------------------------------------------------
# reading answers and prompts


def first_line(text: str) -> str:
    """The answer's first line, as compared between the full and the sparse prefill."""
    return text.strip().split("\n", 1)[0].strip()


# an answer after its prefix is the expected answer's words and a few more: enough to tell "89423" from "8942" or
# "89423-B", not the sentence that follows; in chat form the first sentence, up to a cap
ANSWER_SLACK_WORDS = 2
CHAT_ANSWER_WORDS = 40
_SENTENCE_END = re.compile(r"[.!?;](?=\s|$)")
_WRAPPING = " :\"'*`"


def answer_text(case: Case, generated: str) -> str:
    """The answer itself: the generated text up to its first sentence or line end, and for a completion (an answer
    prefix before it) at most two words past the expected answer's; surrounding quotes, backticks and emphasis
    dropped, white space collapsed. Two runs agree on the answer when these are equal."""
    text = first_line(generated).lstrip(_WRAPPING)
    end = _SENTENCE_END.search(text)
    if end:
        text = text[:end.start()]
    limit = CHAT_ANSWER_WORDS if case.chat else len(case.answer.split()) + ANSWER_SLACK_WORDS
    return " ".join(text.split()[:limit]).strip(_WRAPPING + ".,")


def answers_agree(full_text: str, full_correct: bool, spec_text: str, spec_correct: bool) -> bool:
    """Two answers (answer_text) agree when they are equal, or when both give the expected answer: an instruct model's
    "X is defined as 16" and "X is set to 16" are the same answer in other words."""
    return full_text == spec_text or (full_correct and spec_correct)


def is_correct(case: Case, generated: str) -> bool:
    """The generated text (after the answer prefix) starts with the answer, as a whole word or number; in chat form
    (no answer prefix) the answer is anywhere in its first line, as a whole word or number."""
    text = first_line(generated).lstrip(" :\"'*")
    answer = re.escape(case.answer) + r"(?![0-9A-Za-z_])"
    if case.chat:
        return re.search(r"(?<![0-9A-Za-z_])" + answer, text) is not None
    return re.match(answer, text) is not None


def token_span(pieces: Sequence[str], text: str) -> range:
    """The token indices whose pieces overlap the first occurrence of `text` in the joined pieces (the prompt as the
    tokenizer cut it)."""
    joined = "".join(pieces)
    start = joined.find(text)
    if start < 0:
        raise ValueError(f"{text[:60]!r} is not among the prompt's tokens")
    end = start + len(text)
    first = last = None
    offset = 0
    for index, piece in enumerate(pieces):
        if offset < end and offset + len(piece) > start:
            first = index if first is None else first
            last = index
        offset += len(piece)
        if offset >= end:
            break
    assert first is not None and last is not None
    return range(first, last + 1)
