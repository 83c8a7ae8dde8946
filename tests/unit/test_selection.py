"""spbuild._selection (cpp/common/spec-prefill-select.cpp) against a NumPy reference, plus properties of the selection.

The reference lives in selection_reference.py, next to this file. Scores are mostly non-negative float32 values
(attention probabilities); some strategies bring zeros, ties and non-finite values.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from spbuild import _selection as sel


def _load_reference():
    path = Path(__file__).with_name("selection_reference.py")
    spec = importlib.util.spec_from_file_location("selection_reference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("selection_reference", module)
    spec.loader.exec_module(module)
    return module


ref = _load_reference()

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MEDIUM = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- strategies ----------------------------------------------------------------------------------------------

probability = st.floats(0.0, 1.0, width=32, allow_subnormal=False)


def score_arrays(min_size: int = 0, max_size: int = 300) -> st.SearchStrategy[np.ndarray]:
    """Non-negative float32 scores: generic values, few distinct values (ties, zeros), or sparse spikes."""
    sizes = st.integers(min_size, max_size)
    generic = sizes.flatmap(lambda n: hnp.arrays(np.float32, n, elements=probability))
    tied = sizes.flatmap(lambda n: hnp.arrays(
        np.float32, n, elements=st.sampled_from([0.0, 0.0, 0.25, 0.5, 1.0]).map(np.float32)))
    sparse = sizes.flatmap(lambda n: hnp.arrays(
        np.float32, n, elements=st.one_of(st.just(0.0), st.just(0.0), st.just(0.0), probability)))
    return st.one_of(generic, tied, sparse)


def with_non_finite(arr_strategy):
    """Some scores replaced by inf / nan (the selection counts them as 0)."""
    @st.composite
    def build(draw):
        arr = draw(arr_strategy).copy()
        if arr.size:
            idx = draw(st.lists(st.integers(0, arr.size - 1), max_size=4))
            for i in idx:
                arr[i] = draw(st.sampled_from([np.inf, -np.inf, np.nan]))
        return arr
    return build()


# keep as a user types it (k / 1000); mass either as typed or any float32 in (0, 1]
keep_values = st.integers(1, 1000).map(lambda k: k / 1000)
mass_values = st.one_of(st.integers(1, 1000).map(lambda k: k / 1000),
                        st.floats(0.0, 1.0, width=32, exclude_min=True, allow_subnormal=False))


@st.composite
def select_params(draw):
    return dict(
        keep=draw(keep_values),
        mass=draw(mass_values),
        chunk_size=draw(st.one_of(st.integers(0, 40), st.sampled_from([0, 1, 32]))),
        keep_first=draw(st.integers(0, 50)),
        keep_last=draw(st.integers(0, 100)),
    )


def run_select(scores, mode, p):
    return list(sel.select(np.ascontiguousarray(scores, dtype=np.float32), mode, p["keep"], p["mass"],
                           p["chunk_size"], p["keep_first"], p["keep_last"]))


# --- pool_row ------------------------------------------------------------------------------------------------


def assert_close(got, want, rtol=1e-5):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6 * scale + 1e-30)


@st.composite
def pool_cases(draw):
    n_cells = draw(st.integers(1, 60))
    probs = draw(st.one_of(
        hnp.arrays(np.float32, n_cells, elements=probability),
        hnp.arrays(np.float32, n_cells, elements=st.sampled_from([0.0, 0.0, 0.5, 1.0]).map(np.float32))))
    key0 = draw(st.integers(0, n_cells - 1))
    n_keys = draw(st.integers(1, n_cells - key0))
    n_norm = draw(st.integers(0, n_cells))
    kernel = draw(st.integers(-2, 20))
    return probs, key0, n_keys, n_norm, kernel


@FAST
@given(pool_cases())
def test_pool_row_matches_reference(case):
    probs, key0, n_keys, n_norm, kernel = case
    got = sel.pool_row(probs, key0, n_keys, n_norm, kernel)
    assert got.dtype == np.float32 and got.shape == (n_keys,)
    assert_close(got, ref.pool_row(probs, key0, n_keys, n_norm, kernel))


@FAST
@given(hnp.arrays(np.float64, st.integers(1, 40), elements=st.floats(0, 1)), st.integers(-1, 12))
def test_reference_pool_span_is_the_naive_window_mean(span, kernel):
    np.testing.assert_allclose(ref.pool_span(span, kernel), ref.pool_span_naive(span, kernel), rtol=1e-9, atol=1e-12)


def test_pool_row_by_hand():
    probs = np.array([1, 2, 3, 4, 0, 0], np.float32)  # normaliser over the first 4 cells: 10
    # kernel 3 (left 1, right 1) over cells [1, 5): 0.2 0.3 0.4 0.0 -> (0.5/2, 0.9/3, 0.7/3, 0.4/2)
    np.testing.assert_allclose(sel.pool_row(probs, 1, 4, 4, 3), [0.25, 0.3, 0.7 / 3, 0.2], rtol=1e-6)
    # kernel 2 (left 0, right 1)
    np.testing.assert_allclose(sel.pool_row(probs, 1, 4, 4, 2), [0.25, 0.35, 0.2, 0.0], rtol=1e-6)
    # no pooling
    for kernel in (-1, 0, 1):
        np.testing.assert_allclose(sel.pool_row(probs, 1, 4, 4, kernel), [0.2, 0.3, 0.4, 0.0], rtol=1e-6)
    # a zero normaliser gives zeros
    np.testing.assert_array_equal(sel.pool_row(probs, 0, 6, 0, 3), np.zeros(6, np.float32))
    np.testing.assert_array_equal(sel.pool_row(probs, 4, 2, 6, 1)[:0], np.zeros(0))


# --- score ---------------------------------------------------------------------------------------------------


@st.composite
def score_cases(draw):
    n_rows = draw(st.integers(0, 3))
    n_layers = draw(st.integers(1, 3))
    n_head = draw(st.integers(1, 4))
    n_cells = draw(st.integers(1, 40))
    elements = st.one_of(probability, st.just(0.0))
    attn = draw(hnp.arrays(np.float32, (n_rows, n_layers, n_head, n_cells), elements=elements))
    if attn.size and draw(st.booleans()):
        # whole heads with no mass at all (skipped)
        for r, layer, h in draw(st.lists(st.tuples(st.integers(0, n_rows - 1), st.integers(0, n_layers - 1),
                                                   st.integers(0, n_head - 1)), max_size=4)):
            attn[r, layer, h] = 0.0
    key0 = draw(st.integers(0, n_cells - 1))
    n_keys = draw(st.integers(1, n_cells - key0))
    n_norm = draw(st.integers(0, n_cells))
    kernel = draw(st.integers(0, 12))
    scale = draw(st.one_of(st.just(1.0), st.floats(1e-3, 10.0)))
    return attn, key0, n_keys, n_norm, kernel, scale


@FAST
@given(score_cases(), st.sampled_from([1, 4]))
def test_score_matches_reference(case, n_threads):
    attn, key0, n_keys, n_norm, kernel, scale = case
    got = sel.score(attn, key0, n_keys, n_norm, kernel, scale, n_threads)
    assert got.dtype == np.float32 and got.shape == (n_keys,)
    assert_close(got, ref.score(attn, key0, n_keys, n_norm, kernel, scale))


def test_score_by_hand():
    # one row, two layers, one head each: the max over layers, then scale
    attn = np.zeros((1, 2, 1, 4), np.float32)
    attn[0, 0, 0] = [1, 0, 0, 1]   # -> 0.5 0 0 0.5
    attn[0, 1, 0] = [0, 3, 1, 0]   # -> 0 0.75 0.25 0
    np.testing.assert_allclose(sel.score(attn, 0, 4, 4, 1, 2.0), [1.0, 1.5, 0.5, 1.0], rtol=1e-6)
    # two rows: the mean of the rows' maxima
    attn2 = np.concatenate([attn, np.zeros_like(attn)])
    np.testing.assert_allclose(sel.score(attn2, 0, 4, 4, 1), [0.25, 0.375, 0.125, 0.25], rtol=1e-6)
    # no rows: zeros
    np.testing.assert_array_equal(sel.score(np.zeros((0, 1, 1, 4), np.float32), 0, 4, 4, 3), np.zeros(4))


def test_score_threads_on_a_long_span():
    # 70,000 keys: more than 4 * 16384, so 4 threads really split the span (and the pooling windows cross splits)
    rng = np.random.default_rng(1234)
    n_cells, key0 = 70_000, 100
    n_keys, n_norm = n_cells - key0 - 50, n_cells - 20
    attn = rng.random((2, 2, 3, n_cells), dtype=np.float32) ** 8  # skewed, like attention
    attn[1, 0, 2] = 0.0  # a head with no mass
    for kernel in (1, 8, 13):
        one = sel.score(attn, key0, n_keys, n_norm, kernel, 1.0, 1)
        four = sel.score(attn, key0, n_keys, n_norm, kernel, 1.0, 4)
        assert_close(four, one, rtol=1e-6)
        assert_close(one, ref.score(attn, key0, n_keys, n_norm, kernel))


# --- plan_windows --------------------------------------------------------------------------------------------


@FAST
@given(st.integers(-5, 5000), st.integers(-5, 6000))
def test_plan_windows(n_tokens, window):
    got = [tuple(w) for w in sel.plan_windows(n_tokens, window)]
    assert got == ref.plan_windows(n_tokens, window)
    if n_tokens <= 0:
        assert got == []
        return
    if window <= 0 or window >= n_tokens:
        assert got == [(0, n_tokens)]
        return
    assert len(got) == -(-n_tokens // window)
    assert got[0][0] == 0 and got[-1][1] == n_tokens
    assert all(a[1] == b[0] for a, b in zip(got, got[1:]))  # contiguous, no overlap
    sizes = [e - b for b, e in got]
    assert all(0 < s <= window for s in sizes)
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # larger first


# --- check_params --------------------------------------------------------------------------------------------

VALID = dict(mode="keep", keep=0.3, mass=0.85, chunk_size=32, keep_first=4, keep_last=64)
INVALID = [
    dict(mode="top"), dict(mode=""),
    dict(keep=0.0), dict(keep=-0.1), dict(keep=1.5), dict(keep=float("nan")),
    dict(mass=0.0), dict(mass=-1.0), dict(mass=1.0001), dict(mass=float("nan")),
    dict(chunk_size=-1), dict(keep_first=-1), dict(keep_last=-1),
]


@pytest.mark.parametrize("mode", ["keep", "mass"])
@pytest.mark.parametrize("change", [{}, dict(keep=1.0, mass=1.0), dict(chunk_size=0, keep_first=0, keep_last=0),
                                    dict(keep=1e-6, mass=1e-6)])
def test_check_params_valid(mode, change):
    params = {**VALID, **change, "mode": mode}
    assert sel.check_params(**params) is None
    assert ref.check_params(**params) is None
    sel.select(np.ones(10, np.float32), **params)  # no error


@pytest.mark.parametrize("change", INVALID, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_check_params_invalid(change):
    params = {**VALID, **change}
    problem = sel.check_params(**params)
    assert isinstance(problem, str) and problem
    assert ref.check_params(**params) is not None
    with pytest.raises(ValueError):
        sel.select(np.ones(10, np.float32), **params)
    with pytest.raises(ValueError):
        ref.select(np.ones(10, np.float32), **params)


# --- select: against the reference ---------------------------------------------------------------------------


@FAST
@given(score_arrays(), select_params(), st.sampled_from(["keep", "mass"]))
def test_select_matches_reference(scores, p, mode):
    assert run_select(scores, mode, p) == ref.select(scores, mode, **p)


@st.composite
def scores_with_line_ends(draw):
    """Scores and a line-end flag per token: lines of a few tokens to a few chunks long, as prompts have them."""
    scores = draw(score_arrays(min_size=1))
    line_ends = [0] * len(scores)
    i = draw(st.integers(0, 20))
    while i < len(scores):
        line_ends[i] = 1
        i += draw(st.integers(1, 80))
    return scores, line_ends


@FAST
@given(scores_with_line_ends(), select_params(), st.sampled_from(["keep", "mass"]))
def test_select_along_lines_matches_reference(data, p, mode):
    scores, line_ends = data
    got = list(sel.select(np.ascontiguousarray(scores, dtype=np.float32), mode, p["keep"], p["mass"],
                          p["chunk_size"], p["keep_first"], p["keep_last"], line_ends))
    assert got == ref.select(scores, mode, **p, line_ends=line_ends)


@FAST
@given(scores_with_line_ends(), select_params(), st.sampled_from(["keep", "mass"]), st.booleans())
def test_complete_lines_matches_reference(data, p, mode, chunk_lines):
    scores, line_ends = data
    got = list(sel.select(np.ascontiguousarray(scores, dtype=np.float32), mode, p["keep"], p["mass"],
                          p["chunk_size"], p["keep_first"], p["keep_last"], line_ends, chunk_lines=chunk_lines,
                          complete_lines=True))
    assert got == ref.select(scores, mode, **p, line_ends=line_ends, chunk_lines=chunk_lines,
                                complete_lines=True)
    # completion only adds tokens to the selection it starts from
    plain = sel.select(np.ascontiguousarray(scores, dtype=np.float32), mode, p["keep"], p["mass"], p["chunk_size"],
                       p["keep_first"], p["keep_last"], line_ends, chunk_lines=chunk_lines)
    assert set(plain) <= set(got)


# token texts as a tokenizer gives them: words split into pieces, mixed case, digits, punctuation, newlines, UTF-8
PIECES = ["The", " key", " for", " vault", " Or", "ion", " ORION", " is", " 4", "497", "8", ".", "\n", ".\n", " what",
          " What", "?", " Lyon", " lyon", "_x", "Ä", "ßen", " Straße", " café", " 2024", " 12", ":", "46", " log", "ging",
          " ERROR", " error", " var", "_", "QXJ", " =", " ", "  ", "\t", "\n\n", " GGML", "_TYPE", "_Q", "4", "__", "_K"]


@st.composite
def prompt_pieces(draw):
    """Token texts, a line-end flag per token (a piece ending a line, or some other token), the question's length."""
    pieces = draw(st.lists(st.sampled_from(PIECES), min_size=1, max_size=300))
    line_ends = [int(p.endswith("\n") or draw(st.integers(0, 30)) == 0) for p in pieces]
    return pieces, line_ends, draw(st.integers(0, 80))


