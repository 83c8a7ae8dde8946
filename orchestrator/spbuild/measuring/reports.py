"""What `spbuild bench` and `spbuild eval` write: results.json (the rows, the summary and the exact commands),
results.md (the tables) and PNG plots. `spbuild report DIR` writes the tables and plots again from results.json, so
a run on a machine without matplotlib is plotted here."""

from __future__ import annotations

import json
import math
import os
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from spbuild.errors import SpbuildError
from spbuild.measuring import tasks
from spbuild.measuring.evaluate import CONTEXT_TOKENS, TAIL_TOKENS
from spbuild.measuring.stats import Rate, rate

# ---------------------------------------------------------------------------------------------------------------
# eval


def _group(rows: Sequence[dict], key: Callable[[dict], tuple]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[key(row)].append(row)
    return dict(groups)


def _setting_order(row: dict) -> tuple:
    return (row["select"], row.get("variant", ""), row["window"], row["value"])


def _by_setting(rows: Sequence[dict]) -> list[tuple[str, list[dict]]]:
    """The rows of each setting, settings in table order (selection, variant, window, value)."""
    groups = _group(rows, lambda r: (r["setting"],))
    return [(setting, group) for (setting,), group in sorted(groups.items(),
                                                             key=lambda item: _setting_order(item[1][0]))]


def eval_summary(rows: Sequence[dict]) -> list[dict]:
    """Per setting: how many cases ran, and the rates of retention, agreement and correctness; also the number of
    answers that changed although every evidence line was kept."""
    summary = []
    for setting, group in _by_setting(rows):
        summary.append({"setting": setting, "select": group[0]["select"], "value": group[0]["value"],
                        "window": group[0]["window"], **_rates(group)})
    return summary


def answer_agrees(row: dict) -> bool:
    """The answers agree (tasks.answers_agree; rows of runs before the answer metric: their whole first lines)."""
    if "full_answer_text" not in row:
        return row.get("answer_agree", row["agree"])
    return tasks.answers_agree(row["full_answer_text"], row["full_correct"], row["spec_answer_text"],
                               row["spec_correct"])


def _rates(group: Sequence[dict]) -> dict:
    ran = [r for r in group if r["status"] != "failed"]
    sparse = [r for r in ran if r["status"] == "active"]
    kept_but_changed = [r for r in ran if r["evidence_retained"] and not answer_agrees(r)]
    kept_fraction = [r["n_kept"] / r["n_prompt"] for r in ran if r.get("n_kept") is not None and r["n_prompt"]]
    return {
        "cases": len(group), "failed": len(group) - len(ran), "sparse": len(sparse),
        "retention": rate([r["evidence_retained"] for r in ran]).as_dict(),
        "answer_agreement": rate([answer_agrees(r) for r in ran]).as_dict(),
        "agreement": rate([r["agree"] for r in ran]).as_dict(),
        "spec_correct": rate([r["spec_correct"] for r in ran]).as_dict(),
        "full_correct": rate([r["full_correct"] for r in ran]).as_dict(),
        # what a user loses: answers the full prefill gets right that spec prefill still gets right
        "correct_kept": rate([r["spec_correct"] for r in ran if r["full_correct"]]).as_dict(),
        "changed_although_kept": len(kept_but_changed),
        "kept_fraction": sum(kept_fraction) / len(kept_fraction) if kept_fraction else math.nan,
    }


def _cell(d: dict) -> str:
    return str(Rate(d["k"], d["n"]))


def eval_markdown(rows: Sequence[dict]) -> str:
    out = ["## By setting", "",
           "| setting | cases | kept (mean) | right answers kept | answer = full prefill's | first line = full "
           "prefill's | evidence retained | correct (spec) | correct (full) | answer changed although kept | failed |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in eval_summary(rows):
        out.append(f"| {s['setting']} | {s['cases']} | {s['kept_fraction']:.1%} | {_cell(s['correct_kept'])} | "
                   f"{_cell(s['answer_agreement'])} | {_cell(s['agreement'])} | {_cell(s['retention'])} | "
                   f"{_cell(s['spec_correct'])} | {_cell(s['full_correct'])} | "
                   f"{s['changed_although_kept']} | {s['failed']} |")
    out += ["", "Right answers kept: correct with spec prefill where the full prefill is correct. Answer: the "
            "generated text up to its sentence end, two words past the expected answer's; first line: "
            "all of it, the text after the answer too. 95% Wilson intervals in brackets."]
    for title, field in (("length (asked tokens)", "n_tokens"), ("kind", "kind"), ("filler", "filler")):
        values = sorted({r[field] for r in rows}, key=lambda v: (isinstance(v, str), v))
        if len(values) < 2 and field != "n_tokens":
            continue
        out += ["", f"## Answer = full prefill's, and evidence retained, by {title}", "",
                "| setting | " + " | ".join(f"{v:,}" if isinstance(v, int) else str(v) for v in values) + " |",
                "|---|" + "---|" * len(values)]
        for setting, group in _by_setting(rows):
            cells = []
            for v in values:
                sub = [r for r in group if r[field] == v and r["status"] != "failed"]
                agree, kept = rate([answer_agrees(r) for r in sub]), rate([r["evidence_retained"] for r in sub])
                cells.append(f"{agree} / {kept.value:.0%}" if kept.n else str(agree))
            out.append(f"| {setting} | " + " | ".join(cells) + " |")
    lengths = sorted({r["n_tokens"] for r in rows})
    out += ["", "## Right answers kept, by length (asked tokens)", "",
            "| setting | " + " | ".join(f"{v:,}" for v in lengths) + " |", "|---|" + "---|" * len(lengths)]
    for setting, group in _by_setting(rows):
        cells = [str(rate([r["spec_correct"] for r in group
                           if r["n_tokens"] == v and r["status"] != "failed" and r["full_correct"]])) for v in lengths]
        out.append(f"| {setting} | " + " | ".join(cells) + " |")
    ran = [r for r in rows if r["status"] != "failed"]
    changed = [r for r in ran if r.get("evidence_retained") and not answer_agrees(r)]
    stayed = [r for r in ran if r.get("evidence_retained") and answer_agrees(r) and r.get("status") == "active"]
    if changed and any(r.get("context_kept") is not None for r in changed):
        out += ["", "## What else was kept, for answers with all their evidence kept", "",
                f"| answers | cases | kept within {CONTEXT_TOKENS} tokens of the evidence | kept of the last {TAIL_TOKENS} tokens |",
                "|---|---|---|---|"]
        for label, group in (("the same as the full prefill's", stayed), ("changed", changed)):
            out.append(f"| {label} | {len(group)} | {_mean(group, 'context_kept')} | {_mean(group, 'tail_kept')} |")
    if changed:
        out += ["", "## Answers that changed although every evidence line was kept", "",
                "| case | setting | expected | full prefill | spec prefill |", "|---|---|---|---|---|"]
        for r in changed[:40]:
            out.append(f"| {r['case']} | {r['setting']} | {r['answer']} | {_quote(r.get('full_answer_text', r['full_answer']))} | "
                       f"{_quote(r.get('spec_answer_text', r['spec_answer']))} |")
        if len(changed) > 40:
            out.append(f"| ... {len(changed) - 40} more in results.json | | | | |")
    failed = [r for r in rows if r["status"] == "failed"]
    if failed:
        out += ["", "## Failed", ""] + [f"- {r['case']} {r['setting']}: {r['error'][-200:]}" for r in failed[:20]]
    return "\n".join(out) + "\n"


def _mean(rows: Sequence[dict], field: str) -> str:
    values = [r[field] for r in rows if r.get(field) is not None]
    return f"{sum(values) / len(values):.0%}" if values else "-"


def _quote(text: str) -> str:
    return "`" + text.replace("|", "\\|").replace("`", "'")[:60] + "`" if text else "(empty)"


def eval_plots(rows: Sequence[dict], out_dir: Path) -> list[Path]:
    """Agreement, correctness and retention against p (a line per window), and agreement against length (a line per
    setting)."""
    plt = _pyplot()
    written = []
    keep_rows = [r for r in rows if r["select"] == "keep" and r["status"] != "failed"]
    if keep_rows:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharey=True)
        for ax, (metric, title) in zip(axes, (("answer_agree", "answer = full prefill's"), ("spec_correct", "answer correct"),
                                              ("evidence_retained", "evidence retained")), strict=True):
            for (variant, window), group in sorted(_group(keep_rows, lambda r: (r.get("variant", ""),
                                                                                  r["window"])).items()):
                ps = sorted({r["value"] for r in group})
                label = "full-prompt scoring" if window == 0 else f"windows of {window}"
                ax.plot(ps, [rate([answer_agrees(r) if metric == "answer_agree" else r[metric]
                                   for r in group if r["value"] == p]).value for p in ps], marker="o",
                        label=f"{label}, {variant}" if variant else label)
            if metric == "spec_correct":
                ps = sorted({r["value"] for r in keep_rows})
                ax.axhline(rate([r["full_correct"] for r in keep_rows]).value, color="grey", linestyle="--",
                           label="full prefill")
            ax.set_title(title)
            ax.set_xlabel("p (fraction kept)")
            ax.set_ylim(0, 1.05)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("share of cases")
        axes[-1].legend(loc="lower right")
        fig.tight_layout()
        written.append(_save(fig, out_dir / "eval-vs-p.png", plt))
    ran = [r for r in rows if r["status"] != "failed"]
    if len({r["n_tokens"] for r in ran}) > 1:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for setting, group in _by_setting(ran):
            ns = sorted({r["n_tokens"] for r in group})
            ax.plot(ns, [rate([answer_agrees(r) for r in group if r["n_tokens"] == n]).value for n in ns], marker="o",
                    label=setting)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["n_tokens"] for r in ran}), [f"{n // 1024}K" if n >= 1024 else str(n)
                                                           for n in sorted({r["n_tokens"] for r in ran})])
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("answer = full prefill's")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        written.append(_save(fig, out_dir / "eval-vs-length.png", plt))
    return written


