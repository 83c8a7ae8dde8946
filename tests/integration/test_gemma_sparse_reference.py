"""The sparse prefill on a sliding-window target, checked against an independent forward pass: the real Gemma 3 270M
in llama-server, and the same weights in NumPy (gemma_reference.py) with the kept tokens at their original
positions. llama.cpp's next-token log-probabilities after a sparse prefill must match the reference as closely as
after a dense one, for the first generated token and the second (decoded at position N + 1 over the sparse KV, after
the sliding-window cache has moved on). Two wrong references, one without the sliding window and one with the kept
tokens moved to compacted positions, must be far off: the comparison can tell a mask or a position error."""

from __future__ import annotations

import numpy as np
import pytest

from gemma_reference import Gemma3
from spbuild.measuring import tasks

pytestmark = [pytest.mark.build, pytest.mark.slow]

N_PROBS = 10


@pytest.fixture(scope="module")
def reference(gemma, source_tree) -> Gemma3:
    return Gemma3(gemma, source_tree)


@pytest.fixture(scope="module")
def gemma_server(build, gemma, tmp_path_factory):
    from spbuild.measuring.server import ServerProcess

    server = ServerProcess(build.binary("llama-server"), [
        "-m", gemma, "-mpd", gemma, "--spec-prefill", "-c", "4096", "-np", "1", "--device", "none",
        "--spec-prefill-min-tokens", "0"], log=tmp_path_factory.mktemp("gemma-ref") / "server.log")
    server.wait_ready(300)
    yield server
    server.stop()


def _count(server, text: str) -> int:
    return len(server.request("POST", "/tokenize", {"content": text, "add_special": True}).json()["tokens"])


def _llama(server, prompt: str, spec_prefill: dict) -> tuple[list[int], list[dict], dict]:
    """The kept positions and the top log-probabilities of the first two generated tokens."""
    body = server.request("POST", "/completion", {
        "prompt": prompt, "n_predict": 2, "temperature": 0, "n_probs": N_PROBS, "cache_prompt": False,
        "spec_prefill": {**spec_prefill, "return_kept": True}}).json()
    sp = body["timings"]["spec_prefill"]
    return [i for b, e in sp["kept"] for i in range(b, e)], body["completion_probabilities"], sp


def _distance(reference_lp: np.ndarray, step: dict) -> float:
    """The largest difference over llama.cpp's top tokens, in log-probability."""
    top = step["top_logprobs"]
    return float(np.abs(reference_lp[[t["id"] for t in top]] - np.array([t["logprob"] for t in top])).max())


def test_sparse_prefill_on_gemma3_matches_an_independent_forward_pass(gemma_server, reference):
    case = tasks.make_case("needle", "logs", 1100, 0.4, 3, count_tokens=lambda t: _count(gemma_server, t))
    tokens = gemma_server.request("POST", "/tokenize", {"content": case.prompt, "add_special": True}).json()["tokens"]
    n = len(tokens)

    dense_kept, dense_steps, dense_sp = _llama(gemma_server, case.prompt, {"enabled": False})
    assert dense_sp["status"] == "disabled" and dense_kept == list(range(n))
    dense = _distance(reference.logprobs(tokens, list(range(n))), dense_steps[0])

    kept, steps, sp = _llama(gemma_server, case.prompt, {"p": 0.2})
    assert sp["status"] == "active" and len(kept) < 0.35 * n and kept[-1] == n - 1
    # gaps inside the last token's sliding window, and kept tokens beyond it: both mask paths are exercised
    assert any(b - a > 1 for a, b in zip(kept, kept[1:]) if a > n - 512)
    assert kept[0] < n - 512
    kept_tokens = [tokens[i] for i in kept]
    sparse_lp = reference.logprobs(kept_tokens, kept)
    sparse = _distance(sparse_lp, steps[0])
    # the second token: the first generated one decoded at position n over the sparse KV
    first = steps[0]["id"]
    second = _distance(reference.logprobs([*kept_tokens, first], [*kept, n]), steps[1])

    tolerance = max(0.5, 2.0 * dense)  # llama.cpp's CPU matmuls quantise activations: the dense run sets the scale
    assert dense < 0.5, f"the reference does not match even the dense prefill: {dense:.3f}"
    assert sparse < tolerance and second < tolerance, (dense, sparse, second)
    assert int(sparse_lp.argmax()) == steps[0]["top_logprobs"][0]["id"]

    no_window = _distance(reference.logprobs(kept_tokens, kept, swa=False), steps[0])
    compacted = _distance(reference.logprobs(kept_tokens, list(range(len(kept)))), steps[0])
    assert no_window > 3 * sparse and compacted > 3 * sparse, (sparse, no_window, compacted)
