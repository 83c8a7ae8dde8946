"""llama-server --spec-prefill against the built server over real HTTP: per-request control, status in every
response, slots, the prompt cache and multi-turn reuse, no freeze, cancellation, bad input, metrics.

The models are tiny random llama-architecture GGUFs with the llama-bpe vocabulary (a target and a draft with other
weights), made at test time; everything runs on the CPU backend."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from harness import BREAK_EVEN_ENV

# about n tokens of text: common words the llama-bpe tokenizer keeps whole
from spbuild.measuring import tasks
from spbuild.measuring.bench import make_prompt as words

pytestmark = pytest.mark.build

P = 0.2
MIN_TOKENS = 256


def spec_args(models, *extra: str, n_parallel: int = 2, n_ctx: int = 16384) -> list[str]:
    # windows down to 256 tokens: the tiny prompts here check the mechanics, not the cost
    return ["-m", models["target"], "-mpd", models["draft"], "--device", "none", "-c", str(n_ctx),
            "-np", str(n_parallel), "--spec-prefill-p", str(P), "--spec-prefill-min-tokens", str(MIN_TOKENS),
            "--spec-prefill-window-min", "256", "--metrics", "--slots", *map(str, extra)]


def complete(server, prompt: str, n_predict: int = 4, **fields) -> dict:
    response = server.request("POST", "/completion",
                              {"prompt": prompt, "n_predict": n_predict, "temperature": 0, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def spec(body: dict) -> dict:
    return body["timings"]["spec_prefill"]


def slot_state(server, slot: int) -> dict:
    slots = server.request("GET", "/slots").json()
    return next(s for s in slots if s["id"] == slot)["spec_prefill"]


@pytest.fixture
def spec_server(server_factory, bpe_models):
    return server_factory(spec_args(bpe_models))


def test_a_long_prompt_is_scored_and_prefilled_sparsely(spec_server):
    body = complete(spec_server, words(3000), id_slot=0)
    sp = spec(body)
    assert sp["status"] == "active", sp
    assert sp["n_prompt"] == body["tokens_evaluated"]
    # about p of the 32-token chunks plus the always-kept head and tail
    assert 0.15 * sp["n_prompt"] < sp["n_kept"] < 0.35 * sp["n_prompt"], sp
    assert body["timings"]["prompt_n"] == sp["n_kept"]  # prompt_n: tokens actually evaluated
    assert sp["score_ms"] > 0 and sp["sparse_prefill_ms"] > 0 and sp["n_windows"] == 1
    # the phases of scoring nest: the reduction of the rows is part of the query steps, which are part of scoring
    assert 0 < sp["score_reduce_ms"] < sp["score_query_ms"] < sp["score_ms"], sp
    assert body["tokens_predicted"] == 4
    # the target's KV holds the kept positions and the generated tokens after position N, not the dropped ones
    kv = slot_state(spec_server, 0)
    assert kv["n_kv_positions"] == sp["n_kept"] + body["tokens_predicted"] - 1, kv
    assert kv["kv_pos_max"] == sp["n_prompt"] + body["tokens_predicted"] - 2, kv
    assert kv["kv_first_gap"] >= 4, kv


def test_return_kept_lists_the_prefilled_positions_as_ranges(spec_server):
    prompt = words(3000, seed=5)
    plain = spec(complete(spec_server, prompt, id_slot=0, cache_prompt=False))
    assert "kept" not in plain  # only when asked: a 128K prompt's ranges are not small
    sp = spec(complete(spec_server, prompt, id_slot=0, cache_prompt=False, spec_prefill={"return_kept": True}))
    ranges = sp["kept"]
    assert sp["status"] == "active" and len(ranges) > 1
    assert all(begin < end for begin, end in ranges)
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))  # sorted, disjoint, not touching
    assert sum(end - begin for begin, end in ranges) == sp["n_kept"] == plain["n_kept"]
    assert ranges[0][0] == 0 and ranges[-1][1] == sp["n_prompt"]  # the first tokens and the last one
    # the KV holds exactly those positions (and the generated tokens after N)
    kv = slot_state(spec_server, 0)
    assert kv["kv_first_gap"] == ranges[0][1]
    # a reused dense prefix is one range, the new tokens' selection follows it
    follow = prompt + " " + words(1500, seed=6)
    dense = spec(complete(spec_server, prompt, id_slot=1, spec_prefill={"enabled": False}))
    assert dense["status"] == "disabled"
    more = spec(complete(spec_server, follow, id_slot=1, spec_prefill={"return_kept": True}))
    # (merged with the selection's first chunk where that starts right after it)
    assert more["n_reused"] > 0 and more["kept"][0][0] == 0 and more["kept"][0][1] >= more["n_reused"], more
    assert sum(end - begin for begin, end in more["kept"]) == more["n_kept"] < more["n_prompt"]
    # not scored: every position, in one range
    short = spec(complete(spec_server, words(100), spec_prefill={"return_kept": True}))
    assert short["status"] == "skipped_min_tokens" and short["kept"] == [[0, short["n_prompt"]]]


def test_short_prompts_and_disabled_requests_say_so(spec_server):
    short = spec(complete(spec_server, words(100)))
    assert short["status"] == "skipped_min_tokens" and short["n_kept"] == short["n_prompt"], short
    assert "below the minimum" in short["reason"]
    off = complete(spec_server, words(3000, seed=2), spec_prefill={"enabled": False})
    assert spec(off)["status"] == "disabled"
    assert off["timings"]["prompt_n"] == off["tokens_evaluated"]


def test_per_request_settings_change_the_selection(spec_server):
    prompt = words(3000, seed=3)
    few = spec(complete(spec_server, prompt, id_slot=0, cache_prompt=False, spec_prefill={"p": 0.1}))
    many = spec(complete(spec_server, prompt, id_slot=0, cache_prompt=False, spec_prefill={"p": 0.5}))
    assert few["status"] == many["status"] == "active"
    assert few["n_kept"] < many["n_kept"]
    capped = spec(complete(spec_server, prompt, id_slot=0, cache_prompt=False, spec_prefill={"max_keep": 200}))
    assert capped["n_kept"] <= 200 + 4, capped  # the always-kept head and tail even beyond the cap
    # vllm-mlx's flat fields
    flat = spec(complete(spec_server, prompt, id_slot=0, cache_prompt=False, specprefill_keep_pct=0.5))
    assert flat["n_kept"] == many["n_kept"]
    assert spec(complete(spec_server, prompt, specprefill=False))["status"] == "disabled"
    mass = spec(complete(spec_server, prompt, id_slot=0, cache_prompt=False,
                         spec_prefill={"select": "mass", "mass": 0.5}))
    assert mass["status"] in ("active", "kept_all")


def test_per_request_chunks_head_and_tail_shape_the_kept_ranges(spec_server):
    prompt = words(3000, seed=5)

    def kept(**fields) -> list[list[int]]:
        sp = spec(complete(spec_server, prompt, cache_prompt=False, spec_prefill={"return_kept": True, **fields}))
        assert sp["status"] == "active", sp
        return sp["kept"]

    n = spec(complete(spec_server, prompt, cache_prompt=False, spec_prefill={"enabled": False}))["n_prompt"]
    # chunks of 128 tokens: every kept range but the head's and the tail's is whole chunks on the 128-token grid
    for begin, end in kept(chunk_size=128, keep_first=0, keep_last=1)[:-1]:
        assert begin % 128 == 0 and (end % 128 == 0 or end == n), (begin, end)
    tail = kept(keep_last=700)[-1]
    assert tail[1] == n and tail[0] <= n - 700, tail
    head = kept(keep_first=300)[0]
    assert head[0] == 0 and head[1] >= 300, head


def test_chunks_along_lines_keep_and_drop_whole_lines(spec_server):
    """With chunk_lines every cut of a prompt of short lines moves to a line end, so each kept range (but the always-kept
    tail) is whole lines; with fixed chunks of the same size most are not."""
    prompt = "".join(words(20, seed=100 + i) + "\n" for i in range(150))
    tokens = spec_server.request("POST", "/tokenize", {"content": prompt, "add_special": True,
                                                        "with_pieces": True}).json()["tokens"]
    pieces = [t["piece"] for t in tokens]
    line_ends = {i for i, p in enumerate(pieces) if p.endswith("\n")}
    line_ends |= {i - 1 for i, p in enumerate(pieces) if p.startswith("\n") and i > 0}

    def ranges(chunk_lines: bool, complete_lines: bool = False) -> list[list[int]]:
        sp = spec(complete(spec_server, prompt, cache_prompt=False, spec_prefill={
            "return_kept": True, "chunk_lines": chunk_lines, "complete_lines": complete_lines, "keep_first": 0,
            "keep_last": 1}))
        assert sp["status"] == "active", sp
        return sp["kept"][:-1]  # the last range holds the tail, cut by count

    def whole_lines(begin: int, end: int) -> bool:
        return (begin == 0 or begin - 1 in line_ends) and end - 1 in line_ends

    along = ranges(True)
    assert len(along) >= 10 and all(whole_lines(b, e) for b, e in along), along
    fixed = ranges(False)
    assert not all(whole_lines(b, e) for b, e in fixed)
    props = spec_server.request("GET", "/props").json()["spec_prefill"]
    assert props["chunk_lines"] in (True, False) and props["complete_lines"] in (True, False)

    # complete_lines: the fixed chunks' selection, each kept run grown to its line's start and end where at most half
    # a chunk (16 tokens) is missing
    completed = ranges(False, complete_lines=True)
    covered = lambda rs: {i for b, e in rs for i in range(b, e)}  # noqa: E731
    assert covered(fixed) < covered(completed)
    for b, e in completed:
        start = max([j + 1 for j in line_ends if j < b] + [0])
        end = min([j + 1 for j in line_ends if j >= e - 1] + [len(pieces)])
        assert start == b or b - start > 16, (b, e, start)
        assert end == e or end - e > 16, (b, e, end)


def test_question_lines_keep_the_lines_that_share_a_rare_word_with_the_question(spec_server):
    """question_lines: a line naming the question's rare word is kept whole whatever it scores, at a p that keeps few
    other chunks; on by default (2: a word in at most two lines before the question), 0 turns it off."""
    fact = "The key for vault Zorblax is 4497."
    lines = [words(20, seed=300 + i) for i in range(120)]
    lines.insert(10, fact)
    prompt = "\n".join(lines) + "\n\nQuestion: what is the key for vault Zorblax?\nAnswer:"
    tokens = spec_server.request("POST", "/tokenize", {"content": prompt, "add_special": True,
                                                        "with_pieces": True}).json()["tokens"]
    span = tasks.token_span([t["piece"] for t in tokens], fact)

    def kept(**fields) -> set[int]:
        sp = spec(complete(spec_server, prompt, cache_prompt=False,
                           spec_prefill={"p": 0.05, "return_kept": True, **fields}))
        assert sp["status"] == "active", sp
        return {i for b, e in sp["kept"] for i in range(b, e)}

    assert spec_server.request("GET", "/props").json()["spec_prefill"]["question_lines"] == 2
    plain, asked = kept(question_lines=0), kept()
    assert set(span) <= asked, (span, sorted(asked))
    # the fact's line is what was added (its chunk edges aside, a line of its own: nothing else of the prompt)
    assert len(asked - plain) <= len(span) + 64, sorted(asked - plain)


@pytest.mark.parametrize("fields, name", [
    ({"spec_prefill": {"p": 0}}, "spec_prefill.p"),
    ({"spec_prefill": {"p": 1.5}}, "spec_prefill.p"),
    ({"spec_prefill": {"p": "half"}}, "spec_prefill.p"),
    ({"spec_prefill": {"select": "best"}}, "spec_prefill.select"),
    ({"spec_prefill": {"mass": -1}}, "spec_prefill.mass"),
    ({"spec_prefill": {"min_tokens": -5}}, "spec_prefill.min_tokens"),
    ({"spec_prefill": {"window": 100}}, "spec_prefill.window"),
    ({"spec_prefill": {"lookahead": 0}}, "spec_prefill.lookahead"),
    ({"spec_prefill": {"lookahead": 9}}, "spec_prefill.lookahead"),  # above max(--spec-prefill-lookahead 8, 8)
    ({"spec_prefill": {"enabled": "yes"}}, "spec_prefill.enabled"),
    ({"spec_prefill": {"return_kept": 1}}, "spec_prefill.return_kept"),
    ({"spec_prefill": {"chunk_size": 70000}}, "spec_prefill.chunk_size"),
    ({"spec_prefill": {"keep_first": -1}}, "spec_prefill.keep_first"),
    ({"spec_prefill": {"keep_last": 1.5}}, "spec_prefill.keep_last"),
    ({"spec_prefill": {"chunk_lines": "yes"}}, "spec_prefill.chunk_lines"),
    ({"spec_prefill": {"question_lines": -1}}, "spec_prefill.question_lines"),
    ({"spec_prefill": {"break_even": -0.5}}, "spec_prefill.break_even"),
    ({"spec_prefill": {"break_even": "high"}}, "spec_prefill.break_even"),
    ({"spec_prefill": {"keep": 0.2}}, "spec_prefill.keep"),
    ({"spec_prefill": 3}, "spec_prefill"),
    ({"specprefill_keep_pct": 2}, "specprefill_keep_pct"),
    # checked before the conversion to float: these round to 0 there
    ({"spec_prefill": {"p": 1e-300}}, "spec_prefill.p"),
    ({"spec_prefill": {"p": 4.9e-324}}, "spec_prefill.p"),
    ({"spec_prefill": {"p": 1e-46}}, "spec_prefill.p"),
    ({"spec_prefill": {"mass": 1e-300}}, "spec_prefill.mass"),
    ({"specprefill_keep_pct": 1e-300}, "specprefill_keep_pct"),
    ({"spec_prefill": {"window": 2 ** 40}}, "spec_prefill.window"),
    ({"spec_prefill": {"layers": -1}}, "spec_prefill.layers"),
    ({"spec_prefill": {"layers": 1.5}}, "spec_prefill.layers"),
    ({"spec_prefill": {"break_even": 1e300}}, "spec_prefill.break_even"),
])
def test_bad_fields_get_a_400_naming_the_field(spec_server, fields, name):
    response = spec_server.request("POST", "/completion", {"prompt": words(50), "n_predict": 1, **fields})
    assert response.status_code == 400, response.text
    assert f"'{name}'" in response.json()["error"]["message"]
    chat = spec_server.request("POST", "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **fields})
    assert chat.status_code == 400, chat.text
    assert spec_server.request("GET", "/health").status_code == 200


def settings_table() -> list[dict]:
    from spbuild import _selection
    return _selection.settings()


def json_default(setting: dict):
    """A setting's default as /props writes it."""
    text = setting["default"]
    if setting["type"] == "bool":
        return text == "enabled"
    if setting["type"] in ("int", "float"):
        return pytest.approx(float(text))
    return text


