"""A soak of llama-server --spec-prefill: 1,000 mixed requests over 4 slots (spec prefill on and off, streamed and
not, /completion and /v1/chat/completions, clients that hang up mid-request, follow-ups that extend a slot's prompt)
from 6 clients at once. Afterwards: no request failed, the server's RSS did not grow with --cache-ram 0, /metrics
counts what was sent, and no slot is left busy."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from spbuild.measuring.bench import make_prompt as words

pytestmark = [pytest.mark.build, pytest.mark.slow]

N_REQUESTS = 1000
N_SLOTS = 4
N_CLIENTS = 6
WARMUP = 150  # requests before the RSS baseline: allocators and caches reach their size
RSS_GROWTH_MAX_MIB = 48


@dataclass
class Sent:
    status: str | None  # timings.spec_prefill.status, None for a request the client dropped
    spec_on: bool


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _one(server, i: int) -> Sent:
    rng = random.Random(i)
    spec_on = rng.random() < 0.75
    fields: dict = {"spec_prefill": {"p": rng.choice([0.1, 0.3, 0.6])} if spec_on else False}
    if rng.random() < 0.3:
        fields = {"specprefill": spec_on, **({"specprefill_keep_pct": 0.25} if spec_on else {})}
    text = words(rng.choice([50, 300, 800, 1600]), seed=rng.randrange(40))  # repeated texts: cache hits, follow-ups
    if rng.random() < 0.2:
        text += " " + words(rng.choice([20, 400]), seed=i)  # a follow-up extending an earlier prompt
    chat = rng.random() < 0.4
    stream = rng.random() < 0.4
    drop = stream and rng.random() < 0.25
    body: dict = {"temperature": 0, "stream": stream, **fields}
    if chat:
        path = "/v1/chat/completions"
        body |= {"messages": [{"role": "user", "content": text}], "max_tokens": rng.choice([1, 4, 16])}
    else:
        path = "/completion"
        body |= {"prompt": text, "n_predict": rng.choice([1, 4, 16])}
    with requests.post(f"{server.url}{path}", json=body, stream=stream, timeout=300) as response:
        assert response.status_code == 200, (response.status_code, response.text[:300], body)
        if drop:
            next(response.iter_lines(), None)  # a token or two, then hang up
            return Sent(None, spec_on)
        if stream:
            # bytes, split at line ends only: a random model's text may hold U+2028, where str.splitlines splits
            chunks = [json.loads(line[6:]) for line in response.iter_lines()
                      if line.startswith(b"data: ") and line != b"data: [DONE]"]
            final = next(c for c in reversed(chunks) if "timings" in c)
        else:
            final = response.json()
    return Sent(final["timings"]["spec_prefill"]["status"], spec_on)


def _metric_counts(server) -> Counter:
    counts: Counter = Counter()
    for line in server.request("GET", "/metrics").text.splitlines():
        if line.startswith("llamacpp:spec_prefill_requests_total{"):
            counts[line.split('status="')[1].split('"')[0]] = int(float(line.split()[-1]))
    return counts


def test_a_thousand_mixed_requests_over_four_slots(server_factory, bpe_models):
    server = server_factory(["-m", bpe_models["target"], "-mpd", bpe_models["draft"], "--device", "none",
                             "-c", str(N_SLOTS * 4096), "-np", str(N_SLOTS), "--spec-prefill-min-tokens", "256",
                             "--cache-ram", "0", "--metrics", "--slots"])
    started = time.monotonic()
    with ThreadPoolExecutor(N_CLIENTS) as pool:
        warm = list(pool.map(lambda i: _one(server, i), range(WARMUP)))
        rss_warm = _rss_mib(server.proc.pid)
        rest = list(pool.map(lambda i: _one(server, i), range(WARMUP, N_REQUESTS)))
    elapsed = time.monotonic() - started
    sent = warm + rest
    rss_end = _rss_mib(server.proc.pid)
    print(f"soak: {N_REQUESTS} requests in {elapsed:.0f} s; RSS {rss_warm:.0f} -> {rss_end:.0f} MiB; "
          f"statuses {Counter(s.status for s in sent)}")

    # nothing stuck: every slot idle once the clients are done (a dropped request's slot is released when noticed)
    deadline = time.monotonic() + 30
    while any(s["is_processing"] for s in server.request("GET", "/slots").json()) and time.monotonic() < deadline:
        time.sleep(0.2)
    slots = server.request("GET", "/slots").json()
    assert not any(s["is_processing"] for s in slots), slots
    assert all(s["spec_prefill"]["state"] in ("idle", "sparse_prefill") for s in slots), slots

    # every answered request is counted under its status; a dropped one is counted at most once
    answered = Counter(s.status for s in sent if s.status is not None)
    dropped = sum(s.status is None for s in sent)
    counted = _metric_counts(server)
    for status, n in answered.items():
        assert counted[status] >= n, (status, counted, answered)
    assert sum(answered.values()) <= sum(counted.values()) <= sum(answered.values()) + dropped, (counted, answered)
    assert answered["active"] > 100 and answered["disabled"] > 50, answered
    assert all(s.status == "disabled" for s in sent if s.status is not None and not s.spec_on)

    assert rss_end - rss_warm < RSS_GROWTH_MAX_MIB, (rss_warm, rss_end)
    assert elapsed < 900, elapsed  # bounded: a stuck slot or a lost wake-up would hang clients
    assert server.request("GET", "/health").status_code == 200
