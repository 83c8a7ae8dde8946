"""Scoring with the first K layers (--spec-prefill-layers) and the target scoring for itself (-mpd self), through
llama-specprefill on tiny random models, on the CPU. The reference for the graph's early stop is the same scoring with
the whole graph computed (LLAMA_SPEC_PREFILL_LAYER_STOP=0): the same layers' attention must give the same scores."""

from __future__ import annotations

import re

import numpy as np
import pytest

from spbuild.measuring import bench

from harness import TINY_ARCHS
from test_specprefill import CPU, assert_kv_is_kept_plus_generated, run_tool

PROMPT = bench.make_prompt(2500)
WHOLE_GRAPH = {"LLAMA_SPEC_PREFILL_LAYER_STOP": "0"}


def score(tool, target, draft, *args, env=None, log=None):
    return run_tool(tool, target, *args, draft=draft, prompt=PROMPT, env=env, log=log)


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("fa", ["on", "off"])
@pytest.mark.parametrize("window", [0, 1024], ids=["full", "windowed"])
def test_the_first_layers_score_as_with_the_whole_graph_computed(tool, deep_model, layers, fa, window):
    """The graph stops after layer K-1's output: the layers before it (their KV, their attention weights, on the flash
    attention side branch or the plain path) are what the whole graph computes for them, so the scores are equal."""
    args = ("--spec-prefill-layers", str(layers), "-fa", fa, "--spec-prefill-window", str(window),
            "--spec-prefill-lookahead", "8")
    stopped = score(tool, deep_model, deep_model, *args)
    whole = score(tool, deep_model, deep_model, *args, env=WHOLE_GRAPH)
    assert stopped["status"] == whole["status"] == "sparse", (stopped["reason"], whole["reason"])
    assert (stopped["n_layers_run"], whole["n_layers_run"]) == (layers, 4)
    assert stopped["n_layers"] == whole["n_layers"] == layers  # the rows of exactly the first K layers
    # no logits: the rows are the window's last 8 tokens, whatever the draft would have generated
    assert stopped["n_rows"] == whole["n_rows"] == 8 * stopped["n_windows"]
    a, b = np.array(stopped["scores"]), np.array(whole["scores"])
    assert np.allclose(a, b, rtol=1e-5, atol=0), float(np.max(np.abs(a - b) / b))
    assert stopped["kept"] == whole["kept"]


def test_fewer_layers_score_with_fewer_layers(tool, deep_model):
    """All layers (the default) keep the greedy lookahead rows; the first layer alone scores differently, from the
    prompt's own last tokens, and says so."""
    full = score(tool, deep_model, deep_model)
    first = score(tool, deep_model, deep_model, "--spec-prefill-layers", "1")
    assert (full["n_layers"], full["n_layers_run"]) == (4, 4)
    assert (first["n_layers"], first["n_layers_run"]) == (1, 1)
    assert not np.allclose(full["scores"], first["scores"], rtol=1e-2)
    assert first["status"] == "sparse" and first["kept"] != full["kept"]
    # as many layers as the model has is all of them, with lookahead tokens
    every = score(tool, deep_model, deep_model, "--spec-prefill-layers", "4")
    assert every["scores"] == full["scores"]


def test_the_target_scores_for_itself(tool, deep_model):
    """-mpd self: the target's own weights in a context of their own, no second model; by default a quarter of its
    layers. It scores as the same file given as a draft does at the same layer count."""
    log: list[str] = []
    itself = score(tool, deep_model, "self", log=log)
    assert itself["self"] is True and itself["status"] == "sparse", itself["reason"]
    assert itself["n_layers_run"] == 1  # a quarter of 4
    assert "scoring with the first 1" in log[0] and "its own weights" in log[0]
    two = score(tool, deep_model, "self", "--spec-prefill-layers", "2")
    as_draft = score(tool, deep_model, deep_model, "--spec-prefill-layers", "2")
    assert two["n_layers_run"] == as_draft["n_layers_run"] == 2
    assert not as_draft["self"]
    assert np.allclose(two["scores"], as_draft["scores"], rtol=1e-5, atol=0)
    assert two["kept"] == as_draft["kept"]
    assert two["run"]["text"] == as_draft["run"]["text"]


def kv_layers(log: str) -> list[int]:
    """The layer count of each KV cache the run made, in order (llama_kv_cache's size line at -lv 4)."""
    return [int(m) for m in re.findall(r"llama_kv_cache: size = .*?cells, +(\d+) layers", log)]


