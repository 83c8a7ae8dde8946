"""Benchmarks, not tests: random-weight models of real shapes, and llama-specprefill measured side by side with a full
prefill of the same prompt, in one run. Prints a table and writes it as Markdown.

It needs only NumPy and llama.cpp's own gguf-py (in the fetched tree), so it also runs as a plain script on a GPU
machine that has nothing else: `python3 bench.py make-model ...` / `python3 bench.py run ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

try:
    from spbuild.models import KINDS, SHAPES, make
    from spbuild.server import ServerProcess
except ImportError:  # run as a script on a machine without the package: python3 orchestrator/spbuild/bench.py
    from models import KINDS, SHAPES, make  # type: ignore[no-redef]
    from server import ServerProcess  # type: ignore[no-redef]

# common English words that the llama-bpe tokenizer keeps as single tokens, so N words make about N tokens
WORDS = ("the of and to in is was for on that with as by at from his her they this are had not but have one "
         "all were when there can been more who will would their what said each which she do how if up other "
         "about out many then them these so some make like into time has look two write go see number no way "
         "could people my than first water been call who oil its now find long down day did get come made may").split()


# the longest any one benchmark process may run (a 128K full prefill on a slow backend takes minutes)
TIMEOUT_S = 3600


def make_prompt(n_tokens: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_tokens))


@dataclass
class Config:
    name: str
    args: list[str]
    env: dict[str, str]


def default_configs(window: int, scorings: list[str]) -> list[Config]:
    """p 0.1 and 0.3, full-prompt and windowed; per scoring place (LLAMA_SPEC_PREFILL_SCORING) when asked."""
    configs = []
    for scoring in scorings:
        suffix = "" if scoring == "auto" else f" [{scoring} scoring]"
        env = {} if scoring == "auto" else {"LLAMA_SPEC_PREFILL_SCORING": scoring}
        for p in ("0.1", "0.3"):
            configs.append(Config(f"p={p} full{suffix}", ["--spec-prefill-p", p], env))
            configs.append(Config(f"p={p} window {window // 1024}K{suffix}",
                                  ["--spec-prefill-p", p, "--spec-prefill-window", str(window)], env))
    return configs


def draft_prefill_ms(bin_dir: Path, draft: Path, n_tokens: int, common: list[str], log: Path) -> float:
    """The draft's plain prefill of n_tokens with flash attention, by upstream's llama-bench."""
    argv = [str(bin_dir / "llama-bench"), "-m", str(draft), "-p", str(n_tokens), "-n", "0", "-fa", "1", "-r", "1",
            "-o", "json", *common]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log.write_text(f"timed out after {TIMEOUT_S} s\n")
        return float("nan")
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return float("nan")
    return json.loads(proc.stdout)[0]["avg_ns"] / 1e6


def run(bin_dir: Path, target: Path, draft: Path, sizes: list[int], window: int, out_dir: Path,
        bench_args: list[str], tool_args: list[str], only: list[str] | None = None,
        draft_bench: bool = True, scorings: list[str] | None = None) -> list[dict]:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    n_ctx_draft = max(max(sizes) + 16384, 16 * (window + 512))
    for n in sizes:
        prompt = out_dir / f"prompt-{n}.txt"
        prompt.write_text(make_prompt(n))
        t_draft = float("nan")
        if draft_bench:
            t_draft = draft_prefill_ms(bin_dir, draft, n, bench_args, out_dir / f"llama-bench-{n}.log")
            print(f"[{n}] draft prefill (llama-bench, flash attention): {t_draft:.0f} ms", file=sys.stderr, flush=True)
        baseline = None
        configs = [c for c in default_configs(window, scorings or ["auto"]) if only is None or c.name in only]
        for i, config in enumerate(configs):
            report = out_dir / f"run-{n}-{i}.json"
            argv = [str(bin_dir / "llama-specprefill"), "-m", str(target), "-mpd", str(draft), "-f", str(prompt),
                    "-c", str(n + 256), "-n", "4", "--temp", "0", "--spec-prefill-ctx", str(n_ctx_draft),
                    "--json", str(report), *tool_args, *config.args]
            if baseline is None:
                argv.append("--baseline")
            started = time.monotonic()
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                                      env={**os.environ, **config.env}, timeout=TIMEOUT_S)
                (out_dir / f"run-{n}-{i}.log").write_text(proc.stdout + proc.stderr)
                failure = f"exit code {proc.returncode}" if proc.returncode != 0 else None
            except subprocess.TimeoutExpired:
                failure = f"timed out after {TIMEOUT_S} s"
            if failure is None and not report.exists():
                failure = "no report written"
            if failure is not None:
                # recorded, and the run goes on with the next configuration
                rows.append({"n_prompt": n, "config": config.name, "status": "failed", "reason": failure})
                print(f"[{n}] {config.name}: {failure}, see {out_dir}/run-{n}-{i}.log", file=sys.stderr)
                continue
            data = json.loads(report.read_text())
            if baseline is None:
                baseline = data["baseline"]["ttft_ms"]
            spec = data["run"]
            row = {
                "n_prompt": data["n_prompt"], "config": config.name, "status": data["status"], "reason": data["reason"],
                "reduced_on": data.get("reduced_on", ""),
                "kept": len(data["kept"]), "windows": data["n_windows"], "parallel": data["n_parallel"],
                "score_ms": data["score_ms"], "draft_prefill_ms": t_draft,
                "score_over_draft": data["score_ms"] / t_draft, "prefill_ms": spec["prefill_ms"],
                "score_draft_prefill_ms": data["score_draft_prefill_ms"], "score_query_ms": data["score_query_ms"],
                "ttft_ms": spec["ttft_ms"], "baseline_ttft_ms": baseline, "speedup": baseline / spec["ttft_ms"],
            }
            rows.append(row)
            (out_dir / "results.md").write_text(markdown(rows))  # as it goes: a run cut short keeps what it measured
            print(f"[{n}] {config.name}: kept {row['kept']}, score {row['score_ms']:.0f} ms "
                  f"({row['score_over_draft']:.2f}x draft prefill), TTFT {row['ttft_ms']:.0f} ms vs "
                  f"{baseline:.0f} ms: {row['speedup']:.2f}x ({time.monotonic() - started:.0f} s)"
                  + (f"; {row['status']}: {row['reason']}" if row["status"] != "sparse" else "")
                  + (f"; rows reduced on {row['reduced_on']}" if row["reduced_on"] else ""),
                  file=sys.stderr, flush=True)
    (out_dir / "results.json").write_text(json.dumps(rows, indent=1))
    table = markdown(rows)
    (out_dir / "results.md").write_text(table)
    print(table)
    return rows


def _ttft(server: ServerProcess, prompt: str, fields: dict) -> tuple[float, dict]:
    """Client-side time to the first streamed token of a completion, and the final chunk's timings."""

    body = {"prompt": prompt, "n_predict": 4, "temperature": 0, "stream": True, "cache_prompt": False, **fields}
    started = time.monotonic()
    first = None
    timings: dict = {}
    with requests.post(f"{server.url}/completion", json=body, stream=True, timeout=TIMEOUT_S) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith(b"data: "):
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("content"):
                first = time.monotonic()
            timings = chunk.get("timings", timings)
    return ((first or time.monotonic()) - started) * 1e3, timings