@FAST
@given(prompt_pieces(), st.integers(0, 6))
def test_question_lines_match_reference(data, max_lines):
    pieces, line_ends, n_question = data
    got = {i for i, f in enumerate(sel.question_lines(pieces, line_ends, n_question, max_lines)) if f}
    assert got == ref.question_line_positions(pieces, line_ends, n_question, max_lines)
    # only lines before the question are added
    assert all(i < len(pieces) - n_question for i in got)


@FAST
@given(prompt_pieces(), select_params(), st.sampled_from(["keep", "mass"]), st.integers(0, 4))
def test_select_with_question_lines_matches_reference(data, p, mode, max_lines):
    pieces, line_ends, _ = data
    scores = np.ascontiguousarray(np.random.default_rng(len(pieces)).random(len(pieces)), dtype=np.float32)
    got = list(sel.select(scores, mode, p["keep"], p["mass"], p["chunk_size"], p["keep_first"], p["keep_last"],
                          line_ends, chunk_lines=False, complete_lines=True, pieces=pieces, question_lines=max_lines))
    assert got == ref.select(scores, mode, **p, line_ends=line_ends, chunk_lines=False, complete_lines=True,
                             pieces=pieces, question_lines=max_lines)
    # question lines only add to the selection
    plain = sel.select(scores, mode, p["keep"], p["mass"], p["chunk_size"], p["keep_first"], p["keep_last"],
                       line_ends, chunk_lines=False, complete_lines=True)
    assert set(plain) <= set(got)


