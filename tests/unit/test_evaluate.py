"""The eval's bookkeeping: settings as the server and the tool take them, a row from what was kept and answered, the
run going on past failures, the statistics, and the report writers (tables, plots, `spbuild report`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spbuild.errors import SpbuildError
from spbuild.measuring import eval_cli, evaluate, reports, tasks
from spbuild.measuring.evaluate import Answer, Setting
from spbuild.measuring.server import ServerProcess, refuse_own_address
from spbuild.measuring.stats import Rate, Spread, rate


def test_settings_name_themselves_and_speak_both_interfaces():
    keep, mass = Setting("keep", 0.2, 0), Setting("mass", 0.9, 2048)
    assert (keep.name, mass.name) == ("p=0.2 full", "mass=0.9 W=2048")
    # "full" asks for a window longer than any prompt: the server's window 0 is automatic and windows long prompts
    assert keep.request() == {"enabled": True, "min_tokens": 0, "window": evaluate.WHOLE_PROMPT, "return_kept": True,
                              "select": "keep", "p": 0.2}
    assert mass.request()["window"] == 2048
    assert mass.request()["mass"] == 0.9 and "p" not in mass.request()
    assert keep.tool_args()[-2:] == ["--spec-prefill-p", "0.2"]
    assert mass.tool_args()[-4:] == ["--spec-prefill-select", "mass", "--spec-prefill-mass", "0.9"]
    grid = evaluate.settings_grid([0.1, 0.3], [0, 4096], [0.8])
    assert [s.name for s in grid] == ["p=0.1 full", "p=0.3 full", "p=0.1 W=4096", "p=0.3 W=4096", "mass=0.8 full",
                                      "mass=0.8 W=4096"]


class PiecesBackend:
    """A stand-in for the model: the prompt's characters as pieces, a selection that keeps every k-th span of 16
    pieces, and answers that are right exactly when the evidence was kept. It exercises the runner's bookkeeping; the
    real server and tool run in tests/integration/test_eval_bench.py."""

    def __init__(self, case: tasks.Case, fail_on: str | None = None):
        self.case = case
        self.fail_on = fail_on
        self.calls: list[str] = []

    def command(self) -> list[str]:
        return ["fake"]

    def pieces(self, prompt: str) -> list[str]:
        return ["<bos>", *prompt]

    def full(self, prompt: str) -> Answer:
        self.calls.append("full")
        return Answer(f" {self.case.answer}.\nmore")

    def sparse(self, prompt: str, setting: Setting) -> Answer:
        self.calls.append(setting.name)
        if setting.name == self.fail_on:
            raise SpbuildError("llama-server answered 500: boom")
        n = len(prompt) + 1
        every = max(1, round(1 / setting.value))
        kept = [i for i in range(n) if (i // 16) % every == 0]
        spans = evaluate.evidence_spans(self.case, self.pieces(prompt))
        held = all(i in set(kept) for s in spans for i in s)
        return Answer(f" {self.case.answer}." if held else " 12:46:0", "active", kept=kept)


def test_a_row_says_what_was_kept_and_answered():
    case = tasks.make_case("needle", "prose", 300, 0.5, 1)
    backend = PiecesBackend(case)
    rows = evaluate.run(backend, [case], [Setting("keep", 1.0), Setting("keep", 0.5)])
    everything, half = rows
    assert everything["evidence_retained"] and everything["agree"] and everything["spec_correct"]
    assert everything["evidence_tokens_kept"] == everything["evidence_tokens"] == len(case.evidence[0])
    assert half["n_kept"] < half["n_prompt"]
    # a line of 25 characters cut into spans of 16, every other span kept: some of it, never all of it
    assert 0 < half["evidence_tokens_kept"] < half["evidence_tokens"]
    assert not half["evidence_retained"] and not half["agree"] and not half["spec_correct"] and half["full_correct"]
    assert half["spec_answer"] == "12:46:0" and half["full_answer"] == f"{case.answer}."
    assert backend.calls.count("full") == 1  # the full prefill once per case, whatever the settings
    # the kept set as ranges, the evidence spans, and the share kept around the evidence and at the end
    assert everything["kept_ranges"] == [[0, everything["n_prompt"]]] and everything["context_kept"] == 1.0
    assert sum(e - b for b, e in half["kept_ranges"]) == half["n_kept"]
    assert all(e - b == 16 for b, e in half["kept_ranges"][:-1])  # spans of 16, every other one
    (start, stop), = half["evidence_spans"]
    assert stop - start == half["evidence_tokens"]
    assert 0.3 < half["context_kept"] < 0.7 and 0.3 < half["tail_kept"] < 0.7


def test_the_full_prefill_runs_once_per_case_across_the_scorers_servers():
    """Each scorer has its own server, the target's full prefill is the same on all: the second server reuses the
    first one's answer, and its rows still compare against it."""
    case = tasks.make_case("needle", "prose", 300, 0.5, 1)
    first, second = PiecesBackend(case), PiecesBackend(case)
    shared: dict = {}
    rows = evaluate.run(first, [case], [Setting("keep", 1.0)], full_prefills=shared)
    rows += evaluate.run(second, [case], [Setting("keep", 0.5, scorer="self")], full_prefills=shared)
    assert first.calls.count("full") == 1 and "full" not in second.calls
    assert rows[1]["full_answer"] == rows[0]["full_answer"] == f"{case.answer}." and not rows[1]["agree"]
    third = PiecesBackend(case)
    evaluate.run(third, [case], [Setting("keep", 0.5)])  # no shared cache: its own full prefill
    assert third.calls.count("full") == 1


