"""`spbuild bench`: time to first token with spec prefill against the full prefill of the same prompt, measured
side by side in one run, through the built llama-server (one process, spec prefill set per request) or
llama-specprefill, with the phases (queue, scoring: the draft's prefill and query steps, the sparse prefill) and the
draft's own flash-attention prefill by llama-bench, from which the bound follows:

    bound = T_full / (T_draft_prefill + T_sparse_prefill)

the speedup if scoring cost no more than the draft's plain prefill. The same ratio with the draft prefill this run's
scoring measured (of_bound_in_run) leaves out llama-bench's run-to-run spread (about 8% on an H200 at 8K), so it shows
what the query steps and the rest of the scoring cost. Warm-up runs first, then repetitions; medians and spread. Also random-weight models of real shapes (`make-model`) and the speculative-decoding table
(`spec-decoding`): `python -m spbuild.measuring.bench --help`.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    # run as a script on a bare GPU machine (python3 orchestrator/spbuild/measuring/bench.py ...): the package's folder replaces
    # this file's, whose modules (bisect, stats) would shadow the standard library's
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import json
import math
import random
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from spbuild.errors import SpbuildError
from spbuild.measuring import reports
from spbuild.measuring.evaluate import SELF, Setting, numbers, scorers, settings_grid, status_of_tool, windows
from spbuild.measuring.models import KINDS, SHAPES, make
from spbuild.measuring.requests import from_options
from spbuild.measuring.server import ServerProcess, refuse_own_address
from spbuild.measuring.stats import Spread

# common English words that the llama-bpe tokenizer keeps as single tokens, so N words make about N tokens
WORDS = ("the of and to in is was for on that with as by at from his her they this are had not but have one "
         "all were when there can been more who will would their what said each which she do how if up other "
         "about out many then them these so some make like into time has look two write go see number no way "
         "could people my than first water been call who oil its now find long down day did get come made may").split()

# the longest any one benchmark process or request may run (a 128K full prefill on a slow backend takes minutes)
TIMEOUT_S = 3600
PHASES = ("queue_ms", "score_ms", "score_draft_prefill_ms", "score_query_ms", "score_reduce_ms", "sparse_prefill_ms")


def make_prompt(n_tokens: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_tokens))


@dataclass(frozen=True)
class Plan:
    """What one bench run measures."""

    sizes: list[int]
    settings: list[Setting]
    repeat: int = 3
    warmup: int = 1

    def __post_init__(self) -> None:
        if self.repeat < 1 or self.warmup < 0:
            raise SpbuildError(f"--repeat must be at least 1 and --warmup at least 0, got {self.repeat}/{self.warmup}")
        if not self.sizes or not self.settings:
            raise SpbuildError("nothing to measure: give at least one size and one setting")

    @property
    def steps(self) -> int:
        """Measurements, for the progress bar: per size the draft's prefill, the full prefill and each setting."""
        return len(self.sizes) * (2 + len(self.settings))


def draft_prefill(bin_dir: Path, draft: Path, n_tokens: int, repeat: int, args: Sequence[str],
                  log: Path) -> tuple[Spread, list[str]]:
    """The draft's plain prefill of n_tokens with flash attention, by upstream's llama-bench (which warms up itself)."""
    argv = [str(bin_dir / "llama-bench"), "-m", str(draft), "-p", str(n_tokens), "-n", "0", "-fa", "1",
            "-r", str(repeat), "-o", "json", *args]
    if not (bin_dir / "llama-bench").exists():
        log.write_text("llama-bench is not in this build: `spbuild build` builds it\n")
        return Spread.of([]), argv
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log.write_text(f"timed out after {TIMEOUT_S} s\n")
        return Spread.of([]), argv
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return Spread.of([]), argv
    result = json.loads(proc.stdout)[0]
    return Spread.of([ns / 1e6 for ns in result.get("samples_ns") or [result["avg_ns"]]]), argv