def _started(binary: Path, args: list[str], log: Path) -> ServerProcess:
    server = ServerProcess(binary, args, log=log)
    try:
        server.wait_ready(600)
    except (RuntimeError, TimeoutError):
        server.stop()
        raise
    return server


def run_server(bin_dir: Path, target: Path, draft: Path, sizes: list[int], window: int, p: float, out_dir: Path,
               server_args: list[str], draft_args: list[str], unpatched_bin: Path | None = None,
               repeat: int = 2) -> list[dict]:
    """TTFT through llama-server's HTTP API with spec prefill on and off (per request), against llama-specprefill
    --baseline on the same prompt, and optionally an unpatched llama-server; full-prompt scoring when N fits the draft
    context, windows of `window` tokens above 64K."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in sizes:
        prompt = make_prompt(n)
        prompt_file = out_dir / f"prompt-{n}.txt"
        prompt_file.write_text(prompt)
        windowed = n > 65536
        spec_args = ["-mpd", str(draft), *draft_args, "--spec-prefill-p", str(p), "--spec-prefill-ctx", str(n + 16384)]
        if windowed:
            spec_args += ["--spec-prefill-window", str(window)]
        common = ["-m", str(target), "-c", str(n + 512), "-np", "1", *server_args]
        warm = make_prompt(2048, seed=7)

        def best(server: ServerProcess, fields: dict) -> tuple[float, dict]:
            _ttft(server, warm, fields)
            runs = [_ttft(server, prompt, fields) for _ in range(repeat)]
            return min(runs, key=lambda r: r[0])

        server = _started(bin_dir / "llama-server", common + spec_args, out_dir / f"server-{n}.log")
        try:
            on_ms, on_timings = best(server, {})
            off_ms, off_timings = best(server, {"spec_prefill": {"enabled": False}})
        finally:
            server.stop()
        unpatched_ms = float("nan")
        if unpatched_bin:
            plain = _started(unpatched_bin / "llama-server", common, out_dir / f"server-unpatched-{n}.log")
            try:
                unpatched_ms, _ = best(plain, {})
            finally:
                plain.stop()
        report = out_dir / f"tool-{n}.json"
        tool_argv = [str(bin_dir / "llama-specprefill"), "-m", str(target), "-f", str(prompt_file), "-c", str(n + 512),
                     "-n", "4", "--temp", "0", "--baseline", "--repeat", str(repeat), "--json", str(report),
                     *server_args, *spec_args]
        try:
            proc = subprocess.run(tool_argv, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)
            (out_dir / f"tool-{n}.log").write_text(proc.stdout + proc.stderr)
            tool = json.loads(report.read_text()) if proc.returncode == 0 and report.exists() else None
        except subprocess.TimeoutExpired:
            tool = None
        sp = on_timings.get("spec_prefill", {})
        row = {
            "n_prompt": sp.get("n_prompt", n), "config": f"p={p} " + (f"window {window // 1024}K" if windowed else "full"),
            "status": sp.get("status"), "kept": sp.get("n_kept"),
            "server_ttft_ms": on_ms, "server_prompt_ms": on_timings.get("prompt_ms"),
            "server_score_ms": sp.get("score_ms"), "server_sparse_prefill_ms": sp.get("sparse_prefill_ms"),
            "server_off_ttft_ms": off_ms, "server_off_prompt_ms": off_timings.get("prompt_ms"),
            "unpatched_ttft_ms": unpatched_ms,
            "tool_ttft_ms": tool["run"]["ttft_ms"] if tool else float("nan"),
            "tool_baseline_ttft_ms": tool["baseline"]["ttft_ms"] if tool else float("nan"),
            "commands": {"server": common + spec_args, "tool": tool_argv[1:]},
        }
        row["server_over_tool"] = row["server_ttft_ms"] / row["tool_ttft_ms"]
        row["speedup"] = row["server_off_ttft_ms"] / row["server_ttft_ms"]
        rows.append(row)
        print(f"[{n}] server TTFT {on_ms:.0f} ms ({row['status']}, kept {row['kept']}), tool {row['tool_ttft_ms']:.0f} "
              f"ms ({row['server_over_tool']:.3f}x); spec prefill off {off_ms:.0f} ms, unpatched {unpatched_ms:.0f} ms,"
              f" tool baseline {row['tool_baseline_ttft_ms']:.0f} ms", file=sys.stderr, flush=True)
        (out_dir / "server-results.json").write_text(json.dumps(rows, indent=1))
    table = server_markdown(rows)
    (out_dir / "server-results.md").write_text(table)
    print(table)
    return rows


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
                "--spec-prefill-p", str(p), *server_args, *(["--spec-type", spec_type] if spec_type != "none" else []),
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


def server_markdown(rows: list[dict]) -> str:
    lines = ["| prompt tokens | config | kept | server TTFT ms (scoring + sparse prefill) | tool TTFT ms | server / tool | "
             "server, spec prefill off | unpatched server | tool baseline | speedup (server) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['n_prompt']:,} | {r['config']} | {r['kept']:,} | {r['server_ttft_ms']:,.0f} "
                     f"({r['server_score_ms']:,.0f} + {r['server_sparse_prefill_ms']:,.0f}) | {r['tool_ttft_ms']:,.0f} | "
                     f"{r['server_over_tool']:.3f}x | {r['server_off_ttft_ms']:,.0f} | {r['unpatched_ttft_ms']:,.0f} | "
                     f"{r['tool_baseline_ttft_ms']:,.0f} | **{r['speedup']:.2f}x** |")
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict]) -> str:
    lines = ["| prompt tokens | config | kept | windows (side by side) | scoring ms (draft prefill + query steps) | "
             "scoring / draft prefill | sparse prefill ms | TTFT ms | full-prefill TTFT ms | speedup |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("status") == "failed":
            lines.append(f"| {r['n_prompt']:,} | {r['config']} | failed: {r['reason']} |||||||| |")
            continue
        lines.append(f"| {r['n_prompt']:,} | {r['config']} | {r['kept']:,} | {r['windows']} ({r['parallel']}) | "
                     f"{r['score_ms']:,.0f} ({r['score_draft_prefill_ms']:,.0f} + {r['score_query_ms']:,.0f}) | "
                     f"{r['score_over_draft']:.2f}x | {r['prefill_ms']:,.0f} | "
                     f"{r['ttft_ms']:,.0f} | {r['baseline_ttft_ms']:,.0f} | **{r['speedup']:.2f}x** |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make-model", help="write a random-weight GGUF of a named shape (see spbuild.models)")
    mk.add_argument("--tree", type=Path, required=True, help="the fetched llama.cpp tree (for gguf-py and the vocab)")
    mk.add_argument("--shape", choices=sorted(SHAPES), required=True, help="the model's shape, or its target's")
    mk.add_argument("--kind", choices=KINDS, default="llama",
                    help="a llama model, a Qwen3.5 target with an MTP head, or a draft for a llama target")
    mk.add_argument("--ctx", type=int, default=131072, help="trained context written into the model")
    mk.add_argument("out", type=Path)
    rn = sub.add_parser("run", help="llama-specprefill against a full prefill, over prompt sizes and configs")
    rn.add_argument("--bin", type=Path, required=True, help="the build's bin/ folder")
    rn.add_argument("--target", type=Path, required=True)
    rn.add_argument("--draft", type=Path, required=True)
    rn.add_argument("--sizes", default="8192,32768,131072")
    rn.add_argument("--window", type=int, default=8192)
    rn.add_argument("--out", type=Path, default=Path("bench-out"))
    rn.add_argument("--bench-args", default="-b 4096 -ub 1024", help="llama-bench arguments (batch sizes)")
    rn.add_argument("--only", help="comma-separated config names to run (default: all)")
    rn.add_argument("--no-draft-bench", action="store_true", help="skip the llama-bench reference of the draft")
    rn.add_argument("--scoring", default="auto",
                    help="comma-separated places to reduce the attention rows: auto, host, graph "
                         "(LLAMA_SPEC_PREFILL_SCORING); each adds its configs")
    rn.add_argument("--tool-args", default="-b 4096 -ub 1024 -ngl 99 -nglpd 99 -fa on",
                    help="llama-specprefill arguments shared by every run")
    sv = sub.add_parser("server", help="TTFT through llama-server over HTTP, spec prefill on and off, against the tool")
    sv.add_argument("--bin", type=Path, required=True, help="the build's bin/ folder")
    sv.add_argument("--unpatched-bin", type=Path, help="bin/ of a build of the pin without the series")
    sv.add_argument("--target", type=Path, required=True)
    sv.add_argument("--draft", type=Path, required=True)
    sv.add_argument("--sizes", default="32768,131072")
    sv.add_argument("--window", type=int, default=8192)
    sv.add_argument("--p", type=float, default=0.1)
    sv.add_argument("--repeat", type=int, default=2, help="measured runs per setting (the fastest is reported)")
    sv.add_argument("--out", type=Path, default=Path("bench-out"))
    sv.add_argument("--server-args", default="-b 4096 -ub 1024 -ngl 99 -fa on",
                    help="arguments shared by the servers (the unpatched one too) and the tool")
    sv.add_argument("--draft-args", default="-nglpd 99", help="prefill-draft arguments of the patched server and the tool")
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
    if args.command == "server":
        run_server(args.bin, args.target, args.draft, [int(s) for s in args.sizes.split(",")], args.window, args.p,
                   args.out, args.server_args.split(), args.draft_args.split(), args.unpatched_bin, args.repeat)
        return 0
    if args.command == "make-model":
        started = time.monotonic()
        make(args.tree, args.kind, args.shape, args.out, args.ctx)
        print(f"wrote {args.out} ({args.out.stat().st_size / 1e9:.1f} GB) in {time.monotonic() - started:.0f} s",
              file=sys.stderr)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    run(args.bin, args.target, args.draft, sizes, args.window, args.out, args.bench_args.split(),
        args.tool_args.split(), args.only.split(",") if args.only else None, not args.no_draft_bench,
        args.scoring.split(","))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
