"""Which glslc a Vulkan build gets: probed with ggml's own feature tests, the modern toolchain only where it adds a
fast path and passes its probes, a given glslc only if it runs. Fake glslc scripts stand in for compilers that lack
extensions; the probes are the tree's real shader files when a fetched tree is there, else copies made here."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from spbuild.building import vulkan_toolchain as vt
from spbuild.errors import ToolMissing

PROBES = {
    "GL_KHR_cooperative_matrix": "coopmat.comp",
    "GL_NV_cooperative_matrix2": "coopmat2.comp",
    "GL_EXT_integer_dot_product": "integer_dot.comp",
    "GL_EXT_bfloat16": "bfloat16.comp",
}


@pytest.fixture
def tree(tmp_path) -> Path:
    """A tree with ggml-vulkan's probe layout: the CMakeLists calls and one shader per extension."""
    vulkan = tmp_path / "tree" / "ggml" / "src" / "ggml-vulkan"
    tests = vulkan / "vulkan-shaders" / "feature-tests"
    tests.mkdir(parents=True)
    calls = []
    for ext, name in PROBES.items():
        (tests / name).write_text(f"#version 460\n#extension {ext} : require\nvoid main() {{}}\n")
        calls.append(f'test_shader_extension_support(\n    "{ext}"\n    "${{CMAKE_CURRENT_SOURCE_DIR}}/vulkan-shaders/'
                     f'feature-tests/{name}"\n    "GGML_VULKAN_X_GLSLC_SUPPORT")\n')
    (vulkan / "CMakeLists.txt").write_text("".join(calls))
    return tmp_path / "tree"