def stream_ttft(server: ServerProcess, prompt: str, spec_prefill: dict, n_predict: int = 4) -> tuple[float, dict]:
    """Client-side time to the first streamed token of a completion, and the final chunk's timings."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "stream": True, "cache_prompt": False,
            "spec_prefill": spec_prefill}
    started = time.monotonic()
    first = None
    timings: dict = {}
    with requests.post(f"{server.url}/completion", json=body, stream=True, timeout=TIMEOUT_S) as response:
        if response.status_code != 200:
            raise SpbuildError(f"llama-server answered {response.status_code}: {response.text[:300]}")
        for line in response.iter_lines():
            if not line.startswith(b"data: "):
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("content"):
                first = time.monotonic()
            timings = chunk.get("timings", timings)
    return ((first or time.monotonic()) - started) * 1e3, timings


def draft_ctx_cap(n_ctx: int) -> int:
    """--spec-prefill-ctx for prompts of up to n_ctx tokens: a cap, not a size. Above the draft's trained context too,
    so that window 0 is full-prompt scoring at every N; with room for the windows of any N side by side, which add a
    sink, the question and the lookahead each (the server prepares the slot's prompt in full and in 8K windows, the
    tool sizes the draft context for each prompt)."""
    return 2 * n_ctx + 1024


class ServerLeg:
    """One llama-server for every size (its context fits the largest prompt, the draft's too, so that window 0 is
    full-prompt scoring at every N); spec prefill is set per request."""

    def __init__(self, bin_dir: Path, target: Path, draft: Path, n_ctx: int, server_args: Sequence[str],
                 draft_args: Sequence[str], log: Path):
        # break-even 0: every request is scored, the bench measures spec prefill, not the gate; any window it is asked
        self.argv = ["-m", str(target), "-mpd", str(draft), "--spec-prefill", "-c", str(n_ctx + 512),
                     "--spec-prefill-ctx", str(draft_ctx_cap(n_ctx)), "--spec-prefill-break-even", "0",
                     "--spec-prefill-window-min", "256", "-np", "1", *server_args, *draft_args]
        self.server = ServerProcess(bin_dir / "llama-server", self.argv, log=log)
        try:
            self.server.wait_ready(900)
        except (RuntimeError, TimeoutError) as err:
            self.server.stop()
            raise SpbuildError(f"llama-server did not start for the bench: {err}") from err

    def command(self) -> list[str]:
        return ["llama-server", *self.argv]

    def close(self) -> None:
        self.server.stop()

    def full(self, prompt: str, warmup: int, repeat: int) -> list[dict]:
        runs = [{"ttft_ms": stream_ttft(self.server, prompt, {"enabled": False})[0]} for _ in range(warmup + repeat)]
        return runs[warmup:]

    def sparse(self, prompt: str, setting: Setting, warmup: int, repeat: int) -> list[dict]:
        measured = []
        for _ in range(warmup + repeat):
            ttft, timings = stream_ttft(self.server, prompt, {**setting.request(), "return_kept": False})
            sp = timings.get("spec_prefill", {})
            measured.append({"ttft_ms": ttft, **{k: sp.get(k, math.nan) for k in PHASES},
                             "status": sp.get("status", "?"), "reason": sp.get("reason", ""),
                             "n_kept": sp.get("n_kept", 0), "n_windows": sp.get("n_windows", 0)})
        return measured[warmup:]


class ToolLeg:
    """llama-specprefill, one process per size and setting: --baseline --repeat gives both TTFTs per repetition."""

    def __init__(self, bin_dir: Path, target: Path, draft: Path, n_ctx: int, server_args: Sequence[str],
                 draft_args: Sequence[str], work: Path):
        self.binary = bin_dir / "llama-specprefill"
        self.common = ["-m", str(target), "-mpd", str(draft), "-c", str(n_ctx + 512), "--spec-prefill-ctx",
                       str(draft_ctx_cap(n_ctx)), "-n", "4", "--temp", "0", *server_args, *draft_args]
        self.work = work
        self._full: dict[str, list[dict]] = {}
        self._runs = 0

    def command(self) -> list[str]:
        return ["llama-specprefill", *self.common]

    def close(self) -> None:
        pass

    def _run(self, prompt: str, setting: Setting, runs: int) -> dict:
        self._runs += 1
        prompt_file = self.work / f"prompt-{self._runs}.txt"
        prompt_file.write_text(prompt)
        report = self.work / f"tool-{self._runs}.json"
        argv = [str(self.binary), *self.common, "-f", str(prompt_file), "--json", str(report), "--baseline",
                "--repeat", str(runs), *setting.tool_args()]
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)
        (self.work / f"tool-{self._runs}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0 or not report.exists():
            raise SpbuildError(f"llama-specprefill failed (exit code {proc.returncode}), see "
                               f"{self.work / f'tool-{self._runs}.log'}")
        return json.loads(report.read_text())

    def full(self, prompt: str, warmup: int, repeat: int) -> list[dict]:
        # the baselines come with the settings' runs (--baseline), measured in the same processes (see sparse)
        return self._full.get(prompt, [])

    def sparse(self, prompt: str, setting: Setting, warmup: int, repeat: int) -> list[dict]:
        data = self._run(prompt, setting, warmup + repeat)
        runs = data["repeats"][warmup:]
        status = status_of_tool(data["status"])
        measured = [{"ttft_ms": r["ttft_ms"], "queue_ms": 0.0, "score_ms": r["score_ms"],
                     "score_draft_prefill_ms": r["draft_prefill_ms"], "score_query_ms": r["query_ms"],
                     "score_reduce_ms": r["reduce_ms"],
                     "sparse_prefill_ms": r.get("prefill_ms", math.nan), "status": status,
                     "reason": data.get("reason", ""), "n_kept": len(data["kept"]) if data["status"] == "sparse"
                     else data["n_prompt"], "n_windows": data.get("n_windows", 0)} for r in runs]
        self._full.setdefault(prompt, []).extend({"ttft_ms": r["baseline_ttft_ms"]} for r in runs)
        return measured


Leg = ServerLeg | ToolLeg


def run(legs: Leg | dict[str, Leg], bin_dir: Path, draft: Path, plan: Plan, out_dir: Path,
        bench_args: Sequence[str] = (), on_step: Callable[[str], None] | None = None,
        on_size: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Every size under the full prefill and every setting: warm-up runs, then `plan.repeat` measured ones. `legs`:
    one per scorer the settings name (a single leg is the draft's); the first also measures the full prefill.
    `on_size` gets the rows so far after each size."""
    legs = legs if isinstance(legs, dict) else {"draft": legs}
    first = next(iter(legs.values()))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    step = on_step or (lambda _: None)
    for n in plan.sizes:
        prompt = make_prompt(n)
        t_draft, draft_argv = draft_prefill(bin_dir, draft, n, plan.repeat, bench_args, out_dir / f"llama-bench-{n}.log")
        step(f"N={n:,}: draft prefill {t_draft.median:,.0f} ms")
        measured = {}
        for setting in plan.settings:
            try:
                runs = legs[setting.scorer].sparse(prompt, setting, plan.warmup, plan.repeat)
            except (SpbuildError, requests.RequestException, subprocess.TimeoutExpired) as err:
                runs = str(err)
            measured[setting] = runs
            step(f"N={n:,} {setting.name}")
        try:
            full = first.full(prompt, plan.warmup, plan.repeat)
        except (SpbuildError, requests.RequestException) as err:
            full = []
            for setting in plan.settings:
                measured[setting] = measured[setting] if isinstance(measured[setting], str) else f"full prefill: {err}"
        step(f"N={n:,}: full prefill")
        t_full = Spread.of([r["ttft_ms"] for r in full])
        for setting, runs in measured.items():
            rows.append(_row(n, setting, runs, t_full, t_draft, draft_argv))
        if on_size:
            on_size(rows)
    return rows