@FAST
@given(st.integers(1, 400), select_params(), st.sampled_from(["keep", "mass"]),
       st.lists(st.tuples(st.integers(0, 400), st.integers(0, 120)), max_size=4), st.integers(0, 2**32 - 1))
def test_select_with_protected_spans_matches_reference(n, p, mode, spans, seed):
    scores = np.ascontiguousarray(np.random.default_rng(seed).random(n), dtype=np.float32)
    protect = [0] * n
    for begin, length in spans:
        for i in range(begin, min(n, begin + length)):
            protect[i] = 1
    args = (scores, mode, p["keep"], p["mass"], p["chunk_size"], p["keep_first"], p["keep_last"])
    got = list(sel.select(*args, chunk_lines=False, protect=protect))
    assert got == ref.select(*args[:2], **p, chunk_lines=False, protect=protect)
    # the unprotected selection plus every protected token
    plain = set(sel.select(*args, chunk_lines=False))
    assert plain | {i for i in range(n) if protect[i]} == set(got)


def test_protected_spans_are_added_to_the_unprotected_selection():
    """A 1,024-token prompt in 32 chunks of 32, its first 8 chunks protected (a system message and tool schemas).
    Scoring nothing, they are kept on top of what p = 0.25 keeps without them: a quarter of all 32 chunks (8, the
    highest, 23-30) and the always-kept tail (31). Scoring highest, they are what the unprotected selection keeps
    anyway, and the open part gets no less than it would without them (the 3-turn tools eval lost calls when p applied
    to the open part alone and the tool results kept fewer tokens than under `off`)."""
    n, chunk = 1024, 32
    scores = np.zeros(n, np.float32)
    for c in range(8, 32):
        scores[c * chunk:(c + 1) * chunk] = c  # later chunks score higher
    protect = [1] * (8 * chunk) + [0] * (n - 8 * chunk)
    args = (scores, "keep", 0.25, 0.85, chunk, 0, 1)
    plain = set(sel.select(*args, chunk_lines=False))
    assert plain == set(range(23 * chunk, n))
    assert set(sel.select(*args, chunk_lines=False, protect=protect)) == set(range(8 * chunk)) | plain

    scores[:8 * chunk] = 100.0  # the protected chunks now score highest: the unprotected pick is them and the tail
    args = (scores, "keep", 0.25, 0.85, chunk, 0, 1)
    plain = set(sel.select(*args, chunk_lines=False))
    assert plain == set(range(8 * chunk)) | set(range(31 * chunk, n))
    assert set(sel.select(*args, chunk_lines=False, protect=protect)) == plain
    with pytest.raises(ValueError, match="protect flag"):
        sel.select(*args, protect=[1])


