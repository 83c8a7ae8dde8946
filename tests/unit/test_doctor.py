from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from spbuild.building import doctor, vulkan_toolchain
from spbuild.building.doctor import FAIL, OK, WARN, Check

SYSTEM_GLSLC = "/usr/bin/glslc"
needs_glslc = pytest.mark.skipif(not Path(SYSTEM_GLSLC).is_file(), reason="glslc is not installed here")


def write_vulkan_header(base: Path, minor: int, patch: int) -> Path:
    header = base / "vulkan" / "vulkan_core.h"
    header.parent.mkdir(parents=True, exist_ok=True)
    header.write_text(
        "// fake\n"
        f"#define VK_HEADER_VERSION {patch}\n"
        f"#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, {minor}, VK_HEADER_VERSION)\n"
    )
    return header


def test_vulkan_header_version(tmp_path):
    header = write_vulkan_header(tmp_path, 3, 239)
    assert doctor.vulkan_header_version([tmp_path]) == ((1, 3, 239), header)


def test_vulkan_header_version_first_dir_wins_and_missing(tmp_path):
    write_vulkan_header(tmp_path / "a", 3, 280)
    write_vulkan_header(tmp_path / "b", 3, 239)
    assert doctor.vulkan_header_version([tmp_path / "none", tmp_path / "a", tmp_path / "b"])[0] == (1, 3, 280)
    assert doctor.vulkan_header_version([tmp_path / "none"]) is None
    (tmp_path / "c" / "vulkan").mkdir(parents=True)
    (tmp_path / "c" / "vulkan" / "vulkan_core.h").write_text("#define VK_HEADER_VERSION 239\n")  # incomplete
    assert doctor.vulkan_header_version([tmp_path / "c"]) is None


@pytest.mark.parametrize(("patch", "note"), [(239, True), (261, False), (290, False)])
def test_check_vulkan_headers_notes_old_headers(tmp_path, monkeypatch, patch, note):
    write_vulkan_header(tmp_path, 3, patch)
    monkeypatch.setattr(doctor, "_include_dirs", lambda: [tmp_path])
    check = doctor.check_vulkan_headers()
    assert check.status == OK
    assert f"1.3.{patch}" in check.detail
    assert ("compatibility patch" in check.detail) == note


@pytest.mark.parametrize(
    ("key", "debian", "fedora", "macos"),
    [
        ("vulkan-headers", "sudo apt-get install -y libvulkan-dev",
         "sudo dnf install -y vulkan-headers vulkan-loader-devel",
         "brew install vulkan-headers vulkan-loader molten-vk"),
        ("glslc", "sudo apt-get install -y glslc", "sudo dnf install -y glslc", "brew install shaderc"),
        ("spirv-headers", "sudo apt-get install -y spirv-headers", "sudo dnf install -y spirv-headers-devel",
         "brew install spirv-headers"),
    ],
)
def test_advice_lines(key, debian, fedora, macos):
    assert Check("x", FAIL, "missing", key).advice() == [
        f"Debian/Ubuntu: {debian}", f"Fedora: {fedora}", f"macOS: {macos}"]
    assert Check("x", WARN, "meh", key).advice()[0] == f"Debian/Ubuntu: {debian}"


def test_no_advice_when_ok_or_without_key():
    assert Check("x", OK, "fine", "glslc").advice() == []
    assert Check("x", FAIL, "missing").advice() == []


def test_every_advice_entry_has_three_platforms():
    assert all(len(v) == 3 and all(v) for v in doctor.ADVICE.values())