def test_the_settings_table_makes_the_flags_props_and_request_fields(build, server_factory, bpe_models):
    """Every row of the settings table is a flag with its variable in --help, a /props entry, and, where a request
    may set it, a request field; the seed tool's SP_* variables set their rows where LLAMA_ARG_* is unset."""
    table = settings_table()
    usage = subprocess.run([build.binary("llama-server"), "--help"], capture_output=True, text=True, timeout=60).stdout
    for setting in table:
        assert setting["flags"][0] in usage and setting["env"] in usage, setting["key"]
    server = server_factory(["-m", bpe_models["target"], "-mpd", bpe_models["draft"], "--device", "none"],
                            env={"SP_KEEP_PCT": "0.45", "SP_SELECT_MODE": "chunk", "SP_MAX_KEEP": "2000",
                                 "LLAMA_ARG_SPEC_PREFILL_CHUNK": "16", "SP_CHUNK": "64"})
    props = server.request("GET", "/props").json()["spec_prefill"]
    seeded = {"p": pytest.approx(0.45), "select": "keep", "max_keep": 2000, "chunk_size": 16}  # LLAMA_ARG_* wins
    seeded["break_even"] = pytest.approx(float(os.environ.get(BREAK_EVEN_ENV, "1.1")))  # the suite's own setting
    for setting in table:
        assert props[setting["key"]] == seeded.get(setting["key"], json_default(setting)), setting["key"]
    # a request's unknown field names every field a request may set: the table's, and its own
    response = server.request("POST", "/completion", {"prompt": "hi", "n_predict": 1, "spec_prefill": {"pp": 1}})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert all(s["key"] in message for s in table if s["per_request"]), message
    assert "pool_kernel" not in message and "queue_max" not in message  # flags only
    bad = subprocess.run([build.binary("llama-server"), "-m", bpe_models["target"], "-mpd", bpe_models["draft"],
                          "--device", "none", "--port", "0"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SP_KEEP_PCT": "2"})
    assert bad.returncode != 0
    assert '"SP_KEEP_PCT"' in bad.stderr and "must be in (0, 1], got '2'" in bad.stderr, bad.stderr[-2000:]


def test_request_windows_below_the_floor_are_refused(server_factory, bpe_models):
    # a request's own small windows made its scoring dearer than none (1.43x at 256 tokens): by default the floor is
    # 1024, --spec-prefill-window-min moves it
    args = spec_args(bpe_models)
    i = args.index("--spec-prefill-window-min")
    server = server_factory(args[:i] + args[i + 2:])
    assert server.request("GET", "/props").json()["spec_prefill"]["window_min"] == 1024
    response = server.request("POST", "/completion", {"prompt": words(50), "n_predict": 1,
                                                      "spec_prefill": {"window": 512}})
    assert response.status_code == 400, response.text
    assert "'spec_prefill.window': must be 0 or an integer >= 1024" in response.json()["error"]["message"]
    assert spec(complete(server, words(3000, seed=34), spec_prefill={"window": 1024}))["n_windows"] > 1


def test_a_request_chooses_its_lookahead(spec_server):
    """The query rows are the prompt's last token and lookahead - 1 draft tokens: by default eight (the server's
    --spec-prefill-lookahead 8, the paper's); a request may ask for fewer (each is a draft decode), down to the last
    token alone, and the response counts the rows it used."""
    prompt = words(2000, seed=31)
    default = spec(complete(spec_server, prompt, cache_prompt=False, spec_prefill={"return_kept": True}))
    one = spec(complete(spec_server, prompt, cache_prompt=False, spec_prefill={"lookahead": 1, "return_kept": True}))
    assert default["status"] == one["status"] == "active", (default, one)
    assert default["n_windows"] == one["n_windows"] == 1
    assert one["n_rows"] == 1, one
    # the tiny draft's greedy answer does not end at once, so the default's eight give more than one row
    assert 1 < default["n_rows"] <= 8, default
    # the greedy tokens' rows score the prompt otherwise than the last token's alone
    assert default["kept"] != one["kept"]
    assert spec_server.request("GET", "/props").json()["spec_prefill"]["lookahead"] == 8


def test_a_request_scores_with_the_first_layers(spec_server):
    """spec_prefill.layers: the draft's first K layers score (the rest of its graph is not computed) and the rows are
    the prompt's last tokens; the response says how many layers ran. More than the draft has is all of them."""
    prompt = words(2000, seed=32)
    full = spec(complete(spec_server, prompt, cache_prompt=False, spec_prefill={"return_kept": True}))
    first = spec(complete(spec_server, prompt, cache_prompt=False, spec_prefill={"layers": 1, "return_kept": True}))
    every = spec(complete(spec_server, prompt, cache_prompt=False, spec_prefill={"layers": 99, "return_kept": True}))
    assert full["status"] == first["status"] == every["status"] == "active", (full, first, every)
    assert (full["n_layers"], first["n_layers"], every["n_layers"]) == (2, 1, 2)
    assert first["n_rows"] == 8  # the prompt's last eight tokens, none generated
    assert first["kept"] != full["kept"] and every["kept"] == full["kept"]
    assert spec_server.request("GET", "/props").json()["spec_prefill"]["layers"] == 0


def test_the_target_scores_for_itself(server_factory, bpe_models):
    """-mpd self: no second model; by default a quarter of the target's layers (at least one) score, here one of
    two, and the target answers from the sparse KV as with a draft."""
    args = spec_args(bpe_models)
    args[args.index("-mpd") + 1] = "self"
    server = server_factory(args)
    assert server.request("GET", "/props").json()["spec_prefill"]["draft"] == "self"
    body = complete(server, words(3000, seed=33), id_slot=0)
    sp = spec(body)
    assert sp["status"] == "active" and sp["n_layers"] == 1, sp
    assert body["timings"]["prompt_n"] == sp["n_kept"] < sp["n_prompt"]
    two = spec(complete(server, words(3000, seed=33), id_slot=1, spec_prefill={"layers": 2}))
    assert two["status"] == "active" and two["n_layers"] == 2, two


def test_every_endpoint_reports_it(spec_server):
    prompt = words(2000, seed=4)
    oai = spec_server.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 2, "temperature": 0,
                                                            "spec_prefill": {"p": 0.3}})
    assert oai.status_code == 200, oai.text
    assert oai.json()["timings"]["spec_prefill"]["status"] == "active"
    chat = spec_server.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": words(2000, seed=5)}], "max_tokens": 2, "temperature": 0})
    assert chat.status_code == 200, chat.text
    assert chat.json()["timings"]["spec_prefill"]["status"] == "active"
    # streaming: the final chunk carries the timings
    with requests.post(f"{spec_server.url}/completion", json={"prompt": words(2000, seed=6), "n_predict": 3,
                                                               "stream": True, "temperature": 0},
                       stream=True, timeout=300) as response:
        # bytes, split at line ends only: a random model's text may hold U+2028, where str.splitlines splits
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith(b"data: ")]
    assert chunks[-1]["timings"]["spec_prefill"]["status"] == "active", chunks[-1]