def test_question_lines_keep_the_asked_key_and_skip_common_words():
    """A multi-key prompt: the asked vault's line shares 'orion' (any case, split over pieces) with the question and
    is kept although it scores nothing; 'vault' is in four lines, too common under a limit of 3 to add any; the other
    vaults' lines and the filler are not kept."""
    lines = [["Log", " entry", " number", f" {k}", " was", " fine", ".\n"] for k in range(40)]
    lines[5] = ["The", " key", " for", " vault", " Or", "ion", " is", " 449", "78", ".\n"]
    lines[20] = ["The", " key", " for", " vault", " Vega", " is", " 129", "84", ".\n"]
    lines[30] = ["The", " key", " for", " vault", " Lyra", " is", " 555", "12", ".\n"]
    lines[33] = ["Vault", " access", " is", " logged", ".\n"]
    question = ["What", " is", " the", " key", " for", " vault", " ORION", "?", "\n", "Answer", ":"]
    pieces = [p for line in lines for p in line] + question
    line_ends = [int(p.endswith("\n")) for p in pieces]
    start = {k: sum(len(line) for line in lines[:k]) for k in range(len(lines) + 1)}
    scores = np.zeros(len(pieces), np.float32)
    scores[start[10]:start[11]] = 1.0  # the selection's own pick: a filler line
    args = (scores, "keep", 0.05, 0.85, 8, 0, len(question), line_ends)
    plain = set(sel.select(*args, chunk_lines=False))
    asked = set(sel.select(*args, chunk_lines=False, pieces=pieces, question_lines=3))
    assert asked - plain == set(range(start[5], start[6]))
    # 'vault' is in four lines before the question: with a limit of 4 they all come in
    four = set(sel.select(*args, chunk_lines=False, pieces=pieces, question_lines=4)) - plain
    assert four == set().union(*(range(start[k], start[k + 1]) for k in (5, 20, 30, 33)))
    with pytest.raises(ValueError, match="question_lines"):
        sel.select(*args, pieces=pieces, question_lines=-1)


