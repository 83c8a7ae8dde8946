"""llama-specprefill on tiny random models: what it keeps, what the target's KV then holds, and how it refuses bad
input. Every run is on the CPU (`--device none`), so any build can run them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spbuild.measuring import bench

from harness import TINY_ARCHS, lavapipe_available, words_prompt

CPU = ("--device", "none")
# the tiny models' trained context is 256: give the target and the draft room for the test prompts
ROOMY = ("-c", "8192", "--spec-prefill-ctx", "16384")
PROMPT = words_prompt(2400)  # about 2,700 tokens of the test tokenizer
# lavapipe runs a tiny model's prefill at about 250 tokens/s: the Vulkan checks compare scores, which needs no more
# than a few hundred tokens (20 chunks)
VULKAN_PROMPT_WORDS = 600


def run_tool(tool, model, *args, prompt=PROMPT, device=CPU, env=None, log=None, draft=None):
    """The tool on `model` scoring for itself as its own draft (or `draft`: a file, or "self")."""
    result = tool.run("-m", model, "-mpd", draft or model, *device, *ROOMY, "-n", "6", "--temp", "0",
                      "--spec-prefill-min-tokens", "256", *args, prompt=prompt, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    if log is not None:
        log.append(result.stderr)
    return result.report


def assert_kv_is_kept_plus_generated(report):
    """The target's attention KV holds exactly the kept prompt positions and then the generated tokens, from N on."""
    n = report["n_prompt"]
    run = report["run"]
    generated = set(range(n, n + run["n_decoded"] - 1))  # the last sampled token is not decoded
    assert run["kv_positions"] == sorted(set(report["kept"]) | generated)


@pytest.mark.parametrize("arch", list(TINY_ARCHS))
@pytest.mark.parametrize("window", [0, 1024], ids=["full", "windowed"])
def test_keep_mode_on_each_architecture(tool, tiny_models, arch, window):
    p, chunk = 0.3, 32
    # eight rows: the greedy lookahead decodes on every architecture, beside the prompt's last token
    report = run_tool(tool, tiny_models[arch], "--spec-prefill-p", str(p), "--spec-prefill-window", str(window),
                      "--spec-prefill-lookahead", "8")
    n = report["n_prompt"]
    assert report["status"] == "sparse", report["reason"]
    assert report["n_rows"] == 8 * report["n_windows"]  # the test vocabulary has no end-of-generation token
    assert report["n_layers"] >= 1
    assert report["n_windows"] == (1 if window == 0 else math.ceil(n / window))
    assert len(report["scores"]) == n and all(s > 0 for s in report["scores"])

    kept = report["kept"]
    assert kept == sorted(set(kept)) and kept[0] == 0 and kept[-1] == n - 1
    n_chunks = math.ceil(n / chunk)
    forced = set(range(4)) | set(range(n - 64, n))
    forced_chunks = {c for c in range(n_chunks) if all(i in forced for i in range(c * chunk, min(n, (c + 1) * chunk)))}
    kept_set = set(kept)
    chosen = {c for c in range(n_chunks) if c not in forced_chunks
              and all(i in kept_set for i in range(c * chunk, min(n, (c + 1) * chunk)))}
    assert len(chosen) == math.ceil(p * n_chunks)  # the top 30% of chunks, besides the always-kept head and tail
    assert_kv_is_kept_plus_generated(report)


def test_mass_mode_keeps_the_requested_share(tool, tiny_models):
    report = run_tool(tool, tiny_models["llama"], "--spec-prefill-select", "mass", "--spec-prefill-mass", "0.5")
    scores = np.array(report["scores"], dtype=np.float64)
    kept = np.array(report["kept"])
    assert report["status"] == "sparse"
    assert scores[kept].sum() >= 0.5 * scores.sum() * (1 - 1e-6)
    assert len(kept) < report["n_prompt"]
    assert_kv_is_kept_plus_generated(report)


def test_runs_are_deterministic(tool, tiny_models):
    first = run_tool(tool, tiny_models["qwen35"], "--spec-prefill-window", "1024")
    second = run_tool(tool, tiny_models["qwen35"], "--spec-prefill-window", "1024")
    assert first["kept"] == second["kept"]
    assert first["scores"] == second["scores"]
    assert first["run"]["tokens"] == second["run"]["tokens"]