def _row(n: int, setting: Setting, runs: list[dict] | str, t_full: Spread, t_draft: Spread,
         draft_argv: list[str]) -> dict:
    row: dict = {"n_prompt": n, "setting": setting.name, "select": setting.select, "value": setting.value,
                 "window": setting.window, "variant": setting.variant_name, "scorer": setting.scorer,
                 "llama_bench": draft_argv[1:]}
    if isinstance(runs, str):
        return {**row, "error": runs[-500:]}
    spec = Spread.of([r["ttft_ms"] for r in runs])
    phases = {k: Spread.of([r[k] for r in runs]) for k in PHASES}
    bound = t_full.median / (t_draft.median + phases["sparse_prefill_ms"].median)
    # the draft prefill the scoring itself timed, in the same requests (a plain flash-attention prefill, too)
    bound_in_run = t_full.median / (phases["score_draft_prefill_ms"].median + phases["sparse_prefill_ms"].median)
    speedup = t_full.median / spec.median
    last = runs[-1]
    return {**row, "status": last["status"], "reason": last["reason"], "n_kept": last["n_kept"],
            "n_windows": last["n_windows"], "full_ttft_ms": t_full.as_dict(), "spec_ttft_ms": spec.as_dict(),
            **{k: v.as_dict() for k, v in phases.items()}, "draft_prefill_ms": t_draft.as_dict(),
            "speedup": speedup, "bound": bound, "of_bound": speedup / bound if bound else math.nan,
            "of_bound_in_run": speedup / bound_in_run if bound_in_run else math.nan}