def test_question_lines_match_an_identifier_whole_where_its_parts_are_common():
    """An enum of the tools eval's kind: every line holds 'ggml', 'ftype' and 'mostly', so no part is rare enough;
    the asked identifier, whole, is in one line before the question, and that line is kept."""
    names = ["Q4_0", "Q4_1", "IQ2_XXS", "IQ2_XS", "Q8_0", "IQ3_S"]
    lines = [["    GGML", "_F", "TYPE", "_MOST", "LY", f"_{n}", f" = {k}", ",\n"] for k, n in enumerate(names)]
    question = ["Record", " the", " value", " of", " GGML", "_FTYPE", "_MOSTLY", "_IQ", "2", "_XXS", ".", "\n"]
    pieces = [p for line in lines for p in line] + question
    line_ends = [int(p.endswith("\n")) for p in pieces]
    got = {i for i, f in enumerate(sel.question_lines(pieces, line_ends, len(question), 2)) if f}
    assert got == set(range(2 * 8, 3 * 8))  # the IQ2_XXS line, not IQ2_XS's
    assert got == ref.question_line_positions(pieces, line_ends, len(question), 2)


def test_complete_lines_keeps_a_cut_line_whole_and_ranks_as_fixed_chunks():
    """The quality bar's lost multi-key answer: the fact's line (tokens 60-75) crosses the fixed cut at 64, and the
    chunk before the cut ranks low. Fixed chunks keep 64-75 only; completing lines adds 60-63 (the line's start, 4
    tokens, within half a chunk) and nothing else of that chunk; a line start or end farther than half a chunk away is
    not reached."""
    n, chunk = 256, 32
    line_ends = [0] * n
    for end in (19, 41, 59, 75, 101, 130, 160, 190, 220):
        line_ends[end] = 1
    scores = np.full(n, 0.01, np.float32)
    scores[62:76] = 1.0
    fixed = set(sel.select(scores, "keep", 0.125, 0.85, chunk, 0, 0, line_ends, chunk_lines=False))
    complete = set(sel.select(scores, "keep", 0.125, 0.85, chunk, 0, 0, line_ends, chunk_lines=False,
                              complete_lines=True))
    assert set(range(64, 96)) <= fixed and 63 not in fixed
    # the run 64-95 grows back to its line's start (60) and on to its line's end (101); the always-kept last chunk
    # (224-255) grows back to its line's start (221)
    assert complete - fixed == set(range(60, 64)) | set(range(96, 102)) | set(range(221, 224))
    far = [0] * n
    far[59] = far[150] = far[200] = 1  # 64-95's next line end is 55 tokens on, the tail's line start 23 back: too far
    assert set(sel.select(scores, "keep", 0.125, 0.85, chunk, 0, 0, far, chunk_lines=False,
                          complete_lines=True)) - fixed == set(range(60, 64))