def test_flash_attention_scores_match_the_plain_path(tool, tiny_models):
    """With flash attention on everywhere (the query steps output their attention weights as a side branch), the
    scores must match a draft without flash attention, whose attention weights come from the plain path."""
    with_fa = run_tool(tool, tiny_models["llama"], "-fa", "on")
    without = run_tool(tool, tiny_models["llama"], "-fa", "off")
    a, b = np.array(with_fa["scores"]), np.array(without["scores"])
    assert np.allclose(a, b, rtol=2e-3, atol=1e-7), float(np.max(np.abs(a - b) / b))
    assert np.argsort(-a)[:50].tolist() == np.argsort(-b)[:50].tolist() or with_fa["kept"] == without["kept"]


@pytest.mark.parametrize("window", [0, 1024], ids=["full", "windowed"])
def test_grouped_query_heads_score_like_the_plain_path(tool, bpe_models, window):
    """A draft whose query heads share KV heads (4 and 2 here) computes a query step's attention weights beside flash
    attention with each group of heads as one matmul's columns; the weights must be the plain path's, head for head,
    with one sequence and with windows side by side."""
    args = ("--spec-prefill-window", str(window))
    prompt = bench.make_prompt(3000)
    with_fa = run_tool(tool, bpe_models["draft"], "-fa", "on", *args, prompt=prompt)
    without = run_tool(tool, bpe_models["draft"], "-fa", "off", *args, prompt=prompt)
    assert with_fa["n_windows"] == (1 if window == 0 else 3)
    a, b = np.array(with_fa["scores"]), np.array(without["scores"])
    assert np.allclose(a, b, rtol=2e-3, atol=1e-7), float(np.max(np.abs(a - b) / b))
    assert with_fa["kept"] == without["kept"]


def test_windows_score_every_token_once(tool, tiny_models):
    """Windowed scores are a per-window rescaled version of single-window ones: same length, all positive, and each
    window contributes its own span (no token left at zero, none scored twice)."""
    report = run_tool(tool, tiny_models["llama"], "--spec-prefill-window", "512")
    n = report["n_prompt"]
    assert report["n_windows"] == math.ceil(n / 512) == len(report["windows"])
    assert report["n_parallel"] >= 2  # windows run side by side as sequences of one batch
    # the windows' own spans tile the prompt: every position in exactly one window
    covered = [0] * n
    for begin, end in report["windows"]:
        assert 0 <= begin < end <= n and end - begin <= 512
        for i in range(begin, end):
            covered[i] += 1
    assert covered == [1] * n, [i for i, c in enumerate(covered) if c != 1][:20]
    assert all(s > 0 for s in report["scores"])


@pytest.mark.parametrize("arch", list(TINY_ARCHS))
@pytest.mark.parametrize("window", [0, 512], ids=["full", "windowed"])
@pytest.mark.parametrize("group_mb", ["64", "0"], ids=["layers-together", "layer-by-layer"])
def test_scoring_graph_matches_the_host_reference(tool, tiny_models, arch, window, group_mb):
    """The attention rows reduced by a ggml graph (on the CPU backend here) score like the host code that the Python
    extension checks against NumPy, whether the layers are reduced together (the default: every layer of these
    models fits one group) or in groups of one layer, merged by a max over the groups."""
    log: list[str] = []
    args = ("--spec-prefill-window", str(window))
    graph = run_tool(tool, tiny_models[arch], *args, log=log,
                     env={"LLAMA_SPEC_PREFILL_SCORING": "graph", "LLAMA_SPEC_PREFILL_GRAPH_GROUP_MB": group_mb})
    host = run_tool(tool, tiny_models[arch], *args, env={"LLAMA_SPEC_PREFILL_SCORING": "host"}, log=log)
    assert "attention rows are reduced on CPU" in log[0]
    assert "attention rows are reduced" not in log[1]
    assert (graph["reduced_on"], host["reduced_on"]) == ("CPU", "host")
    a, b = np.array(graph["scores"]), np.array(host["scores"])
    assert np.allclose(a, b, rtol=1e-5, atol=0), float(np.max(np.abs(a - b) / b))
    assert graph["kept"] == host["kept"]
    assert (graph["n_rows"], graph["n_layers"]) == (host["n_rows"], host["n_layers"])


