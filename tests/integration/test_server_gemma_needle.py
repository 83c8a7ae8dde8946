"""The real Gemma 3 270M as target and prefill draft behind llama-server: every other prompt of the needle sweep
(10 prompts spread over its 1K-2.5K tokens; the tool's marks hold on all 20, test_gemma_needle.py) answered with
speculative prefill (p=0.2) as the full prefill answers them, through /completion and /v1/chat/completions in turn.
The full prefill's answers are the tool's (conftest.py gemma_needles: same model, same tokens, greedy, on the CPU);
that the server's own full prefill gives the same is checked on one prompt per endpoint."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.build, pytest.mark.slow]

# Gemma 3 270M is a base model without a chat template: a template that passes the user's message through gives it
# the prompt it knows (with the server's default template it answers noise, with or without spec prefill)
PASS_THROUGH = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"


# every other prompt of the sweep: the server's path is what this module checks, and ten prompts (five per endpoint)
# cover the sweep's lengths and depths at half the cost (the module's setup: 101 s before, 40 s after, 2 cores)
SERVER_STRIDE = 2


def _answer(server, endpoint: str, prompt: str, spec_prefill: dict) -> tuple[str, dict]:
    common = {"temperature": 0, "cache_prompt": False, "spec_prefill": spec_prefill}
    if endpoint == "chat":
        response = server.request("POST", "/v1/chat/completions",
                                  {"messages": [{"role": "user", "content": prompt}], "max_tokens": 6, **common})
        assert response.status_code == 200, response.text
        body = response.json()
        return body["choices"][0]["message"]["content"], body["timings"]
    response = server.request("POST", "/completion", {"prompt": prompt, "n_predict": 6, **common})
    assert response.status_code == 200, response.text
    body = response.json()
    return body["content"], body["timings"]


def _endpoint(index: int) -> str:
    return "chat" if index % 2 else "completion"


@pytest.fixture(scope="module")
def outcomes(build, gemma, gemma_needles, tmp_path_factory):
    from harness import ServerProcess

    log = tmp_path_factory.mktemp("gemma-server") / "server.log"
    server = ServerProcess(build.binary("llama-server"), ["-m", str(gemma), "-mpd", str(gemma), "--device", "none",
                                                           "--no-warmup", "-c", "8192", "-np", "1",
                                                           "--spec-prefill-p", "0.2", "--spec-prefill-min-tokens", "256",
                                                           "--jinja",
                                                           "--chat-template", PASS_THROUGH], log=log)
    try:
        server.wait_ready(600)
        results = []
        for i, needle in enumerate(gemma_needles[::SERVER_STRIDE]):
            endpoint = _endpoint(i)
            # the first prompt of each endpoint also with a full prefill: the reference the others take from the tool
            full = _answer(server, endpoint, needle["prompt"], {"enabled": False})[0] if i < 2 else None
            sparse, timings = _answer(server, endpoint, needle["prompt"], {"enabled": True})
            results.append({"seed": needle["seed"], "endpoint": endpoint, "status": timings["spec_prefill"]["status"],
                            "n_prompt": timings["spec_prefill"]["n_prompt"], "tool_n_prompt": needle["n_prompt"],
                            "full": needle["full_answer"], "server_full": full, "sparse": sparse,
                            "code": needle["code"]})
        return results
    finally:
        server.stop()


def test_every_prompt_is_scored(outcomes):
    assert all(o["status"] == "active" for o in outcomes), outcomes
    assert min(o["n_prompt"] for o in outcomes) >= 900 and max(o["n_prompt"] for o in outcomes) <= 2800
    # both endpoints tokenize the prompt as the tool does
    assert all(o["n_prompt"] == o["tool_n_prompt"] for o in outcomes), outcomes


def test_the_servers_full_prefill_answers_as_the_tools(outcomes):
    checked = [o for o in outcomes if o["server_full"] is not None]
    assert {o["endpoint"] for o in checked} == {"completion", "chat"}
    assert all(o["server_full"] == o["full"] for o in checked), checked


def test_answers_match_the_full_prefill(outcomes):
    same = [o for o in outcomes if o["sparse"] == o["full"]]
    assert len(same) >= 0.9 * len(outcomes), [o for o in outcomes if o["sparse"] != o["full"]]
    # and the full prefill finds the code, so the comparison means something
    assert sum(o["code"] in o["full"] for o in outcomes) >= 0.9 * len(outcomes), outcomes
