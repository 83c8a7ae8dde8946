"""Spec prefill for requests with tools (--spec-prefill-tool-guard protect) and a client's own kept spans
(spec_prefill.keep), against the built server over real HTTP.

The target renders chats with Qwen2.5's template from the fetched tree (tools in the system block, tool results as
user turns); the models are the tiny llama-bpe pair on the CPU backend, so what is checked is where the spans lie and
that they are kept, not the calls the model makes (the real pair does that, in the tools eval)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spbuild.measuring.bench import make_prompt as words

from test_server_specprefill import complete, spec, spec_args

pytestmark = pytest.mark.build

TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name.replace('_', ' ')} in the repository",
    "parameters": {"type": "object", "properties": {arg: {"type": "string", "description": f"the {arg}"}},
                   "required": [arg]}}}
    for name, arg in [("read_file", "path"), ("grep", "pattern"), ("list_dir", "path"), ("run_tests", "target"),
                      ("git_log", "path")]]
SYSTEM = "You are a coding agent. Answer with one tool call at a time and cite the file you read."
ASK = "Find where the scheduler's graph is reserved and tell me which constant sizes it. " + words(120, seed=40)


def call(name: str, **args: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": f"call_{name}", "function": {"name": name, "arguments": json.dumps(args)}}]}


def result(name: str, text: str) -> dict:
    return {"role": "tool", "tool_call_id": f"call_{name}", "content": text}


def file_text(n: int, seed: int) -> str:
    """About n tokens in lines of 12 words, as a file a tool returns."""
    ws = words(n, seed=seed).split(" ")
    return "\n".join(" ".join(ws[i:i + 12]) for i in range(0, len(ws), 12))


def agent_turns(rounds: int) -> list[dict]:
    """A system message, the user's request, then `rounds` tool calls, each with a long result."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}]
    calls = [("grep", {"pattern": "ggml_backend_sched_reserve"}), ("read_file", {"path": "src/llama-context.cpp"}),
             ("read_file", {"path": "ggml/src/ggml-backend.cpp"})]
    for k in range(rounds):
        name, args = calls[k]
        messages += [call(name, **args), result(name, file_text(1500, seed=41 + k))]
    return messages


@pytest.fixture(scope="module")
def qwen_template(source_tree: Path) -> Path:
    return source_tree / "models" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"


@pytest.fixture
def tools_server(server_factory, bpe_models, qwen_template):
    return server_factory(spec_args(bpe_models, "--jinja", "--chat-template-file", qwen_template,
                                    "--spec-prefill-tool-guard", "protect", n_parallel=1))