def test_a_failing_request_is_a_row_and_the_run_goes_on():
    cases = [tasks.make_case("needle", "logs", 300, d, 0) for d in (0.2, 0.8)]
    backend = PiecesBackend(cases[0], fail_on="p=0.5 full")
    seen = []
    rows = evaluate.run(backend, cases, [Setting("keep", 0.5), Setting("keep", 1.0)], seen.append)
    assert [r["status"] for r in rows] == ["failed", "active", "failed", "active"]
    assert "500: boom" in rows[0]["error"]
    assert seen == rows
    summary = reports.eval_summary(rows)
    assert [(s["setting"], s["cases"], s["failed"]) for s in summary] == [("p=0.5 full", 2, 2), ("p=1 full", 2, 0)]


def _row(setting: str, value: float, window: int, kept: bool, agree: bool, correct: bool, n: int = 2048,
         kind: str = "needle") -> dict:
    return {"case": f"{kind}-{n}", "kind": kind, "filler": "prose", "n_tokens": n, "depth": 0.5, "n_prompt": n,
            "setting": setting, "select": "keep", "value": value, "window": window, "status": "active",
            "n_kept": int(n * value), "evidence_retained": kept, "agree": agree, "spec_correct": correct,
            "full_correct": True, "answer": "52445", "full_answer": "52445.", "spec_answer": "52445." if agree else
            "12445.", "evidence_tokens": 9, "evidence_tokens_kept": 9 if kept else 3}


def test_the_summary_counts_answers_that_changed_although_the_evidence_was_kept():
    rows = [_row("p=0.2 full", 0.2, 0, True, True, True), _row("p=0.2 full", 0.2, 0, True, False, False),
            _row("p=0.2 full", 0.2, 0, False, False, False), _row("p=0.1 full", 0.1, 0, False, True, True)]
    by_name = {s["setting"]: s for s in reports.eval_summary(rows)}
    s = by_name["p=0.2 full"]
    assert (s["retention"]["k"], s["retention"]["n"]) == (2, 3)
    assert (s["agreement"]["k"], s["spec_correct"]["k"], s["full_correct"]["k"]) == (1, 1, 3)
    assert s["changed_although_kept"] == 1
    rows[2]["full_correct"] = False  # a case the full prefill gets wrong does not count against spec prefill
    s = {s["setting"]: s for s in reports.eval_summary(rows)}["p=0.2 full"]
    assert (s["correct_kept"]["k"], s["correct_kept"]["n"]) == (1, 2)
    rows[2]["full_correct"] = True
    assert s["kept_fraction"] == pytest.approx(0.2, abs=0.001)
    assert [x["setting"] for x in reports.eval_summary(rows)] == ["p=0.1 full", "p=0.2 full"]  # by p
    table = reports.eval_markdown(rows)
    assert "| p=0.2 full | 3 | 20.0% | 33% (1/3) | 33% (1/3) | 33% (1/3) | 67% (2/3) | 33% (1/3) | 100% (3/3) | 1 | 0 |" \
        in table
    # the answer itself agrees where only the text after it differs: the answer column counts it, the first line not
    rows[1].update(answer_agree=True, spec_correct=True)
    s = {s["setting"]: s for s in reports.eval_summary(rows)}["p=0.2 full"]
    assert (s["answer_agreement"]["k"], s["agreement"]["k"], s["changed_although_kept"]) == (2, 1, 0)
    rows[1].update(answer_agree=False, spec_correct=False)
    assert "| needle-2048 | p=0.2 full | 52445 | `52445.` | `12445.` |" in table
    rows[0].update(context_kept=0.5, tail_kept=1.0)
    rows[1].update(context_kept=0.25, tail_kept=0.5)
    table = reports.eval_markdown(rows)
    assert "| the same as the full prefill's | 1 | 50% | 100% |" in table and "| changed | 1 | 25% | 50% |" in table


