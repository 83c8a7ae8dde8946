"""The build works: the patched binaries run, the extended upstream test passes, the server completes on CPU and on a
Vulkan device (Mesa's lavapipe)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from harness import lavapipe_available


def test_server_version(build):
    proc = subprocess.run([build.binary("llama-server"), "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "version:" in proc.stdout + proc.stderr


def test_server_has_the_spec_prefill_flags(build):
    """The PR's flag names, the vllm-mlx aliases and the server's own; test_server_specprefill.py runs them."""
    proc = subprocess.run([build.binary("llama-server"), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for flag in ("--spec-prefill", "-mpd", "--spec-prefill-p", "--spec-prefill-window", "--spec-prefill-select",
                 "--specprefill", "--specprefill-min-tokens", "--spec-prefill-max-keep", "--spec-prefill-reuse",
                 "--spec-prefill-break-even", "--no-spec-prefill-tool-guard"):
        assert flag in proc.stdout, flag


def test_batch_alloc_accepts_gaps_only_when_allowed(build):
    """Upstream's test-batch-alloc passes with the series applied, and the series' test of the opt-in position-gap
    rule (cpp/tests/test-batch-alloc-pos-gaps.cpp, on upstream's helpers) runs every case."""
    proc = subprocess.run([build.binary("test-batch-alloc")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gaps = subprocess.run([build.binary("test-batch-alloc-pos-gaps")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "LLAMA_TEST_VERBOSE": "1"})
    out = gaps.stdout + gaps.stderr
    assert gaps.returncode == 0, out
    assert "gaps_in_batch (7 assertion(s))" in out and "gaps_after_memory (3 assertion(s))" in out, out


def _complete(server) -> dict:
    response = server.request("POST", "/completion",
                              {"prompt": "alpha beta gamma delta", "n_predict": 8, "temperature": 0, "seed": 1})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["tokens_predicted"] > 0
    assert body["content"]
    assert body["timings"]["prompt_n"] > 0
    return body


def test_server_completion_on_cpu(server_factory, tiny_models):
    server = server_factory(["-m", tiny_models["llama"], "-c", "512", "--device", "none", "-np", "1"])
    first = _complete(server)
    second = _complete(server)
    assert first["content"] == second["content"]  # temperature 0 is deterministic


@pytest.mark.skipif(not lavapipe_available(), reason="no lavapipe Vulkan device (apt install mesa-vulkan-drivers)")
def test_server_completion_on_lavapipe(build, server_factory, tiny_models):
    if build.record.backend != "vulkan":
        pytest.skip(f"a {build.record.backend} build has no Vulkan backend")
    env = {"GGML_VK_VISIBLE_DEVICES": "0"}
    devices = subprocess.run([build.binary("llama-server"), "--list-devices"], capture_output=True, text=True,
                             env={**os.environ, **env}, timeout=120)
    assert "Vulkan0" in devices.stdout + devices.stderr
    # -fa off: on Debian 12's lavapipe (Mesa 22.3) the flash-attention path segfaults inside the driver on the first
    # request after the server's warm-up; the plain attention path runs
    server = server_factory(["-m", tiny_models["llama"], "-c", "512", "-ngl", "99", "-np", "1", "-fa", "off"],
                            env=env, timeout=600)
    body = _complete(server)
    cpu = server_factory(["-m", tiny_models["llama"], "-c", "512", "--device", "none", "-np", "1"])
    assert body["content"] == _complete(cpu)["content"]


def test_the_vulkan_build_records_its_glslc_and_that_glslc_compiles_the_probes(build, source_tree):
    """The glslc the build used (spbuild's choice: the system's, or Debian trixie's from <workdir>/toolchain)
    compiles ggml's probe shaders as the record says, and the record's fast paths are what it compiled in."""
    if build.record.backend != "vulkan":
        pytest.skip(f"a {build.record.backend} build has no Vulkan backend")
    from spbuild.building import vulkan_toolchain

    chosen = build.record.glslc
    assert chosen is not None and chosen["origin"] in ("system", "toolchain", "given")
    assert vulkan_toolchain.probe(Path(chosen["glslc"]), source_tree) == chosen["extensions"]
    if chosen["origin"] == "toolchain":
        # the reason it was chosen: coopmat, coopmat2 and integer_dot, with headers that define them
        assert all(chosen["extensions"][ext] for ext in vulkan_toolchain.FAST_PATHS)
        assert all(chosen["headers"].values())
    cache = (Path(build.record.build_dir) / "CMakeCache.txt").read_text()
    assert re.search(rf"^Vulkan_GLSLC_EXECUTABLE:\w+={re.escape(chosen['glslc'])}$", cache, re.M)
