"""The eval's engine (`spbuild eval`, whose options and reports are spbuild.measuring.eval_cli): answer quality of spec prefill
against the full prefill of the same prompt, on cases with a known answer (`spbuild.measuring.tasks`), through the built
llama-server (one process, the model loaded once) or llama-specprefill.

For each case and setting it records whether the evidence tokens were among the kept ones (retention), whether the
answer itself (`tasks.answer_text`: up to its sentence end, at most two words past the expected answer's)
equals the full prefill's (answer agreement), whether the whole first line does (first-line agreement, which also
counts the text after the answer), and whether each answer is correct. The full prefill runs once per case; each
setting is one more request.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import requests

from spbuild.errors import SpbuildError
from spbuild.measuring import tasks
from spbuild.measuring.server import ServerProcess

N_PREDICT = 24
# the longest a single request or tool run may take (a 32K full prefill on two CPU cores takes minutes)
TIMEOUT_S = 3600


# what a setting may change per request (the selection's shape, the lookahead): the server's field and the tool's flag
VARIANT_FIELDS = {"chunk_size": "--spec-prefill-chunk", "chunk_lines": "--spec-prefill-chunk-lines",
                    "complete_lines": "--spec-prefill-complete-lines",
                    "question_lines": "--spec-prefill-question-lines",
                    "keep_first": "--spec-prefill-keep-first", "keep_last": "--spec-prefill-keep-last",
                    "lookahead": "--spec-prefill-lookahead", "layers": "--spec-prefill-layers"}
# the window a Setting of window 0 sends: longer than any prompt, so scored whole (the server's own 0 is automatic, and
# windows prompts of more than 16K new tokens)
WHOLE_PROMPT = 1 << 30

# on or off: 1 or 0 in --vary, a boolean in the request, a flag or its --no- form
SWITCH_FIELDS = {"chunk_lines", "complete_lines"}

# what scores the prompt: the prefill draft, or the target's own first layers (-mpd self), one server each
SCORERS = ("draft", "self")
SELF = "self"  # -mpd's name for the target's own weights


@dataclass(frozen=True)
class Setting:
    """One spec-prefill configuration: keep a fraction p, or the smallest set holding `value` of the score mass; score
    the whole prompt (window 0) or in windows of `window` tokens; `variant` changes the selection's shape (chunk size,
    always-kept head and tail), the lookahead or the layers that score from the server's defaults; `scorer` is the
    prefill draft or the target itself (SCORERS)."""

    select: str  # keep | mass
    value: float
    window: int = 0
    variant: tuple[tuple[str, int], ...] = ()
    scorer: str = "draft"

    @property
    def variant_name(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.variant)

    @property
    def name(self) -> str:
        what = f"p={self.value:g}" if self.select == "keep" else f"mass={self.value:g}"
        name = f"{what} " + ("full" if self.window == 0 else f"W={self.window}")
        name = f"{name} {self.variant_name}" if self.variant else name
        return f"{name} self" if self.scorer == "self" else name

    def request(self) -> dict:
        fields: dict = {"enabled": True, "min_tokens": 0, "window": self.window or WHOLE_PROMPT, "return_kept": True,
                        "select": self.select,
                        **{k: bool(v) if k in SWITCH_FIELDS else v for k, v in self.variant}}
        fields["p" if self.select == "keep" else "mass"] = self.value
        return fields

    def tool_args(self) -> list[str]:
        args = ["--spec-prefill-min-tokens", "0", "--spec-prefill-window", str(self.window or WHOLE_PROMPT)]
        for key, value in self.variant:
            flag = VARIANT_FIELDS[key]
            if key in SWITCH_FIELDS:
                args.append(flag if value else "--no-" + flag.removeprefix("--"))
            else:
                args += [flag, str(value)]
        if self.select == "keep":
            return args + ["--spec-prefill-p", str(self.value)]
        return args + ["--spec-prefill-select", "mass", "--spec-prefill-mass", str(self.value)]


def settings_grid(ps: Iterable[float], windows: Iterable[int], masses: Iterable[float] = (),
                  variants: Iterable[tuple[tuple[str, int], ...]] = ((),),
                  scorers: Iterable[str] = ("draft",), layers: str = "0") -> list[Setting]:
    """Every p (and mass) at every window, for each variant, layer count (with_layers) and scorer."""
    windows, ps, masses, variants = list(windows), list(ps), list(masses), list(variants)
    scorers = list(scorers)
    grid = []
    for scorer in scorers:
        for variant in with_layers(variants, layers, scorer, scorers):
            grid += [Setting("keep", p, w, variant, scorer) for w in windows for p in ps]
            grid += [Setting("mass", m, w, variant, scorer) for w in windows for m in masses]
    return grid


def with_layers(variants: Iterable[tuple[tuple[str, int], ...]], text: str, scorer: str = "draft",
                scorers: Sequence[str] = SCORERS) -> list[tuple[tuple[str, int], ...]]:
    """--layers: every variant again for each layer count of `scorer` (0: the scorer's default, all layers of a
    draft). A count applies to every scorer, SCORER:K to that one alone, so that "draft:0,draft:12,self:4" compares a
    draft's whole depth and first 12 layers with the target's first 4 in one run; a scorer no count names takes 0."""
    variants = list(variants)
    counts: list[int] = []
    for item in (v.strip() for v in text.split(",")):
        only, _, value = item.rpartition(":")
        try:
            k = int(value)
        except ValueError:
            k = -1
        if not item or k < 0 or (":" in item and not only):
            raise SpbuildError(f"--layers takes layer counts, 0 (the scorer's default) or more, each optionally "
                               f"SCORER:K, got {text!r}")
        if only and only not in scorers:
            raise SpbuildError(f"--layers names scorer {only!r}, which is not among the run's scorers "
                               f"({', '.join(scorers)})", hint="add it to --scorers, or drop the prefix")
        if (not only or only == scorer) and k not in counts:
            counts.append(k)
    return [(*v, ("layers", k)) if k else v for k in counts or [0] for v in variants]


def scorers(text: str) -> list[str]:
    """--scorers: draft (the prefill draft), self (the target's own first layers), or both, comma-separated."""
    return names(text, SCORERS, "scorer")


def variants(text: str) -> list[tuple[tuple[str, int], ...]]:
    """--vary: the server's selection defaults, then each ';'-separated variant, e.g. "chunk_size=64;keep_last=256"
    (a variant may set several fields: "chunk_size=64,keep_last=256")."""
    out: list[tuple[tuple[str, int], ...]] = [()]
    for part in (v.strip() for v in text.split(";")):
        if not part:
            continue
        variant = []
        for item in part.split(","):
            key, _, value = item.partition("=")
            key = key.strip()
            if key not in VARIANT_FIELDS or not value.strip().isdigit() or \
                    (key in SWITCH_FIELDS and value.strip() not in ("0", "1")) or \
                    (key == "lookahead" and int(value) < 1):
                raise SpbuildError(f"--vary: {item.strip()!r} is not FIELD=N with FIELD one of "
                                   f"{', '.join(VARIANT_FIELDS)} ({', '.join(SWITCH_FIELDS)}: 0 or 1; "
                                   f"lookahead: 1 or more)")
            variant.append((key, int(value)))
        out.append(tuple(variant))
    return out


@dataclass
class Answer:
    text: str
    status: str = "full"
    reason: str = ""
    kept: list[int] | None = None  # prompt token indices the target prefilled (None: not reported)
    n_windows: int = 0
    timings: dict = field(default_factory=dict)


class Backend(Protocol):
    """Where the prompts run: the pieces of a prompt's tokens, its full-prefill answer, its answer under a setting."""

    def pieces(self, prompt: str) -> list[str]: ...

    def full(self, prompt: str) -> Answer: ...

    def sparse(self, prompt: str, setting: Setting) -> Answer: ...

    def command(self) -> list[str]: ...


class ServerBackend:
    """One llama-server with the target and the prefill draft; spec prefill is set per request."""

    def __init__(self, bin_dir: Path, target: Path, draft: Path, n_ctx: int, extra: Sequence[str], log: Path):
        # the draft's context holds the slot's whole context and the lookahead (the server sizes it for the longest
        # prompt a slot can hold), so that window 0 is full-prompt scoring at every length
        n_slot = n_ctx + N_PREDICT + 64
        # break-even 0: every request is scored, the eval measures the selection, not the gate; any window it is asked
        self.argv = ["-m", str(target), "-mpd", str(draft), "--spec-prefill", "-c", str(n_slot),
                     "--spec-prefill-ctx", str(n_slot + 256), "--spec-prefill-break-even", "0",
                     "--spec-prefill-window-min", "256", "-np", "1", "--temp", "0", *extra]
        self.server = ServerProcess(bin_dir / "llama-server", self.argv, log=log)
        try:
            self.server.wait_ready(600)
        except (RuntimeError, TimeoutError) as err:
            self.server.stop()
            raise SpbuildError(f"llama-server did not start for the eval: {err}") from err

    def close(self) -> None:
        self.server.stop()

    def command(self) -> list[str]:
        return ["llama-server", *self.argv]

    def count_tokens(self, text: str) -> int:
        return len(self._tokenize(text, pieces=False))

    def _tokenize(self, text: str, pieces: bool) -> list:
        response = self.server.request("POST", "/tokenize", {"content": text, "add_special": True,
                                                             "with_pieces": pieces}, timeout=TIMEOUT_S)
        response.raise_for_status()
        return response.json()["tokens"]

    def render_chat(self, message: str) -> str:
        """A user message as the server's chat template renders it for the model (the prompt /completion gets)."""
        response = self.server.request("POST", "/apply-template",
                                       {"messages": [{"role": "user", "content": message}]}, timeout=TIMEOUT_S)
        response.raise_for_status()
        return response.json()["prompt"]

    def pieces(self, prompt: str) -> list[str]:
        return [t["piece"] if isinstance(t["piece"], str) else bytes(t["piece"]).decode("utf-8", "replace")
                for t in self._tokenize(prompt, pieces=True)]

    def _complete(self, prompt: str, spec_prefill: dict) -> Answer:
        body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "cache_prompt": False,
                "spec_prefill": spec_prefill}
        response = self.server.request("POST", "/completion", body, timeout=TIMEOUT_S)
        if response.status_code != 200:
            raise SpbuildError(f"llama-server answered {response.status_code}: {response.text[:300]}")
        data = response.json()
        timings = data.get("timings", {})
        sp = timings.get("spec_prefill", {})
        kept = [i for begin, end in sp["kept"] for i in range(begin, end)] if "kept" in sp else None
        return Answer(data["content"], sp.get("status", "full"), sp.get("reason", ""), kept, sp.get("n_windows", 0),
                      {"prompt_ms": timings.get("prompt_ms"), "score_ms": sp.get("score_ms"), "n_kept": sp.get("n_kept"),
                       "sparse_prefill_ms": sp.get("sparse_prefill_ms"), "n_prompt": sp.get("n_prompt")})

    def full(self, prompt: str) -> Answer:
        return self._complete(prompt, {"enabled": False})

    def sparse(self, prompt: str, setting: Setting) -> Answer:
        return self._complete(prompt, setting.request())


