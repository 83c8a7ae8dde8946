"""The real Gemma 3 270M as draft and target (and with its own Q4_0 requantisation as the draft): needles in
1K-4K-token prompts survive a 20% speculative prefill, and the answers match a full prefill's. The pass marks (95%
kept, 90% same answer) are the product's quality bar."""

from __future__ import annotations

import pytest

from needles import make_needle

from spbuild.tasks import token_span

# 20 prompts from about 1,000 to 4,000 tokens, needles at depths spread over 10-90%
CASES = [(100 + 300 * i // 19, 0.1 + 0.8 * ((i * 7) % 20) / 19, 1000 + i) for i in range(20)]


def _outcomes(build, target, draft, cases, tmp):
    from harness import SpecPrefillTool

    tool = SpecPrefillTool(build.binary("llama-specprefill"), tmp)
    results = []
    for n_sentences, depth, seed in cases:
        needle = make_needle(n_sentences, depth, seed)
        run = tool.run("-m", target, "-mpd", draft, "--device", "none", "-c", "8192", "-n", "6", "--temp", "0",
                       "--spec-prefill-p", "0.2", "--spec-prefill-min-tokens", "256", "--baseline",
                       prompt=needle.prompt, timeout=900)
        assert run.returncode == 0, run.stderr[-2000:]
        report = run.report
        span = token_span(report["prompt_pieces"], needle.needle)
        kept = set(report["kept"])
        results.append({
            "seed": seed,
            "n_prompt": report["n_prompt"],
            "status": report["status"],
            "needle_kept": all(i in kept for i in span),
            "same_answer": report["run"]["text"] == report["baseline"]["text"],
            "answer": report["run"]["text"],
            "code": needle.code,
        })
    return results


@pytest.fixture(scope="module")
def outcomes(build, gemma, tmp_path_factory):
    return _outcomes(build, gemma, gemma, CASES, tmp_path_factory.mktemp("needles"))


@pytest.fixture(scope="module")
def outcomes_q4_0_draft(build, gemma, gemma_q4_0, tmp_path_factory):
    """The target scored by a draft that is not itself: the same model requantised to Q4_0."""
    return _outcomes(build, gemma, gemma_q4_0, CASES[::2], tmp_path_factory.mktemp("needles-q4_0"))


def test_prompts_span_1k_to_4k_tokens(outcomes):
    lengths = [o["n_prompt"] for o in outcomes]
    assert min(lengths) >= 900 and max(lengths) <= 4300
    assert all(o["status"] == "sparse" for o in outcomes)


def test_needle_is_kept(outcomes):
    kept = sum(o["needle_kept"] for o in outcomes)
    assert kept >= 0.95 * len(outcomes), [o for o in outcomes if not o["needle_kept"]]


def test_answer_matches_full_prefill(outcomes):
    same = sum(o["same_answer"] for o in outcomes)
    assert same >= 0.90 * len(outcomes), [o for o in outcomes if not o["same_answer"]]
    # and the full prefill itself finds the code, so the comparison means something
    assert sum(o["code"] in o["answer"] for o in outcomes) >= 0.9 * len(outcomes)


def test_another_draft_keeps_the_needles_and_the_answers(outcomes_q4_0_draft):
    outcomes = outcomes_q4_0_draft
    assert all(o["status"] == "sparse" for o in outcomes)
    assert sum(o["needle_kept"] for o in outcomes) >= 0.9 * len(outcomes), [o for o in outcomes if not o["needle_kept"]]
    assert sum(o["same_answer"] for o in outcomes) >= 0.9 * len(outcomes), [o for o in outcomes if not o["same_answer"]]
