"""`spbuild eval --kinds tools`: the tool calls of spec prefill against the full prefill's, through the built
llama-server's /v1/chat/completions (its chat template, its tool-call parser), on `tool_tasks` cases.

Per case, setting and turn: whether the call parses (a known tool, JSON arguments valid against its schema), whether
it equals the full prefill's (tool name and arguments), whether it is the right call, whether the tokens the right
call needs were kept, what was protected, and the TTFT of each turn (a case of several turns runs on one slot, each
turn reusing the cached prefix as an agent's client does). `skip` (every request with tools prefilled whole) is the
full prefill itself, so the settings are the guards that score: `protect` and `off`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import requests

from spbuild.errors import SpbuildError
from spbuild.measuring import tasks, tool_tasks
from spbuild.measuring.evaluate import TIMEOUT_S, ServerBackend, Setting

TOOL_GUARDS = ("protect", "off")
MAX_TOKENS = 96  # a tool call of these schemas is 20-60 tokens
_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in tool_tasks.TOOLS}


@dataclass(frozen=True)
class ToolSetting:
    setting: Setting
    guard: str

    @property
    def name(self) -> str:
        return f"{self.setting.name} {self.guard}"

    def request(self) -> dict:
        return {**self.setting.request(), "tool_guard": self.guard}


@dataclass(frozen=True)
class Call:
    """The first tool call of a response (name None: the model answered in text)."""

    name: str | None
    arguments: dict | None  # None: not JSON
    text: str
    error: str  # why the call is invalid ("" when valid)
    in_text: bool = False  # written as a bare JSON object in the content, not in the template's call syntax

    @property
    def valid(self) -> bool:
        return self.name is not None and not self.error

    def key(self) -> str:
        return json.dumps([self.name, self.arguments], sort_keys=True) if self.name else "text:" + self.text.strip()


def _call_in_text(text: str) -> dict | None:
    """A {"name": ..., "arguments": ...} object written in the content: small instruct models (Qwen2.5-Coder 0.5B
    and 1.5B) often drop their template's <tool_call> tags, and agent clients read such an object as the call."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict) and "name" in value and "arguments" in value:
            return value
        start = text.find("{", start + 1)
    return None


def parse_call(message: dict) -> Call:
    """The first call of a chat completion's message, checked against its tool's schema."""
    calls = message.get("tool_calls") or []
    text = message.get("content") or ""
    in_text = False
    if calls:
        function = calls[0].get("function", {})
    elif (function := _call_in_text(text)) is not None:
        in_text = True
    else:
        return Call(None, None, text, "no tool call")
    name, raw = function.get("name"), function.get("arguments", "")
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as err:
        return Call(name, None, text, f"arguments are not JSON: {err}", in_text)
    if name not in _SCHEMAS:
        return Call(name, arguments, text, f"unknown tool {name!r}", in_text)
    try:
        jsonschema.validate(arguments, _SCHEMAS[name])
    except jsonschema.ValidationError as err:
        return Call(name, arguments, text, f"arguments do not match the schema: {err.message}", in_text)
    return Call(name, arguments, text, "", in_text)


def is_right(call: Call, turn: tool_tasks.Turn) -> bool:
    if call.name != turn.name or not isinstance(call.arguments, dict):
        return False
    return all(str(call.arguments.get(k, "")).strip().removeprefix("./") == str(v) for k, v in turn.arguments.items())