def fake_glslc(path: Path, lacks: list[str], runs: bool = True) -> Path:
    """A glslc that compiles every shader except those requiring an extension in `lacks`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "exit 127\n" if not runs else (
        'if [ "$1" = --version ]; then echo "shaderc vFAKE"; exit 0; fi\n'
        'for a in "$@"; do f="$a"; done\n'
        + "".join(f'if grep -q "{ext}" "$f"; then echo "error: \'#extension\' : extension not supported: {ext}" >&2; '
                  "exit 1; fi\n" for ext in lacks)
        + "exit 0\n")
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def headers(root: Path, defines: list[str]) -> Path:
    (root / "vulkan").mkdir(parents=True)
    (root / "vulkan" / "vulkan_core.h").write_text("".join(f"#define {d} 1\n" for d in defines))
    return root


@pytest.fixture
def system_path(tmp_path, monkeypatch):
    """PATH with only a folder for the fake system glslc (plus what sh and grep need)."""
    bin_dir = tmp_path / "sysbin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("VULKAN_SDK", raising=False)
    return bin_dir


def test_the_real_tree_probes_are_found(h):
    tree = h.REPO_ROOT / ".spbuild" / "src" / "llama.cpp"
    if not (tree / "ggml").is_dir():
        pytest.skip("no fetched tree")
    probes = vt.feature_probes(tree)
    assert set(vt.FAST_PATHS) <= set(probes) and all(p.is_file() for p in probes.values())


def test_probe_uses_the_exit_status(tree, tmp_path):
    glslc = fake_glslc(tmp_path / "g" / "glslc", lacks=["GL_NV_cooperative_matrix2", "GL_EXT_bfloat16"])
    assert vt.probe(glslc, tree) == {"GL_KHR_cooperative_matrix": True, "GL_NV_cooperative_matrix2": False,
                                     "GL_EXT_integer_dot_product": True, "GL_EXT_bfloat16": False}
    # a glslc that does not start passes CMake's stderr check; here it passes nothing
    broken = fake_glslc(tmp_path / "b" / "glslc", lacks=[], runs=False)
    assert not any(vt.probe(broken, tree).values())


def test_a_fast_path_needs_its_header_define(tmp_path):
    include = headers(tmp_path / "inc", ["VK_KHR_cooperative_matrix"])
    choice = vt.Choice("g", "system", "v", dict.fromkeys(vt.FAST_PATHS, True), headers=vt.header_defines(include))
    assert choice.fast_paths == ["GL_KHR_cooperative_matrix", "GL_EXT_integer_dot_product"]
    assert "GL_NV_cooperative_matrix2" in (choice.warning() or "")


def test_auto_keeps_a_system_glslc_that_has_every_fast_path(tree, tmp_path, system_path, monkeypatch):
    fake_glslc(system_path / "glslc", lacks=["GL_EXT_bfloat16"])
    monkeypatch.setattr(vt, "header_defines", lambda include: {"VK_KHR_cooperative_matrix": True,
                                                               "VK_NV_cooperative_matrix2": True})
    monkeypatch.setattr(vt, "install", lambda *a, **k: pytest.fail("the toolchain is not needed"))
    choice = vt.choose("auto", tree, tmp_path / "toolchain")
    assert choice.origin == "system" and len(choice.fast_paths) == 3 and choice.warning() is None
    assert choice.defines() == {"Vulkan_GLSLC_EXECUTABLE": str(system_path / "glslc")}


def complete_toolchain(dest: Path, lacks: list[str]) -> None:
    """A toolchain folder as install() leaves it, with a fake glslc."""
    fake_glslc(dest / "glslc", lacks=lacks)
    headers(dest / "root" / "usr" / "include", ["VK_KHR_cooperative_matrix", "VK_NV_cooperative_matrix2"])
    (dest / "complete").write_text("glslc fake\n")


def test_auto_takes_the_toolchain_that_adds_fast_paths(tree, tmp_path, system_path):
    fake_glslc(system_path / "glslc", lacks=list(PROBES))  # Debian 12's: none
    complete_toolchain(tmp_path / "toolchain", lacks=["GL_EXT_bfloat16"])
    choice = vt.choose("auto", tree, tmp_path / "toolchain")
    assert choice.origin == "toolchain" and len(choice.fast_paths) == 3
    assert choice.defines()["Vulkan_GLSLC_EXECUTABLE"] == str((tmp_path / "toolchain" / "glslc").resolve())
    assert choice.defines()["Vulkan_INCLUDE_DIR"].endswith("root/usr/include")


def test_auto_rejects_a_toolchain_glslc_that_fails_its_probes(tree, tmp_path, system_path):
    fake_glslc(system_path / "glslc", lacks=list(PROBES))
    complete_toolchain(tmp_path / "toolchain", lacks=list(PROBES))  # installed, but it compiles none
    choice = vt.choose("auto", tree, tmp_path / "toolchain")
    assert choice.origin == "system"
    assert "adds no fast path" in choice.note


def test_auto_falls_back_to_the_system_when_the_toolchain_cannot_install(tree, tmp_path, system_path, monkeypatch):
    fake_glslc(system_path / "glslc", lacks=list(PROBES))

    def unreachable(dest: Path) -> vt.Installed:
        raise vt.ToolchainError("no route to the Debian archive")

    monkeypatch.setattr(vt, "install", unreachable)
    choice = vt.choose("auto", tree, tmp_path / "toolchain")
    assert choice.origin == "system" and "no route to the Debian archive" in choice.note
    with pytest.raises(vt.ToolchainError):
        vt.choose("toolchain", tree, tmp_path / "toolchain")


def test_a_given_glslc_must_run(tree, tmp_path, system_path):
    with pytest.raises(ToolMissing, match="not a glslc that runs"):
        vt.choose(str(fake_glslc(tmp_path / "x" / "glslc", lacks=[], runs=False)), tree, tmp_path / "toolchain")
    given = vt.choose(str(fake_glslc(tmp_path / "sdk" / "glslc", lacks=["GL_EXT_bfloat16"])), tree, tmp_path / "tc")
    assert given.origin == "given" and given.extensions["GL_KHR_cooperative_matrix"]


def test_the_toolchain_needs_linux_x86_64_and_dpkg(monkeypatch, tmp_path):
    monkeypatch.setattr(vt.platform, "system", lambda: "Darwin")
    with pytest.raises(vt.ToolchainError, match="Linux x86_64"):
        vt.install(tmp_path / "toolchain")
    assert not (tmp_path / "toolchain").exists()
