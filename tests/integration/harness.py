"""Helpers for the integration tests: running llama-specprefill, a llama-server process, tiny prompts."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from spbuild.building.build import BuildRecord
from spbuild.building.cmake import PRODUCT_TARGETS
from spbuild.measuring.server import ServerProcess  # noqa: F401 - the tests take it from here

# test-llama-archs saves random tiny models per architecture: a plain-RoPE one, a hybrid IMROPE one, a sliding-window one
BREAK_EVEN_ENV = "LLAMA_ARG_SPEC_PREFILL_BREAK_EVEN"  # set to 0 for the whole suite (conftest.break_even_off)
TINY_ARCHS = {"llama": "llama-dense", "qwen35": "qwen35-dense", "gemma3": "gemma3-dense"}


def strict() -> bool:
    """In CI and under `spbuild test`, a missing build or product binary fails the run instead of skipping it: a suite
    that skipped everything would pass having tested nothing."""
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("SPBUILD_TEST") == "1"


def missing(reason: str) -> None:
    """Skip, or fail when strict(), for something the build should have had."""
    if strict():
        pytest.fail(f"{reason} (CI=true or `spbuild test`: a product binary must not be missing)", pytrace=False)
    pytest.skip(reason)


# which tests ran against which binaries, printed at the end of the run (conftest.py)
BINARIES_USED: dict[str, set[str]] = {}


@dataclass(frozen=True)
class Build:
    record: BuildRecord
    bin_dir: Path

    def binary(self, name: str) -> Path:
        path = self.bin_dir / name
        if not path.exists():
            if name in PRODUCT_TARGETS:
                missing(f"{name} is not in this build ({self.bin_dir}); build it with `spbuild build`")
            how = "spbuild build --rpc" if name.endswith("rpc-server") else "spbuild build"
            pytest.skip(f"{name} is not in this build ({self.bin_dir}); build it with `{how}`")
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        BINARIES_USED.setdefault(str(path), set()).add(test)
        return path


def words_prompt(n_words: int, seed: int = 1) -> str:
    """Text the tiny models' test tokenizer turns into roughly one token per 3.5 characters."""
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
        # a random model's output may cut a UTF-8 character: the tool prints its bytes as they come
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout,
                              env={**os.environ, **(env or {})})
        found = sanitizer_report(proc.stderr) if os.environ.get("SPBUILD_SANITIZE") else ""
        if found:
            pytest.fail(f"sanitizer report from {' '.join(argv[:1])}:\n{found}", pytrace=False)
        data = json.loads(report.read_text()) if proc.returncode == 0 and report.exists() else None
        return ToolRun(proc.returncode, proc.stdout, proc.stderr, data)


# what AddressSanitizer, LeakSanitizer, UndefinedBehaviorSanitizer and ThreadSanitizer print first
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error: ", "WARNING: ThreadSanitizer")


def sanitizer_report(log: str) -> str:
    """The first sanitizer report in a process's output, with some lines after it; empty when there is none."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if any(marker in line for marker in SANITIZER_MARKERS):
            return "\n".join(lines[i:i + 40])
    return ""


def lavapipe_available() -> bool:
    """A Vulkan CPU device (Mesa's lavapipe) that ggml-vulkan uses when told GGML_VK_VISIBLE_DEVICES=0."""
    if not shutil.which("vulkaninfo"):
        return False
    proc = subprocess.run(["vulkaninfo", "--summary"], capture_output=True, text=True)
    return proc.returncode == 0 and "llvmpipe" in proc.stdout