class ChatRunner:
    """The chat requests of the tools eval on one ServerBackend's server (its one slot)."""

    def __init__(self, backend: ServerBackend):
        self.server = backend.server

    def _post(self, path: str, body: dict) -> dict:
        response = self.server.request("POST", path, body, timeout=TIMEOUT_S)
        if response.status_code != 200:
            raise SpbuildError(f"llama-server answered {response.status_code} on {path}: {response.text[:300]}")
        return response.json()

    def prompt(self, messages: Sequence[dict]) -> str:
        return self._post("/apply-template", {"messages": list(messages), "tools": tool_tasks.TOOLS,
                                              "add_generation_prompt": True})["prompt"]

    def pieces(self, messages: Sequence[dict]) -> list[str]:
        tokens = self._post("/tokenize", {"content": self.prompt(messages), "add_special": True,
                                          "with_pieces": True})["tokens"]
        return [t["piece"] if isinstance(t["piece"], str) else bytes(t["piece"]).decode("utf-8", "replace")
                for t in tokens]

    def count_tokens(self, messages: Sequence[dict]) -> int:
        return len(self._post("/tokenize", {"content": self.prompt(messages), "add_special": True})["tokens"])

    def chat(self, messages: Sequence[dict], spec_prefill: dict, cache: bool) -> tuple[Call, dict]:
        data = self._post("/v1/chat/completions", {
            "messages": list(messages), "tools": tool_tasks.TOOLS, "max_tokens": MAX_TOKENS, "temperature": 0,
            "cache_prompt": cache, "spec_prefill": spec_prefill})
        return parse_call(data["choices"][0]["message"]), data.get("timings", {})

    def conversation(self, case: tool_tasks.ToolCase, spec_prefill: dict) -> list[tuple[Call, dict] | str]:
        """The case's turns in order on the slot: the first prefills from scratch, each next one reuses the cache."""
        out: list[tuple[Call, dict] | str] = []
        for t, turn in enumerate(case.turns):
            try:
                out.append(self.chat(case.messages[:turn.end], spec_prefill, cache=t > 0))
            except (SpbuildError, requests.RequestException) as err:
                out.append(str(err))
        return out


def sized_case(runner: ChatRunner, tree: Path, intent: str, n_tokens: int, depth: float, seed: int,
               turns: int) -> tool_tasks.ToolCase:
    """A case whose last prompt is about n_tokens long: made once at a guessed size, then rescaled by its count."""
    # the fixed part (the system message, the tool schemas, the requests) is measured apart from the reads
    fixed = runner.count_tokens(tool_tasks.make_case(tree, intent, 0, depth, seed, turns).messages)
    if n_tokens < fixed + 256:
        raise SpbuildError(f"a tools case of {turns} turn(s) takes {fixed} tokens before any read: {n_tokens} is too "
                           "short", hint=f"ask --lengths of {fixed + 256} or more")
    n_chars = 3 * (n_tokens - fixed)
    best: tuple[int, tool_tasks.ToolCase] | None = None
    # reads are cut per file and filler files come and go with the size, so the count is not linear in n_chars:
    # rescale until within 3% and keep the closest
    for _ in range(6):
        case = tool_tasks.make_case(tree, intent, n_chars, depth, seed, turns)
        n = runner.count_tokens(case.messages[:case.turns[-1].end])
        if best is None or abs(n - n_tokens) < best[0]:
            best = (abs(n - n_tokens), case)
        if abs(n - n_tokens) <= 0.03 * n_tokens:
            break
        n_chars = max(1, round(n_chars * (n_tokens - fixed) / max(n - fixed, 1)))
    assert best is not None
    return best[1]


def row_of(case: tool_tasks.ToolCase, n_tokens: int, t: int, name: str, pieces: Sequence[str],
           full: tuple[Call, dict] | str, spec: tuple[Call, dict] | str) -> dict:
    turn = case.turns[t]
    row: dict = {"case": case.id, "intent": case.intent, "n_tokens": n_tokens, "depth": case.depth,
                 "turns": len(case.turns), "turn": t + 1, "setting": name, "n_prompt": len(pieces),
                 "expected": {"name": turn.name, "arguments": turn.arguments}}
    if isinstance(full, str) or isinstance(spec, str):
        return {**row, "status": "failed", "error": (full if isinstance(full, str) else spec)[-500:]}
    (full_call, full_timings), (spec_call, timings) = full, spec
    sp = timings.get("spec_prefill", {})
    kept = {i for begin, end in sp["kept"] for i in range(begin, end)} if "kept" in sp else None
    spans = [tasks.token_span(pieces, text) for text in turn.evidence]
    retained = None if kept is None else all(i in kept for s in spans for i in s)
    return {**row, "status": sp.get("status", "full"), "reason": sp.get("reason", ""),
            "full_call": {"name": full_call.name, "arguments": full_call.arguments, "text": full_call.text[:200],
                          "in_text": full_call.in_text},
            "spec_call": {"name": spec_call.name, "arguments": spec_call.arguments, "text": spec_call.text[:200],
                          "in_text": spec_call.in_text},
            "full_valid": full_call.valid, "spec_valid": spec_call.valid, "spec_error": spec_call.error,
            "equal": full_call.key() == spec_call.key(),
            "full_right": is_right(full_call, turn), "spec_right": is_right(spec_call, turn),
            "evidence_spans": [[s.start, s.stop] for s in spans], "evidence_retained": retained,
            "n_kept": sp.get("n_kept"), "n_reused": sp.get("n_reused"),
            "protected": sp.get("protected", []), "n_protected": sp.get("n_protected", 0),
            "ttft_ms": timings.get("prompt_ms"), "full_ttft_ms": full_timings.get("prompt_ms"),
            "n_prefilled": timings.get("prompt_n"), "full_n_prefilled": full_timings.get("prompt_n"),
            "score_ms": sp.get("score_ms")}