@FAST
@given(scores_with_line_ends(), st.integers(0, 48))
def test_chunks_along_lines(data, chunk_size):
    scores, line_ends = data
    n, chunk = len(scores), max(1, chunk_size)
    bounds = list(sel.chunks(n, chunk_size, line_ends))
    assert bounds == [r.start for r in ref.chunk_ranges(n, chunk_size, line_ends)] + [n]
    assert bounds[0] == 0 and bounds[-1] == n and all(a < b for a, b in zip(bounds, bounds[1:]))
    for a, b in zip(bounds, bounds[1:-1]):  # every cut but the prompt's end
        if line_ends[b - 1] and chunk > 1:
            assert (chunk + 1) // 2 <= b - a <= chunk + chunk // 2  # moved to a line end, within the range
        else:
            assert b - a == chunk  # no line end in range: the fixed cut
    assert list(sel.chunks(n, chunk_size)) == list(range(0, n, chunk)) + [n]


def test_a_short_line_is_kept_whole():
    """A fact on a line of its own across a fixed cut: fixed chunks split it between a kept chunk and a dropped one
    (the quality bar's lost multi-key answer lost the line's first token so); chunks along lines keep it whole."""
    n, chunk = 256, 32
    line_ends = [0] * n
    for end in (19, 41, 59, 75, 101, 130, 160, 190, 220):  # lines of 16 to 30 tokens
        line_ends[end] = 1
    scores = np.full(n, 0.01, np.float32)
    scores[60:76] = 1.0  # the fact: tokens 60-75, a line of its own across the fixed cut at 64
    fixed = set(sel.select(scores, "keep", 0.125, 0.85, chunk, 0, 0))
    along = set(sel.select(scores, "keep", 0.125, 0.85, chunk, 0, 0, line_ends))
    fact = set(range(60, 76))
    assert fact <= along and not fact <= fixed
    assert 42 in sel.chunks(n, chunk, line_ends) and 76 in sel.chunks(n, chunk, line_ends)


