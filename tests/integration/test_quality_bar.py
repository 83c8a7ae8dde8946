"""The quality bar's mechanism check: Gemma 3 270M as target and prefill draft behind llama-server, at a fixed p=0.6, on
a fixed set of `spbuild eval` cases (four task kinds at 1K, 1.5K and 2K tokens, evidence at several depths, the three
fillers in turn), scored over the whole prompt and in windows.

The marks: where the full prefill answers right, spec prefill answers right too in at least 90% of cases; windowed
scoring within 5 points of full-prompt scoring; every evidence line kept in at least 95%. At p=0.6 the selection
reaches them on these cases since kept runs are completed to whole lines (7 of 7 right answers and 12 of 12 evidence
sets in both modes; with fixed chunks alone 6 of 7 and 11 of 12: docs/log/quality-notes.md), so a change to the
scoring or the selection that loses one answer or evidence set fails. The p is fixed, not the server's default: the
defaults come from the real Qwen2.5-Coder pair (docs/quality.md, held by test_real_pair_bar.py); this base model
scoring for itself answers half of the multi-key and chain cases wrong with the full prompt, and at p=0.3 it keeps 6
of these 7 right answers. Agreement with the full prefill is not a mark: on this model the answers the full prefill
gets wrong move with any change to the prompt. The kinds are the four it answers: it cannot sum (distributed) or
follow a chain of four variables (vartrack)."""

from __future__ import annotations

import pytest

from spbuild.measuring import evaluate, reports, tasks

pytestmark = [pytest.mark.build, pytest.mark.slow]

WINDOW = 512  # 2-4 windows at these lengths
P = 0.6  # the bar's p: where this model held the marks (the server's default is the real pair's)

# the aim, which p=0.6 holds on these cases (2026-12-02)
STILL_CORRECT_HELD = 0.9
RETENTION_HELD = 0.95


@pytest.fixture(scope="module")
def quality_rows(build, gemma, tmp_path_factory) -> tuple[float, list[dict]]:
    out = tmp_path_factory.mktemp("quality-bar")
    bin_dir = build.binary("llama-server").parent
    backend = evaluate.ServerBackend(bin_dir, gemma, gemma, int(max(tasks.QUALITY_BAR_LENGTHS) * 1.1) + 256,
                                     ["--device", "none", "--no-warmup"], out / "server.log")
    try:
        cases = tasks.quality_bar(backend.count_tokens)
        settings = [evaluate.Setting("keep", P, 0), evaluate.Setting("keep", P, WINDOW)]
        rows = evaluate.run(backend, cases, settings)
        # the rows as `spbuild eval` reports them, beside the server's log, for a failure to be read
        reports.write(out, "eval", {"via": "server", "target": str(gemma), "draft": str(gemma),
                                    "command": backend.command(), "complete": True}, rows, plots=False)
        return P, rows
    finally:
        backend.close()


def _by_window(rows: list[dict], window: int) -> list[dict]:
    return [r for r in rows if r["window"] == window]


def _summary(rows: list[dict], window: int) -> dict:
    """The setting's rates as `spbuild eval` reports them (reports.eval_summary)."""
    (summary,) = reports.eval_summary(_by_window(rows, window))
    return summary


def _still_correct(rows: list[dict], window: int) -> float:
    summary = _summary(rows, window)
    answerable = summary["correct_kept"]["n"]  # the cases the full prefill answers right
    assert answerable >= summary["cases"] // 2, "the full prefill answers too few cases right to measure what is lost"
    return summary["correct_kept"]["rate"]


def _report(rows: list[dict]) -> list[tuple]:
    return [(r["case"], r["setting"], r["answer"], r["full_answer"], r["spec_answer"]) for r in rows
            if not r["agree"]]


def test_every_case_is_scored_at_the_bar_p(quality_rows):
    p, rows = quality_rows
    assert 0.0 < p <= 1.0
    assert len(rows) == 2 * len(tasks.QUALITY_BAR_LENGTHS) * len(tasks.QUALITY_BAR_KINDS)
    assert all(r["status"] == "active" for r in rows), [(r["case"], r["setting"], r.get("reason")) for r in rows]
    assert all(r["n_windows"] >= 2 for r in _by_window(rows, WINDOW))
    assert all(r["n_windows"] == 1 for r in _by_window(rows, 0))


def test_right_answers_stay_right(quality_rows):
    _, rows = quality_rows
    for window in (0, WINDOW):
        assert _still_correct(rows, window) >= STILL_CORRECT_HELD, _report(_by_window(rows, window))


def test_windowed_scoring_is_within_five_points_of_full_prompt_scoring(quality_rows):
    _, rows = quality_rows
    assert _still_correct(rows, WINDOW) >= _still_correct(rows, 0) - 0.05, _report(_by_window(rows, WINDOW))


def test_the_evidence_is_kept(quality_rows):
    _, rows = quality_rows
    lost = [(r["case"], r["setting"]) for r in rows if not r["evidence_retained"]]
    for window in (0, WINDOW):
        assert _summary(rows, window)["retention"]["rate"] >= RETENTION_HELD, lost