@pytest.fixture
def bare_machine(tmp_path, monkeypatch):
    """No programs on PATH, no include directories, no SDK, no compiler override."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    for var in ("VULKAN_SDK", "CXX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "no-cuda"))  # else /usr/local/cuda is looked at
    monkeypatch.setattr(doctor, "_include_dirs", lambda: [tmp_path])
    return empty


def test_diagnose_vulkan_on_a_bare_machine(bare_machine):
    report = doctor.diagnose("vulkan")
    failed = {c.name: c for c in report.failures}
    for name in ("Vulkan headers", "Vulkan loader", "glslc", "SPIR-V headers", "C++ compiler", "git"):
        assert name in failed, name
    advice = "\n".join(line for c in report.failures for line in c.advice())
    assert "sudo apt-get install -y libvulkan-dev" in advice
    assert "sudo apt-get install -y glslc" in advice
    assert "sudo apt-get install -y spirv-headers" in advice
    assert "\n".join(failed["SPIR-V headers"].advice()).count("spirv-headers") == 3
    # no glslc: no shader probes; no vulkaninfo: a warning, not a failure
    assert not [c for c in report.checks if c.name.startswith("glslc GL_")]
    device = next(c for c in report.checks if c.name == "Vulkan device")
    assert device.status == WARN


def test_diagnose_vulkan_finds_headers_in_the_include_dirs(bare_machine, tmp_path):
    write_vulkan_header(tmp_path, 3, 275)
    (tmp_path / "spirv" / "unified1").mkdir(parents=True)
    (tmp_path / "spirv" / "unified1" / "spirv.hpp").write_text("// spirv\n")
    report = doctor.diagnose("vulkan", probe_device=False)
    status = {c.name: c.status for c in report.checks}
    assert status["Vulkan headers"] == OK
    assert status["SPIR-V headers"] == OK
    assert status["glslc"] == FAIL
    assert "Vulkan device" not in status


def test_diagnose_other_backends(bare_machine):
    names = {b: {c.name for c in doctor.diagnose(b).failures} for b in ("cuda", "sycl", "hip")}
    assert "nvcc" in names["cuda"]
    assert "icpx (oneAPI DPC++)" in names["sycl"]
    assert "hipcc (ROCm)" in names["hip"]
    assert "Vulkan headers" not in names["cuda"]


def test_vulkan_sdk_glslc_takes_precedence(tmp_path, monkeypatch):
    sdk_glslc = tmp_path / "sdk" / "bin" / "glslc"
    sdk_glslc.parent.mkdir(parents=True)
    sdk_glslc.write_text("#!/bin/sh\n")
    monkeypatch.setenv("VULKAN_SDK", str(tmp_path / "sdk"))
    assert doctor.glslc_path() == str(sdk_glslc)


def make_fake_glslc(where: Path, unsupported: list[str]) -> Path:
    """A glslc that rejects the given extensions the way shaderc does."""
    where.mkdir(parents=True, exist_ok=True)
    script = where / "glslc"
    grep = shutil.which("grep")  # absolute: the tests run it with PATH narrowed to `where`
    checks = "".join(
        f'if {grep} -q "{ext} " "$src"; then echo "$src:2: error: \'#extension\' : extension not supported: {ext}" >&2;'
        " exit 1; fi\n" for ext in unsupported)
    script.write_text("#!/bin/sh\nfor src; do :; done\n" + checks + "exit 0\n")
    script.chmod(0o755)
    return script


def _supports(glslc: str | Path, extension: str, tmp_path: Path) -> bool:
    shader = tmp_path / "probe.comp"
    shader.write_text(f"#version 460\n#extension {extension} : require\nvoid main() {{}}\n")
    return vulkan_toolchain.compiles(Path(glslc), shader)


def test_shader_feature_probe_with_a_fake_glslc(tmp_path, monkeypatch):
    fake = make_fake_glslc(tmp_path / "bin", ["GL_KHR_cooperative_matrix", "GL_EXT_bfloat16"])
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("VULKAN_SDK", raising=False)
    # before anything is fetched: a minimal shader for each extension ggml-vulkan probes for
    checks = {c.name: c for c in doctor.check_shader_features()}
    assert checks["glslc GL_KHR_cooperative_matrix"].status == WARN
    assert checks["glslc GL_EXT_bfloat16"].status == WARN
    assert checks["glslc GL_EXT_integer_dot_product"].status == OK
    assert checks["glslc GL_NV_cooperative_matrix2"].status == OK
    report = doctor.Report("vulkan", list(checks.values()))
    warning = report.shader_warning()
    assert warning is not None
    assert "GL_KHR_cooperative_matrix" in warning and "GL_EXT_bfloat16" in warning
    assert "GL_EXT_integer_dot_product" not in warning
    # the advice is spbuild's own toolchain first, not a manual SDK install
    advice = checks["glslc GL_KHR_cooperative_matrix"].advice()[0]
    assert "spbuild build --vulkan" in advice and "trixie" in advice
    assert doctor.Report("vulkan", [checks["glslc GL_EXT_integer_dot_product"]]).shader_warning() is None
    assert fake.exists()


def test_with_a_fetched_tree_the_doctor_runs_the_trees_own_probes(tmp_path, monkeypatch):
    make_fake_glslc(tmp_path / "bin", ["GL_KHR_cooperative_matrix"])
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("VULKAN_SDK", raising=False)
    vulkan = tmp_path / "tree" / "ggml" / "src" / "ggml-vulkan"
    tests = vulkan / "vulkan-shaders" / "feature-tests"
    tests.mkdir(parents=True)
    (tests / "coopmat.comp").write_text("#version 460\n#extension GL_KHR_cooperative_matrix : require\nvoid main() {}\n")
    (tests / "integer_dot.comp").write_text("#version 460\n#extension GL_EXT_integer_dot_product : require\nvoid main() {}\n")
    (vulkan / "CMakeLists.txt").write_text(
        'test_shader_extension_support(\n    "GL_KHR_cooperative_matrix"\n    "${CMAKE_CURRENT_SOURCE_DIR}/vulkan-shaders/'
        'feature-tests/coopmat.comp"\n    "GGML_VULKAN_COOPMAT_GLSLC_SUPPORT")\n'
        'test_shader_extension_support(\n    "GL_EXT_integer_dot_product"\n    "${CMAKE_CURRENT_SOURCE_DIR}/vulkan-shaders/'
        'feature-tests/integer_dot.comp"\n    "GGML_VULKAN_INTEGER_DOT_GLSLC_SUPPORT")\n')
    checks = {c.name: c.status for c in doctor.check_shader_features(tmp_path / "tree")}
    assert checks == {"glslc GL_KHR_cooperative_matrix": WARN, "glslc GL_EXT_integer_dot_product": OK}


def test_a_glslc_that_does_not_run_supports_nothing(tmp_path):
    assert not _supports(tmp_path / "no-glslc", "GL_EXT_shader_explicit_arithmetic_types", tmp_path)


@needs_glslc
def test_system_glslc_lacks_cooperative_matrix():
    assert vulkan_toolchain.probe(Path(SYSTEM_GLSLC), None)["GL_KHR_cooperative_matrix"] is False


@needs_glslc
def test_system_glslc_has_explicit_arithmetic_types(tmp_path):
    # verified on this machine (Debian 12, shaderc 2023.2): a long-standing extension compiles
    assert _supports(SYSTEM_GLSLC, "GL_EXT_shader_explicit_arithmetic_types", tmp_path) is True


@needs_glslc
def test_system_glslc_rejects_a_made_up_extension(tmp_path):
    assert _supports(SYSTEM_GLSLC, "GL_EXT_no_such_extension_spbuild", tmp_path) is False


def test_check_program_and_tool(bare_machine):
    assert doctor.check_program("icpx", "icpx").status == FAIL
    check = doctor.check_tool("cmake", lambda: None, (3, 19))
    assert (check.status, check.detail, check.advice_key) == (FAIL, "no cmake >= 3.19", "cmake")
    assert shutil.which("git") is None  # the fixture really emptied PATH


def test_a_checkout_without_nodejs_is_warned_for_the_workflow_lint(bare_machine):
    assert "Node.js (tests)" not in {c.name for c in doctor.diagnose("cpu").checks}  # an installed spbuild has no tests
    node = next(c for c in doctor.diagnose("cpu", tests=True).checks if c.name == "Node.js (tests)")
    assert node.status == WARN and "node and npm not found" in node.detail
    assert node.advice()[0] == "Debian/Ubuntu: sudo apt-get install -y nodejs npm"