@MEDIUM
@given(with_non_finite(score_arrays(min_size=1)), select_params(), st.sampled_from(["keep", "mass"]))
def test_select_non_finite_scores_count_as_zero(scores, p, mode):
    got = run_select(scores, mode, p)
    assert got == ref.select(scores, mode, **p)
    assert got == run_select(np.where(np.isfinite(scores), scores, 0).astype(np.float32), mode, p)


@pytest.mark.parametrize("keep,n_chunks,expected", [
    (0.3, 10, 3), (0.3, 100, 30), (0.3, 1000, 300), (0.1, 1000, 100), (0.7, 100, 70), (0.05, 2000, 100),
    (0.25, 10, 3), (0.001, 10, 1), (1.0, 7, 7),
])
def test_keep_count_of_typed_fractions(keep, n_chunks, expected):
    # keep is a float32 in C++: 0.3f * 100 = 30.0000012 must still keep 30 chunks, not 31
    chunk = 4
    scores = np.arange(n_chunks * chunk, dtype=np.float32)[::-1].copy()  # the head scores highest
    kept = sel.select(scores, "keep", keep, 0.5, chunk, 0, 0)
    # the last chunk is the forced tail; the top `expected` chunks are the first ones
    want = [i for i in range(n_chunks * chunk) if i < expected * chunk or i >= (n_chunks - 1) * chunk]
    assert list(kept) == want
    assert ref.keep_count(keep, n_chunks, n_chunks - 1) == min(expected, n_chunks - 1)


def test_select_small_cases():
    assert list(sel.select(np.zeros(0, np.float32))) == []
    assert list(sel.select(np.array([0.5], np.float32), "keep", 0.3, 0.85, 32, 0, 0)) == [0]
    assert list(sel.select(np.array([0.5], np.float32), "mass", 0.3, 0.85, 0, 0, 0)) == [0]
    # single tokens, no forced head, tail of one token: the top 30 % of 10 tokens are 3 tokens
    scores = np.array([0.1, 0.9, 0.2, 0.8, 0.3, 0.7, 0.0, 0.0, 0.0, 0.0], np.float32)
    assert list(sel.select(scores, "keep", 0.3, 0.85, 1, 0, 0)) == [1, 3, 5, 9]
    # mass: total 3.0, target 1.5; held by the tail token 0; take 0.9 then 0.8 -> 1.7 >= 1.5
    assert list(sel.select(scores, "mass", 0.3, 0.5, 1, 0, 0)) == [1, 3, 9]
    # all zero scores in mass mode: the target is 0, nothing beyond the forced tokens
    assert list(sel.select(np.zeros(20, np.float32), "mass", 0.3, 0.9, 4, 2, 0)) == [0, 1, 16, 17, 18, 19]
    # ties go to the lower chunk index
    assert list(sel.select(np.ones(12, np.float32), "keep", 0.25, 0.9, 3, 0, 0)) == [0, 1, 2, 9, 10, 11]


# --- select: properties --------------------------------------------------------------------------------------


def structure(scores, p, kept):
    """(chunks, forced, candidates, chosen candidates) for a selection `kept` of `scores`."""
    n = len(scores)
    chunks = ref.chunk_ranges(n, p["chunk_size"])
    forced = ref.forced_positions(n, p["chunk_size"], p["keep_first"], p["keep_last"])
    candidates = [c for c, r in enumerate(chunks) if not set(r) <= forced]
    kept_set = set(kept)
    chosen = [c for c in candidates if set(chunks[c]) <= kept_set]
    return chunks, forced, candidates, chosen


