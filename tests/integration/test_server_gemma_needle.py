"""The real Gemma 3 270M as target and prefill draft behind llama-server: needle prompts of 1K-2.5K tokens answered the
same with and without speculative prefill (p=0.2), through /completion and /v1/chat/completions."""

from __future__ import annotations

import pytest

from needles import make_needle

pytestmark = [pytest.mark.build, pytest.mark.slow]

# 20 prompts from about 1,000 to 2,500 tokens, needles at depths spread over 10-90%; every other one through the chat
# endpoint. Gemma 3 270M is a base model without a chat template: a template that passes the user's message through
# gives it the prompt it knows (with the server's default template it answers noise, with or without spec prefill)
PASS_THROUGH = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"
CASES = [(100 + 150 * i // 19, 0.1 + 0.8 * ((i * 7) % 20) / 19, 2000 + i, "chat" if i % 2 else "completion")
         for i in range(20)]


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


@pytest.fixture(scope="module")
def outcomes(build, gemma, tmp_path_factory):
    from harness import ServerProcess

    log = tmp_path_factory.mktemp("gemma-server") / "server.log"
    server = ServerProcess(build.binary("llama-server"), ["-m", str(gemma), "-mpd", str(gemma), "--device", "none",
                                                           "-c", "8192", "-np", "1", "--spec-prefill-p", "0.2",
                                                           "--spec-prefill-min-tokens", "256", "--jinja",
                                                           "--chat-template", PASS_THROUGH], log=log)
    try:
        server.wait_ready(600)
        results = []
        for n_sentences, depth, seed, endpoint in CASES:
            needle = make_needle(n_sentences, depth, seed)
            full, _ = _answer(server, endpoint, needle.prompt, {"enabled": False})
            sparse, timings = _answer(server, endpoint, needle.prompt, {"enabled": True})
            results.append({"seed": seed, "endpoint": endpoint, "status": timings["spec_prefill"]["status"],
                            "n_prompt": timings["spec_prefill"]["n_prompt"], "full": full, "sparse": sparse,
                            "code": needle.code})
        return results
    finally:
        server.stop()


def test_every_prompt_is_scored(outcomes):
    assert all(o["status"] == "active" for o in outcomes), outcomes
    assert min(o["n_prompt"] for o in outcomes) >= 900 and max(o["n_prompt"] for o in outcomes) <= 2800


def test_answers_match_the_full_prefill(outcomes):
    same = [o for o in outcomes if o["sparse"] == o["full"]]
    assert len(same) >= 0.9 * len(outcomes), [o for o in outcomes if o["sparse"] != o["full"]]
    # and the full prefill finds the code, so the comparison means something
    assert sum(o["code"] in o["full"] for o in outcomes) >= 0.9 * len(outcomes), outcomes