def test_requests_with_tools_are_prefilled_in_full(server_factory, bpe_models):
    server = server_factory(spec_args(bpe_models, "--jinja"))
    tools = [{"type": "function", "function": {"name": "get_time", "description": "the time",
                                                "parameters": {"type": "object", "properties": {}}}}]
    body = {"messages": [{"role": "user", "content": words(2000, seed=7)}], "max_tokens": 2, "tools": tools}
    response = server.request("POST", "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    assert response.json()["timings"]["spec_prefill"]["status"] == "skipped_tool_guard"
    unguarded = server_factory(spec_args(bpe_models, "--jinja", "--no-spec-prefill-tool-guard"))
    response = unguarded.request("POST", "/v1/chat/completions", body)
    assert response.json()["timings"]["spec_prefill"]["status"] == "active"


def test_props_and_metrics(spec_server):
    props = spec_server.request("GET", "/props").json()["spec_prefill"]
    assert props["enabled"] and props["p"] == pytest.approx(P) and props["min_tokens"] == MIN_TOKENS
    assert props["reuse"] == "sparse" and props["select"] == "keep"
    sp = spec(complete(spec_server, words(3000, seed=8)))
    complete(spec_server, words(50, seed=9))
    metrics = spec_server.request("GET", "/metrics").text
    assert 'llamacpp:spec_prefill_requests_total{status="active"} 1' in metrics
    assert 'llamacpp:spec_prefill_requests_total{status="skipped_min_tokens"} 1' in metrics
    assert f"llamacpp:spec_prefill_tokens_scored_total {sp['n_prompt']}" in metrics
    assert f"llamacpp:spec_prefill_tokens_skipped_total {sp['n_prompt'] - sp['n_kept']}" in metrics


def test_multi_turn_reuses_the_sparse_prefix_and_scores_only_new_tokens(spec_server):
    conversation = words(3000, seed=10)
    first = complete(spec_server, conversation, id_slot=0)
    assert spec(first)["status"] == "active"
    kept_before = spec(first)["n_kept"] + first["tokens_predicted"] - 1  # the last token generated is not in the KV
    for turn in range(2):
        conversation += first["content"] + words(1500, seed=20 + turn)
        body = complete(spec_server, conversation, id_slot=0)
        sp = spec(body)
        assert sp["status"] == "active", sp
        n_reused = sp["n_reused"]
        assert n_reused >= spec(first)["n_prompt"], (sp, spec(first))
        assert body["timings"]["cache_n"] == n_reused
        # the reused prefix keeps its earlier selection; only new tokens were evaluated
        assert body["timings"]["prompt_n"] == sp["n_kept"] - kept_before, (sp, kept_before)
        assert sp["n_kept"] < sp["n_prompt"] and sp["n_prompt"] - n_reused > 1000
        kv = slot_state(spec_server, 0)
        assert kv["n_kv_positions"] == sp["n_kept"] + body["tokens_predicted"] - 1, (kv, sp)
        kept_before = sp["n_kept"] + body["tokens_predicted"] - 1
        first = body
    # a retry of the same prompt reuses the selection and the KV: nothing is scored
    retry = complete(spec_server, conversation, id_slot=0)
    sp = spec(retry)
    assert sp["status"] == "reused" and sp["score_ms"] == 0, sp
    assert retry["timings"]["prompt_n"] == 1
    # a follow-up of a few tokens, below min_tokens, is prefilled in full on top of the sparse prefix
    small = complete(spec_server, conversation + words(40, seed=30), id_slot=0)
    assert spec(small)["status"] == "reused" and small["timings"]["prompt_n"] > 30


def test_exact_reuse_and_disabled_requests_never_build_on_a_sparse_kv(server_factory, bpe_models):
    server = server_factory(spec_args(bpe_models, "--spec-prefill-reuse", "exact"))
    prompt = words(3000, seed=11)
    first = complete(server, prompt, id_slot=0)
    gap = slot_state(server, 0)["kv_first_gap"]
    assert gap > 0
    follow = complete(server, prompt + words(1000, seed=12), id_slot=0)
    assert spec(follow)["n_reused"] == gap == follow["timings"]["cache_n"]
    assert spec(first)["status"] == spec(follow)["status"] == "active"

    default = server_factory(spec_args(bpe_models))
    complete(default, prompt, id_slot=0)
    gap = slot_state(default, 0)["kv_first_gap"]
    off = complete(default, prompt, id_slot=0, spec_prefill={"enabled": False})
    assert off["timings"]["cache_n"] == gap
    assert off["timings"]["prompt_n"] == spec(off)["n_prompt"] - gap
    assert slot_state(default, 0)["kv_first_gap"] == -1  # dense again


def test_no_draft_kv_leaks_across_slots(server_factory, bpe_models):
    """PR #27692's field bug: draft KV keyed by slot piled up until the draft decode failed. Four slots, a draft
    context that holds about two prompts, twelve large prompts on rotating slots: every one is scored."""
    server = server_factory(spec_args(bpe_models, "--spec-prefill-ctx", "4096", n_parallel=4, n_ctx=4 * 4096))
    for i in range(12):
        sp = spec(complete(server, words(1800, seed=100 + i), n_predict=1, id_slot=i % 4))
        assert sp["status"] == "active", (i, sp)
    assert "failed" not in server.log_tail()


def test_long_prompts_are_scored_in_windows_that_fit_the_draft_context(server_factory, bpe_models):
    server = server_factory(spec_args(bpe_models, "--spec-prefill-ctx", "2048"))
    sp = spec(complete(server, words(6000, seed=13)))
    assert sp["status"] == "active" and sp["n_windows"] >= 3, sp


def test_per_request_windows_are_scored_side_by_side_and_full_scoring_comes_back(spec_server):
    """The draft context is prepared at startup for full-prompt scoring (one long sequence). A request's own window
    reshapes the same cells into short sequences, so its windows are scored side by side instead of one after the
    other; the next full-scoring request gets its long sequence back, not windows."""
    prompt = words(3000, seed=17)

    def score(**fields) -> dict:  # the same prompt each time, scored anew (no reuse from the slot's KV)
        return spec(complete(spec_server, prompt, cache_prompt=False, **fields))

    windowed = score(spec_prefill={"window": 512})
    assert windowed["status"] == "active" and windowed["n_windows"] >= 5, windowed
    assert windowed["n_parallel"] == windowed["n_windows"], windowed
    assert windowed["score_setup_ms"] > 0, windowed
    again = score(spec_prefill={"window": 512})
    assert again["n_parallel"] == again["n_windows"] and again["score_setup_ms"] == 0, again
    assert again["n_kept"] == windowed["n_kept"]
    full = score()
    assert full["status"] == "active" and full["n_windows"] == 1 and full["n_parallel"] == 1, full
    assert full["score_setup_ms"] > 0, full


def test_the_prepared_context_has_room_for_8k_windows_side_by_side(server_factory, bpe_models):
    """Prepared for the slot's prompt in full, the draft context also holds that prompt in windows of 8,192 side by
    side, though each window adds a sink, the question and the lookahead: a request's 8K windows are scored in one
    round (in the slot's cells alone, 3 windows of 7,168 cells would not fit side by side). They are the default above
    16,384 new tokens (window 0, automatic); a window as long as the prompt still scores it whole."""
    server = server_factory(spec_args(bpe_models, n_parallel=1, n_ctx=20480))
    prompt = words(20300, seed=23)
    sp = spec(complete(server, prompt, n_predict=1, cache_prompt=False))
    assert sp["status"] == "active" and 20300 < sp["n_prompt"] < 20480, sp
    assert sp["n_windows"] == 3 and sp["n_parallel"] == 3, sp
    whole = spec(complete(server, prompt, n_predict=1, cache_prompt=False, spec_prefill={"window": 20480}))
    assert whole["status"] == "active" and whole["n_windows"] == 1, whole


def test_concurrent_requests_with_mixed_settings(server_factory, bpe_models):
    server = server_factory(spec_args(bpe_models, n_parallel=4, n_ctx=4 * 4096))
    cases = [({"p": 0.2}, "active"), ({"enabled": False}, "disabled"), ({"p": 0.5}, "active"),
             ({"min_tokens": 100000}, "skipped_min_tokens")]
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(complete, server, words(2500, seed=200 + i), 4, spec_prefill=fields)
                   for i, (fields, _) in enumerate(cases)]
        results = [f.result() for f in futures]
    for (fields, status), body in zip(cases, results):
        assert spec(body)["status"] == status, (fields, spec(body))
        assert body["tokens_predicted"] == 4
    queued = [spec(b)["queue_ms"] for b, (_, s) in zip(results, cases) if s == "active"]
    assert len(queued) == 2
    assert server.request("GET", "/health").status_code == 200


