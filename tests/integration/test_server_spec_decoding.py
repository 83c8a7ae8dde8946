"""llama-server --spec-prefill together with every speculative-decoding type, over real HTTP.

The target verifies every drafted token, so a draft that mirrors the sparse prompt can lower acceptance but never change
the output: at temperature 0 the tokens with spec prefill and spec decoding must equal those with spec prefill alone,
for every type, prompt length, slot layout and multi-turn reuse. The models are tiny random GGUFs made at test time
(spbuild.measuring.models) with the llama-bpe vocabulary; everything runs on the CPU backend."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

# about n tokens of text: common words the llama-bpe tokenizer keeps whole
from spbuild.measuring.bench import make_prompt as words

pytestmark = pytest.mark.build

P = 0.2
MIN_TOKENS = 256
N_PREDICT = 32
# a few hundred tokens at p=0.2 first: the shape of PR #27692's DFlash failure ("positions are not continuous")
PROMPTS = [words(400, seed=11), words(1300, seed=12), words(2600, seed=13)]
FIRST_TURN, FOLLOW_UP = words(1000, seed=14), words(600, seed=15)

# ngram lookups of one token, so that the short random outputs find matches to draft from
NGRAM_ARGS = {
    "ngram-simple": ["--spec-ngram-simple-size-n", "1", "--spec-ngram-simple-size-m", "8"],
    "ngram-map-k": ["--spec-ngram-map-k-size-n", "1", "--spec-ngram-map-k-size-m", "8"],
    "ngram-map-k4v": ["--spec-ngram-map-k4v-size-n", "1", "--spec-ngram-map-k4v-size-m", "8"],
    "ngram-mod": ["--spec-ngram-mod-n-match", "1", "--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "8"],
    # ngram-cache drafts only from a static lookup cache, which llama-server cannot be given: it never drafts there
    "ngram-cache": [],
}
# type -> (the target it drafts for, the draft model it takes with -md)
DRAFT_TYPES = {
    "draft-simple": ("target", "prefill-draft"),
    "draft-eagle3": ("target", "eagle3"),
    "draft-dflash": ("target", "dflash"),
    "draft-dspark": ("target", "dspark"),
    "draft-mtp": ("mtp-target", None),
}
TYPES = [*DRAFT_TYPES, *NGRAM_ARGS]


def _models(spec_decoding_models, bpe_models) -> dict:
    return {**spec_decoding_models, "prefill-draft": bpe_models["draft"]}


def _server_args(models: dict, target: str, *extra: str) -> list[str]:
    # flash attention off: on the CPU it rounds a batch of queries differently from one query, so a verified draft
    # could flip a near-tie of the random model's logits with no speculative prefill at all; without it the target's
    # logits do not depend on the batch shape and "lossless" can be exact
    return ["-m", str(models[target]), "-mpd", str(models["prefill-draft"]), "--device", "none", "-c", "8192", "-fa", "off",
            "-np", "2", "--spec-prefill-p", str(P), "--spec-prefill-min-tokens", str(MIN_TOKENS), *extra]


def _spec_args(models: dict, spec_type: str) -> tuple[str, list[str]]:
    if spec_type in NGRAM_ARGS:
        return "target", ["--spec-type", spec_type, *NGRAM_ARGS[spec_type]]
    target, draft = DRAFT_TYPES[spec_type]
    return target, ["--spec-type", spec_type, *(["-md", str(models[draft])] if draft else [])]


def _complete(server, prompt: str, slot: int, cache_prompt: bool = False, probs: bool = False) -> dict:
    response = server.request("POST", "/completion", {
        "prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "return_tokens": True, "id_slot": slot,
        "cache_prompt": cache_prompt, **({"n_probs": 2} if probs else {})})
    assert response.status_code == 200, response.text
    return response.json()


def _session(server, probs: bool = False) -> dict:
    """What the tests compare: each prompt alone on slot 0, two prompts on both slots at once, and a follow-up that
    reuses slot 0's sparse KV. probs: each token's two most likely candidates too (for the reference)."""
    alone = [_complete(server, prompt, 0, probs=probs) for prompt in PROMPTS]
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda i: _complete(server, PROMPTS[i], i - 1, probs=probs), (1, 2)))
    first = _complete(server, FIRST_TURN, 0, cache_prompt=True, probs=probs)
    follow_up = _complete(server, FIRST_TURN + first["content"] + FOLLOW_UP, 0, cache_prompt=True, probs=probs)
    return {"alone": alone, "both": both, "turns": [first, follow_up]}


# the widest gap between the two most likely tokens that a verified batch may still flip: the target's logits for a
# batch of drafted tokens and for one token at a time differ in the last bits (the CPU's matrix kernels differ by batch
# size), which decides only between candidates this close; the random models meet such near-ties now and then
NEAR_TIE_LOGPROB = 1e-2


def _assert_same_tokens(got: list[int], reference: dict, where: str) -> None:
    """The tokens equal the reference's, or the two part at a near-tie of the reference's logits, where the other
    candidate was taken (after which neither has to follow the other)."""
    want = reference["tokens"]
    diverged = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if diverged is None:
        assert len(got) == len(want), f"{where}: {len(got)} tokens against {len(want)}"
        return
    top = reference["completion_probabilities"][diverged]["top_logprobs"]
    gap = top[0]["logprob"] - top[1]["logprob"]
    assert gap < NEAR_TIE_LOGPROB and got[diverged] == top[1]["id"], \
        f"{where}: spec decoding changed token {diverged} ({got[diverged]} for {want[diverged]}, a logprob gap of {gap:.4f})"


@pytest.fixture(scope="module")
def references(build, spec_decoding_models, bpe_models, tmp_path_factory) -> dict:
    """Spec prefill alone, per target: the tokens every speculative-decoding type must reproduce."""
    from harness import ServerProcess

    models = _models(spec_decoding_models, bpe_models)
    cache: dict[str, dict] = {}

    def reference(target: str) -> dict:
        if target not in cache:
            log = tmp_path_factory.mktemp("reference") / "server.log"
            server = ServerProcess(build.binary("llama-server"), _server_args(models, target), log=log)
            try:
                server.wait_ready()
                cache[target] = _session(server, probs=True)
            finally:
                server.stop()
        return cache[target]

    return reference  # type: ignore[return-value]


def _tokens(body: dict) -> list[int]:
    return body["tokens"]


@pytest.mark.parametrize("spec_type", TYPES)
def test_spec_decoding_with_spec_prefill_is_lossless(server_factory, spec_decoding_models, bpe_models, references,
                                                     spec_type):
    models = _models(spec_decoding_models, bpe_models)
    target, extra = _spec_args(models, spec_type)
    expected = references(target)
    server = server_factory(_server_args(models, target, *extra))
    got = _session(server)
    # draft-simple's draft is the prefill draft here: one copy of its weights serves both
    assert ("the speculative-decoding draft's weights, shared" in server.log.read_text()) == (spec_type == "draft-simple")

    for kind in ("alone", "both", "turns"):
        for i, (body, ref) in enumerate(zip(got[kind], expected[kind], strict=True)):
            where = f"{spec_type}, {kind} #{i}"
            spec = body["timings"]["spec_prefill"]
            assert spec["status"] == ref["timings"]["spec_prefill"]["status"], where
            assert spec["n_kept"] == ref["timings"]["spec_prefill"]["n_kept"], where
            _assert_same_tokens(_tokens(body), ref, where)
            if spec_type in DRAFT_TYPES:
                assert body["timings"].get("draft_n", 0) > 0, f"{where}: nothing was drafted"
    if spec_type in NGRAM_ARGS and spec_type != "ngram-cache":
        # an ngram drafts only where the text repeats itself, which the random model's output does now and then
        drafted = [body["timings"].get("draft_n", 0) for kind in got.values() for body in kind]
        assert sum(drafted) > 0, f"{spec_type}: nothing drafted in {len(drafted)} requests"
    for body in got["alone"] + got["both"] + got["turns"][:1]:
        assert body["timings"]["spec_prefill"]["status"] == "active"
    # the follow-up builds on the first turn's sparse KV: its new tokens are scored or prefilled, the rest reused; a
    # hybrid target (the MTP one) keeps no checkpoints of a sparse prefill, so it prefills the follow-up anew
    follow_up = got["turns"][1]["timings"]["spec_prefill"]
    assert follow_up["status"] in ("active", "reused"), follow_up
    assert follow_up["n_reused"] == expected["turns"][1]["timings"]["spec_prefill"]["n_reused"], follow_up
    if target != "mtp-target":
        assert follow_up["n_reused"] > 0, follow_up


def test_a_draft_that_needs_the_target_cannot_be_the_prefill_draft(build, spec_decoding_models, bpe_models):
    proc = subprocess.run([build.binary("llama-server"), "-m", spec_decoding_models["target"], "--device", "none",
                           "--port", "0", "--spec-prefill", "-md", spec_decoding_models["eagle3"],
                           "--spec-type", "draft-eagle3"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "reads the target's hidden states" in proc.stdout + proc.stderr
    assert "-mpd" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_gemma_acceptance_with_and_without_spec_prefill(server_factory, gemma, gemma_q4_0, capsys):
    """The real Gemma 3 270M as target, its Q4_0 quantisation as prefill draft and draft-simple draft: how much of the
    drafting survives a sparse prompt. Reported, not asserted beyond > 0 (the draft still helps) and losslessness."""
    from needles import make_needle

    server = server_factory(["-m", str(gemma), "-mpd", str(gemma_q4_0), "-md", str(gemma_q4_0),
                             "--spec-type", "draft-simple", "--device", "none", "-c", "8192", "-np", "1", "-fa", "off",
                             "--spec-prefill-p", str(P), "--spec-prefill-min-tokens", str(MIN_TOKENS)], timeout=600)
    totals = {True: [0, 0], False: [0, 0]}
    for i in range(4):  # about 600 to 1,500 tokens
        prompt = make_needle(60 + 30 * i, 0.1 + 0.2 * i, 3000 + i).prompt + " and the story goes on:"
        for enabled in (False, True):
            response = server.request("POST", "/completion", {
                "prompt": prompt, "n_predict": 48, "temperature": 0, "cache_prompt": False,
                "spec_prefill": {"enabled": enabled}})
            assert response.status_code == 200, response.text
            timings = response.json()["timings"]
            assert timings["spec_prefill"]["status"] == ("active" if enabled else "disabled")
            totals[enabled][0] += timings.get("draft_n", 0)
            totals[enabled][1] += timings.get("draft_n_accepted", 0)
    rates = {enabled: accepted / max(1, drafted) for enabled, (drafted, accepted) in totals.items()}
    with capsys.disabled():
        print(f"\nGemma 3 270M, draft-simple (Q4_0): acceptance {rates[False]:.1%} with a full prefill "
              f"({totals[False][1]}/{totals[False][0]}), {rates[True]:.1%} with spec prefill p={P} "
              f"({totals[True][1]}/{totals[True][0]})")
    assert rates[False] > 0 and rates[True] > 0, totals