@pytest.mark.parametrize("draft", ["self", "file"])
def test_the_scoring_context_holds_the_kv_of_the_layers_it_scores_with(tool, deep_model, draft):
    """Scoring with the first 2 of 4 layers, the scoring context holds the KV of those 2 only (the target's own
    context holds all 4): -mpd self costs no second copy of the target's whole KV. Whole-graph scoring (the
    reference) holds all 4, and both score alike."""
    scorer = "self" if draft == "self" else deep_model
    cut_log: list[str] = []
    whole_log: list[str] = []
    cut = score(tool, deep_model, scorer, "--spec-prefill-layers", "2", "-lv", "4", log=cut_log)
    whole = score(tool, deep_model, scorer, "--spec-prefill-layers", "2", "-lv", "4", env=WHOLE_GRAPH, log=whole_log)
    assert cut["status"] == whole["status"] == "sparse", (cut["reason"], whole["reason"])
    # the target's context, the probe's (every layer, to see the graph), then the scoring context
    assert kv_layers(cut_log[0])[-1] == 2 and kv_layers(whole_log[0])[-1] == 4
    assert kv_layers(cut_log[0])[0] == 4
    assert np.allclose(cut["scores"], whole["scores"], rtol=1e-5, atol=0)
    assert cut["kept"] == whole["kept"]


def test_more_layers_than_the_scorer_has_are_refused(tool, deep_model):
    result = tool.run("-m", deep_model, "-mpd", "self", *CPU, "--spec-prefill-layers", "5", prompt="alpha beta")
    assert result.returncode != 0
    assert "--spec-prefill-layers 5, but the target" in result.stderr and "has 4 layers" in result.stderr


def test_a_bad_layer_count_is_refused(tool, deep_model):
    result = tool.run("-m", deep_model, "-mpd", deep_model, *CPU, "--spec-prefill-layers", "two", prompt="alpha")
    assert result.returncode != 0
    assert "--spec-prefill-layers must be an integer >= 0, got 'two'" in result.stderr


def test_a_bad_layer_stop_setting_is_refused(tool, deep_model):
    result = tool.run("-m", deep_model, "-mpd", deep_model, *CPU, prompt="alpha beta",
                      env={"LLAMA_SPEC_PREFILL_LAYER_STOP": "maybe"})
    assert result.returncode != 0
    assert "LLAMA_SPEC_PREFILL_LAYER_STOP is 'maybe'" in result.stderr


def test_first_layers_without_attention_are_refused_at_startup(tool, tiny_models):
    """Qwen3.5 puts recurrent layers first: its first layer has no attention weights to score with, which the scorer
    finds in its own graph at startup and names the first layer that has."""
    result = tool.run("-m", tiny_models["qwen35"], "-mpd", "self", *CPU, "--spec-prefill-layers", "1",
                      prompt="alpha beta")
    assert result.returncode != 0
    assert "its first 1 layers hold no full-attention layer (the first is layer 1)" in result.stderr
    # with that layer it scores, reading only the attention layer
    report = run_tool(tool, tiny_models["qwen35"], "--spec-prefill-layers", "2")
    assert report["status"] == "sparse" and report["n_layers"] == 1


@pytest.mark.parametrize("arch", list(TINY_ARCHS))
def test_the_target_scores_for_itself_on_each_architecture(tool, tiny_models, arch):
    """Plain RoPE, IMROPE with recurrent layers, and sliding-window attention: the target's own first layers through
    its first full-attention one (all of these two-layer models' for Qwen3.5 and Gemma 3, whose layer 0 is recurrent
    or sliding-window) score, and the target's KV holds the kept positions."""
    report = score(tool, tiny_models[arch], "self")
    assert report["self"] and report["status"] == "sparse", report["reason"]
    assert report["n_layers_run"] == (1 if arch == "llama" else 2)
    assert report["n_layers"] == 1  # Qwen3.5's recurrent layer has no attention rows; Gemma 3's window is 32 tokens
    assert_kv_is_kept_plus_generated(report)


def test_sliding_window_layers_alone_are_refused(tool, tiny_models):
    """Gemma 3's first layer attends within a sliding window: it cannot score a prompt longer than that window."""
    result = tool.run("-m", tiny_models["gemma3"], "-mpd", "self", *CPU, "--spec-prefill-layers", "1",
                      prompt="alpha beta")
    assert result.returncode != 0
    assert "its first 1 layers hold no full-attention layer (the first is layer 1)" in result.stderr