# ---------------------------------------------------------------------------------------------------------------
# bench


def bench_markdown(rows: Sequence[dict]) -> str:
    out = ["| prompt tokens | setting | status | kept | TTFT ms, full prefill | TTFT ms, spec prefill | speedup | "
           "bound | of bound | of bound, this run's draft prefill | score ms (draft prefill + query steps) | "
           "sparse prefill ms | draft FA prefill ms |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("error"):
            out.append(f"| {r['n_prompt']:,} | {r['setting']} | failed: {r['error'][-120:]} ||||||||||| |")
            continue
        in_run = r.get("of_bound_in_run", math.nan)  # not in results of older runs
        out.append(
            f"| {r['n_prompt']:,} | {r['setting']} | {r['status']} | {r['n_kept']:,} | {_ms(r['full_ttft_ms'])} | "
            f"{_ms(r['spec_ttft_ms'])} | **{r['speedup']:.2f}x** | {r['bound']:.2f}x | {r['of_bound']:.0%} | "
            f"{in_run:.0%} | "
            f"{r['score_ms']['median']:,.0f} ({r['score_draft_prefill_ms']['median']:,.0f} + "
            f"{r['score_query_ms']['median']:,.0f}) | {r['sparse_prefill_ms']['median']:,.0f} | "
            f"{_ms(r['draft_prefill_ms'])} |")
    return ("\n".join(out) + "\n\nTTFT: median of the repetitions, [lowest, highest] after it. Bound: full-prefill TTFT "
            "over (the draft's own flash-attention prefill + the sparse prefill), the speedup if scoring cost no more "
            "than that prefill; with this run's draft prefill, the one the scoring timed in the same requests "
            "(llama-bench's varies by about 8% from run to run).\n").replace("nan%", "-").replace("nan", "-")


def _ms(spread: dict) -> str:
    if spread["n"] == 0:
        return "-"
    if spread["n"] == 1:
        return f"{spread['median']:,.0f}"
    return f"{spread['median']:,.0f} [{spread['low']:,.0f}, {spread['high']:,.0f}]"


def bench_plots(rows: Sequence[dict], out_dir: Path) -> list[Path]:
    """TTFT against N (full prefill and each setting) and speedup against N with each setting's bound."""
    plt = _pyplot()
    ok = [r for r in rows if not r.get("error")]
    if not ok:
        return []
    fig, (ax_ttft, ax_speedup) = plt.subplots(1, 2, figsize=(13, 4.5))
    ns = sorted({r["n_prompt"] for r in ok})
    full = {r["n_prompt"]: r["full_ttft_ms"]["median"] for r in ok}
    ax_ttft.plot(ns, [full[n] / 1e3 for n in ns], marker="o", color="black", label="full prefill")
    for (setting,), group in sorted(_group(ok, lambda r: (r["setting"],)).items()):
        group = sorted(group, key=lambda r: r["n_prompt"])
        x = [r["n_prompt"] for r in group]
        line = ax_ttft.plot(x, [r["spec_ttft_ms"]["median"] / 1e3 for r in group], marker="o", label=setting)[0]
        ax_speedup.plot(x, [r["speedup"] for r in group], marker="o", color=line.get_color(), label=setting)
        ax_speedup.plot(x, [r["bound"] for r in group], linestyle="--", color=line.get_color(),
                        label=f"{setting}: bound")
    for ax in (ax_ttft, ax_speedup):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [f"{n // 1024}K" for n in ns])
        ax.set_xlabel("prompt tokens")
        ax.grid(alpha=0.3)
    ax_ttft.set_yscale("log")
    ax_ttft.set_ylabel("TTFT, s (median)")
    ax_speedup.set_ylabel("TTFT speedup over the full prefill")
    ax_ttft.legend(fontsize="small")
    ax_speedup.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    return [_save(fig, out_dir / "bench.png", plt)]