@FAST
@given(score_arrays(), select_params(), st.sampled_from(["keep", "mass"]))
def test_select_structure(scores, p, mode):
    kept = run_select(scores, mode, p)
    n = len(scores)
    assert kept == sorted(set(kept))  # sorted, unique
    assert all(0 <= i < n for i in kept)
    if n == 0:
        assert kept == []
        return
    assert kept[-1] == n - 1  # the last token
    assert set(range(min(n, p["keep_first"]))) <= set(kept)  # the head
    chunks, forced, candidates, chosen = structure(scores, p, kept)
    assert forced <= set(kept)
    # a union of whole chunks plus the forced head and tail
    chunk_len = max(1, p["chunk_size"])
    for i in set(kept) - forced:
        assert set(chunks[i // chunk_len]) <= set(kept)
    assert set(kept) == forced.union(*(set(chunks[c]) for c in chosen))
    # determinism
    assert run_select(scores, mode, p) == kept


@FAST
@given(score_arrays(min_size=1), select_params())
def test_keep_mode_takes_the_formula_count(scores, p):
    kept = run_select(scores, "keep", p)
    chunks, _, candidates, chosen = structure(scores, p, kept)
    n_top = max(1, math.ceil(p["keep"] * len(chunks) - 1e-6))
    assert len(chosen) == min(n_top, len(candidates))
    # and they are the best-ranked ones
    assert chosen == sorted(ref.ranked_candidates(scores, p["chunk_size"], p["keep_first"], p["keep_last"])
                            [:len(chosen)])


@FAST
@given(score_arrays(min_size=1), select_params())
def test_mass_mode_holds_the_mass_and_no_more_chunks_than_needed(scores, p):
    kept = run_select(scores, "mass", p)
    chunks, forced, candidates, chosen = structure(scores, p, kept)
    s = np.asarray(scores, np.float64)
    total = float(s.sum())
    target = float(np.float32(p["mass"])) * total
    held = float(s[kept].sum())
    tol = 1e-9 * total
    assert held >= target - tol
    if chosen:
        ranked = ref.ranked_candidates(scores, p["chunk_size"], p["keep_first"], p["keep_last"])
        assert sorted(ranked[:len(chosen)]) == chosen  # taken in rank order
        last = ranked[len(chosen) - 1]
        newly = [i for i in chunks[last] if i not in forced]
        assert held - float(s[newly].sum()) < target + tol  # without the last chunk taken, short of the target
    else:
        assert float(s[sorted(forced)].sum()) >= target - tol or not candidates


@MEDIUM
@given(score_arrays(min_size=1), select_params(), st.sampled_from(["keep", "mass"]), st.integers(-20, 20))
def test_select_is_scale_invariant(scores, p, mode, log2_factor):
    # a power of two scales every float32 and every float64 sum exactly, so even ties and the mass boundary stay put
    scores = np.where(scores < 2.0 ** -100, 0, scores).astype(np.float32)  # no subnormals after scaling down
    scaled = (scores * np.float32(2.0 ** log2_factor)).astype(np.float32)
    assert np.array_equal(scaled / np.float32(2.0 ** log2_factor), scores)
    assert run_select(scaled, mode, p) == run_select(scores, mode, p)


@MEDIUM
@given(st.data(), select_params())
def test_select_scale_invariant_for_any_factor_when_chunks_are_apart(data, p):
    # any positive factor, with chunk means far apart (no ties to break differently after rounding)
    chunk = max(1, p["chunk_size"])
    n_chunks = data.draw(st.integers(1, 30))
    n = data.draw(st.integers((n_chunks - 1) * chunk + 1, n_chunks * chunk))
    levels = data.draw(st.permutations(range(1, n_chunks + 1)))
    scores = np.repeat(np.asarray(levels, np.float32), chunk)[:n]
    factor = data.draw(st.floats(1e-3, 1e3))
    scaled = (scores * factor).astype(np.float32)
    assert run_select(scaled, "keep", p) == run_select(scores, "keep", p)


@FAST
@given(st.data(), select_params())
def test_needle_chunk_is_kept(data, p):
    chunk = max(1, p["chunk_size"])
    n_chunks = data.draw(st.integers(3, 40))
    n = data.draw(st.integers((n_chunks - 1) * chunk + 1, n_chunks * chunk))
    background = data.draw(hnp.arrays(np.float32, n, elements=st.floats(0.0, 0.01)))
    needle = data.draw(st.integers(1, n_chunks - 2))  # a middle chunk (always a full one)
    scores = background.copy()
    scores[needle * chunk:(needle + 1) * chunk] = 1.0
    kept = set(run_select(scores, "keep", p))
    assert set(range(needle * chunk, (needle + 1) * chunk)) <= kept


@MEDIUM
@given(score_arrays(min_size=1), select_params())
def test_keep_all_keeps_everything(scores, p):
    everything = list(range(len(scores)))
    assert run_select(scores, "keep", {**p, "keep": 1.0}) == everything
    # mass 1 keeps everything too, when no score is lost in the rounding of the total (1e-33 + 1 == 1)
    if np.all(scores > 0) and scores.min() > 1e-6 * scores.max():
        assert run_select(scores, "mass", {**p, "mass": 1.0}) == everything