@pytest.mark.parametrize("window", [0, 1024], ids=["full", "windowed"])
def test_scoring_graph_skips_heads_that_ignore_the_prompt(tool, sharp_model, window):
    """Lookahead tokens that attend only to themselves give some heads no weight on the prompt: the host skips those
    heads, and so must the graph (it once took them for broken rows and fell back to the host, found on CUDA)."""
    log: list[str] = []
    args = ("--spec-prefill-window", str(window), "--spec-prefill-p", "0.1", "--spec-prefill-lookahead", "8")
    prompt = bench.make_prompt(2400)
    graph = run_tool(tool, sharp_model, *args, prompt=prompt, env={"LLAMA_SPEC_PREFILL_SCORING": "graph"}, log=log)
    host = run_tool(tool, sharp_model, *args, prompt=prompt, env={"LLAMA_SPEC_PREFILL_SCORING": "host"})
    assert "scoring on the host" not in log[0]
    assert graph["reduced_on"] == "CPU"  # no layer handed over to the host
    assert graph["status"] == host["status"] == "sparse"
    a, b = np.array(graph["scores"]), np.array(host["scores"])
    assert np.count_nonzero(b == 0) > 0  # the case is there: tokens no row weighs at all
    assert np.allclose(a, b, rtol=1e-5, atol=0), float(np.max(np.abs(a - b)))
    assert graph["kept"] == host["kept"]


@pytest.mark.skipif(not lavapipe_available(), reason="no lavapipe Vulkan device (apt install mesa-vulkan-drivers)")
@pytest.mark.parametrize("arch,fa,group_mb", [("llama", "off", "64"),
                                              pytest.param("gemma3", "off", "64", marks=pytest.mark.slow),  # 13 s
                                              ("llama", "on", "64"), ("llama", "on", "0")])
def test_scoring_on_a_vulkan_device_matches_the_cpu(build, tool, tiny_models, arch, fa, group_mb):
    """With the draft on a Vulkan device, its attention rows are reduced there and score like the CPU reference: read
    layer by layer during the decode on the plain path (-fa off), all at once after it beside flash attention; the
    layers reduced together, or one group each (LLAMA_SPEC_PREFILL_GRAPH_GROUP_MB=0)."""
    if build.record.backend != "vulkan":
        pytest.skip(f"a {build.record.backend} build has no Vulkan backend")
    log: list[str] = []
    prompt = words_prompt(VULKAN_PROMPT_WORDS)
    on_gpu = run_tool(tool, tiny_models[arch], "-fa", fa, prompt=prompt, device=("-ngl", "99", "-nglpd", "99"),
                      env={"GGML_VK_VISIBLE_DEVICES": "0", "LLAMA_SPEC_PREFILL_GRAPH_GROUP_MB": group_mb}, log=log)
    on_cpu = run_tool(tool, tiny_models[arch], "-fa", "off", prompt=prompt, env={"LLAMA_SPEC_PREFILL_SCORING": "host"})
    assert "attention rows are reduced on Vulkan0" in log[0]
    assert on_gpu["reduced_on"] == "Vulkan0"
    a, b = np.array(on_gpu["scores"]), np.array(on_cpu["scores"])
    assert np.allclose(a, b, rtol=1e-3, atol=0), float(np.max(np.abs(a - b) / b))


@pytest.mark.skipif(not lavapipe_available(), reason="no lavapipe Vulkan device (apt install mesa-vulkan-drivers)")
@pytest.mark.slow  # 10 s on 2 cores
def test_grouped_query_heads_on_a_vulkan_device_score_like_the_cpu(build, tool, bpe_models):
    """The grouped-heads side branch (4 query heads on 2 KV heads) on a Vulkan device, windows side by side, against
    the CPU's plain path reduced on the host."""
    if build.record.backend != "vulkan":
        pytest.skip(f"a {build.record.backend} build has no Vulkan backend")
    args = ("--spec-prefill-window", "512")
    prompt = bench.make_prompt(1500)
    on_gpu = run_tool(tool, bpe_models["draft"], "-fa", "on", *args, prompt=prompt, device=("-ngl", "99", "-nglpd", "99"),
                      env={"GGML_VK_VISIBLE_DEVICES": "0"})
    on_cpu = run_tool(tool, bpe_models["draft"], "-fa", "off", *args, prompt=prompt,
                      env={"LLAMA_SPEC_PREFILL_SCORING": "host"})
    assert on_gpu["reduced_on"] == "Vulkan0" and on_gpu["n_windows"] == 4, on_gpu["n_windows"]
    a, b = np.array(on_gpu["scores"]), np.array(on_cpu["scores"])
    assert np.allclose(a, b, rtol=1e-3, atol=1e-7), float(np.max(np.abs(a - b) / b))


