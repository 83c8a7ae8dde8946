"""Eval kinds built from real text: the fetched llama.cpp tree's own C and C++ sources (code nobody here wrote).

The context of a case is whole source files of the tree, in an order drawn from the seed, with one excerpt (the
evidence line and the lines around it, under its file's name) placed at the asked depth. The generator extracts the
known answer from the excerpt and drops from the context every filler file that mentions the question's key, so the
excerpt is the only place the answer can come from:

- `define`: the value of a `#define NAME VALUE` macro (a number);
- `enum`: the value of an enum constant given explicitly (`NAME = 42,`);
- `docfn`: which function a one-line comment right above its definition describes;
- `param`: the name of the first parameter of a function defined on one line.

The corpus is read once per tree (files sorted by path); the same tree and arguments give the same case everywhere.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SOURCE_KINDS = ("define", "enum", "docfn", "param")
SOURCE_FILLER = "source"

# upstream code only: our own files (the overlay of cpp/) and the files our patches hook into are left out, as are
# the backends' folders under ggml/src, which a tree packed for one backend lacks (the corpus must be the same there)
_FOLDERS = ("src", "common", "ggml/include", "ggml/src", "tools", "examples")
_FLAT_FOLDERS = ("ggml/src",)
_SUFFIXES = (".c", ".cpp", ".h", ".hpp")
_OURS = re.compile(r"spec[-_]?prefill", re.IGNORECASE)
_MAX_FILE_BYTES = 120_000
EXCERPT_LINES = 6  # lines on either side of the evidence line that travel with it


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the tree
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Question:
    kind: str
    key: str  # the identifier or comment the question names; no filler file may contain it
    question: str
    answer_prefix: str
    answer: str
    file: int  # index into the corpus
    line: int  # the evidence line's index in that file
    evidence: tuple[str, ...]  # lines of the excerpt the answer needs, as they appear


@cache
def corpus(tree: Path) -> tuple[SourceFile, ...]:
    files = []
    for folder in _FOLDERS:
        base = tree / folder
        if not base.is_dir():
            continue
        for path in sorted(base.glob("*") if folder in _FLAT_FOLDERS else base.rglob("*")):
            rel = path.relative_to(tree).as_posix()
            if path.suffix not in _SUFFIXES or not path.is_file() or path.stat().st_size > _MAX_FILE_BYTES:
                continue
            text = path.read_text(encoding="utf-8", errors="replace").replace("\t", "    ")
            if _OURS.search(rel) or _OURS.search(text):
                continue
            files.append(SourceFile(rel, tuple(line.rstrip() for line in text.splitlines())))
    if not files:
        raise ValueError(f"{tree} holds no C or C++ sources under {', '.join(_FOLDERS)}: not a llama.cpp tree")
    return tuple(sorted(files, key=lambda f: f.path))


_DEFINE = re.compile(r"^#\s*define\s+([A-Z][A-Z0-9_]{5,})\s+\(?(-?\d+[uUlL]*)\)?\s*(//.*|/\*.*)?$")
_ENUM = re.compile(r"^\s+([A-Z][A-Z0-9_]{5,})\s*=\s*(-?\d+)\s*,\s*(//.*)?$")
_COMMENT = re.compile(r"^//\s*(?!TODO|FIXME|NOTE|XXX|[Ss]ame as)(\S.{24,110}\S)\s*$")
_DEFINITION = re.compile(r"^(?:static\s+)?(?:inline\s+)?(?:const\s+)?[A-Za-z_][\w:<>*& ]*?[\s*&]"
                         r"([a-z_][a-z0-9_]{5,})\s*\(([^()]*)\)\s*(?:const\s*)?\{?\s*$")
_PARAM = re.compile(r"^\s*(?:const\s+)?(?:struct\s+)?[A-Za-z_][\w:<>]*(?:\s*[*&]+\s*|\s+)(?:const\s+)?"
                    r"([a-z_][a-z0-9_]*)\s*(?:=.*)?$")


# the kinds that ask a named constant's value: its pattern (name, value), what it is called, the answer prefix's verb
_CONSTANTS = {"define": (_DEFINE, "macro", "is defined as"), "enum": (_ENUM, "enum constant", "is")}

# answers a model could guess without reading: one-digit values, and the commonest first-parameter names
_MIN_VALUE = 10
_COMMON_PARAMS = 12


@cache
def questions(tree: Path, kind: str) -> tuple[Question, ...]:
    """Every question of `kind` the corpus offers, each with one unambiguous answer: its key is defined once in the
    whole corpus."""
    files = corpus(tree)
    found: list[Question] = []
    for index, source in enumerate(files):
        for number, line in enumerate(source.lines):
            question = _question(kind, index, number, source.lines)
            if question:
                found.append(question)
    counts = Counter(q.key for q in found)
    unique = [q for q in found if counts[q.key] == 1]
    if kind == "param":
        common = {name for name, _ in Counter(q.answer for q in unique).most_common(_COMMON_PARAMS)}
        unique = [q for q in unique if q.answer not in common and len(q.answer) >= 3]
    return tuple(unique)


def _question(kind: str, index: int, number: int, lines: Sequence[str]) -> Question | None:
    line = lines[number]
    if kind in _CONSTANTS:
        pattern, what, verb = _CONSTANTS[kind]
        m = pattern.match(line)
        if m:
            name, value = m.group(1), m.group(2).rstrip("uUlL")
            if abs(int(value)) < _MIN_VALUE:
                return None
            return Question(kind, name, f"What is the value of the {what} {name}?", f"{name} {verb}", value,
                            index, number, (line,))
    elif kind == "docfn":
        m = _COMMENT.match(line)
        following = lines[number + 1] if number + 1 < len(lines) else ""
        d = _DEFINITION.match(following)
        if m and d and (number == 0 or not lines[number - 1].lstrip().startswith("//")):
            comment = m.group(1)
            return Question(kind, comment, f"Which function is described by the comment \"{comment}\"?",
                            "The function is", d.group(1), index, number, (line, following))
    elif kind == "param":
        d = _DEFINITION.match(line)
        if d and not line.startswith((" ", "#")) and d.group(2).strip() not in ("", "void"):
            first = _PARAM.match(d.group(2).split(",")[0])
            if first and first.group(1) not in ("void", "const", "struct"):
                name = d.group(1)
                return Question(kind, name, f"What is the name of the first parameter of the function {name}?",
                                f"The first parameter of {name} is named", first.group(1), index, number, (line,))
    return None


@dataclass(frozen=True)
class Rendered:
    body: str  # the context: files, with the excerpt at its depth
    question: Question


def render(tree: Path, kind: str, n_chars: int, depth: float, seed: int) -> Rendered:
    """About n_chars of context for one question of `kind`, drawn from the seed, its excerpt at `depth`."""
    if kind not in SOURCE_KINDS:
        raise ValueError(f"unknown source kind {kind!r} (known: {', '.join(SOURCE_KINDS)})")
    files = corpus(tree)
    pool = questions(tree, kind)
    if not pool:
        raise ValueError(f"the tree at {tree} offers no question of kind {kind!r}")
    rng = random.Random(f"source/{kind}/{seed}")
    q = pool[rng.randrange(len(pool))]
    source = files[q.file]
    lo, hi = max(0, q.line - EXCERPT_LINES), min(len(source.lines), q.line + len(q.evidence) + EXCERPT_LINES)
    excerpt = f"// File: {source.path} (lines {lo + 1}-{hi})\n" + "\n".join(source.lines[lo:hi])
    order = [i for i in range(len(files)) if i != q.file]
    rng.shuffle(order)
    lines: list[str] = []
    size = 0
    for i in order:
        if size >= n_chars:
            break
        text = "\n".join(files[i].lines)
        if q.key in text or q.answer_prefix in text:
            continue
        for line in (f"// File: {files[i].path}", *files[i].lines, ""):
            if size >= n_chars:
                break
            lines.append(line)
            size += len(line) + 1
    # the excerpt goes at a blank line near the depth, so that it reads as a fragment of its own
    at = round(depth * len(lines))
    near = [k for k in range(max(0, at - 40), min(len(lines), at + 40) + 1) if k == 0 or not lines[k - 1].strip()]
    at = min(near, key=lambda k: abs(k - at)) if near else at
    lines[at:at] = [excerpt, ""]
    return Rendered("\n".join(lines).strip("\n"), q)