def test_reports_write_tables_plots_and_again_from_the_json(tmp_path):
    rows = [_row(f"p={p} {'full' if w == 0 else f'W={w}'}", p, w, p > 0.1, p > 0.1 or w == 0, p > 0.1, n, kind)
            for p in (0.1, 0.2, 0.3) for w in (0, 2048) for n in (2048, 8192) for kind in ("needle", "multihop")]
    files = reports.write(tmp_path, "eval", {"via": "server", "describe": {"target": "gemma.gguf"}}, rows)
    assert {f.name for f in files} == {"results.json", "results.md", "eval-vs-p.png", "eval-vs-length.png"}
    for png in ("eval-vs-p.png", "eval-vs-length.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["kind"] == "eval" and len(document["rows"]) == len(rows) and len(document["summary"]) == 6
    first = (tmp_path / "results.md").read_text()
    assert "- target: `gemma.gguf`" in first and "by kind" in first
    (tmp_path / "results.md").unlink()
    (tmp_path / "eval-vs-p.png").unlink()
    reports.rewrite(tmp_path)
    assert (tmp_path / "results.md").read_text() == first and (tmp_path / "eval-vs-p.png").exists()


def test_a_run_in_progress_says_it_is_partial(tmp_path):
    rows = [_row("p=0.2 full", 0.2, 0, True, True, True)]
    reports.write(tmp_path, "eval", {"complete": False}, rows, plots=False)
    assert "Partial: 1 rows so far" in (tmp_path / "results.md").read_text()
    reports.write(tmp_path, "eval", {"complete": True}, rows, plots=False)
    assert "Partial" not in (tmp_path / "results.md").read_text()


def test_report_refuses_a_folder_without_results(tmp_path):
    with pytest.raises(SpbuildError, match="results.json not found"):
        reports.rewrite(tmp_path)
    (tmp_path / "results.json").write_text('{"kind": "other", "rows": []}')
    with pytest.raises(SpbuildError, match="not a bench or eval result"):
        reports.rewrite(tmp_path)


def test_spread_and_rate():
    s = Spread.of([120.0, 100.0, 110.0, float("nan")])
    assert (s.median, s.low, s.high, s.n) == (110.0, 100.0, 120.0, 3)
    assert s.relative == pytest.approx(20 / 110)
    assert Spread.of([]).n == 0 and math.isnan(Spread.of([]).median)
    r = rate([True, True, False, None])
    assert (r.k, r.n, str(r)) == (2, 3, "67% (2/3)")
    # the Wilson interval of 0/10 is not [0, 0]: ten failures do not prove a rate of 0
    low, high = Rate(0, 10).interval
    assert low == 0.0 and 0.25 < high < 0.35
    assert str(Rate(0, 0)) == "-"


@given(k=st.integers(0, 200), extra=st.integers(0, 200))
def test_the_interval_holds_the_rate(k, extra):
    r = Rate(k, k + extra)
    if r.n:
        low, high = r.interval
        assert 0.0 <= low <= r.value <= high <= 1.0


def test_variants_change_the_selection_shape_by_request_and_by_flag():
    assert evaluate.variants("") == [()]
    grid = evaluate.settings_grid([0.2], [0, 2048], (), evaluate.variants("chunk_size=64; keep_last=256,keep_first=8"))
    assert [s.name for s in grid] == ["p=0.2 full", "p=0.2 W=2048", "p=0.2 full chunk_size=64",
                                      "p=0.2 W=2048 chunk_size=64", "p=0.2 full keep_last=256,keep_first=8",
                                      "p=0.2 W=2048 keep_last=256,keep_first=8"]
    both = grid[4]
    assert both.request()["keep_last"] == 256 and both.request()["keep_first"] == 8
    assert "chunk_size" not in grid[0].request()
    args = both.tool_args()
    assert args[args.index("--spec-prefill-keep-last") + 1] == "256"
    assert args[args.index("--spec-prefill-keep-first") + 1] == "8"
    (lines,) = evaluate.settings_grid([0.2], [0], (), evaluate.variants("chunk_lines=1"))[1:]
    assert lines.request()["chunk_lines"] is True and "--spec-prefill-chunk-lines" in lines.tool_args()
    (no_lines,) = evaluate.settings_grid([0.2], [0], (), evaluate.variants("chunk_lines=0"))[1:]
    assert no_lines.request()["chunk_lines"] is False and "--no-spec-prefill-chunk-lines" in no_lines.tool_args()
    (complete,) = evaluate.settings_grid([0.2], [0], (), evaluate.variants("chunk_lines=0,complete_lines=1"))[1:]
    assert complete.request()["complete_lines"] is True and complete.request()["chunk_lines"] is False
    assert "--spec-prefill-complete-lines" in complete.tool_args()
    (look,) = evaluate.settings_grid([0.2], [0], (), evaluate.variants("lookahead=1"))[1:]
    assert look.request()["lookahead"] == 1 and look.name == "p=0.2 full lookahead=1"
    args = look.tool_args()
    assert args[args.index("--spec-prefill-lookahead") + 1] == "1"
    for bad in ("chunk=64", "keep_last=-1", "keep_last=many", "keep_last", "chunk_lines=2", "lookahead=0"):
        with pytest.raises(SpbuildError, match="--vary"):
            evaluate.variants(bad)


def test_layer_counts_and_scorers_are_settings_of_one_run():
    """--layers repeats every variant per layer count (0: the scorer's default), --scorers every setting per scorer;
    the names tell them apart, and a layer count travels as a request field and a flag alike."""
    grid = evaluate.settings_grid([0.2], [0], (), evaluate.variants("lookahead=1"), evaluate.scorers("draft,self"),
                                  "0,6")
    assert [s.name for s in grid] == ["p=0.2 full", "p=0.2 full lookahead=1", "p=0.2 full layers=6",
                                      "p=0.2 full lookahead=1,layers=6", "p=0.2 full self",
                                      "p=0.2 full lookahead=1 self", "p=0.2 full layers=6 self",
                                      "p=0.2 full lookahead=1,layers=6 self"]
    six = grid[2]
    assert six.scorer == "draft" and six.request()["layers"] == 6 and "layers" not in grid[0].request()
    args = six.tool_args()
    assert args[args.index("--spec-prefill-layers") + 1] == "6"
    assert {s.scorer for s in grid[4:]} == {"self"}
    for bad in ("-1", "six", ""):
        with pytest.raises(SpbuildError, match="--layers"):
            evaluate.with_layers([()], bad)
    with pytest.raises(SpbuildError, match="unknown scorer: target"):
        evaluate.scorers("draft,target")


def test_a_layer_count_can_name_its_scorer():
    """SCORER:K gives that scorer alone the count, so one run holds the draft's whole depth and the target's first K
    layers without the draft's first K; a scorer no count names scores with its default; a prefix must be a scorer
    of the run."""
    grid = evaluate.settings_grid([0.3], [0], (), [()], ["draft", "self"], "draft:0,self:3,self:4")
    assert [s.name for s in grid] == ["p=0.3 full", "p=0.3 full layers=3 self", "p=0.3 full layers=4 self"]
    assert [s.name for s in evaluate.settings_grid([0.3], [0], (), [()], ["draft", "self"], "0,self:4")] == \
        ["p=0.3 full", "p=0.3 full self", "p=0.3 full layers=4 self"]
    assert [s.name for s in evaluate.settings_grid([0.3], [0], (), [()], ["draft", "self"], "draft:12")] == \
        ["p=0.3 full layers=12", "p=0.3 full self"]
    assert [s.name for s in evaluate.settings_grid([0.3], [0], (), [()], ["draft", "self"], "6,self:6")] == \
        ["p=0.3 full layers=6", "p=0.3 full layers=6 self"]
    with pytest.raises(SpbuildError, match="not among the run's scorers"):
        evaluate.settings_grid([0.3], [0], (), [()], ["draft"], "self:4")
    for bad in ("self:", "self:-1", ":4", "self:x"):
        with pytest.raises(SpbuildError, match="--layers"):
            evaluate.with_layers([()], bad)


@pytest.mark.parametrize("server_args", ["--port 8080", "-ngl 99 --host 0.0.0.0", "--port=9"])
def test_an_address_in_the_server_args_is_refused_before_anything_runs(tmp_path, capsys, server_args):
    # the harness starts the server on a port of its own: with the user's --port last, it polled its own for 600 s
    code = eval_cli.main(["--bin", str(tmp_path), "--via", "server", f"--server-args={server_args}",
                          "--out", str(tmp_path / "out")])
    assert code == 1
    err = capsys.readouterr().err
    assert "the harness starts llama-server on a free local port of its own" in err, err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SpbuildError, match="the harness starts llama-server"):
        ServerProcess(tmp_path / "llama-server", server_args.split())
    refuse_own_address(["-ngl", "99", "--portable"])  # a flag that only starts like one is fine


def test_the_eval_request_holds_every_option_and_its_defaults_are_the_parsers():
    # the modules below the CLI take an EvalRequest: an option the request lacks would be parsed and never reach them
    parser = argparse.ArgumentParser()
    eval_cli.add_arguments(parser)
    fields = {f.name for f in dataclasses.fields(eval_cli.EvalRequest)}
    options = {a.dest for a in parser._actions if a.dest != "help"}
    assert options - {"no_plots"} == fields - {"plots"}
    assert eval_cli.EvalRequest.from_args(parser.parse_args([])) == eval_cli.EvalRequest()
    request = eval_cli.EvalRequest.from_args(parser.parse_args(["--no-plots", "--turns", "2", "--p", "0.5"]))
    assert (request.plots, request.turns, request.p) == (False, "2", "0.5")