def _started(binary: Path, args: list[str], log: Path) -> ServerProcess:
    server = ServerProcess(binary, args, log=log)
    try:
        server.wait_ready(600)
    except (RuntimeError, TimeoutError):
        server.stop()
        raise
    return server


# ngram lookups short enough that model output finds matches in its own history and the prompt
NGRAM_ARGS = {
    "ngram-simple": ["--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m", "8"],
    "ngram-map-k": ["--spec-ngram-map-k-size-n", "2", "--spec-ngram-map-k-size-m", "8"],
    "ngram-map-k4v": ["--spec-ngram-map-k4v-size-n", "2", "--spec-ngram-map-k4v-size-m", "8"],
    "ngram-mod": ["--spec-ngram-mod-n-match", "2", "--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "8"],
}


def run_spec_decoding(bin_dir: Path, target: Path, prefill_draft: Path, types: dict[str, tuple[Path, list[str]]],
                      sizes: list[int], p: float, n_predict: int, out_dir: Path, server_args: list[str],
                      repeat: int = 2) -> list[dict]:
    """Decode speed and acceptance of each speculative-decoding type with spec prefill off and on (per request, one
    server per type), and decode speed with no speculative decoding at all, for prompts of each size. `types` maps a
    --spec-type to its target and extra arguments (a -md draft); "none" is the reference."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    n_ctx = max(sizes) + n_predict + 256
    for spec_type, (type_target, extra) in {"none": (target, []), **types}.items():
        argv = ["-m", str(type_target), "-c", str(n_ctx), "-np", "1", "-mpd", str(prefill_draft),
                "--spec-prefill-p", str(p), "--spec-prefill-break-even", "0", *server_args, *(["--spec-type", spec_type] if spec_type != "none" else []),
                *extra]
        try:
            server = _started(bin_dir / "llama-server", argv, out_dir / f"server-{spec_type}.log")
        except (RuntimeError, TimeoutError) as err:
            rows.append({"spec_type": spec_type, "error": str(err)[-300:], "command": argv})
            print(f"[{spec_type}] failed to start: see {out_dir / f'server-{spec_type}.log'}", file=sys.stderr)
            continue
        try:
            for n in sizes:
                row: dict = {"spec_type": spec_type, "n_prompt": n, "command": argv}
                try:
                    row.update(_spec_decoding_row(server, n, n_predict, repeat))
                except requests.RequestException as err:  # recorded; the other sizes and types still run
                    rows.append({**row, "error": f"N={n}: {err}"[-300:]})
                    continue
                rows.append(row)
                print(f"[{spec_type} {n}] acceptance {row['full_acceptance']:.2f} -> {row['sparse_acceptance']:.2f}, "
                      f"decode {row['full_decode_tps']:.1f} -> {row['sparse_decode_tps']:.1f} t/s, prompt "
                      f"{row['full_prompt_ms']:.0f} -> {row['sparse_prompt_ms']:.0f} ms", file=sys.stderr, flush=True)
        finally:
            server.stop()
        (out_dir / "spec-decoding-results.json").write_text(json.dumps(rows, indent=1))
    (out_dir / "spec-decoding-results.md").write_text(spec_decoding_markdown(rows))
    print(spec_decoding_markdown(rows))
    return rows


def _spec_decoding_row(server: ServerProcess, n: int, n_predict: int, repeat: int) -> dict:
    row: dict = {}
    for enabled in (False, True):
        runs = []
        for r in range(repeat):
            body = {"prompt": make_prompt(n, seed=100 + r), "n_predict": n_predict, "temperature": 0,
                    "cache_prompt": False, "ignore_eos": True, "spec_prefill": {"enabled": enabled}}
            response = server.request("POST", "/completion", body, timeout=TIMEOUT_S)
            response.raise_for_status()
            runs.append(response.json()["timings"])
        key = "sparse" if enabled else "full"
        drafted = sum(t.get("draft_n", 0) for t in runs)
        accepted = sum(t.get("draft_n_accepted", 0) for t in runs)
        row[f"{key}_status"] = runs[-1]["spec_prefill"]["status"]
        row[f"{key}_acceptance"] = accepted / drafted if drafted else float("nan")
        row[f"{key}_drafted"] = drafted
        row[f"{key}_decode_tps"] = statistics.median(t["predicted_per_second"] for t in runs)
        row[f"{key}_prompt_ms"] = statistics.median(t["prompt_ms"] for t in runs)
    return row


def spec_decoding_markdown(rows: list[dict]) -> str:
    lines = ["| --spec-type | N | acceptance, full prefill | acceptance, spec prefill | decode t/s, full | "
             "decode t/s, spec prefill | prompt ms, full | prompt ms, spec prefill |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['spec_type']} | failed: {r['error'][-80:]} | | | | | | |")
            continue
        lines.append(f"| {r['spec_type']} | {r['n_prompt']:,} | {r['full_acceptance']:.1%} | "
                     f"{r['sparse_acceptance']:.1%} | {r['full_decode_tps']:,.1f} | {r['sparse_decode_tps']:,.1f} | "
                     f"{r['full_prompt_ms']:,.0f} | {r['sparse_prompt_ms']:,.0f} ({r['sparse_status']}) |")
    return "\n".join(lines).replace("nan%", "-") + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`spbuild bench`'s options (also `python -m spbuild.measuring.bench measure`, with --bin)."""
    parser.add_argument("--via", choices=("server", "tool"), default="server",
                        help="measure through llama-server over HTTP (default) or llama-specprefill")
    parser.add_argument("--target", type=Path, help="target GGUF (default: a random model of --shapes' first shape)")
    parser.add_argument("--draft", type=Path, help="prefill draft GGUF (default: --shapes' second shape)")
    parser.add_argument("--shapes", default="8b,1.5b", help=f"target,draft shapes of random-weight models, made "
                        f"once into the models folder when --target/--draft are not given (known: "
                        f"{', '.join(sorted(SHAPES))})")
    parser.add_argument("--sizes", default="8192,32768", help="prompt lengths in tokens, comma-separated")
    parser.add_argument("--p", default="0.1,0.3", help="fractions kept, comma-separated")
    parser.add_argument("--window", default="0,8192", help="scoring windows, comma-separated (0: the whole prompt)")
    parser.add_argument("--layers", default="0", help="score with the scorer's first K layers, comma-separated counts "
                        "(0: its default, all layers of a draft), each for every scorer or, as SCORER:K, for one (0,self:4)")
    parser.add_argument("--scorers", default="draft", help="what scores: draft (the prefill draft), self (the target's "
                        "own first layers, -mpd self), or both, comma-separated; one server each")
    parser.add_argument("--repeat", type=int, default=3, help="measured runs per setting (median and spread)")
    parser.add_argument("--warmup", type=int, default=1, help="runs before the measured ones, per setting")
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="where results.json/.md and bench.png go")
    parser.add_argument("--server-args", default="-ngl 99 -fa on -b 4096 -ub 1024",
                        help="arguments of the server (or the tool): devices, offload, batch sizes")
    parser.add_argument("--draft-args", default="-nglpd 99", help="the prefill draft's arguments (-devpd, -nglpd)")
    parser.add_argument("--bench-args", default="-ngl 99 -b 4096 -ub 1024",
                        help="llama-bench's arguments for the draft's own prefill")
    parser.add_argument("--no-plots", action="store_true", help="tables only (plot later with `spbuild report DIR`)")


