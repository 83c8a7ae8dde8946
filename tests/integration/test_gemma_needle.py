"""The real Gemma 3 270M as target, scored by itself and by its own Q4_0 requantisation (a draft that differs from
the target), through llama-specprefill: needles in 1K-2.5K-token prompts survive a 20% speculative prefill, and the
answers match a full prefill's. The pass marks (95% kept, 90% same answer) are the product's quality bar. The sweep
runs once per session (conftest.py gemma_needles, prompts in needles.SWEEP)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.build, pytest.mark.slow]


def test_prompts_span_1k_to_2500_tokens(gemma_needles):
    lengths = [o["n_prompt"] for o in gemma_needles]
    assert min(lengths) >= 900 and max(lengths) <= 2800
    assert all(o["status"] == "sparse" for o in gemma_needles)


def test_needle_is_kept(gemma_needles):
    kept = sum(o["needle_kept"] for o in gemma_needles)
    assert kept >= 0.95 * len(gemma_needles), [o for o in gemma_needles if not o["needle_kept"]]


def test_answer_matches_full_prefill(gemma_needles):
    same = sum(o["same_answer"] for o in gemma_needles)
    assert same >= 0.90 * len(gemma_needles), [o for o in gemma_needles if not o["same_answer"]]
    # and the full prefill itself finds the code, so the comparison means something
    assert sum(o["code"] in o["full_answer"] for o in gemma_needles) >= 0.9 * len(gemma_needles)


def test_another_draft_keeps_the_needles_and_the_answers(gemma_needles):
    """The target scored by a draft that is not itself: the same model requantised to Q4_0 (every other case)."""
    outcomes = [o for o in gemma_needles if o["draft"] == "q4_0"]
    assert len(outcomes) == len(gemma_needles) // 2
    assert all(o["status"] == "sparse" for o in outcomes)
    assert sum(o["needle_kept"] for o in outcomes) >= 0.9 * len(outcomes), [o for o in outcomes if not o["needle_kept"]]
    assert sum(o["same_answer"] for o in outcomes) >= 0.9 * len(outcomes), [o for o in outcomes if not o["same_answer"]]