def run(runner: ChatRunner, tree: Path, intents: Sequence[str], lengths: Sequence[int], depths: Sequence[float],
        seeds: int, turns: Sequence[int], settings: Sequence[ToolSetting],
        on_row: Callable[[dict], None] | None = None) -> list[dict]:
    rows = []
    for n_turns in turns:
        for n_tokens in lengths:
            for depth in depths:
                for seed in range(seeds):
                    for intent in intents:
                        case = sized_case(runner, tree, intent, n_tokens, depth, seed, n_turns)
                        pieces = [runner.pieces(case.messages[:turn.end]) for turn in case.turns]
                        full = runner.conversation(case, {"enabled": False})
                        for setting in settings:
                            for t, spec in enumerate(runner.conversation(case, setting.request())):
                                row = row_of(case, n_tokens, t, setting.name, pieces[t], full[t], spec)
                                rows.append(row)
                                if on_row:
                                    on_row(row)
    return rows


def _share(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows if r.get(key) is not None]
    return f"{sum(map(bool, values))}/{len(values)}" if values else "-"


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summary(rows: list[dict]) -> list[dict]:
    """Per setting and turn count: the shares the aim is read from, and the mean TTFT per turn."""
    out = []
    done = [r for r in rows if r["status"] != "failed"]
    for name in dict.fromkeys(r["setting"] for r in rows):
        for n_turns in sorted({r["turns"] for r in rows if r["setting"] == name}):
            mine = [r for r in done if r["setting"] == name and r["turns"] == n_turns]
            per_turn = []
            for t in range(1, n_turns + 1):
                these = [r for r in mine if r["turn"] == t]
                full, spec = _mean([r["full_ttft_ms"] for r in these]), _mean([r["ttft_ms"] for r in these])
                per_turn.append({"turn": t, "full_ttft_ms": full, "ttft_ms": spec,
                                 "speedup": full / spec if full and spec else None})
            out.append({"setting": name, "turns": n_turns, "calls": len(mine),
                        "failed": sum(1 for r in rows if r["setting"] == name and r["turns"] == n_turns
                                      and r["status"] == "failed"),
                        "equal": _share(mine, "equal"),
                        # the aim's share: of the calls the full prefill made, those spec prefill made the same
                        "equal_calls": _share([r for r in mine if r["full_valid"]], "equal"),
                        "spec_valid": _share(mine, "spec_valid"),
                        "full_valid": _share(mine, "full_valid"),
                        "new_invalid": sum(1 for r in mine if r["full_valid"] and not r["spec_valid"]),
                        "spec_right": _share(mine, "spec_right"), "full_right": _share(mine, "full_right"),
                        # the quality table's "right answers kept", for calls: a fragile caller's wrong calls move
                        # with any change of context, and spec prefill fixing one counts against "equal"
                        "right_kept": _share([r for r in mine if r["full_right"]], "spec_right"),
                        "evidence_retained": _share(mine, "evidence_retained"),
                        "full_in_text": sum(1 for r in mine if r["full_call"]["in_text"]), "per_turn": per_turn})
    return out


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = ["# spbuild eval: tool calls", "", *(f"- {k}: `{v}`" for k, v in meta["describe"].items()), ""]
    if not meta.get("complete"):
        lines += [f"**Partial: {len(rows)} rows so far (the run is going on, or was cut short).**", ""]
    lines += ["| setting | turns | requests | equal to full | of the full's calls, equal | valid (full) | new invalid | right (full) "
              "| right calls kept | evidence kept | full calls in text | TTFT per turn, full -> spec ms (x) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary(rows):
        ttft = "; ".join(f"{p['full_ttft_ms']:.0f} -> {p['ttft_ms']:.0f} ({p['speedup']:.2f}x)"
                         if p["speedup"] else "-" for p in s["per_turn"])
        failed = f" ({s['failed']} failed)" if s["failed"] else ""
        lines.append(f"| {s['setting']} | {s['turns']} | {s['calls']}{failed} | {s['equal']} | {s['equal_calls']} | {s['spec_valid']} "
                     f"({s['full_valid']}) | {s['new_invalid']} | {s['spec_right']} ({s['full_right']}) | "
                     f"{s['right_kept']} | {s['evidence_retained']} | {s['full_in_text']} | {ttft} |")
    changed = [r for r in rows if r["status"] != "failed" and not r["equal"]]
    if changed:
        lines += ["", "## Calls that changed", "", "| case | turn | setting | full | spec | evidence kept | protected |",
                  "|---|---|---|---|---|---|---|"]
        for r in changed:
            def shown(call: dict) -> str:
                text = f"{call['name']}({json.dumps(call['arguments'])})" if call["name"] else f"text {call['text'][:40]!r}"
                return text.replace("|", "\\|")
            spans = ", ".join(f"{p['role']} {p['begin']}-{p['end']}" for p in r["protected"]) or "-"
            lines.append(f"| {r['case']} | {r['turn']} | {r['setting']} | {shown(r['full_call'])} | "
                         f"{shown(r['spec_call'])} | {r['evidence_retained']} | {spans} |")
    return "\n".join(lines) + "\n"


def write(out_dir: Path, meta: dict, rows: list[dict]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tools.json").write_text(json.dumps({**meta, "summary": summary(rows), "rows": rows}, indent=1) + "\n")
    (out_dir / "tools.md").write_text(markdown(meta, rows))
    return [out_dir / "tools.json", out_dir / "tools.md"]


def evaluate(bin_dir: Path, target: Path, draft: Path, tree: Path, out_dir: Path, lengths: Sequence[int],
             depths: Sequence[float], seeds: int, turns: Sequence[int], settings: Sequence[Setting],
             guards: Sequence[str], server_args: Sequence[str], intents: Sequence[str] = tool_tasks.INTENTS,
             progress: Callable[[int], Callable[[dict], None]] | None = None) -> list[Path]:
    """The tools eval on one server (the draft scores; `self` is the scorer when draft is the path 'self')."""
    tool_settings = [ToolSetting(s, g) for s in settings for g in guards]
    started = time.monotonic()
    n_ctx = int(max(lengths) * 1.15) + 512
    out_dir.mkdir(parents=True, exist_ok=True)
    backend = ServerBackend(bin_dir, target, draft, n_ctx, [*server_args, "--jinja"], out_dir / "server-tools.log")
    rows: list[dict] = []
    meta = {"target": str(target), "draft": str(draft), "settings": [s.name for s in tool_settings],
            "command": backend.command(),
            "describe": {"target": target.name, "draft": draft.name,
                         "cases": f"{len(intents)} intents ({', '.join(intents)}) x lengths "
                                  f"{', '.join(map(str, lengths))} x depths {', '.join(map(str, depths))} x {seeds} "
                                  f"seed(s), turns {', '.join(map(str, turns))}",
                         "command": " ".join(backend.command())}}
    total = sum(t for t in turns) * len(lengths) * len(depths) * seeds * len(intents) * len(tool_settings)
    shown = progress(total) if progress else None

    def on_row(row: dict) -> None:
        rows.append(row)
        write(out_dir, {**meta, "complete": False}, rows)
        if shown:
            shown(row)
    try:
        run(ChatRunner(backend), tree, intents, lengths, depths, seeds, turns, tool_settings, on_row)
    finally:
        backend.close()
    meta["elapsed_s"] = round(time.monotonic() - started, 1)
    return write(out_dir, {**meta, "complete": True}, rows)


def describe_row(row: dict) -> str:
    if row["status"] == "failed":
        return f"{row['case']} turn {row['turn']} {row['setting']}: failed: {row['error'][-120:]}"
    same = "same call" if row["equal"] else f"call changed ({row['full_call']['name']} -> {row['spec_call']['name']})"
    right = "right" if row["spec_right"] else "wrong"
    return f"{row['case']} turn {row['turn']} {row['setting']}: {row['status']}, {same}, {right}, " \
           f"TTFT {row['full_ttft_ms']:.0f} -> {row['ttft_ms']:.0f} ms"