class ToolBackend:
    """llama-specprefill, one process per prompt and setting (the first with --baseline for the full answer)."""

    def __init__(self, bin_dir: Path, target: Path, draft: Path, n_ctx: int, extra: Sequence[str], work: Path):
        self.binary = bin_dir / "llama-specprefill"
        self.common = ["-m", str(target), "-mpd", str(draft), "-c", str(n_ctx + N_PREDICT + 64), "--spec-prefill-ctx",
                       str(n_ctx + N_PREDICT + 320), "-n", str(N_PREDICT), "--temp", "0", *extra]
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        self._with_baseline: dict[str, dict] = {}  # the last prompt -> the report of its run with --baseline
        self._runs = 0

    def close(self) -> None:
        pass

    def command(self) -> list[str]:
        return ["llama-specprefill", *self.common]

    def _run(self, prompt: str, args: list[str]) -> dict:
        self._runs += 1
        prompt_file = self.work / "prompt.txt"
        prompt_file.write_text(prompt)
        report = self.work / f"run-{self._runs}.json"
        argv = [str(self.binary), *self.common, "-f", str(prompt_file), "--json", str(report), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)
        (self.work / f"run-{self._runs}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0 or not report.exists():
            raise SpbuildError(f"llama-specprefill failed (exit code {proc.returncode}); see "
                               f"{self.work / f'run-{self._runs}.log'}: {proc.stderr.strip()[-300:]}")
        return json.loads(report.read_text())

    def _baseline(self, prompt: str) -> dict:
        # the first sparse run of a prompt carries --baseline; a prompt with no such run gets one of its own
        if prompt not in self._with_baseline:
            self._with_baseline = {prompt: self._run(prompt, ["--baseline"])}
        return self._with_baseline[prompt]

    def pieces(self, prompt: str) -> list[str]:
        return self._baseline(prompt)["prompt_pieces"]

    def full(self, prompt: str) -> Answer:
        return Answer(self._baseline(prompt)["baseline"]["text"])

    def sparse(self, prompt: str, setting: Setting) -> Answer:
        first = prompt not in self._with_baseline
        data = self._run(prompt, setting.tool_args() + (["--baseline"] if first else []))
        if first:
            self._with_baseline = {prompt: data}
        kept = list(data["kept"]) if data["status"] == "sparse" else list(range(data["n_prompt"]))
        if kept and kept[-1] != data["n_prompt"] - 1:
            kept.append(data["n_prompt"] - 1)  # the tool prefills the last token always, as the server does
        return Answer(data["run"]["text"], status_of_tool(data["status"]), data.get("reason", ""),
                      kept, data.get("n_windows", 0),
                      {"prompt_ms": data["run"]["prefill_ms"] + data["score_ms"], "score_ms": data["score_ms"],
                       "sparse_prefill_ms": data["run"]["prefill_ms"], "n_prompt": data["n_prompt"]})


# the tool's statuses (common_spec_prefill_status_name) in the server's words, so that both read alike
_TOOL_STATUS = {"sparse": "active", "kept_all": "kept_all", "short": "skipped_min_tokens", "failed": "error_fallback",
                "cancelled": "error_fallback"}


def status_of_tool(status: str) -> str:
    """llama-specprefill's status as llama-server names it (bench and eval rows read alike through either)."""
    return _TOOL_STATUS.get(status, status)


def evidence_spans(case: tasks.Case, pieces: Sequence[str]) -> list[range]:
    return [tasks.token_span(pieces, line) for line in case.evidence]


def outcome(case: tasks.Case, setting: Setting, pieces: Sequence[str], full: Answer, spec: Answer) -> dict:
    """One row of the eval: the case, the setting, what was kept and what was answered."""
    spans = evidence_spans(case, pieces)
    kept = set(spec.kept) if spec.kept is not None else None
    n_evidence = sum(len(s) for s in spans)
    n_evidence_kept = sum(1 for s in spans for i in s if kept is not None and i in kept)
    lines_kept = [kept is not None and all(i in kept for i in s) for s in spans]
    full_text, spec_text = tasks.answer_text(case, full.text), tasks.answer_text(case, spec.text)
    full_correct, spec_correct = tasks.is_correct(case, full.text), tasks.is_correct(case, spec.text)
    return {
        "case": case.id, "kind": case.kind, "filler": case.filler, "n_tokens": case.n_tokens, "depth": case.depth,
        "n_prompt": len(pieces), "setting": setting.name, "select": setting.select, "value": setting.value,
        "window": setting.window, "variant": setting.variant_name, "scorer": setting.scorer, "status": spec.status,
        "reason": spec.reason,
        "n_windows": spec.n_windows,
        "n_kept": len(kept) if kept is not None else None,
        "evidence_tokens": n_evidence, "evidence_tokens_kept": n_evidence_kept if kept is not None else None,
        "evidence_lines": len(spans), "evidence_lines_kept": sum(lines_kept) if kept is not None else None,
        "evidence_retained": all(lines_kept) if kept is not None else None,
        "answer": case.answer, "full_answer": tasks.first_line(full.text), "spec_answer": tasks.first_line(spec.text),
        "agree": tasks.first_line(full.text) == tasks.first_line(spec.text),
        "full_answer_text": full_text, "spec_answer_text": spec_text,
        "answer_agree": tasks.answers_agree(full_text, full_correct, spec_text, spec_correct),
        "full_correct": full_correct, "spec_correct": spec_correct,
        # for looking into changed answers afterwards: what around the evidence and before the question was kept
        "context_kept": _share_kept(kept, _around(spans, CONTEXT_TOKENS, len(pieces))),
        "tail_kept": _share_kept(kept, range(max(0, len(pieces) - TAIL_TOKENS), len(pieces))),
        "evidence_spans": [[s.start, s.stop] for s in spans],
        "kept_ranges": _ranges(sorted(kept)) if kept is not None else None,
        "timings": spec.timings,
        "full_timings": full.timings,
    }


CONTEXT_TOKENS = 32  # the tokens on either side of an evidence line that `context_kept` covers
TAIL_TOKENS = 256  # the prompt's end (the question and the lines before it) that `tail_kept` covers


def _around(spans: Sequence[range], width: int, n: int) -> list[int]:
    inside = {i for s in spans for i in s}
    near = {i for s in spans for i in range(max(0, s.start - width), min(n, s.stop + width))}
    return sorted(near - inside)


def _share_kept(kept: set[int] | None, positions: Sequence[int]) -> float | None:
    if kept is None or not positions:
        return None
    return round(sum(1 for i in positions if i in kept) / len(positions), 4)


def _ranges(positions: Sequence[int]) -> list[list[int]]:
    ranges: list[list[int]] = []
    for i in positions:
        if ranges and ranges[-1][1] == i:
            ranges[-1][1] = i + 1
        else:
            ranges.append([i, i + 1])
    return ranges


def run(backend: Backend, cases: Sequence[tasks.Case], settings: Sequence[Setting],
        on_row: Callable[[dict], None] | None = None,
        full_prefills: dict[str, tuple[list[str], Answer]] | None = None) -> list[dict]:
    """Every case under every setting; a failure of one request is a row with its error, and the run goes on.
    full_prefills (prompt -> its pieces and full-prefill answer) is shared by the servers of one run's scorers: the
    target's full prefill is the same whatever scores, so each case's is computed once."""
    rows = []
    full_prefills = {} if full_prefills is None else full_prefills
    for case in cases:
        answers: list[tuple[Setting, Answer | str, float]] = []
        for setting in settings:
            started = time.monotonic()
            try:
                answers.append((setting, backend.sparse(case.prompt, setting), time.monotonic() - started))
            except (SpbuildError, requests.RequestException, subprocess.TimeoutExpired) as err:
                answers.append((setting, str(err), 0.0))
        try:
            if case.prompt not in full_prefills:
                full_prefills[case.prompt] = (backend.pieces(case.prompt), backend.full(case.prompt))
            pieces, full = full_prefills[case.prompt]
        except (SpbuildError, requests.RequestException, subprocess.TimeoutExpired) as err:
            pieces, full = [], Answer("")
            answers = [(setting, f"full prefill: {err}", 0.0) for setting, _, _ in answers]
        for setting, spec, seconds in answers:
            if isinstance(spec, str):
                row = _failed(case, setting, spec)
            else:
                row = outcome(case, setting, pieces, full, spec)
                row["wall_s"] = round(seconds, 3)
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def _failed(case: tasks.Case, setting: Setting, error: str) -> dict:
    return {"case": case.id, "kind": case.kind, "filler": case.filler, "n_tokens": case.n_tokens, "depth": case.depth,
           "setting": setting.name, "select": setting.select, "value": setting.value, "window": setting.window,
           "variant": setting.variant_name, "scorer": setting.scorer, "status": "failed", "error": error[-500:]}


def case_record(case: tasks.Case) -> dict:
    """A case as the report keeps it (the prompt itself is in the run's cases.jsonl)."""
    record = asdict(case)
    record.pop("prompt")
    return record


def numbers(text: str, kind: type) -> list:
    """A comma-separated option value (--p, --lengths, --sizes) as numbers of `kind`."""
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise SpbuildError(f"not a list of {kind.__name__} values: {text!r}") from err


def windows(text: str) -> list[int]:
    """--window: 0 (the whole prompt) or a window of at least 256 tokens, as the server accepts."""
    values = numbers(text, int)
    if any(w and w < 256 for w in values):
        raise SpbuildError(f"--window values are 0 (the whole prompt) or at least 256, got {text}")
    return values


def names(text: str, known: Sequence[str], what: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SpbuildError(f"unknown {what}: {', '.join(unknown) or '(none given)'} (known: {', '.join(known)})")
    return names