@pytest.mark.skipif(not lavapipe_available(), reason="no lavapipe Vulkan device (apt install mesa-vulkan-drivers)")
def test_draft_prefill_after_query_steps_keeps_the_schedulers_plan(build, tool, tiny_models):
    """A query step's graph (attention weights beside flash attention) has more nodes than a prefill's, so the
    scheduler re-plans its buffers for it. The next prefill must start from the worst-case plan again: otherwise each
    of its ubatches outgrows the last one's plan and re-plans behind a device sync (on an H200 a 32K-token draft
    prefill went from 612 to 800-860 ms). ggml aborts on such a re-plan under GGML_SCHED_DEBUG_REALLOC=1. It needs a
    device beside the CPU (one backend re-plans inside its allocator, unchecked), so it runs on lavapipe."""
    if build.record.backend != "vulkan":
        pytest.skip(f"a {build.record.backend} build has no Vulkan backend")
    # two runs: the second one's prefill follows the first one's query steps, as the first one's follows the warm-up's
    report = run_tool(tool, tiny_models["llama"], "-fa", "on", "-ub", "128", "--repeat", "2",
                      prompt=words_prompt(500), device=("-ngl", "99", "-nglpd", "99"),
                      env={"GGML_VK_VISIBLE_DEVICES": "0", "GGML_SCHED_DEBUG_REALLOC": "1"})
    assert len(report["repeats"]) == 2
    assert report["status"] == "sparse", report["reason"]
    assert report["reduced_on"] == "Vulkan0"
    assert report["n_prompt"] > 4 * 128  # several prefill ubatches


@pytest.mark.parametrize("kernel", [1, 8], ids=["no-pooling", "even-kernel"])
def test_scoring_graph_pools_like_the_host_reference(tool, tiny_models, kernel):
    args = ("--spec-prefill-pool-kernel", str(kernel), "--spec-prefill-window", "1024")
    graph = run_tool(tool, tiny_models["llama"], *args, env={"LLAMA_SPEC_PREFILL_SCORING": "graph"})
    host = run_tool(tool, tiny_models["llama"], *args, env={"LLAMA_SPEC_PREFILL_SCORING": "host"})
    a, b = np.array(graph["scores"]), np.array(host["scores"])
    assert np.allclose(a, b, rtol=1e-5, atol=0), float(np.max(np.abs(a - b) / b))


def test_unknown_scoring_place_is_refused(tool, tiny_models):
    result = tool.run("-m", tiny_models["llama"], "-mpd", tiny_models["llama"], *CPU, prompt="alpha beta",
                      env={"LLAMA_SPEC_PREFILL_SCORING": "gpu"})
    assert result.returncode != 0
    assert "LLAMA_SPEC_PREFILL_SCORING is 'gpu': use auto, host or graph" in result.stderr


def test_bad_scoring_group_size_is_refused(tool, tiny_models):
    result = tool.run("-m", tiny_models["llama"], "-mpd", tiny_models["llama"], *CPU, prompt="alpha beta",
                      env={"LLAMA_SPEC_PREFILL_GRAPH_GROUP_MB": "lots"})
    assert result.returncode != 0
    assert "LLAMA_SPEC_PREFILL_GRAPH_GROUP_MB is 'lots': use a number of MiB, 0 or more" in result.stderr


def test_short_prompt_is_prefilled_in_full_and_says_why(tool, tiny_models):
    report = run_tool(tool, tiny_models["llama"], "--spec-prefill-min-tokens", "100000")
    assert report["status"] == "short"
    assert "min-tokens" in report["reason"]
    assert report["kept"] == list(range(report["n_prompt"]))
    assert report["run"]["kv_positions"][: report["n_prompt"]] == list(range(report["n_prompt"]))


def test_generation_continues_at_the_full_prompt_length(tool, tiny_models):
    report = run_tool(tool, tiny_models["gemma3"], "--spec-prefill-p", "0.1")
    n = report["n_prompt"]
    assert report["status"] == "sparse"
    assert report["run"]["kv_positions"][-1] == n + report["run"]["n_decoded"] - 2


