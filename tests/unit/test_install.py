"""What `--install-deps` / `doctor --fix` would run: one package-manager command per platform for what the doctor
misses, sudo only when not root, pip for CMake and Ninja, and a clear list of what no command can install."""

from __future__ import annotations

import sys

import pytest
from spbuild.building import doctor, install


def report(*checks: tuple[str, str, str | None]) -> doctor.Report:
    return doctor.Report("vulkan", [doctor.Check(name, status, "detail", key) for name, status, key in checks])


MISSING_VULKAN = report(("C++ compiler", doctor.OK, "compiler"), ("Vulkan headers", doctor.FAIL, "vulkan-headers"),
                        ("Vulkan loader", doctor.FAIL, "vulkan-loader"), ("glslc", doctor.FAIL, "glslc"),
                        ("SPIR-V headers", doctor.FAIL, "spirv-headers"), ("Vulkan device", doctor.WARN, "vulkan-device"),
                        ("glslc GL_KHR_cooperative_matrix", doctor.WARN, "vulkan-fast-paths"), ("cmake", doctor.FAIL, "cmake"))


@pytest.mark.parametrize(("text", "manager"), [
    ('ID=debian\nVERSION_ID="12"\n', "apt-get"), ('ID=ubuntu\nID_LIKE=debian\n', "apt-get"),
    ('ID=linuxmint\nID_LIKE="ubuntu debian"\n', "apt-get"), ('ID=fedora\n', "dnf"),
    ('ID="rocky"\nID_LIKE="rhel centos fedora"\n', "dnf"), ('ID=arch\n', None),
])
def test_package_manager_from_os_release(tmp_path, text, manager):
    (tmp_path / "os-release").write_text(text)
    assert install.package_manager("Linux", tmp_path / "os-release") == manager


def test_macos_uses_brew(tmp_path):
    assert install.package_manager("Darwin", tmp_path / "none") == "brew"


def test_debian_as_root_one_apt_command_and_pip():
    plan = install.plan(MISSING_VULKAN, "apt-get", root=True)
    assert plan.commands == [
        ["apt-get", "update", "-qq"],
        ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "--no-install-recommends",
         "libvulkan-dev", "glslc", "spirv-headers", "vulkan-tools", "mesa-vulkan-drivers"],
        [sys.executable, "-m", "pip", "install", "-q", "cmake"],
    ]
    assert plan.cannot == []


def test_not_root_goes_through_sudo(monkeypatch):
    monkeypatch.setattr(install.shutil, "which", lambda name: "/usr/bin/sudo" if name == "sudo" else None)
    plan = install.plan(MISSING_VULKAN, "dnf", root=False)
    assert plan.commands[0][:4] == ["sudo", "dnf", "install", "-y"]
    assert "vulkan-loader-devel" in plan.commands[0] and "spirv-headers-devel" in plan.commands[0]


def test_not_root_without_sudo_says_so(monkeypatch):
    monkeypatch.setattr(install.shutil, "which", lambda name: None)
    plan = install.plan(MISSING_VULKAN, "apt-get", root=False)
    assert [c[-1] for c in plan.commands] == ["cmake"]  # pip needs no root
    assert any("sudo is not there" in c for c in plan.cannot)


def test_brew_never_uses_sudo():
    plan = install.plan(MISSING_VULKAN, "brew", root=False)
    assert plan.commands[0][:2] == ["brew", "install"] and "shaderc" in plan.commands[0]


def test_what_no_manager_installs_is_listed_with_the_advice():
    plan = install.plan(report(("nvcc", doctor.FAIL, "nvcc")), None, root=True)
    assert plan.commands == [] and plan.cannot and "nvcc" in plan.cannot[0]
    # a warning without a package (the SDK's extensions) is not an install
    assert install.plan(report(("glslc GL_EXT_bfloat16", doctor.WARN, "vulkan-sdk")), "apt-get", root=True).commands == []


def test_a_machine_with_only_lavapipe_is_told_about_gpu_drivers_and_installs_nothing(tmp_path, monkeypatch):
    """Mesa's drivers are there already (lavapipe is one of them): installing them again would change nothing."""
    fake = tmp_path / "vulkaninfo"
    fake.write_text("#!/bin/sh\necho 'GPU0:'\necho '\tdeviceType = PHYSICAL_DEVICE_TYPE_CPU'\n"
                    "echo '\tdeviceName = llvmpipe (LLVM 15.0.6, 256 bits)'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    check = doctor.check_vulkan_device()
    assert (check.status, check.advice_key) == (doctor.WARN, "vulkan-gpu")
    assert "llvmpipe" in check.detail and "vendor's Vulkan driver" in check.advice()[0]
    assert install.plan(doctor.Report("vulkan", [check]), "apt-get", root=True).commands == []


def test_nodejs_for_the_tests_is_installed_with_the_rest():
    missing = report(("glslc", doctor.FAIL, "glslc"), ("Node.js (tests)", doctor.WARN, "node"))
    assert install.plan(missing, "apt-get", root=True).commands[1][-3:] == ["glslc", "nodejs", "npm"]
    assert install.plan(missing, "brew", root=True).commands[0] == ["brew", "install", "shaderc", "node"]