class Streamer:
    """A client streaming a long answer on one slot, so that results flow all the time, with each token's arrival
    time; stopped by closing it."""

    def __init__(self, server, slot: int, n_predict: int = 12000) -> None:
        self.arrivals: list[float] = []
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server, slot, n_predict))
        self._thread.start()
        assert self._started.wait(120), "the streaming request produced no tokens"

    def _run(self, server, slot: int, n_predict: int) -> None:
        with requests.post(f"{server.url}/completion", json={"prompt": words(20, seed=1), "n_predict": n_predict,
                                                              "stream": True, "temperature": 0, "id_slot": slot,
                                                              "ignore_eos": True}, stream=True, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith(b"data: "):
                    self.arrivals.append(time.monotonic())
                    if len(self.arrivals) == 20:
                        self._started.set()
                if self._stop.is_set():
                    return

    @property
    def tokens(self) -> int:
        return len(self.arrivals)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def join(self) -> None:
        """Waits for the answer to end by itself."""
        self._thread.join()


def _longest_gap_while_streaming(server, big_prompt: str, big_fields: dict) -> tuple[float, dict]:
    """Slot 0 streams tokens while slot 1 gets a big prompt: the longest wait between slot 0's tokens, and slot 1's
    response."""
    streamer = Streamer(server, 0, n_predict=400)
    t0 = time.monotonic()
    body = complete(server, big_prompt, 1, id_slot=1, **big_fields)
    t1 = time.monotonic()
    streamer.join()
    arrivals = streamer.arrivals
    during = [b - a for a, b in zip(arrivals, arrivals[1:]) if b > t0 and a < t1]
    return max(during), body


def test_scoring_does_not_freeze_other_slots(server_factory, bpe_models):
    server = server_factory(spec_args(bpe_models, "-b", "8192", "-ub", "8192", n_ctx=2 * 12288))
    prompt = words(8000, seed=14)
    plain_gap, plain = _longest_gap_while_streaming(server, prompt, {"spec_prefill": {"enabled": False},
                                                                     "cache_prompt": False})
    spec_gap, body = _longest_gap_while_streaming(server, prompt, {"cache_prompt": False})
    sp = spec(body)
    assert sp["status"] == "active"
    assert spec_gap < plain_gap, (f"while slot 1's prompt was scored ({sp['score_ms']:.0f} ms), slot 0's longest gap "
                                  f"between tokens was {spec_gap * 1e3:.0f} ms; a plain prefill of the same prompt "
                                  f"({plain['timings']['prompt_ms']:.0f} ms) caused {plain_gap * 1e3:.0f} ms")


def test_a_client_that_disconnects_during_scoring_stops_it(server_factory, bpe_models):
    server = server_factory(spec_args(bpe_models, "--spec-prefill-ctx", "16384", n_ctx=2 * 16384))
    prompt = words(12000, seed=15)
    full = spec(complete(server, prompt, 1, cache_prompt=False, id_slot=0))
    assert full["status"] == "active" and full["score_ms"] > 300, full
    _scoring_dropped(server, prompt, 0)  # the same prompt again, dropped while it is being scored
    t0 = time.monotonic()
    after = complete(server, words(2000, seed=16), 1, id_slot=0)
    # the next request did not wait for the dropped scoring to run to its end
    assert spec(after)["status"] == "active"
    assert spec(after)["queue_ms"] < 0.5 * full["score_ms"], (spec(after), full)
    assert time.monotonic() - t0 < 60
    assert server.request("GET", "/health").status_code == 200


def _scoring_dropped(server, prompt: str, slot: int) -> None:
    """Sends the prompt to the slot and closes the connection while the draft scores it."""
    with requests.post(f"{server.url}/completion", json={"prompt": prompt, "n_predict": 1, "stream": True,
                                                          "cache_prompt": False, "id_slot": slot},
                       stream=True, timeout=60):
        deadline = time.monotonic() + 30
        while slot_state(server, slot)["state"] != "scoring" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert slot_state(server, slot)["state"] == "scoring"


def test_a_disconnect_during_scoring_is_noticed_while_another_slot_streams(server_factory, bpe_models):
    # upstream's wait for a request's results restarted its one-second poll of the connection whenever any other
    # request's result arrived: with another client streaming, a dropped request was never noticed and its whole
    # scoring ran before the next request's (measured: 10 of 10 disconnects ignored, the next user waiting 81 s)
    # the longest prompt the tiny models take (32K), so that its scoring lasts well beyond the one-second poll
    server = server_factory(spec_args(bpe_models, "--spec-prefill-ctx", "32768", n_parallel=3, n_ctx=3 * 32768))
    prompt = words(30000, seed=15)
    full = spec(complete(server, prompt, 1, cache_prompt=False, id_slot=1))
    assert full["status"] == "active" and full["score_ms"] > 2500, full  # long enough to tell a wait from none
    streamer = Streamer(server, 0)
    try:
        _scoring_dropped(server, prompt, 1)
        after = spec(complete(server, words(2000, seed=16), 1, id_slot=2))
        streamed = streamer.tokens
    finally:
        streamer.close()
    assert streamed > 20, streamed  # the other slot was streaming all along
    assert after["status"] == "active", after
    # noticed within the poll (1 s) and stopped before its next ubatch, not scored to its end
    assert after["queue_ms"] < 0.5 * full["score_ms"], (after, full)
    assert server.request("GET", "/health").status_code == 200


def test_queue_max_prefills_in_full_what_would_wait_for_the_draft(server_factory, bpe_models):
    server = server_factory(spec_args(bpe_models, "--spec-prefill-ctx", "16384", "--spec-prefill-queue-max", "0",
                                      n_ctx=2 * 16384))
    assert server.request("GET", "/props").json()["spec_prefill"]["queue_max"] == 0
    small = words(2000, seed=30)
    assert spec(complete(server, small, id_slot=1))["status"] == "active"  # an idle draft scores it
    with ThreadPoolExecutor(1) as pool:
        big = pool.submit(complete, server, words(12000, seed=31), 1, id_slot=0, cache_prompt=False)
        deadline = time.monotonic() + 30
        while slot_state(server, 0)["state"] != "scoring" and time.monotonic() < deadline:
            time.sleep(0.01)
        body = complete(server, small, id_slot=1, cache_prompt=False)
        scored = spec(big.result())
    sp = spec(body)
    assert sp["status"] == "skipped_queue", sp
    assert "--spec-prefill-queue-max 0" in sp["reason"], sp
    assert body["timings"]["prompt_n"] == sp["n_prompt"] == sp["n_kept"]  # prefilled in full, not waiting
    assert scored["status"] == "active", scored
    metrics = server.request("GET", "/metrics").text
    assert 'spec_prefill_requests_total{status="skipped_queue"} 1' in metrics, metrics
    assert "llamacpp:spec_prefill_queue_seconds_total" in metrics


def test_a_request_whose_wait_would_eat_its_saving_is_prefilled_in_full(server_factory, bpe_models):
    # the draft is as big as the target here, so scoring 1K tokens costs about their full prefill or more (a speedup
    # of 0.24-0.8, measured or from the shapes): a break-even of 0.15 lets it through when the draft is idle, not
    # behind a 12K-token prompt being scored (at least 12 times as long to score)
    server = server_factory(spec_args(bpe_models, "--spec-prefill-ctx", "16384", n_ctx=2 * 16384))
    small = words(1000, seed=32)
    gate = {"break_even": 0.15}
    assert spec(complete(server, small, id_slot=1, cache_prompt=False, spec_prefill=gate))["status"] == "active"
    with ThreadPoolExecutor(1) as pool:
        big = pool.submit(complete, server, words(12000, seed=33), 1, id_slot=0, cache_prompt=False)
        deadline = time.monotonic() + 30
        while slot_state(server, 0)["state"] != "scoring" and time.monotonic() < deadline:
            time.sleep(0.01)
        behind = spec(complete(server, small, id_slot=1, cache_prompt=False, spec_prefill=gate))
        big.result()
    assert behind["status"] == "skipped_queue", behind
    assert "after the wait for the prefill draft" in behind["reason"], behind
    assert behind["queue_ms"] == 0, behind


def test_slot_save_and_restore_keep_a_sparse_slot_known_as_sparse(server_factory, bpe_models, tmp_path):
    server = server_factory(spec_args(bpe_models, "--slot-save-path", tmp_path))
    prompt = words(3000, seed=17)
    first = spec(complete(server, prompt, id_slot=0))
    gap = slot_state(server, 0)["kv_first_gap"]
    saved = server.request("POST", "/slots/0?action=save", {"filename": "sparse.bin"})
    assert saved.status_code == 200, saved.text
    assert server.request("POST", "/slots/0?action=erase").status_code == 200
    restored = server.request("POST", "/slots/1?action=restore", {"filename": "sparse.bin"})
    assert restored.status_code == 200, restored.text
    # asked for a full prefill, the restored slot is used only up to its first dropped position
    off = complete(server, prompt, id_slot=1, spec_prefill={"enabled": False})
    assert off["timings"]["cache_n"] == gap, (off["timings"], gap, first)


def test_the_ram_prompt_cache_carries_the_sparse_kv(server_factory, bpe_models):
    server = server_factory(spec_args(bpe_models, "--cache-ram", "512", n_parallel=1))
    prompt = words(3000, seed=18)
    first = spec(complete(server, prompt))
    complete(server, words(2000, seed=19))  # the first prompt moves to the RAM cache
    again = complete(server, prompt)
    sp = spec(again)
    assert again["timings"]["cache_n"] > 2000, again["timings"]
    assert sp["status"] == "reused" and sp["n_kept"] == first["n_kept"], (sp, first)


def test_startup_errors(build, bpe_models, tiny_models):
    server = build.binary("llama-server")

    def start(*args) -> str:
        proc = subprocess.run([server, "-m", bpe_models["target"], "--device", "none", "--port", "0", *map(str, args)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc.stdout + proc.stderr

    assert "does not share the target's vocabulary" in start("-mpd", tiny_models["llama"])
    assert "--spec-prefill-reuse must be" in start("-mpd", bpe_models["draft"], "--spec-prefill-reuse", "maybe")
    assert "--spec-prefill-p must be in (0, 1]" in start("-mpd", bpe_models["draft"], "--spec-prefill-p", "0")
    # a number is read whole or refused, naming the flag, its range and the value (not a bare "stof")
    for flag, value, why in [("--spec-prefill-p", "abc", "must be in (0, 1], got 'abc'"),
                             ("--spec-prefill-p", "0.5abc", "must be in (0, 1], got '0.5abc'"),
                             ("--spec-prefill-p", "1e-50", "must be in (0, 1], got '1e-50'"),
                             ("--spec-prefill-chunk", "99999999999", "must be an integer in [0, 65536]"),
                             ("--spec-prefill-window", "100", "must be 0 or an integer >= 256, got '100'"),
                             ("--spec-prefill-ctx", "1024.5", "must be 0 or an integer >= 512"),
                             ("--spec-prefill-break-even", "inf", "must be in [0, 1000000], got 'inf'")]:
        assert f"{flag} {why}" in start("-mpd", bpe_models["draft"], flag, value), (flag, value)


def test_the_environment_turns_it_on(server_factory, bpe_models):
    server = server_factory(["-m", bpe_models["target"], "--device", "none", "-c", "8192"],
                            env={"LLAMA_ARG_SPEC_PREFILL_MODEL": str(bpe_models["draft"]),
                                 "LLAMA_ARG_SPEC_PREFILL_MIN_TOKENS": "256"})
    assert server.request("GET", "/props").json()["spec_prefill"]["enabled"]
    assert spec(complete(server, words(1000, seed=20)))["status"] == "active"


def test_a_server_without_spec_prefill_reports_nothing(server_factory, bpe_models):
    server = server_factory(["-m", bpe_models["target"], "--device", "none", "-c", "8192"])
    body = complete(server, words(1000, seed=21))
    assert "spec_prefill" not in body["timings"]
    assert server.request("GET", "/props").json()["spec_prefill"] == {"enabled": False}


def test_a_scoring_failure_falls_back_to_a_full_prefill(server_factory, bpe_models, nan_draft):
    server = server_factory(["-m", bpe_models["target"], "-mpd", nan_draft, *spec_args(bpe_models)[4:]])
    prompt = words(2000, seed=22)
    body = complete(server, prompt, id_slot=0)
    sp = spec(body)
    assert sp["status"] == "error_fallback", sp
    assert sp["reason"].startswith("scoring failed: layer"), sp  # NaN weights in the attention rows
    assert body["timings"]["prompt_n"] == sp["n_prompt"] == sp["n_kept"]
    plain = server_factory(["-m", bpe_models["target"], "--device", "none", "-c", "16384"])
    assert body["content"] == complete(plain, prompt)["content"]  # the fallback is a real full prefill
    assert spec(complete(server, words(2000, seed=23), id_slot=1))["status"] == "error_fallback"  # and it serves on
    assert 'spec_prefill_requests_total{status="error_fallback"} 2' in server.request("GET", "/metrics").text


def test_the_break_even_gate_is_on_by_default_and_learns_from_requests(server_factory, bpe_models):
    # the draft is as big as the target here: from the models' shapes alone, scoring cannot pay for itself
    server = server_factory(spec_args(bpe_models), env={BREAK_EVEN_ENV: None})
    assert server.request("GET", "/props").json()["spec_prefill"]["break_even"] == pytest.approx(1.1)
    first = spec(complete(server, words(3000, seed=24)))
    assert first["status"] == "skipped_break_even", first
    assert "estimated speedup 0." in first["reason"] and "models' shapes" in first["reason"], first
    # a request can lower the bar (0: score anyway), which measures the scoring's throughput beside the target's ...
    forced = spec(complete(server, words(3000, seed=25), spec_prefill={"break_even": 0}))
    assert forced["status"] == "active", forced
    # ... and from then on the estimate is the measured one
    second = spec(complete(server, words(3000, seed=26), spec_prefill={"break_even": 50}))
    assert second["status"] == "skipped_break_even", second
    assert "measured: target prefill" in second["reason"], second


def test_a_prompt_over_the_context_is_refused_and_the_server_goes_on(server_factory, bpe_models):
    server = server_factory(spec_args(bpe_models, n_ctx=2 * 4096))
    response = server.request("POST", "/completion", {"prompt": words(6000, seed=26), "n_predict": 1})
    assert response.status_code == 400, response.text
    assert spec(complete(server, words(2000, seed=27)))["status"] == "active"


def test_sleeping_frees_the_scorer_and_waking_rebuilds_it(server_factory, bpe_models):
    server = server_factory(spec_args(bpe_models, "--sleep-idle-seconds", "1", "--spec-prefill-ctx", "20480",
                                      n_ctx=2 * 20480))
    assert spec(complete(server, words(2000, seed=28)))["status"] == "active"
    deadline = time.monotonic() + 30
    while not server.request("GET", "/props").json()["is_sleeping"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server.request("GET", "/props").json()["is_sleeping"]
    assert spec(complete(server, words(2000, seed=29)))["status"] == "active"
    assert server.log_tail().count("spec-prefill: prefill draft") >= 1
    # a scoring longer than the idle timeout: the server must not fall asleep under the slot that waits for it
    long = spec(complete(server, words(18000, seed=33)))
    assert long["status"] == "active" and long["score_ms"] > 1000, long


def test_a_follow_up_after_an_idle_purge(server_factory, bpe_models):
    """--cache-idle-slots moves an idle slot to the RAM cache and clears it when another task starts; the follow-up
    comes back from the cache still known as sparse."""
    server = server_factory(spec_args(bpe_models, "--cache-ram", "512", "--cache-idle-slots", "-kvu"))
    prompt = words(3000, seed=30)
    first = spec(complete(server, prompt, id_slot=0))
    complete(server, words(2000, seed=31), id_slot=1)  # slot 0 is idle: saved and cleared
    follow = complete(server, prompt + words(1200, seed=32))
    sp = spec(follow)
    assert follow["timings"]["cache_n"] >= first["n_prompt"] - 1, (follow["timings"], first)
    assert sp["status"] == "active" and sp["n_reused"] >= first["n_prompt"] - 1, sp
    assert sp["n_kept"] < sp["n_prompt"] - 1000, sp  # the reused prefix is still the sparse one


@pytest.mark.parametrize("arch", ["qwen35", "gemma3"], ids=["hybrid-imrope", "sliding-window"])
def test_hybrid_and_sliding_window_targets(server_factory, tiny_models, arch):
    """A hybrid (recurrent + attention, IMROPE) and a sliding-window target behind the server: the sparse prefill
    goes through the batch loop, a retry and a follow-up are served (reusing what the memory allows), and nothing
    fails. Their trained context is 256 tokens, so the prompts are short and min_tokens low."""
    from harness import words_prompt

    model = tiny_models[arch]
    server = server_factory(["-m", model, "-mpd", model, "--device", "none", "-c", "256", "-np", "1",
                             "--spec-prefill-p", "0.3", "--spec-prefill-min-tokens", "64",
                             "--spec-prefill-keep-last", "32", "--spec-prefill-chunk", "16", "--spec-prefill-ctx", "1024",
                             "--slots"])
    prompt = words_prompt(150, seed=40)
    first = complete(server, prompt)
    sp = spec(first)
    assert sp["status"] == "active" and sp["n_kept"] < sp["n_prompt"], sp
    assert first["timings"]["prompt_n"] == sp["n_kept"]
    retry = spec(complete(server, prompt))
    assert retry["status"] in ("reused", "active"), retry  # a recurrent state cannot roll back: scored again
    follow = complete(server, prompt + " " + words_prompt(40, seed=41))
    assert spec(follow)["status"] in ("active", "reused", "skipped_min_tokens"), spec(follow)
    assert server.request("GET", "/health").status_code == 200


def test_cache_reuse_shifts_a_sparse_kv_and_keeps_it_known_as_sparse(server_factory, bpe_models):
    """--cache-reuse moves cached chunks to their new positions by KV shifting; the dropped positions move with them,
    and a request that asks for a full prefill gets one over the first dropped position."""
    server = server_factory(spec_args(bpe_models, "--cache-reuse", "64"))
    body = words(3000, seed=50)
    first = spec(complete(server, "intro " + body, id_slot=0, n_cache_reuse=64))
    assert first["status"] == "active"
    shifted = complete(server, "another longer intro " + body, id_slot=0, n_cache_reuse=64,
                       spec_prefill={"enabled": False})
    sp = spec(shifted)
    assert sp["status"] == "disabled"
    # nothing sparse was built on: the slot's KV is dense again, every prompt position present
    kv = slot_state(server, 0)
    assert kv["kv_first_gap"] == -1, kv
    assert kv["n_kv_positions"] == sp["n_prompt"] + shifted["tokens_predicted"] - 1, (kv, sp)