@dataclass(frozen=True)
class BenchRequest:
    """What `spbuild bench` (or `python -m spbuild.measuring.bench measure`) asks for, past its parser."""
    via: str = "server"
    target: Path | None = None
    draft: Path | None = None
    shapes: str = "8b,1.5b"
    sizes: str = "8192,32768"
    p: str = "0.1,0.3"
    window: str = "0,8192"
    layers: str = "0"
    scorers: str = "draft"
    repeat: int = 3
    warmup: int = 1
    out: Path = Path("bench-out")
    server_args: str = "-ngl 99 -fa on -b 4096 -ub 1024"
    draft_args: str = "-nglpd 99"
    bench_args: str = "-ngl 99 -b 4096 -ub 1024"
    plots: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchRequest:
        """The request add_arguments's options describe."""
        return from_options(cls, args)


def models_for(args: BenchRequest, models_dir: Path, tree: Path | None) -> tuple[Path, Path]:
    """--target/--draft, or random-weight models of --shapes, made once (gguf-py of the fetched tree)."""
    if args.target and args.draft:
        return args.target, args.draft
    shapes = args.shapes.split(",")
    if len(shapes) != 2 or any(s not in SHAPES for s in shapes):
        raise SpbuildError(f"--shapes takes TARGET,DRAFT among {', '.join(sorted(SHAPES))}, got {args.shapes!r}")
    paths = []
    for given, shape in zip((args.target, args.draft), shapes, strict=True):
        path = given or models_dir / f"random-{shape}.gguf"
        if not path.exists():
            if tree is None:
                raise SpbuildError(f"{path} does not exist, and making it needs the fetched tree (spbuild fetch)")
            models_dir.mkdir(parents=True, exist_ok=True)
            make(tree, "llama", shape, path, 131072)
        paths.append(path)
    return paths[0], paths[1]


