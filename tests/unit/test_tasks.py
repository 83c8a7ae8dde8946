"""The eval's task generators: every kind's answer is recoverable from its evidence, the evidence is where the depth
says and in the order the kind needs, the length follows the tokenizer, and token spans cover the evidence exactly."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spbuild.measuring import tasks

kinds = st.sampled_from(tasks.KINDS)
fillers = st.sampled_from(tasks.FILLERS)
depths = st.floats(min_value=0.0, max_value=1.0)


def _body(case: tasks.Case) -> str:
    return case.prompt.rsplit("\n\nQuestion: ", 1)[0]


@settings(max_examples=60, deadline=None)
@given(kind=kinds, filler=fillers, depth=depths, seed=st.integers(0, 1000), n=st.integers(256, 3000))
def test_every_case_holds_its_evidence_once_and_its_answer_follows_from_it(kind, filler, depth, seed, n):
    case = tasks.make_case(kind, filler, n, depth, seed)
    assert case.prompt.endswith("\nAnswer: " + case.prompt.rsplit("\nAnswer: ", 1)[1])
    assert f"Question: {case.question}\n" in case.prompt
    body = _body(case)
    for line in case.evidence:
        assert body.count(line) == 1, line
        assert line in body.split("\n")  # a whole line of its own
    if kind == "distributed":
        counts = [int(re.search(r"logged (\d+) incidents", line).group(1)) for line in case.evidence]
        assert case.answer == str(sum(counts))
    elif kind == "vartrack":
        # follow the chain from the asked variable back to its value
        asked = re.search(r"VAR (\w+)\?", case.question).group(1)
        assignments = dict(re.match(r"VAR (\w+) = (.+)\.$", line).groups() for line in case.evidence)
        value = assignments[asked]
        while value.startswith("VAR "):
            value = assignments[value[4:]]
        assert value == case.answer
    elif kind == "multihop":
        person = re.search(r"does (.+) work\?", case.question).group(1)
        company = re.search(rf"{person} works for (.+)\.", case.evidence[0]).group(1)
        assert case.evidence[1] == f"{company} has its headquarters located at {case.answer}."
        # the second clue shares no word with the question
        assert not set(re.findall(r"\w+", case.evidence[1].lower())) & set(re.findall(r"\w+", case.question.lower()))
    else:
        assert case.answer in case.evidence[-1]


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(("temporal", "vartrack")), filler=fillers, depth=depths, seed=st.integers(0, 1000))
def test_ordered_evidence_comes_in_order(kind, filler, depth, seed):
    case = tasks.make_case(kind, filler, 1500, depth, seed)
    positions = [case.prompt.index(line) for line in case.evidence]
    assert positions == sorted(positions)


@pytest.mark.parametrize("kind", ["needle", "multikey", "multihop"])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_the_primary_evidence_sits_at_its_depth(kind, depth):
    case = tasks.make_case(kind, "prose", 4000, depth, seed=3)
    body = _body(case)
    where = body.index(case.evidence[0]) / len(body)
    assert abs(where - depth) < 0.06


def test_the_temporal_override_sits_at_its_depth_and_the_notice_before_it():
    case = tasks.make_case("temporal", "logs", 4000, 0.7, seed=1)
    body = _body(case)
    notice, update = (body.index(line) / len(body) for line in case.evidence)
    assert abs(update - 0.7) < 0.06 and notice < update
    assert case.answer in case.evidence[1] and case.answer not in case.evidence[0]


def test_the_same_arguments_give_the_same_case_and_seeds_differ():
    a, b = tasks.make_case("multikey", "code", 2000, 0.5, 7), tasks.make_case("multikey", "code", 2000, 0.5, 7)
    assert a == b
    assert tasks.make_case("multikey", "code", 2000, 0.5, 8).prompt != a.prompt


def test_a_tokenizer_sizes_the_prompt():
    def count(text: str) -> int:  # a tokenizer of about 3 characters a token
        return len(text) // 3

    for n in (1000, 4000, 16000):
        case = tasks.make_case("needle", "logs", n, 0.5, 0, count_tokens=count)
        assert abs(count(case.prompt) - n) / n < 0.03
    # without one, the estimate
    assert tasks.make_case("needle", "logs", 4000, 0.5, 0).prompt != tasks.make_case(
        "needle", "logs", 4000, 0.5, 0, count_tokens=count).prompt


def test_bad_arguments_are_refused_with_the_known_values():
    with pytest.raises(ValueError, match="known: needle"):
        tasks.make_case("riddle", "prose", 1000, 0.5)
    with pytest.raises(ValueError, match="known: prose"):
        tasks.make_case("needle", "poetry", 1000, 0.5)
    with pytest.raises(ValueError, match="depth"):
        tasks.make_case("needle", "prose", 1000, 1.5)


def test_the_suite_crosses_kinds_lengths_and_depths_and_takes_fillers_in_turn():
    cases = tasks.suite(tasks.KINDS, tasks.FILLERS, [512, 1024], [0.1, 0.9], seeds=2)
    assert len(cases) == len(tasks.KINDS) * 2 * 2 * 2
    assert len({c.id for c in cases}) == len(cases)
    for kind in tasks.KINDS:
        assert {c.filler for c in cases if c.kind == kind} == set(tasks.FILLERS)


def test_the_quality_bar_is_one_case_per_kind_and_length_with_depths_and_fillers_in_turn():
    cases = tasks.quality_bar()
    assert [(c.kind, c.n_tokens) for c in cases] == [(k, n) for n in tasks.QUALITY_BAR_LENGTHS
                                                     for k in tasks.QUALITY_BAR_KINDS]
    assert {c.depth for c in cases} == set(tasks.QUALITY_BAR_DEPTHS) and {c.filler for c in cases} == set(tasks.FILLERS)
    assert [c.prompt for c in tasks.quality_bar()] == [c.prompt for c in cases]  # the same cases every run


@settings(max_examples=80, deadline=None)
@given(data=st.data(), kind=kinds, filler=fillers)
def test_token_spans_cover_exactly_the_pieces_that_overlap_the_evidence(data, kind, filler):
    case = tasks.make_case(kind, filler, 400, data.draw(depths), data.draw(st.integers(0, 100)))
    # cut the prompt into pieces of random lengths, as a tokenizer would
    rng = random.Random(data.draw(st.integers(0, 10**6)))
    pieces, i = ["<bos>"], 0
    while i < len(case.prompt):
        step = rng.randint(1, 7)
        pieces.append(case.prompt[i:i + step])
        i += step
    joined = "".join(pieces)
    for line in case.evidence:
        span = tasks.token_span(pieces, line)
        start = joined.index(line)
        covered = "".join(pieces[span.start:span.stop])
        assert line in covered
        # no piece outside the span overlaps the line
        before = len("".join(pieces[:span.start]))
        assert before <= start and before + len(pieces[span.start]) > start
        assert len("".join(pieces[:span.stop - 1])) < start + len(line)


def test_answers_are_read_from_the_first_line_and_matched_as_a_whole():
    case = tasks.make_case("needle", "prose", 500, 0.5, 0)
    assert tasks.is_correct(case, f" {case.answer}.\nQuestion: what else")
    assert tasks.is_correct(case, f' "{case.answer}"')
    assert not tasks.is_correct(case, f" {case.answer}7")  # a longer number is another number
    assert not tasks.is_correct(case, f"\n\n{case.answer[:-1]}")
    assert not tasks.is_correct(case, f" 1\n{case.answer}")  # only the first line counts
    assert tasks.first_line("  the city of\nOslo") == "the city of"


def test_a_chat_case_is_a_user_message_ending_with_the_question_and_its_answer_may_come_anywhere_in_the_line():
    completion = tasks.make_case("multikey", "logs", 800, 0.5, 1)
    chat = tasks.make_case("multikey", "logs", 800, 0.5, 1, chat=True)
    assert chat.chat and not completion.chat and chat.id == completion.id + "-chat"
    # the same filler and evidence; the question closes the message, without the completion's answer prefix
    assert chat.prompt.split("\n\nQuestion:")[0] == completion.prompt.split("\n\nQuestion:")[0]
    assert chat.prompt.endswith(f"Question: {chat.question}\nAnswer in one short sentence.")
    assert "\nAnswer: " not in chat.prompt
    assert tasks.is_correct(chat, f"The key of that vault is {chat.answer}.")
    assert not tasks.is_correct(chat, f"The key of that vault is 1{chat.answer}.")  # another number
    assert not tasks.is_correct(completion, f"The key of that vault is {completion.answer}.")
    assert all(case.chat for case in tasks.suite(["needle"], ["prose"], [500], [0.5], chat=True))


def test_the_answer_is_read_up_to_its_end_not_the_sentence_after_it():
    case = tasks.make_case("needle", "prose", 300, 0.5, 0)
    a = case.answer
    # the continuation after the answer differs; the answers are the same
    assert tasks.answer_text(case, f" {a}. The county library celebrated") == a
    assert tasks.answer_text(case, f" {a}. The county library photographed") == a
    assert tasks.answer_text(case, f" **{a}**\nmore") == a
    # a longer or another number is another answer; two words past the answer's still count
    assert tasks.answer_text(case, f" {a}7.") != a
    assert tasks.answer_text(case, f" {a} and the code is 1") != a
    assert tasks.answer_text(case, f" {a} and then a long tail of words") == \
        tasks.answer_text(case, f" {a} and then another long tail")
    assert tasks.answer_text(case, " 3.5 units") == "3.5 units"  # a decimal point is no sentence end
    chat = tasks.make_case("needle", "prose", 300, 0.5, 0, chat=True)
    assert tasks.answer_text(chat, f"The secret code is {a}. It was hidden in the text.") == f"The secret code is {a}"


def test_two_right_answers_in_other_words_agree_and_two_wrong_ones_only_when_equal():
    chat = tasks.make_case("needle", "prose", 300, 0.5, 0, chat=True)
    a = chat.answer
    full, spec = f"The secret code is {a}.", f"The code you asked for is {a}."
    texts = [tasks.answer_text(chat, t) for t in (full, spec)]
    assert texts[0] != texts[1]
    assert tasks.answers_agree(texts[0], tasks.is_correct(chat, full), texts[1], tasks.is_correct(chat, spec))
    wrong = "The secret code is 1234."
    assert not tasks.answers_agree(texts[0], True, tasks.answer_text(chat, wrong), False)
    assert tasks.answers_agree("It is 1234", False, "It is 1234", False)
    assert not tasks.answers_agree("It is 1234", False, "It is 4321", False)
