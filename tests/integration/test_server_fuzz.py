"""Request fuzzing of llama-server --spec-prefill: hypothesis-generated `spec_prefill` objects, vllm-mlx's flat fields
and prompts (text, token ids, over the context) against one live server. The invariant: a 200 whose
`timings.spec_prefill.status` is one of the table's, or a 400 that says what was wrong (naming the field where a
spec-prefill field was), `/health` ok after every request, never a 500."""

from __future__ import annotations

import json
import math
import re

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import ServerProcess
from spbuild.measuring.bench import make_prompt as words

pytestmark = pytest.mark.build

STATUSES = {"disabled", "active", "kept_all", "skipped_min_tokens", "skipped_break_even", "skipped_tool_guard",
            "skipped_incompatible", "skipped_queue", "error_fallback", "reused"}
FIELDS = ["enabled", "p", "select", "mass", "min_tokens", "window", "lookahead", "break_even", "max_keep",
          "chunk_size", "chunk_lines", "complete_lines", "question_lines", "keep_first", "keep_last", "return_kept",
          "tool_guard", "keep"]
N_CTX_SLOT = 4096
N_VOCAB = 128256  # llama-bpe

# any JSON value, nested a little, with the numbers that break conversions: huge, tiny, negative, fractional
json_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=12)
                | st.floats(allow_nan=False, allow_infinity=False)
                | st.sampled_from([0, 1, -1, 0.5, 1e-300, 4.9e-324, 1e308, 2**31, 2**31 - 1, -2**31, 2**63, 256, 1024]))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)

# values each field accepts (the flags' ranges), so that a request built from them must be a 200
valid_values = {
    "enabled": st.booleans(), "p": st.floats(0.01, 1.0), "select": st.sampled_from(["keep", "mass"]),
    "mass": st.floats(0.01, 1.0), "min_tokens": st.integers(0, 5000), "window": st.sampled_from([0, 1024, 2048, 4096]),
    "lookahead": st.integers(1, 8), "break_even": st.floats(0, 100), "max_keep": st.integers(0, 5000),
    "chunk_size": st.integers(0, 256), "chunk_lines": st.booleans(), "complete_lines": st.booleans(),
    "question_lines": st.integers(0, 10), "keep_first": st.integers(0, 600), "keep_last": st.integers(0, 600),
    "return_kept": st.booleans(), "tool_guard": st.sampled_from(["skip", "protect", "off"]),
    "keep": st.lists(st.just([0, 1]), max_size=2),  # every prompt here has a first character and a first token
}
valid_objects = st.fixed_dictionaries({}, optional=valid_values)

# a field with any value, unknown keys too, or something that is not an object at all
any_objects = (st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=10), json_values, max_size=5)
               | json_values)

text_prompts = st.builds(lambda n, seed: words(n, seed=seed), st.integers(1, 900), st.integers(0, 10**6))
token_prompts = st.lists(st.integers(0, N_VOCAB - 1), min_size=1, max_size=1500)
bad_token_prompts = st.lists(st.integers(-5, N_VOCAB + 5), min_size=1, max_size=50)
long_prompts = st.builds(lambda n: [1] * n, st.integers(N_CTX_SLOT + 8, 2 * N_CTX_SLOT))


@pytest.fixture(scope="module")
def fuzz_server(build, bpe_models, tmp_path_factory):
    log = tmp_path_factory.mktemp("fuzz") / "server.log"
    server = ServerProcess(build.binary("llama-server"), [
        "-m", str(bpe_models["target"]), "-mpd", str(bpe_models["draft"]), "--device", "none",
        "-c", str(2 * N_CTX_SLOT), "-np", "2", "--spec-prefill-min-tokens", "64", "--metrics"], log=log)
    try:
        server.wait_ready(300)
        yield server
    finally:
        server.stop()


def _post(server, path: str, body: dict) -> requests.Response:
    response = requests.post(f"{server.url}{path}", json=body, timeout=120)
    assert response.status_code in (200, 400), (response.status_code, response.text[:500], body)
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
    return response


def _status(response: requests.Response) -> str:
    return response.json()["timings"]["spec_prefill"]["status"]


def _error(response: requests.Response) -> str:
    message = response.json()["error"]["message"]
    assert message, response.text
    return message


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])


@FUZZ
@given(obj=valid_objects, prompt=text_prompts | token_prompts)
def test_valid_settings_always_get_a_200_with_a_known_status(fuzz_server, obj, prompt):
    response = _post(fuzz_server, "/completion", {"prompt": prompt, "n_predict": 2, "temperature": 0,
                                                  "spec_prefill": obj})
    assert response.status_code == 200, (response.text[:500], obj)
    assert _status(response) in STATUSES


@FUZZ
@given(obj=any_objects, flat=st.fixed_dictionaries({}, optional={"specprefill": json_values,
                                                                 "specprefill_keep_pct": json_values}),
       prompt=text_prompts, chat=st.booleans())
def test_any_spec_prefill_value_gets_a_200_or_a_400_naming_the_field(fuzz_server, obj, flat, prompt, chat):
    body = {"n_predict": 2, "temperature": 0, "spec_prefill": obj, **flat}
    if chat:
        path, body = "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
    else:
        path, body = "/completion", {**body, "prompt": prompt}
    response = _post(fuzz_server, path, body)
    if response.status_code == 200:
        assert _status(response) in STATUSES
        return
    # the field it names ("Field 'NAME': WHAT") is one the request has: a spec_prefill key (as JSON writes it, control
    # characters escaped: a NUL once cut the message short), the object itself, or a flat field; NAME may hold "': "
    message = _error(response)
    assert message.startswith("Field '"), message
    keys = [json.dumps(k, ensure_ascii=False)[1:-1] for k in obj] if isinstance(obj, dict) else []
    names = {"spec_prefill", *flat, *(f"spec_prefill.{k}" for k in keys)}
    ends = [m.start() for m in re.finditer("': ", message)]
    assert any(message[len("Field '"):end] in names for end in ends), (message, body)


@FUZZ
@given(prompt=bad_token_prompts | long_prompts, obj=valid_objects)
def test_prompts_out_of_the_vocabulary_or_the_context_are_refused(fuzz_server, prompt, obj):
    response = _post(fuzz_server, "/completion", {"prompt": prompt, "n_predict": 1, "spec_prefill": obj})
    out_of_vocab = any(t < 0 or t >= N_VOCAB for t in prompt)
    if out_of_vocab or len(prompt) > N_CTX_SLOT:
        assert response.status_code == 400, response.text[:300]
        _error(response)
    else:
        assert _status(response) in STATUSES


def test_the_fuzzed_server_counted_every_request_it_scored(fuzz_server):
    # after the fuzzing above (or alone): the counters are there and finite, and the server still scores
    # a seed outside the fuzzed ones and no cache: a fuzzed prompt sharing its prefix would leave too few new tokens
    body = requests.post(f"{fuzz_server.url}/completion", json={"prompt": words(400, seed=10**7), "n_predict": 1,
                                                                "cache_prompt": False}, timeout=60).json()
    assert body["timings"]["spec_prefill"]["status"] == "active"
    metrics = requests.get(f"{fuzz_server.url}/metrics", timeout=10).text
    active = next(line for line in metrics.splitlines() if 'status="active"' in line)
    assert math.isfinite(float(active.split()[-1])) and float(active.split()[-1]) >= 1