def check_args(args: BenchRequest) -> None:
    """What can be refused before models are made or fetched."""
    if args.via == "server":
        refuse_own_address(args.server_args.split())


def measure(args: BenchRequest, bin_dir: Path, target: Path, draft: Path,
            progress: Callable[[int], Callable[[str], None]] | None = None, describe: dict | None = None) -> list[Path]:
    """Run the bench the options describe and write its reports; returns the files written."""
    plan = Plan(numbers(args.sizes, int), settings_grid(numbers(args.p, float), windows(args.window),
                                                        scorers=scorers(args.scorers), layers=args.layers),
                args.repeat, args.warmup)
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    n_ctx = max(plan.sizes)

    def leg_for(scorer: str) -> Leg:
        scored_by = Path(SELF) if scorer == "self" else draft
        # the target scores for itself on the target's devices: no draft arguments
        draft_args = args.draft_args.split() if scorer == "draft" else []
        if args.via == "server":
            log = out_dir / ("server.log" if scorer == "draft" else f"server-{scorer}.log")
            return ServerLeg(bin_dir, target, scored_by, n_ctx, args.server_args.split(), draft_args, log)
        work = out_dir if scorer == "draft" else out_dir / f"tool-{scorer}"
        work.mkdir(parents=True, exist_ok=True)
        return ToolLeg(bin_dir, target, scored_by, n_ctx, args.server_args.split(), draft_args, work)

    legs: dict[str, Leg] = {}
    try:
        for scorer in dict.fromkeys(s.scorer for s in plan.settings):
            legs[scorer] = leg_for(scorer)
    except BaseException:
        for made in legs.values():
            made.close()
        raise
    leg = next(iter(legs.values()))
    step = progress(plan.steps) if progress else None
    meta = {"via": args.via, "target": str(target), "draft": str(draft), "sizes": plan.sizes, "repeat": plan.repeat,
            "warmup": plan.warmup, "command": leg.command(),
            "describe": {"via": args.via, "target": target.name, "draft": draft.name, **(describe or {}),
                         "repeat": f"{plan.warmup} warm-up + {plan.repeat} measured",
                         "command": " ".join(leg.command())}}
    started = time.monotonic()
    try:
        # the reports grow with every size, so a run cut short keeps what it measured
        rows = run(legs, bin_dir, draft, plan, out_dir, args.bench_args.split(), step,
                   lambda so_far: reports.write(out_dir, "bench", {**meta, "complete": False}, so_far, plots=False))
    finally:
        for made in legs.values():
            made.close()
    meta["elapsed_s"] = round(time.monotonic() - started, 1)
    return reports.write_complete(out_dir, "bench", meta, rows, plots=args.plots)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spbuild.measuring.bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ms = sub.add_parser("measure", help="as `spbuild bench`, with the build's bin/ folder given (for a machine "
                        "without a spbuild workspace)")
    ms.add_argument("--bin", type=Path, required=True, help="the build's bin/ folder")
    ms.add_argument("--tree", type=Path, help="the fetched llama.cpp tree, to make random models")
    ms.add_argument("--models", type=Path, default=Path("models"), help="where random models are made")
    add_arguments(ms)
    mk = sub.add_parser("make-model", help="write a random-weight GGUF of a named shape (see spbuild.measuring.models)")
    mk.add_argument("--tree", type=Path, required=True, help="the fetched llama.cpp tree (for gguf-py and the vocab)")
    mk.add_argument("--shape", choices=sorted(SHAPES), required=True, help="the model's shape, or its target's")
    mk.add_argument("--kind", choices=KINDS, default="llama",
                    help="a llama model, a Qwen3.5 target with an MTP head, or a draft for a llama target")
    mk.add_argument("--ctx", type=int, default=131072, help="trained context written into the model")
    mk.add_argument("out", type=Path)
    sd = sub.add_parser("spec-decoding", help="decode speed and acceptance of speculative-decoding types, with spec "
                        "prefill off and on")
    sd.add_argument("--bin", type=Path, required=True, help="the build's bin/ folder")
    sd.add_argument("--target", type=Path, required=True)
    sd.add_argument("--prefill-draft", type=Path, required=True)
    sd.add_argument("--draft", type=Path, help="draft-simple's draft (-md)")
    sd.add_argument("--eagle3", type=Path)
    sd.add_argument("--dflash", type=Path)
    sd.add_argument("--dspark", type=Path)
    sd.add_argument("--mtp-target", type=Path, help="a target with an MTP head (draft-mtp runs on it)")
    sd.add_argument("--no-ngram", action="store_true", help="skip the ngram types")
    sd.add_argument("--sizes", default="2048")
    sd.add_argument("--p", type=float, default=0.2)
    sd.add_argument("--n-predict", type=int, default=128)
    sd.add_argument("--repeat", type=int, default=2)
    sd.add_argument("--out", type=Path, default=Path("bench-out"))
    sd.add_argument("--server-args", default="", help="arguments shared by every server (devices, -ngl, -fa)")
    args = parser.parse_args(argv)
    if args.command == "measure":
        try:
            request = BenchRequest.from_args(args)
            check_args(request)
            target, draft = models_for(request, args.models, args.tree)
            for path in measure(request, args.bin, target, draft, reports.plain_progress(str)):
                print(path)
        except SpbuildError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        return 0
    if args.command == "spec-decoding":
        types: dict[str, tuple[Path, list[str]]] = {}
        for spec_type, draft in (("draft-simple", args.draft), ("draft-eagle3", args.eagle3),
                                 ("draft-dflash", args.dflash), ("draft-dspark", args.dspark)):
            if draft:
                types[spec_type] = (args.target, ["-md", str(draft)])
        if args.mtp_target:
            types["draft-mtp"] = (args.mtp_target, [])
        if not args.no_ngram:
            types.update({t: (args.target, a) for t, a in NGRAM_ARGS.items()})
        run_spec_decoding(args.bin, args.target, args.prefill_draft, types, [int(s) for s in args.sizes.split(",")],
                          args.p, args.n_predict, args.out, args.server_args.split(), args.repeat)
        return 0
    started = time.monotonic()
    make(args.tree, args.kind, args.shape, args.out, args.ctx)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e9:.1f} GB) in {time.monotonic() - started:.0f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
