"""The tools eval's cases: a coding agent's conversation over the fetched llama.cpp tree, whose right tool call needs
an argument read from the context.

A case is a system message, the user's task, then rounds of `read_file` calls, each answered with a real source file
of the tree (its first lines), one of them the excerpt that holds the answer (placed at the asked depth among the
rounds), and at the end the user's request for one action:

- `value`: record a named constant's value (`record_constant(name, value)`): the value is in the excerpt only;
- `file`: open the file that defines it (`open_file(path)`): the path is that read's argument and header.

Questions come from `source_tasks` (`#define` and explicit enum values, keys defined once in the tree), and every
filler file that mentions a question's key is left out, as the answer kinds do. A case of several turns grows on one
slot as an agent's does: each turn appends the previous request's right call and its result, more reads, and a new
request, so that a follow-up prefills (and scores) only its new tokens.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from spbuild.measuring import source_tasks

INTENTS = ("value", "file")
MAX_READ_CHARS = 6000  # a read returns a file's first lines up to this size, as agents' read tools cap their output
_CONSTANT_KINDS = ("define", "enum")


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


def _text(description: str) -> dict:
    return {"type": "string", "description": description}


def _number(description: str) -> dict:
    return {"type": "integer", "description": description}


TOOLS = [
    _tool("read_file", "Read a file of the repository, whole or a range of lines.",
          {"path": _text("the file's path from the repository root"), "start_line": _number("first line, from 1"),
           "end_line": _number("last line, inclusive")}, ["path"]),
    _tool("grep", "Search the repository for a regular expression.",
          {"pattern": _text("the regular expression"), "path": _text("a folder to search in")}, ["pattern"]),
    _tool("list_dir", "List a folder of the repository.", {"path": _text("the folder")}, ["path"]),
    _tool("run_tests", "Run the test suite or one test.", {"target": _text("a test name or folder")}, []),
    _tool("git_log", "Show the recent commits that touched a path.",
          {"path": _text("a file or folder"), "count": _number("how many commits")}, ["path"]),
    _tool("search_docs", "Search the project's documentation.", {"query": _text("what to look for")}, ["query"]),
    _tool("record_constant", "Record the value of a named constant found in the sources.",
          {"name": _text("the constant's name"), "value": _number("its value, as a number")}, ["name", "value"]),
    _tool("open_file", "Open a file in the user's editor.", {"path": _text("the file's path")}, ["path"]),
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)

SYSTEM = ("You are a coding agent working in a checkout of the llama.cpp repository. You act only through the tools "
          "you are given, one call at a time, and you base every argument on what the tools returned.")
TASK = ("I am auditing the constants of this tree. Read the files I need one at a time; when I ask for an action, "
        "answer with exactly one tool call.")


@dataclass(frozen=True)
class Turn:
    """One request of a case: its prompt is the first `end` messages; the right call and what it needs."""

    end: int
    key: str
    name: str  # the right tool
    arguments: dict  # the right arguments
    evidence: tuple[str, ...]  # the prompt's text the right call needs (for retention)


@dataclass(frozen=True)
class ToolCase:
    id: str
    intent: str
    n_chars: int  # the reads' size in characters, all turns together
    depth: float
    seed: int
    messages: tuple[dict, ...]
    turns: tuple[Turn, ...]


def _call(index: int, name: str, arguments: dict) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": f"call_{index}", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def _result(index: int, content: str) -> dict:
    return {"role": "tool", "tool_call_id": f"call_{index}", "content": content}


def _request(intent: str, question: source_tasks.Question) -> str:
    what = "macro" if question.kind == "define" else "enum constant"
    if intent == "value":
        return (f"Call record_constant with the name {question.key} and the value the {what} {question.key} has in "
                "the file you read. Answer with the tool call only.")
    return f"Call open_file with the path of the file that defines the {what} {question.key}. Answer with the tool call only."


def make_case(tree: Path, intent: str, n_chars: int, depth: float, seed: int = 0, turns: int = 1) -> ToolCase:
    """A conversation of about n_chars of file reads over `turns` requests, each request's evidence at `depth` among
    the reads of its own turn."""
    if intent not in INTENTS:
        raise ValueError(f"unknown tool intent {intent!r} (known: {', '.join(INTENTS)})")
    if turns < 1:
        raise ValueError("a tool case has at least one turn")
    files = source_tasks.corpus(tree)
    rng = random.Random(f"tools/{intent}/{n_chars}/{depth}/{seed}/{turns}")
    pool = [q for kind in _CONSTANT_KINDS for q in source_tasks.questions(tree, kind)]
    questions: list[source_tasks.Question] = []
    for q in rng.sample(pool, len(pool)):
        if len(questions) < turns and all(q.key != other.key and q.file != other.file for other in questions):
            questions.append(q)
    if len(questions) < turns:
        raise ValueError(f"the tree at {tree} offers {len(questions)} constants in distinct files, not {turns}")
    keys = [q.key for q in questions]
    fillers = [i for i in range(len(files)) if i not in {q.file for q in questions}]
    rng.shuffle(fillers)
    fillers = [i for i in fillers if not any(key in line for key in keys for line in files[i].lines)]

    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    out_turns: list[Turn] = []
    n_calls = 0
    per_turn = n_chars // turns

    def read(path: str, lines: tuple[str, ...], first: int, total: int) -> str:
        nonlocal n_calls
        n_calls += 1
        last = first + len(lines) - 1
        args = {"path": path} if first == 1 and last == total else {"path": path, "start_line": first, "end_line": last}
        header = f"{path} (lines {first}-{last} of {total})"
        messages.extend([_call(n_calls, "read_file", args), _result(n_calls, header + "\n" + "\n".join(lines))])
        return header

    for t, q in enumerate(questions):
        reads: list[tuple[str, tuple[str, ...], int]] = []
        size = 0
        while per_turn - size > 200 and fillers:
            source = files[fillers.pop()]
            lines, used = [], 0
            cap = min(MAX_READ_CHARS, per_turn - size)  # the last read of a turn is cut to what is left
            for line in source.lines:
                if used + len(line) + 1 > cap:
                    break
                lines.append(line)
                used += len(line) + 1
            if lines:
                reads.append((source.path, tuple(lines), len(source.lines)))
                size += used
        source = files[q.file]
        lo = max(0, q.line - source_tasks.EXCERPT_LINES)
        hi = min(len(source.lines), q.line + len(q.evidence) + source_tasks.EXCERPT_LINES)
        at = round(depth * len(reads))
        for path, lines, total in reads[:at]:
            read(path, lines, 1, total)
        header = read(source.path, source.lines[lo:hi], lo + 1, len(source.lines))
        for path, lines, total in reads[at:]:
            read(path, lines, 1, total)
        messages.append({"role": "user", "content": _request(intent, q)})
        if intent == "value":
            name, arguments, evidence = "record_constant", {"name": q.key, "value": int(q.answer)}, q.evidence
        else:
            name, arguments, evidence = "open_file", {"path": source.path}, (header,)
        out_turns.append(Turn(len(messages), q.key, name, arguments, evidence))
        if t + 1 < turns:
            # the agent's right call and its result, then the next turn's reads
            n_calls += 1
            done = f"recorded {q.key}" if intent == "value" else f"opened {source.path}"
            messages.extend([_call(n_calls, name, arguments), _result(n_calls, done)])
    case_id = f"tools-{intent}-{n_chars}-{depth:g}-{seed}" + (f"-t{turns}" if turns > 1 else "")
    return ToolCase(case_id, intent, n_chars, depth, seed, tuple(messages), tuple(out_turns))
