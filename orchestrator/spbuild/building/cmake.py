"""CMake arguments and build targets per backend."""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass, field
from pathlib import Path

from spbuild.errors import SpbuildError

BACKENDS = ("cpu", "vulkan", "cuda", "metal", "sycl", "hip")

_BACKEND_ARGS: dict[str, dict[str, str]] = {
    "cpu": {},
    "vulkan": {"GGML_VULKAN": "ON"},
    "cuda": {"GGML_CUDA": "ON"},
    "metal": {"GGML_METAL": "ON"},
    "sycl": {"GGML_SYCL": "ON", "CMAKE_C_COMPILER": "icx", "CMAKE_CXX_COMPILER": "icpx"},
    "hip": {"GGML_HIP": "ON"},
}

# x86-64 features every machine we target has; GGML_NATIVE builds for the build machine's CPU and such a
# binary dies with "Illegal instruction" elsewhere (measured here on a Q4_K warm-up).
_PORTABLE_X86 = {"GGML_AVX": "ON", "GGML_AVX2": "ON", "GGML_FMA": "ON", "GGML_F16C": "ON", "GGML_BMI2": "ON"}

# `--sanitize`: llama.cpp's and ggml's own options (LLAMA_SANITIZE_*, GGML_SANITIZE_*), and the build folder's suffix
SANITIZERS = {"address": "asan", "undefined": "ubsan", "thread": "tsan"}

PRODUCT_TARGETS = ("llama-server", "llama-specprefill")
# `spbuild bench` times the draft's own prefill with upstream's llama-bench
BENCH_TARGETS = ("llama-bench",)
# the tests write tiny models (test-llama-archs), check the batch validator, and make a second quantisation of a model
TEST_HELPER_TARGETS = ("test-llama-archs", "test-batch-alloc", "test-batch-alloc-pos-gaps", "llama-quantize")


@dataclass
class BuildConfig:
    backend: str = "cpu"
    rpc: bool = False
    debug: bool = False
    test_helpers: bool = True
    targets: list[str] = field(default_factory=list)  # empty: the default set
    defines: dict[str, str] = field(default_factory=dict)  # user -D KEY=VALUE, applied last
    sanitize: list[str] = field(default_factory=list)  # of SANITIZERS

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise SpbuildError(f"unknown backend {self.backend!r}", hint=f"Choose one of: {', '.join(BACKENDS)}.")
        unknown = [name for name in self.sanitize if name not in SANITIZERS]
        if unknown:
            raise SpbuildError(f"unknown sanitizer {', '.join(unknown)}",
                               hint=f"Choose among: {', '.join(SANITIZERS)} (e.g. --sanitize address,undefined).")
        if self.sanitize and self.backend != "cpu":
            raise SpbuildError(f"--sanitize builds the CPU backend only, not {self.backend}: GPU drivers and their "
                               "runtimes are not instrumented and report their own allocations as errors",
                               hint="Run `spbuild build --sanitize address,undefined` (the CPU backend is the default).")
        if "thread" in self.sanitize and "address" in self.sanitize:
            raise SpbuildError("the thread and address sanitizers cannot be combined",
                               hint="Build them separately: --sanitize thread, --sanitize address,undefined.")

    @property
    def name(self) -> str:
        """The build folder's name: one per backend (and variant)."""
        return (self.backend + ("-rpc" if self.rpc else "") + ("-debug" if self.debug else "")
                + "".join(f"-{SANITIZERS[s]}" for s in SANITIZERS if s in self.sanitize))


def parse_define(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    key = key.removeprefix("-D").split(":", 1)[0].strip()
    if not sep or not key:
        raise SpbuildError(f"bad -D {text!r}", hint="Write it as -D KEY=VALUE, e.g. -D CMAKE_CUDA_ARCHITECTURES=90.")
    return key, value


def cmake_defines(config: BuildConfig, machine: str | None = None) -> dict[str, str]:
    machine = (machine or platform.machine()).lower()
    defines = {
        "CMAKE_BUILD_TYPE": "Debug" if config.debug else "Release",
        "GGML_NATIVE": "OFF",
        "LLAMA_USE_PREBUILT_UI": "OFF",  # it downloads at build time
        "LLAMA_BUILD_APP": "OFF",
        "LLAMA_BUILD_TOOLS": "ON",
        "LLAMA_BUILD_SERVER": "ON",
        "LLAMA_BUILD_EXAMPLES": "OFF",
        "LLAMA_BUILD_TESTS": "ON" if config.test_helpers else "OFF",
    }
    if machine in ("x86_64", "amd64"):
        defines.update(_PORTABLE_X86)
    defines.update(_BACKEND_ARGS[config.backend])
    if config.rpc:
        defines["GGML_RPC"] = "ON"
    if config.sanitize:
        # with line numbers in the reports; optimised, so that the suite's prompts still run in minutes
        defines["CMAKE_BUILD_TYPE"] = "Debug" if config.debug else "RelWithDebInfo"
        for name in config.sanitize:
            defines[f"LLAMA_SANITIZE_{name.upper()}"] = "ON"
            defines[f"GGML_SANITIZE_{name.upper()}"] = "ON"
    defines.update(config.defines)
    return defines


def configure_argv(cmake: Path, ninja: Path, source: Path, build: Path, config: BuildConfig) -> list[str]:
    argv = [str(cmake), "-S", str(source), "-B", str(build), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    argv += [f"-D{key}={value}" for key, value in cmake_defines(config).items()]
    return argv


def rpc_server_target(source: Path) -> str:
    """The RPC server's CMake target, as the tree names it: `ggml-rpc-server` in newer trees, `rpc-server` before."""
    cmakelists = source / "tools" / "rpc" / "CMakeLists.txt"
    text = cmakelists.read_text() if cmakelists.is_file() else ""
    match = re.search(r"set\(TARGET\s+([\w-]+)\)", text) or re.search(r"add_executable\(([\w-]+)", text)
    return match.group(1) if match else "rpc-server"


def default_targets(config: BuildConfig, source: Path) -> list[str]:
    # llama-specprefill exists once the series is applied
    targets = [t for t in PRODUCT_TARGETS
               if t == "llama-server" or (source / "tools" / t.removeprefix("llama-") / "CMakeLists.txt").is_file()]
    targets += [t for t in BENCH_TARGETS if (source / "tools" / t / "CMakeLists.txt").is_file()]
    if config.rpc:
        targets.append(rpc_server_target(source))
    if config.test_helpers:
        targets += list(TEST_HELPER_TARGETS)
    return targets


def build_argv(cmake: Path, build: Path, targets: list[str], jobs: int | None) -> list[str]:
    argv = [str(cmake), "--build", str(build), "--target", *targets]
    if jobs:
        argv += ["--parallel", str(jobs)]
    return argv
