"""Install what the doctor finds missing (`spbuild build --install-deps`, `spbuild doctor --fix`): one command of the
platform's package manager (apt-get, dnf, brew), through sudo when not root, printed before it runs; the Python
tools (CMake, Ninja) through this interpreter's pip."""

from __future__ import annotations

import os
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from spbuild.building import doctor
from spbuild.console import console, info, log_path, run_logged
from spbuild.errors import ToolMissing

# the packages behind each of the doctor's advice keys, per package manager
# warnings worth an install: no Vulkan device (Mesa's drivers), no ccache, no Node.js for the tests' workflow lint
INSTALLED_ON_WARNING = ("vulkan-device", "ccache", "node")
PACKAGES: dict[str, dict[str, tuple[str, ...]]] = {
    "apt-get": {
        "compiler": ("build-essential",), "git": ("git",), "ccache": ("ccache",),
        "vulkan-headers": ("libvulkan-dev",), "vulkan-loader": ("libvulkan-dev",), "glslc": ("glslc",),
        "spirv-headers": ("spirv-headers",), "vulkan-device": ("vulkan-tools", "mesa-vulkan-drivers"),
        "nvcc": ("nvidia-cuda-toolkit",), "node": ("nodejs", "npm"),
    },
    "dnf": {
        "compiler": ("gcc", "gcc-c++"), "git": ("git",), "ccache": ("ccache",),
        "vulkan-headers": ("vulkan-headers", "vulkan-loader-devel"), "vulkan-loader": ("vulkan-loader-devel",),
        "glslc": ("glslc",), "spirv-headers": ("spirv-headers-devel",),
        "vulkan-device": ("vulkan-tools", "mesa-vulkan-drivers"), "node": ("nodejs", "npm"),
    },
    "brew": {
        "git": ("git",), "ccache": ("ccache",), "vulkan-headers": ("vulkan-headers", "vulkan-loader", "molten-vk"),
        "vulkan-loader": ("vulkan-loader", "molten-vk"), "glslc": ("shaderc",), "spirv-headers": ("spirv-headers",),
        "vulkan-device": ("vulkan-tools", "molten-vk"), "node": ("node",),
    },
}
PIP_PACKAGES = {"cmake": "cmake", "ninja": "ninja"}
_UPDATE = {"apt-get": ["apt-get", "update", "-qq"]}
_INSTALL = {"apt-get": ["apt-get", "install", "-y", "--no-install-recommends"], "dnf": ["dnf", "install", "-y"],
            "brew": ["brew", "install"]}


def package_manager(system: str | None = None, os_release: Path = Path("/etc/os-release")) -> str | None:
    """apt-get on Debian and its family, dnf on Fedora and its family, brew on macOS; None elsewhere."""
    system = system or platform.system()
    if system == "Darwin":
        return "brew"
    text = os_release.read_text() if os_release.is_file() else ""
    family = " ".join(line.split("=", 1)[1].strip('"') for line in text.splitlines()
                      if line.startswith(("ID=", "ID_LIKE=")))
    if any(name in family.split() for name in ("debian", "ubuntu")):
        return "apt-get"
    if any(name in family.split() for name in ("fedora", "rhel", "centos")):
        return "dnf"
    return None


@dataclass
class Plan:
    commands: list[list[str]]  # run in order
    cannot: list[str]  # what no command here can install, with the doctor's advice


def plan(report: doctor.Report, manager: str | None, root: bool | None = None) -> Plan:
    """The commands that install what `report` misses (failures, and the warnings of INSTALLED_ON_WARNING)."""
    root = os.geteuid() == 0 if root is None and hasattr(os, "geteuid") else bool(root)
    wanted = [c for c in report.checks if c.status == doctor.FAIL or
              (c.status == doctor.WARN and c.advice_key in INSTALLED_ON_WARNING)]
    system, pip, cannot = [], [], []
    for check in wanted:
        key = check.advice_key or ""
        if key in PIP_PACKAGES:
            pip.append(PIP_PACKAGES[key])
        elif manager and key in PACKAGES.get(manager, {}):
            system += [p for p in PACKAGES[manager][key] if p not in system]
        elif check.status == doctor.FAIL:
            cannot.append(f"{check.name}: {check.detail}; " + "; ".join(check.advice()))
    commands: list[list[str]] = []
    if system and manager:
        sudo = [] if root or manager == "brew" else ["sudo"]
        if sudo and shutil.which("sudo") is None:
            cannot.append(f"installing {' '.join(system)} needs root, and sudo is not there")
        else:
            if manager in _UPDATE:
                commands.append(sudo + _UPDATE[manager])
            env = ["env", "DEBIAN_FRONTEND=noninteractive"] if manager == "apt-get" else []
            commands.append(sudo + env + _INSTALL[manager] + system)
    if pip:
        commands.append([sys.executable, "-m", "pip", "install", "-q", *pip])
    return Plan(commands, cannot)


def fix(backend: str, logs_dir: Path, *, tests: bool = False) -> doctor.Report:
    """Install what the doctor misses for `backend` (and, with `tests`, what the test suite needs beyond the build),
    then diagnose again; the report afterwards."""
    # with the device probe: a machine without a Vulkan driver gets Mesa's (the driver of AMD and Intel GPUs, and
    # lavapipe, the CPU device the tests use)
    report = doctor.diagnose(backend, probe_device=True, tests=tests)
    manager = package_manager()
    steps = plan(report, manager)
    if steps.cannot and not steps.commands:
        raise ToolMissing("cannot install what the build needs here:\n  - " + "\n  - ".join(steps.cannot))
    log = log_path(logs_dir, "install-deps")
    for argv in steps.commands:
        info(f"[bold]$ {' '.join(argv)}[/bold]")
        with console.status(f"{argv[-1] if len(argv) < 6 else 'installing'} (log: {log})"):
            code = run_logged(argv, log)
        if code != 0:
            raise ToolMissing(f"`{' '.join(argv)}` failed (exit code {code})", hint=f"Full log: {log}")
    after = doctor.diagnose(backend, probe_device=False, tests=tests)
    if after.failures:
        left = ", ".join(c.name for c in after.failures)
        raise ToolMissing(f"still missing after the install: {left}", hint="; ".join(steps.cannot) or f"Log: {log}")
    return after