def chat(server, messages: list[dict], cache: bool = True, **spec_prefill) -> dict:
    body = {"messages": messages, "tools": TOOLS, "max_tokens": 2, "temperature": 0, "cache_prompt": cache,
            "spec_prefill": {"return_kept": True, **spec_prefill}}
    response = server.request("POST", "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    return response.json()


def prompt_pieces(server, messages: list[dict]) -> list[bytes]:
    """The prompt's tokens as the server tokenizes the rendered chat, each as its bytes."""
    prompt = server.request("POST", "/apply-template", {"messages": messages, "tools": TOOLS}).json()["prompt"]
    tokens = server.request("POST", "/tokenize", {"content": prompt, "add_special": True, "with_pieces": True}).json()
    return [bytes(t["piece"]) if isinstance(t["piece"], list) else t["piece"].encode() for t in tokens["tokens"]]


def kept_positions(sp: dict) -> set[int]:
    return {i for begin, end in sp["kept"] for i in range(begin, end)}


def span_text(pieces: list[bytes], span: dict) -> str:
    return b"".join(pieces[span["begin"]:span["end"]]).decode(errors="replace")


def test_protect_keeps_the_chats_structure_and_scores_the_tool_results(tools_server):
    messages = agent_turns(2)
    sp = spec(chat(tools_server, messages))
    assert sp["status"] == "active", sp
    pieces = prompt_pieces(tools_server, messages)
    assert len(pieces) == sp["n_prompt"]
    spans = {s["role"]: s for s in sp["protected"]}
    assert set(spans) == {"tools", "system", "user", "tool_call"}, sp["protected"]
    # each span holds what it names, and only that message: the latest call, not the first one
    assert all(t["function"]["name"] in span_text(pieces, spans["tools"]) for t in TOOLS)
    assert SYSTEM in span_text(pieces, spans["system"])
    assert ASK in span_text(pieces, spans["user"])
    latest = span_text(pieces, spans["tool_call"])
    assert "src/llama-context.cpp" in latest and "ggml_backend_sched_reserve" not in latest, latest
    assert len(latest) < 300, latest  # the call with its role's header and closer, not the results around it
    # every protected token is prefilled; the tool results are scored and mostly dropped
    kept = kept_positions(sp)
    protected = {i for s in sp["protected"] for i in range(s["begin"], s["end"])}
    assert protected <= kept
    assert sp["n_protected"] == len(protected)
    assert sp["n_kept"] < 0.5 * sp["n_prompt"], sp
    # the slot tells what its last request protected
    slot = tools_server.request("GET", "/slots").json()[0]["spec_prefill"]
    assert slot["protected"] == sp["protected"], slot
    # without protection the same request drops part of those spans: what the test holds is not luck
    off = spec(chat(tools_server, messages, cache=False, tool_guard="off"))
    assert off["status"] == "active" and "protected" not in off, off
    assert not protected <= kept_positions(off)
    # protect keeps what off keeps and adds the spans: the tool results get no fewer tokens than without protection
    assert kept_positions(off) | protected == kept
    assert "protected" not in tools_server.request("GET", "/slots").json()[0]["spec_prefill"]


def test_the_agent_loop_scores_only_the_new_turn_and_keeps_its_call(tools_server):
    """Each round appends a tool call and its result on the same slot: the follow-up reuses the cached prefix, scores
    only the new tokens, and keeps the new latest call whole."""
    first = chat(tools_server, agent_turns(1))
    assert spec(first)["status"] == "active"
    messages = agent_turns(2)
    second = chat(tools_server, messages)
    sp = spec(second)
    assert sp["status"] == "active", sp
    assert second["timings"]["cache_n"] > 1000 and sp["n_reused"] > 1000, (second["timings"], sp)
    call_span = next(s for s in sp["protected"] if s["role"] == "tool_call")
    # the new call lies in the new tokens (its span starts at the previous result's closer, which may be reused)
    assert call_span["end"] - sp["n_reused"] > 20, (call_span, sp["n_reused"])
    assert set(range(call_span["begin"], call_span["end"])) <= kept_positions(sp)
    assert "src/llama-context.cpp" in span_text(prompt_pieces(tools_server, messages), call_span)
    # new tokens scored: fewer than the whole prompt
    assert sp["n_prompt"] - sp["n_reused"] < 0.6 * sp["n_prompt"]


def test_the_next_turn_reuses_the_drafts_kv_of_the_last(server_factory, bpe_models, qwen_template, tools_server):
    """The draft keeps its KV of the last scored prompt: the next turn on the slot prefills only the draft tokens after
    the prefix both share, and keeps nearly the same tokens as a draft that prefills the whole prompt again
    (LLAMA_SPEC_PREFILL_DRAFT_REUSE=0; the ubatches differ, so near-ties in the scores may fall either way)."""
    fresh = server_factory(spec_args(bpe_models, "--jinja", "--chat-template-file", qwen_template,
                                     "--spec-prefill-tool-guard", "protect", n_parallel=1),
                           env={"LLAMA_SPEC_PREFILL_DRAFT_REUSE": "0"})
    turns = {}
    for name, server in (("reuse", tools_server), ("fresh", fresh)):
        first = spec(chat(server, agent_turns(1)))
        assert first["status"] == "active" and first["n_draft_reused"] == 0, first
        turns[name] = spec(chat(server, agent_turns(2)))
        assert turns[name]["status"] == "active", turns[name]
    reuse, fresh_sp = turns["reuse"], turns["fresh"]
    assert fresh_sp["n_draft_reused"] == 0
    # the draft's common prefix with its last prompt is the slot's (the target's cache also holds generated tokens)
    assert reuse["n_draft_reused"] >= 0.9 * reuse["n_reused"] > 1000, reuse
    a, b = kept_positions(reuse), kept_positions(fresh_sp)
    assert len(a & b) >= 0.95 * len(a | b), (len(a), len(b), len(a & b))
    # a prompt that begins otherwise (another conversation) prefills the draft from the start
    other = [{"role": "system", "content": "Another agent."}, *agent_turns(1)[1:]]
    assert spec(chat(tools_server, other, cache=False))["n_draft_reused"] == 0


def test_the_tool_guard_per_request_and_by_flag(server_factory, bpe_models, qwen_template, tools_server):
    messages = agent_turns(1)
    assert spec(chat(tools_server, messages, tool_guard="skip"))["status"] == "skipped_tool_guard"
    response = tools_server.request("POST", "/v1/chat/completions", {
        "messages": messages, "tools": TOOLS, "spec_prefill": {"tool_guard": "sometimes"}})
    assert response.status_code == 400, response.text
    assert "spec_prefill.tool_guard" in response.json()["error"]["message"]
    assert tools_server.request("GET", "/props").json()["spec_prefill"]["tool_guard"] == "protect"
    # the default is skip; a request can ask for protect
    plain = server_factory(spec_args(bpe_models, "--jinja", "--chat-template-file", qwen_template, n_parallel=1))
    assert spec(chat(plain, messages))["status"] == "skipped_tool_guard"
    asked = spec(chat(plain, messages, cache=False, tool_guard="protect"))
    assert asked["status"] == "active" and {s["role"] for s in asked["protected"]} >= {"user", "tool_call"}, asked


def test_a_client_keeps_its_own_spans_by_character(tools_server):
    """spec_prefill.keep on /completion: [begin, end) in characters of a string prompt (multi-byte ones before the
    span, so characters and bytes differ), in tokens of a token prompt."""
    before = "Ärger über Café naïveté. " * 40 + words(800, seed=50)
    target = " The vault code is 4497 and the backup code is 1298."
    prompt = before + target + words(1200, seed=51)
    begin, end = len(before), len(before) + len(target)
    sp = spec(complete(tools_server, prompt, spec_prefill={"keep": [[begin, end]], "return_kept": True}))
    assert sp["status"] == "active", sp
    # the tokens whose bytes overlap the span's bytes
    pieces = [bytes(t["piece"]) if isinstance(t["piece"], list) else t["piece"].encode() for t in tools_server.request(
        "POST", "/tokenize", {"content": prompt, "add_special": True, "with_pieces": True}).json()["tokens"]]
    b0, b1 = len(before.encode()), len(before.encode()) + len(target.encode())
    starts = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces) + 1)]
    lead = len(pieces[0]) if not prompt.encode().startswith(pieces[0]) else 0  # a BOS the prompt does not spell
    want = [i for i in range(len(pieces)) if starts[i] - lead < b1 and starts[i + 1] - lead > b0]
    assert sp["protected"] == [{"role": "client", "begin": want[0], "end": want[-1] + 1}], (sp["protected"], want)
    assert set(range(want[0], want[-1] + 1)) <= kept_positions(sp)
    assert target.strip() in span_text(pieces, sp["protected"][0])
    # a token prompt: the span in tokens
    tokens = tools_server.request("POST", "/tokenize", {"content": words(2000, seed=52)}).json()["tokens"]
    by_token = spec(complete(tools_server, tokens, spec_prefill={"keep": [[300, 420]], "return_kept": True}))
    assert by_token["protected"] == [{"role": "client", "begin": 300, "end": 420}]
    assert set(range(300, 420)) <= kept_positions(by_token)


