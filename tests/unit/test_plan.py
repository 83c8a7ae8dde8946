"""spbuild._selection.plan (cpp/common/spec-prefill-plan.cpp): the windows the draft scores a prompt in, each window's
sequence, and the draft context's shape they need, as properties over many shapes plus small cases by hand.

Prompts are distinct tokens (1000 + their position), so a sequence's layout can be read off its tokens.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spbuild import _selection as sel

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MEDIUM = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

N_SINK = sel.N_SINK
N_QUESTION_MIN = sel.N_QUESTION_MIN


def prompt_of(n: int) -> list[int]:
    return [1000 + i for i in range(n)]


def pad256(n: int) -> int:
    return -(-n // 256) * 256


def rounds(n_windows: int, n_seq: int) -> int:
    return -(-n_windows // n_seq)


def spans(plan) -> list[tuple[int, int]]:
    return [(w["begin"], w["end"]) for w in plan["windows"]]


def expected_window(n_new: int, n_past: int, window: int, keep_last: int, n_look: int, budget: int) -> int:
    """The window size the plan asks common_spec_prefill_plan_windows for: the request's, 8192 for a long prompt
    under window 0, narrowed to what fits one sequence where the new tokens do not."""
    n_question = max(N_QUESTION_MIN, keep_last)
    if window <= 0 and n_new > sel.WINDOW_AUTO_ABOVE:
        window = sel.WINDOW_PREPARED
    if min(N_SINK, n_past) + n_new + n_look > budget:
        window_max = max(256, budget - N_SINK - n_question - n_look)
        window = min(window, window_max) if window > 0 else window_max
    return window


def check_layout(plan, prompt: list[int], *, n_past: int, keep_last: int, n_look: int, budget: int,
                 window: int) -> None:
    """Every window's sequence: sink + (the first window of a continuation) context + own tokens + (all but the last)
    question; the windows cover the new tokens once, in order; n_cells is the longest sequence plus lookahead room.
    `window`: the plan's window size (expected_window)."""
    n = len(prompt)
    n_question = max(N_QUESTION_MIN, keep_last)
    windows = plan["windows"]
    assert windows
    assert windows[0]["begin"] == n_past and windows[-1]["end"] == n
    assert all(w["begin"] < w["end"] for w in windows)
    assert all(a["end"] == b["begin"] for a, b in zip(windows, windows[1:]))  # contiguous, no overlap
    for i, w in enumerate(windows):
        begin, end, key0, tokens = w["begin"], w["end"], w["key0"], w["tokens"]
        last = i == len(windows) - 1
        n_sink = 0 if begin == 0 else min(N_SINK, begin)
        assert tokens[:n_sink] == prompt[:n_sink]
        assert tokens[key0:key0 + end - begin] == prompt[begin:end]
        question = [] if last else prompt[max(end, n - n_question):]
        assert tokens[key0 + end - begin:] == question
        context = tokens[n_sink:key0]
        if i == 0 and begin > n_sink:
            # the context just before the new tokens: all of it, or as much as fills the sequence to the budget, or
            # with several windows one window of it
            assert context == prompt[begin - len(context):begin]
            if len(context) < begin - n_sink:
                full = len(tokens) + n_look == budget if context else len(tokens) + n_look >= budget
                assert full or (len(windows) > 1 and len(context) == window)
            if len(windows) > 1:
                assert len(context) <= window
        else:
            assert context == []
    assert plan["n_cells"] == max(len(w["tokens"]) for w in windows) + n_look


# --- strategies ----------------------------------------------------------------------------------------------

prompt_sizes = st.one_of(
    st.integers(1, 3000),
    st.integers(1, 40_000),
    st.sampled_from([1, 2, 5, 256, 8192, 8193, 16384, 16385, 16389, 32768]),
)


@st.composite
def requests(draw):
    n = draw(prompt_sizes)
    n_past = draw(st.one_of(st.just(0), st.integers(0, 8), st.integers(0, n + 5)))
    window = draw(st.one_of(st.just(0), st.integers(-3, 600), st.integers(1, 50_000), st.sampled_from([n, n - 1])))
    keep_last = draw(st.one_of(st.just(64), st.integers(0, 1000)))
    n_look = draw(st.sampled_from([8, 8, 12, 16]))
    return n, n_past, window, keep_last, n_look