# ---------------------------------------------------------------------------------------------------------------


def can_plot() -> bool:
    """Whether matplotlib is here (a bare GPU machine may lack it: its run is plotted later with `spbuild report`)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise SpbuildError("the plots need matplotlib: pip install matplotlib (or plot later, where it is, with "
                           "`spbuild report DIR`)") from err
    return plt


def _save(fig, path: Path, plt) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _replace_text(path: Path, text: str) -> None:
    """Writes `path` whole or not at all: a run rewrites its results after every row, and a reader (a second shell, a
    collecting script, a test) must never see half of one."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def write(out_dir: Path, kind: str, meta: dict, rows: list[dict], plots: bool = True) -> list[Path]:
    """results.json, results.md and the plots of a bench or eval run; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    document = {"kind": kind, **meta, "rows": rows}
    if kind == "eval":
        document["summary"] = eval_summary(rows)
    _replace_text(out_dir / "results.json", json.dumps(document, indent=1, default=_json_default) + "\n")
    table = eval_markdown(rows) if kind == "eval" else bench_markdown(rows)
    header = f"# spbuild {kind}\n\n" + "".join(f"- {k}: `{v}`\n" for k, v in meta.get("describe", {}).items()) + "\n"
    if meta.get("complete") is False:
        header += f"**Partial: {len(rows)} rows so far (the run is going on, or was cut short).**\n\n"
    _replace_text(out_dir / "results.md", header + table)
    written = [out_dir / "results.json", out_dir / "results.md"]
    if plots:
        written += eval_plots(rows, out_dir) if kind == "eval" else bench_plots(rows, out_dir)
    return written


def write_complete(out_dir: Path, kind: str, meta: dict, rows: list[dict], plots: bool = True) -> list[Path]:
    """The reports of a finished run; without matplotlib, the tables only, and a line saying how to plot later."""
    if plots and not can_plot():
        print("matplotlib is not installed: tables only; plot them later with `spbuild report DIR`", file=sys.stderr)
        plots = False
    return write(out_dir, kind, {**meta, "complete": True}, rows, plots=plots)


def plain_progress(describe: Callable[[Any], str]) -> Callable[[int], Callable[[Any], None]]:
    """Progress as numbered lines on stderr, for a machine without spbuild's console (python -m spbuild.measuring.bench)."""
    def start(total: int) -> Callable[[Any], None]:
        done = 0

        def step(item: Any) -> None:
            nonlocal done
            done += 1
            print(f"[{done}/{total}] {describe(item)}", file=sys.stderr, flush=True)
        return step
    return start


def rewrite(out_dir: Path) -> list[Path]:
    """The tables and plots of an earlier run, from its results.json."""
    source = out_dir / "results.json"
    if not source.is_file():
        raise SpbuildError(f"{source} not found: pass the folder a `spbuild bench` or `spbuild eval` run wrote")
    document = json.loads(source.read_text())
    kind = document.pop("kind", None)
    if kind not in ("bench", "eval"):
        raise SpbuildError(f"{source} is not a bench or eval result (kind {kind!r})")
    rows = document.pop("rows")
    document.pop("summary", None)
    return write(out_dir, kind, document, rows)


def _json_default(value):
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