@pytest.mark.parametrize("prompt, keep, why", [
    ("short text", [[5, 2]], "0 <= begin <= end <= 10"),
    ("short text", [[0, 11]], "0 <= begin <= end <= 10"),
    ("short text", "0-5", "must be an array of [begin, end] ranges"),
    ("short text", [[0, 1.5]], "each range must be"),
    (["one", "two"], [[0, 1]], "needs one prompt"),
])
def test_bad_keep_ranges_are_a_400_naming_the_field(tools_server, prompt, keep, why):
    response = tools_server.request("POST", "/completion", {"prompt": prompt, "n_predict": 1,
                                                            "spec_prefill": {"keep": keep}})
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "spec_prefill.keep" in message and why in message, message


def test_a_bad_tool_guard_flag_fails_at_startup(build, bpe_models):
    proc = subprocess.run([build.binary("llama-server"), "-m", bpe_models["target"], "-mpd", bpe_models["draft"],
                           "--device", "none", "--port", "0", "--spec-prefill-tool-guard", "sometimes"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--spec-prefill-tool-guard must be off, skip or protect, got 'sometimes'" in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def tools_eval(build, bpe_models, source_tree, qwen_template, workspace, tmp_path_factory) -> tuple[dict, str]:
    """`spbuild eval --kinds tools` on the tiny pair: one and three turns, both guards, whole-prompt scoring."""
    out = tmp_path_factory.mktemp("tools-eval") / "made-by-the-eval"
    build.binary("llama-server")
    proc = subprocess.run(
        [sys.executable, "-m", "spbuild", "eval", "--build-dir", str(build.record.build_dir), "--kinds", "tools",
         "--target", str(bpe_models["target"]), "--draft", str(bpe_models["draft"]), "--source-tree", str(source_tree),
         "--lengths", "3072", "--depths", "0.5", "--p", "0.2", "--window", "0", "--turns", "1,3",
         "--tool-guards", "protect,off", "--server-args", f"--device none --chat-template-file {qwen_template}",
         "--out", str(out)],
        capture_output=True, text=True, env={**os.environ, "SPBUILD_WORKDIR": str(workspace.root)}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "tools.json").read_text()), (out / "tools.md").read_text()


@pytest.mark.slow  # 19 s: 16 server rows on the tiny pair
def test_the_tools_eval_grades_every_turn_under_every_guard(tools_eval):
    document, table = tools_eval
    rows = document["rows"]
    assert document["complete"] is True
    # two intents, one case of one turn and one of three, two guards
    assert len(rows) == 2 * (1 + 3) * 2, [(r["case"], r["turn"], r["setting"]) for r in rows]
    assert all(r["status"] == "active" for r in rows), [(r["case"], r.get("reason"), r.get("error")) for r in rows]
    for r in rows:
        assert r["turn"] < r["turns"] or abs(r["n_prompt"] - 3072) / 3072 < 0.1, r["n_prompt"]  # sized by its count
        assert r["ttft_ms"] > 0 and r["full_ttft_ms"] > 0 and r["evidence_retained"] is not None
        assert r["expected"]["name"] in ("record_constant", "open_file")
        if r["setting"].endswith("protect"):
            assert {p["role"] for p in r["protected"]} == {"tools", "system", "user", "tool_call"}, r["protected"]
            assert 0 < r["n_protected"] <= r["n_kept"]
        else:
            assert r["protected"] == [] and r["n_protected"] == 0
        if r["turn"] > 1:  # a follow-up on the slot prefills only what is new
            assert r["n_reused"] > 0.3 * r["n_prompt"] and r["n_prefilled"] < r["n_prompt"] - r["n_reused"] + 8, r
    # whether a call changed, the full prefill's call, the spec call's and its validity are all there to read
    assert {"equal", "full_call", "spec_call", "spec_valid", "full_valid", "spec_right"} <= set(rows[0])
    assert "| p=0.2 full protect | 3 |" in table and "| p=0.2 full off | 1 |" in table
    [summary] = [s for s in document["summary"] if s["setting"] == "p=0.2 full protect" and s["turns"] == 3]
    assert [p["turn"] for p in summary["per_turn"]] == [1, 2, 3]


def test_the_tools_kind_runs_alone(build, workspace, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "spbuild", "eval", "--build-dir", str(build.record.build_dir),
                           "--kinds", "tools,needle", "--target", "x.gguf", "--out", str(tmp_path)],
                          capture_output=True, text=True, env={**os.environ, "SPBUILD_WORKDIR": str(workspace.root)})
    assert proc.returncode != 0 and "runs alone" in proc.stderr, proc.stderr