@st.composite
def fixed_shapes(draw):
    """A prepared context (fixed_n_seq x fixed_n_cells, on the 256-cell grid) and its shape now: none, the prepared
    one, or a reshape of the same cells (never more sequences than n_seq_max)."""
    n_seq_max = draw(st.sampled_from([1, 2, 4, 16, 256]))
    fixed_n_seq = draw(st.integers(1, min(4, n_seq_max)))
    fixed_n_cells = 256 * draw(st.integers(2, 160))
    cells = fixed_n_seq * fixed_n_cells
    kind = draw(st.sampled_from(["none", "prepared", "reshaped"]))
    if kind == "none":
        ctx_n_seq, ctx_n_cells = 0, 0
    elif kind == "prepared":
        ctx_n_seq, ctx_n_cells = fixed_n_seq, fixed_n_cells
    else:
        ctx_n_seq = draw(st.integers(1, min(n_seq_max, cells // 256)))
        ctx_n_cells = min(cells // ctx_n_seq // 256 * 256, fixed_n_cells)
    return dict(fixed_size=True, fixed_n_seq=fixed_n_seq, fixed_n_cells=fixed_n_cells, ctx_n_seq=ctx_n_seq,
                ctx_n_cells=ctx_n_cells, reshape_off=draw(st.booleans()), n_seq_max=n_seq_max,
                n_ctx_max=draw(st.integers(cells, cells + 4096)))


# --- properties ----------------------------------------------------------------------------------------------


@FAST
@given(requests(), st.integers(512, 70_000), st.sampled_from([1, 2, 3, 8, 256]))
def test_growing_context(request, n_ctx_max, n_seq_max):
    n, n_past, window, keep_last, n_look = request
    prompt = prompt_of(n)
    plan = sel.plan(prompt, n_past=n_past, window=window, keep_last=keep_last, n_ctx_max=n_ctx_max,
                    n_seq_max=n_seq_max, n_look_max=n_look)
    n_past = max(0, min(n_past, n - 1))  # at least the last token is scored
    n_new = n - n_past
    want = expected_window(n_new, n_past, window, keep_last, n_look, n_ctx_max)
    check_layout(plan, prompt, n_past=n_past, keep_last=keep_last, n_look=n_look, budget=n_ctx_max, window=want)

    n_windows = len(plan["windows"])
    assert n_windows == (1 if want <= 0 or want >= n_new else -(-n_new // want))
    if window <= 0 and n_new <= sel.WINDOW_AUTO_ABOVE and min(N_SINK, n_past) + n_new + n_look <= n_ctx_max:
        assert n_windows == 1  # automatic and it fits: scored whole

    n_cells = plan["n_cells"]
    if n_ctx_max >= N_SINK + max(N_QUESTION_MIN, keep_last) + n_look + 256:
        assert n_cells <= n_ctx_max  # the budget: every sequence fits the context

    # as many windows side by side as the context holds, up to the windows and the batch's cap
    n_seq = plan["n_seq"]
    assert 1 <= n_seq <= min(n_windows, n_seq_max)
    if n_seq > 1:
        assert n_seq * n_cells <= n_ctx_max
    assert n_seq == n_windows or n_seq == n_seq_max or (n_seq + 1) * n_cells > n_ctx_max


@FAST
@given(requests(), fixed_shapes())
def test_prepared_context(request, shape):
    n, n_past, window, keep_last, n_look = request
    prompt = prompt_of(n)
    plan = sel.plan(prompt, n_past=n_past, window=window, keep_last=keep_last, n_look_max=n_look, **shape)
    n_past = max(0, min(n_past, n - 1))
    budget = shape["fixed_n_cells"]  # a prepared context's sequences are never longer than its own
    n_new = n - n_past
    want = expected_window(n_new, n_past, window, keep_last, n_look, budget)
    check_layout(plan, prompt, n_past=n_past, keep_last=keep_last, n_look=n_look, budget=budget, window=want)

    n_windows = len(plan["windows"])
    assert n_windows == (1 if want <= 0 or want >= n_new else -(-n_new // want))
    n_cells = plan["n_cells"]
    if budget >= N_SINK + max(N_QUESTION_MIN, keep_last) + n_look + 256:
        assert n_cells <= budget

    # the densest shape of the prepared cells, and the current one where its sequences hold the plan's
    cells = shape["fixed_n_seq"] * shape["fixed_n_cells"]
    n_seq_new = max(1, min(n_windows, cells // pad256(n_cells), shape["n_seq_max"]))
    n_seq_now = min(n_windows, shape["ctx_n_seq"]) if shape["ctx_n_cells"] >= n_cells else 0
    n_seq = plan["n_seq"]
    assert 1 <= n_seq <= min(n_windows, shape["n_seq_max"])
    if n_seq_now == 0:
        assert n_seq == n_seq_new  # the current shape cannot hold the plan: reshaped, whatever reshape_off says
        if pad256(n_cells) <= cells:
            assert n_seq * pad256(n_cells) <= cells
    elif shape["reshape_off"]:
        assert n_seq == n_seq_now
    elif rounds(n_windows, n_seq_now) >= 2 * rounds(n_windows, n_seq_new) and \
            rounds(n_windows, n_seq_now) - rounds(n_windows, n_seq_new) >= 2:
        assert n_seq == n_seq_new  # at most half the rounds and at least two fewer: worth a reshape
    else:
        assert n_seq == n_seq_now


@MEDIUM
@given(st.integers(sel.WINDOW_AUTO_ABOVE + 1, 140_000), st.sampled_from([0, -1]))
def test_automatic_windows_above_the_threshold(n, window):
    plan = sel.plan(prompt_of(n), window=window, n_ctx_max=262_144)
    sizes = [e - b for b, e in spans(plan)]
    assert len(sizes) == -(-n // sel.WINDOW_PREPARED) >= 3
    assert max(sizes) <= sel.WINDOW_PREPARED and max(sizes) - min(sizes) <= 1


# --- by hand -------------------------------------------------------------------------------------------------


def test_constants():
    # the cases below are worked out with these
    assert (sel.N_SINK, sel.N_QUESTION_MIN, sel.WINDOW_PREPARED, sel.WINDOW_AUTO_ABOVE) == (4, 256, 8192, 16384)


def test_three_windows_by_hand():
    p = prompt_of(1000)
    plan = sel.plan(p, window=400, n_ctx_max=8192)
    # 1000 tokens in ceil(1000 / 400) = 3 windows, larger first; the question is the last 256 tokens
    assert spans(plan) == [(0, 334), (334, 667), (667, 1000)]
    w0, w1, w2 = plan["windows"]
    assert (w0["key0"], w0["tokens"]) == (0, p[0:334] + p[744:1000])  # BOS is the first window's sink
    assert (w1["key0"], w1["tokens"]) == (4, p[0:4] + p[334:667] + p[744:1000])
    assert (w2["key0"], w2["tokens"]) == (4, p[0:4] + p[667:1000])  # the last window ends with the question itself
    assert plan["n_cells"] == 4 + 333 + 256 + 8
    assert plan["n_seq"] == 3
    # fewer side by side where the context or the batch holds fewer
    assert sel.plan(p, window=400, n_ctx_max=2 * 601 + 1)["n_seq"] == 2
    assert sel.plan(p, window=400, n_ctx_max=8192, n_seq_max=1)["n_seq"] == 1


def test_question_meets_the_window():
    # a question longer than what follows the window: it starts where the window ends, no token twice
    p = prompt_of(1000)
    w0 = sel.plan(p, window=700, keep_last=600, n_ctx_max=8192)["windows"][0]
    assert (w0["begin"], w0["end"]) == (0, 500)
    assert w0["tokens"] == p[0:500] + p[500:1000]


def test_continuation_reads_the_context_before():
    p = prompt_of(1000)
    plan = sel.plan(p, n_past=500, n_ctx_max=8192)
    (w,) = plan["windows"]
    assert (w["begin"], w["end"], w["key0"]) == (500, 1000, 500)
    assert w["tokens"] == p  # sink, then all the context before n_past, then the new tokens
    assert plan["n_cells"] == 1008


def test_continuation_context_fills_what_is_left():
    p = prompt_of(1500)
    (w,) = sel.plan(p, n_past=1000, n_ctx_max=1000)["windows"]
    # 1000 cells - 4 sink - 500 new - 8 lookahead = 488 tokens of context, the ones just before n_past
    assert w["key0"] == 4 + 488
    assert w["tokens"] == p[0:4] + p[512:1000] + p[1000:1500]


def test_continuation_in_windows_reads_one_window_of_context():
    # an agent's third turn: 20K tokens held, 10K new in windows of 8192 -> two windows; the first reads the 8192
    # tokens before n_past, not the 20K the context has room for (the draft would prefill them again every turn)
    p = prompt_of(30_000)
    plan = sel.plan(p, n_past=20_000, window=8192, keep_last=64, n_ctx_max=65536)
    w0, w1 = plan["windows"]
    assert (w0["begin"], w1["end"]) == (20_000, 30_000)
    assert w0["key0"] == 4 + 8192
    assert w0["tokens"][:w0["key0"]] == p[0:4] + p[20_000 - 8192:20_000]
    assert w1["key0"] == 4  # the second window: the sink only
    # one window of new tokens: the whole context where it fits, as before (the draft may start on its own KV then)
    (w,) = sel.plan(p, n_past=25_000, window=8192, keep_last=64, n_ctx_max=65536)["windows"]
    assert w["tokens"] == p


def test_n_past_is_clamped():
    p = prompt_of(600)
    assert spans(sel.plan(p, n_past=600, n_ctx_max=4096)) == [(599, 600)]  # the last token is always scored
    assert spans(sel.plan(p, n_past=10_000, n_ctx_max=4096)) == [(599, 600)]
    assert spans(sel.plan(p, n_past=-5, n_ctx_max=4096)) == [(0, 600)]


def test_automatic_windows_by_hand():
    assert spans(sel.plan(prompt_of(16384), n_ctx_max=65536)) == [(0, 16384)]
    assert spans(sel.plan(prompt_of(16385), n_ctx_max=65536)) == [(0, 5462), (5462, 10924), (10924, 16385)]
    # the threshold counts new tokens only
    assert len(sel.plan(prompt_of(20000), n_past=4000, n_ctx_max=65536)["windows"]) == 1
    # a window of at least the prompt scores it whole
    assert len(sel.plan(prompt_of(20000), window=20000, n_ctx_max=65536)["windows"]) == 1


def test_windows_narrowed_to_the_context():
    p = prompt_of(3000)
    plan = sel.plan(p, n_ctx_max=1024)
    # 1024 - 4 sink - 256 question - 8 lookahead = windows of at most 756: 4 of 750
    assert spans(plan) == [(0, 750), (750, 1500), (1500, 2250), (2250, 3000)]
    assert plan["n_cells"] == 4 + 750 + 256 + 8 <= 1024
    assert plan["n_seq"] == 1
    # a request's smaller window stays
    assert len(sel.plan(p, window=500, n_ctx_max=1024)["windows"]) == 6


PREPARED_32K = dict(fixed_size=True, fixed_n_seq=1, fixed_n_cells=32768, n_ctx_max=32768)


def test_reshape_by_hand():
    p = prompt_of(32768)
    # 16 windows of 2048 in 4 + 2048 + 256 + 8 = 2316 cells (2560 on the grid): 12 fit the 32768 prepared cells,
    # 2 rounds instead of 16
    plan = sel.plan(p, window=2048, ctx_n_seq=1, ctx_n_cells=32768, **PREPARED_32K)
    assert len(plan["windows"]) == 16 and plan["n_cells"] == 2316
    assert plan["n_seq"] == 12
    # a reshape failed once: the prepared shape stays
    assert sel.plan(p, window=2048, ctx_n_seq=1, ctx_n_cells=32768, reshape_off=True, **PREPARED_32K)["n_seq"] == 1
    # no context yet: the densest shape
    assert sel.plan(p, window=2048, **PREPARED_32K)["n_seq"] == 12


def test_reshape_needs_two_rounds_fewer():
    p = prompt_of(20000)
    # 4 windows of 5000 (fits: no narrowing) in 5268 cells: all 4 side by side would fit the prepared cells
    plan = sel.plan(p, window=5000, ctx_n_seq=1, ctx_n_cells=32768, **PREPARED_32K)
    assert len(plan["windows"]) == 4 and plan["n_cells"] == 4 + 5000 + 256 + 8
    assert plan["n_seq"] == 4  # 1 round instead of 4
    # 2 rounds now against 1: half, but only one fewer, so the current shape stays
    assert sel.plan(p, window=5000, ctx_n_seq=2, ctx_n_cells=16384, **PREPARED_32K)["n_seq"] == 2
    assert sel.plan(p, window=5000, ctx_n_seq=3, ctx_n_cells=10752, **PREPARED_32K)["n_seq"] == 3
    # sequences too short for the plan: reshaped even with reshape_off
    assert sel.plan(p, window=5000, ctx_n_seq=8, ctx_n_cells=4096, reshape_off=True, **PREPARED_32K)["n_seq"] == 4


def test_prepared_sequence_is_the_budget():
    # a prepared sequence of 2048 cells narrows the windows of a prompt that a growing context would score whole
    p = prompt_of(6000)
    assert len(sel.plan(p, n_ctx_max=65536)["windows"]) == 1
    plan = sel.plan(p, fixed_size=True, fixed_n_seq=4, fixed_n_cells=2048, n_ctx_max=8192)
    assert all(e - b <= 2048 - 4 - 256 - 8 for b, e in spans(plan))
    assert plan["n_cells"] <= 2048


@pytest.mark.parametrize("bad", [
    dict(prompt=[]), dict(n_ctx_max=0), dict(n_seq_max=0), dict(keep_last=-1), dict(n_look_max=-1),
    dict(fixed_size=True, fixed_n_seq=0, fixed_n_cells=4096), dict(fixed_size=True, fixed_n_seq=1, fixed_n_cells=0),
])
def test_rejects_what_the_driver_never_asks(bad):
    args = dict(prompt=prompt_of(10), n_ctx_max=4096) | bad
    with pytest.raises(ValueError):
        sel.plan(args.pop("prompt"), **args)
