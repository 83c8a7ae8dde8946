"""The tools eval's pure parts: the agent conversations it makes from a tree, and how it reads and grades a call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spbuild.measuring import tool_eval, tool_tasks


def _tree(root: Path) -> Path:
    src = root / "src"
    src.mkdir(parents=True)
    for i in range(40):
        (src / f"file{i:02d}.cpp").write_text("\n".join(
            [f"// filler file {i}", f"static int helper_{i}_value(int x) {{", "    return x * 3;", "}", ""] * 30))
    for i, (name, value) in enumerate([("LLAMA_TEST_LIMIT", 4096), ("GGML_TEST_ALIGN", 64), ("LLAMA_TEST_ROWS", 512)]):
        (src / f"consts{i}.h").write_text(f"#pragma once\n\n// limits\n#define {name} {value}\n\nint unused_{i};\n")
    (src / "mentions.cpp").write_text("// uses LLAMA_TEST_LIMIT and GGML_TEST_ALIGN and LLAMA_TEST_ROWS\nint m;\n")
    return root


KEYS = ("LLAMA_TEST_LIMIT", "GGML_TEST_ALIGN", "LLAMA_TEST_ROWS")


@pytest.mark.parametrize("intent", tool_tasks.INTENTS)
@pytest.mark.parametrize("turns", [1, 3])
def test_a_case_is_an_agent_conversation_whose_right_call_needs_one_read(tmp_path, intent, turns):
    tree = _tree(tmp_path)
    case = tool_tasks.make_case(tree, intent, 9000, 0.5, seed=1, turns=turns)
    messages = case.messages
    assert [m["role"] for m in messages[:2]] == ["system", "user"] and len(case.turns) == turns
    ends = [t.end for t in case.turns]
    assert ends == sorted(ends) and ends[-1] == len(messages)
    for k, turn in enumerate(case.turns):
        request = messages[turn.end - 1]
        assert request["role"] == "user" and turn.key in request["content"] and turn.name in request["content"]
        tool_results = [m["content"] for m in messages[:turn.end] if m["role"] == "tool"]
        # the key is read in exactly one result, and that result holds the evidence
        holding = [r for r in tool_results if turn.key in r]
        assert len(holding) == 1 and all(text in holding[0] for text in turn.evidence)
        if intent == "value":
            assert turn.name == "record_constant" and str(turn.arguments["value"]) in holding[0]
        else:
            assert turn.name == "open_file" and holding[0].startswith(turn.arguments["path"] + " (lines ")
        if k + 1 < turns:  # the agent's right call follows its request, then the next turn's reads
            call = messages[turn.end]["tool_calls"][0]["function"]
            assert (call["name"], json.loads(call["arguments"])) == (turn.name, turn.arguments)
    assert {t.key for t in case.turns} <= set(KEYS) and len({t.key for t in case.turns}) == turns
    assert not any("mentions.cpp" in (m.get("content") or "") for m in messages)  # a filler naming a key is left out
    for m in messages:
        if m["role"] == "assistant":
            name = m["tool_calls"][0]["function"]["name"]
            assert name in tool_eval._SCHEMAS
            tool_eval.parse_call(m)  # every call the case shows is valid against its schema
            assert tool_eval.parse_call(m).valid


def test_the_evidence_sits_at_its_depth_among_the_reads(tmp_path):
    tree = _tree(tmp_path)
    for depth in (0.0, 0.5, 1.0):
        case = tool_tasks.make_case(tree, "value", 20000, depth, seed=2)
        results = [m["content"] for m in case.messages if m["role"] == "tool"]
        where = next(i for i, r in enumerate(results) if case.turns[0].key in r) / (len(results) - 1)
        assert abs(where - depth) < 0.2, (depth, where)
    assert tool_tasks.make_case(tree, "value", 20000, 0.5, 2) == tool_tasks.make_case(tree, "value", 20000, 0.5, 2)
    with pytest.raises(ValueError, match="intent"):
        tool_tasks.make_case(tree, "answer", 1000, 0.5)


def _message(name: str | None, arguments: str = "{}", content: str = "") -> dict:
    calls = [{"type": "function", "function": {"name": name, "arguments": arguments}}] if name else []
    return {"role": "assistant", "content": content, "tool_calls": calls}


def test_a_call_is_valid_only_as_a_known_tool_with_arguments_matching_its_schema():
    good = tool_eval.parse_call(_message("record_constant", '{"name": "X_LIMIT", "value": 4096}'))
    assert good.valid and good.arguments == {"name": "X_LIMIT", "value": 4096}
    cases = {
        "schema": _message("record_constant", '{"name": "X_LIMIT", "value": "4096"}'),  # a string, not an integer
        "not JSON": _message("open_file", '{"path": '),
        "unknown tool": _message("delete_repo", '{}'),
        "no tool call": _message(None, content="The value is 4096."),
    }
    for why, message in cases.items():
        call = tool_eval.parse_call(message)
        assert not call.valid and why in call.error, (why, call)
    assert tool_eval.parse_call(_message("open_file", '{"path": "a.h", "line": 3}')).error  # no extra arguments


def test_calls_compare_by_name_and_arguments_and_grade_against_the_right_one():
    turn = tool_tasks.Turn(5, "X_LIMIT", "open_file", {"path": "src/x.h"}, ("src/x.h (lines 1-9 of 9)",))
    same_a = tool_eval.parse_call(_message("open_file", '{"path": "src/x.h"}'))
    same_b = tool_eval.parse_call(_message("open_file", '{ "path":"src/x.h" }'))
    assert same_a.key() == same_b.key() and tool_eval.is_right(same_a, turn)
    assert tool_eval.is_right(tool_eval.parse_call(_message("open_file", '{"path": "./src/x.h"}')), turn)
    wrong = tool_eval.parse_call(_message("open_file", '{"path": "src/y.h"}'))
    assert wrong.key() != same_a.key() and not tool_eval.is_right(wrong, turn)
    text = tool_eval.parse_call(_message(None, content="src/x.h"))
    assert not tool_eval.is_right(text, turn) and text.key() != same_a.key()
    value = tool_tasks.Turn(5, "X_LIMIT", "record_constant", {"name": "X_LIMIT", "value": 4096}, ())
    assert tool_eval.is_right(tool_eval.parse_call(_message("record_constant", '{"name": "X_LIMIT", "value": 4096}')),
                              value)


def _summary_row(**fields) -> dict:
    """A tools eval row with what summary() and markdown() read: one active request of one turn, right and equal."""
    call = {"name": "f", "arguments": {}, "text": "", "in_text": False}
    return {"setting": "p=0.3 full protect", "turns": 1, "turn": 1, "status": "active", "equal": True,
            "full_valid": True, "spec_valid": True, "full_right": True, "spec_right": True, "evidence_retained": True,
            "full_ttft_ms": 100.0, "ttft_ms": 50.0, "case": "c", "full_call": call, "spec_call": call, "protected": [],
            **fields}


def test_the_summary_counts_new_invalid_calls_and_ttft_per_turn():
    def row(turn: int, equal: bool, full_valid: bool, spec_valid: bool) -> dict:
        return _summary_row(turns=2, turn=turn, equal=equal, full_valid=full_valid, spec_valid=spec_valid,
                            full_right=full_valid, spec_right=spec_valid, full_ttft_ms=100.0 * turn,
                            full_call={"name": "f", "arguments": {}, "text": "", "in_text": turn == 1})
    rows = [row(1, True, True, True), row(2, False, True, False), row(1, False, False, False), row(2, True, True, True)]
    [s] = tool_eval.summary(rows)
    assert (s["calls"], s["equal"], s["new_invalid"], s["spec_valid"]) == (4, "2/4", 1, "2/4") and s["full_in_text"] == 2
    assert s["equal_calls"] == "2/3"  # the aim counts only the calls the full prefill made
    assert [p["speedup"] for p in s["per_turn"]] == [2.0, 4.0]


def test_right_calls_kept_counts_the_full_prefills_right_calls_only():
    def row(full_right: bool, spec_right: bool, equal: bool) -> dict:
        return _summary_row(full_right=full_right, spec_right=spec_right, equal=equal)
    # a wrong full call that spec prefill got right, a right one it kept in another spelling, a right one it lost
    [s] = tool_eval.summary([row(False, True, False), row(True, True, False), row(True, False, False)])
    assert (s["right_kept"], s["equal_calls"], s["spec_right"]) == ("1/2", "0/3", "2/3")
    assert "| 1/2 |" in tool_eval.markdown({"describe": {}, "complete": True}, [row(True, True, True), row(True, False, False)])


@pytest.mark.parametrize("content", [
    '{"name": "record_constant", "arguments": {"name": "X_LIMIT", "value": 4096}}',
    'The call:\n```json\n{"name": "record_constant", "arguments": {"name": "X_LIMIT", "value": 4096}}\n```',
    '<tool_call>\n{"name": "record_constant", "arguments": {"name": "X_LIMIT", "value": 4096}}\n</tool_call>',
])
def test_a_call_written_in_the_content_is_read_as_the_call_and_marked(content):
    call = tool_eval.parse_call(_message(None, content=content))
    assert call.valid and call.in_text and (call.name, call.arguments) == ("record_constant",
                                                                          {"name": "X_LIMIT", "value": 4096})
    parsed = tool_eval.parse_call(_message("record_constant", '{"name": "X_LIMIT", "value": 4096}'))
    assert call.key() == parsed.key() and not parsed.in_text


def test_text_without_a_call_object_is_no_call():
    for content in ("I will read the file first.", '{"path": "src/a.cpp"}', '{"name": "x", "arguments": '):
        call = tool_eval.parse_call(_message(None, content=content))
        assert call.name is None and not call.valid and call.error == "no tool call"