# bad input: a clear error and a non-zero exit


def test_empty_prompt_is_refused(tool, tiny_models):
    result = tool.run("-m", tiny_models["llama"], "-mpd", tiny_models["llama"], *CPU, "-p", "")
    assert result.returncode != 0
    assert "empty prompt" in result.stderr


def test_prompt_longer_than_the_target_context_is_refused(tool, tiny_models):
    result = tool.run("-m", tiny_models["llama"], "-mpd", tiny_models["llama"], *CPU, "-c", "512", "-n", "4",
                      prompt=PROMPT)
    assert result.returncode != 0
    assert "do not fit the target context" in result.stderr


@pytest.mark.parametrize("p", ["0", "1.5", "-0.2"])
def test_fraction_outside_zero_one_is_refused(tool, tiny_models, p):
    result = tool.run("-m", tiny_models["llama"], "-mpd", tiny_models["llama"], *CPU, "--spec-prefill-p", p,
                      prompt="alpha beta")
    assert result.returncode != 0
    assert "--spec-prefill-p must be in (0, 1]" in result.stderr


def test_missing_draft_is_refused(tool, tiny_models, tmp_path):
    result = tool.run("-m", tiny_models["llama"], "-mpd", tmp_path / "nope.gguf", *CPU, prompt="alpha beta")
    assert result.returncode != 0
    assert "not found" in result.stderr


def test_bad_select_mode_is_refused(tool, tiny_models):
    result = tool.run("-m", tiny_models["llama"], "-mpd", tiny_models["llama"], "--spec-prefill-select", "most",
                      prompt="alpha beta")
    assert result.returncode != 0
    assert "--spec-prefill-select must be keep or mass, got 'most'" in result.stderr


def test_draft_with_another_vocabulary_is_refused(tool, tiny_models, gemma):
    result = tool.run("-m", tiny_models["llama"], "-mpd", gemma, *CPU, *ROOMY, prompt="alpha beta")
    assert result.returncode != 0
    assert "does not share the target's vocabulary" in result.stderr


def test_draft_from_hugging_face_offline_says_what_is_missing(tool, tiny_models):
    result = tool.run("-m", tiny_models["llama"], "-hfpd", "ggml-org/no-such-draft-GGUF", "--offline", *CPU,
                      prompt="alpha beta")
    assert result.returncode != 0
    assert "ggml-org/no-such-draft-GGUF" in result.stderr and "--offline" in result.stderr


def test_the_draft_context_holds_to_its_cap(tool, tiny_models):
    """--spec-prefill-ctx caps the draft's KV cells over all its sequences (it once padded past it, up to 2x)."""
    for cap in (1024, 1536):
        report = run_tool(tool, tiny_models["llama"], "--spec-prefill-ctx", str(cap))
        assert report["status"] == "sparse", report["reason"]
        assert report["n_windows"] >= 2
        assert 0 < report["draft_cells"] <= cap, (cap, report["draft_cells"])


def test_a_small_ubatch_caps_the_windows_side_by_side(tool, tiny_models):
    """A query step puts one token per window into one ubatch: never more windows side by side than -ub."""
    report = run_tool(tool, tiny_models["llama"], "--spec-prefill-window", "256", "-ub", "4", "-b", "512")
    assert report["status"] == "sparse", report["reason"]
    assert report["n_windows"] > 4
    assert report["n_parallel"] <= 4


def test_a_scoring_failure_prefills_in_full_and_says_why(tool, bpe_models, nan_draft):
    """A draft whose attention rows are not finite (NaN weights): the tool prefills the whole prompt, and its output
    is the baseline's."""
    result = tool.run("-m", bpe_models["target"], "-mpd", nan_draft, *CPU, "-c", "8192", "-n", "6", "--temp", "0",
                      "--spec-prefill-min-tokens", "256", "--baseline", prompt=" ".join(bench.WORDS * 20))
    assert result.returncode == 0, result.stderr[-3000:]
    report = result.report
    assert report["status"] == "failed"
    assert report["reason"].startswith("scoring failed: layer"), report["reason"]  # NaN weights in the rows
    assert report["kept"] == list(range(report["n_prompt"]))
    assert report["run"]["text"] == report["baseline"]["text"]
