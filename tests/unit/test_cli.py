from __future__ import annotations

import os

import pytest

from spbuild.building.build import BuildRecord, find_build, first_error
from spbuild.cli import main
from spbuild.errors import SpbuildError
from spbuild.tree import patches

# --- argument errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "required"),
        (["frobnicate"], "invalid choice"),
        (["build", "--vulkan", "--cuda"], "not allowed with argument"),
        (["build", "--jobs", "many"], "invalid int value"),
        (["fetch", "--no-such-option"], "unrecognized arguments: --no-such-option"),
        (["doctor", "--backend", "opencl"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_non_zero(capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code not in (0, None)
    assert needle in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert "spbuild 0.1.0" in capsys.readouterr().out


def test_not_a_project_is_an_error_with_a_hint(tmp_path, capsys):
    assert main(["fetch", "--project", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "is not a llama-specprefill checkout" in err
    assert "--project" in err


def test_bad_define_is_reported_before_any_work(project, tmp_path, capsys):
    workdir = tmp_path / "wd"
    assert main(["build", "-D", "FOO", "--project", str(project.root), "--workdir", str(workdir)]) == 1
    assert "bad -D 'FOO'" in capsys.readouterr().err
    assert not workdir.exists()  # nothing was fetched


# --- a round through fetch, patch and export-patches --------------------------------------------------------


def test_fetch_patch_export_through_the_cli(h, project, upstream, workspace, capsys):
    common = ["--project", str(project.root), "--workdir", str(workspace.root)]
    assert main(["fetch", "--source", str(upstream.path), *common]) == 0
    assert h.git(workspace.source_dir, "rev-parse", "HEAD") == upstream.c1
    assert main(["fetch", *common]) == 0  # reused: the pin's unreachable URL is never tried
    assert "already fetched" in capsys.readouterr().err

    assert main(["patch", *common]) == 0
    assert "applied" in capsys.readouterr().err
    assert h.git(workspace.source_dir, "rev-parse", "--abbrev-ref", "HEAD") == patches.BRANCH
    assert main(["export-patches", "--check", *common]) == 0

    (workspace.source_dir / "README.md").write_text("changed in the tree\n")
    h.commit_all(workspace.source_dir, "readme: change")
    assert main(["export-patches", "--check", *common]) == 1
    assert "would change: patches/0003-readme-change.patch" in capsys.readouterr().err
    assert not (project.patches_dir / "0003-readme-change.patch").exists()
    assert main(["export-patches", *common]) == 0
    assert (project.patches_dir / "0003-readme-change.patch").is_file()
    assert main(["export-patches", "--check", *common]) == 0


def test_patch_conflict_exits_3(h, tmp_path, pin, upstream, workspace, capsys):
    ours = ("common: ours", [("common/common.cpp", "common line 6\n", "common line 6 ours\n")])
    theirs = ("common: theirs", [("common/common.cpp", "common line 6\n", "common line 6 theirs\n")])
    project = h.make_project(tmp_path / "p", pin, upstream, [ours])
    [extra] = h.make_patch_files(upstream, pin.commit, [theirs], tmp_path / "theirs", tmp_path / "scratch2")
    (project.patches_dir / extra.name).write_bytes(extra.read_bytes())
    project.series_file.write_text(f"0001-common-ours.patch\n{extra.name}\n")
    common = ["--project", str(project.root), "--workdir", str(workspace.root)]
    assert main(["fetch", "--source", str(upstream.path), *common]) == 0
    assert main(["patch", *common]) == 3
    err = capsys.readouterr().err
    assert "patch 0001-common-theirs.patch does not apply" in err
    assert "common/common.cpp" in err
    assert "export-patches" in err  # the hint


# --- build helpers ------------------------------------------------------------------------------------------

COMPILER_LOG = """\
-- Configuring done
[12/80] Building CXX object common/CMakeFiles/common.dir/arg.cpp.o
FAILED: common/CMakeFiles/common.dir/speculative.cpp.o
/usr/bin/c++ -DGGML_USE_VULKAN -Werror=return-type -O3 -c /src/common/speculative.cpp -o speculative.cpp.o
/src/common/speculative.cpp:42:5: warning: unused variable 'n' [-Wunused-variable]
/src/common/speculative.cpp:57:12: error: 'llama_draft' was not declared in this scope
   57 |     return llama_draft(ctx);
      |            ^~~~~~~~~~~
/src/common/speculative.cpp:90:1: error: expected ';' before '}' token
ninja: build stopped: subcommand failed.
""".splitlines()


def test_first_error_finds_the_first_compiler_error():
    found = first_error(COMPILER_LOG)
    assert found is not None
    shown = found.splitlines()
    assert shown[0] == "/src/common/speculative.cpp:57:12: error: 'llama_draft' was not declared in this scope"
    assert len(shown) == 4  # the error and 3 lines of context
    assert shown[1].strip().startswith("57 |")
    assert first_error(COMPILER_LOG, context=1) == shown[0]


@pytest.mark.parametrize(
    "line",
    [
        "CMake Error at ggml/src/ggml-vulkan/CMakeLists.txt:10 (find_package):",
        "/usr/bin/ld: libllama.a(llama.o): undefined reference to `ggml_foo'",
        "ninja: error: unknown target 'llama-specprefill'",
        "/src/x.cpp:1:10: fatal error: vulkan/vulkan.hpp: No such file or directory",
    ],
)
def test_first_error_kinds(line):
    assert first_error(["-- ok", "[1/2] Building", line, "after"], context=2) == f"{line}\nafter"


def test_first_error_none_in_a_clean_log():
    clean = ["-- The C compiler identification is GNU 12.2.0", "-- Configuring done",
             "/usr/bin/c++ -Werror=return-type -c a.cpp", "a.cpp:3:1: warning: unused [-Wunused]",
             "-- Build files have been written to: /b"]
    assert first_error(clean) is None


def test_find_build_picks_the_backend_or_the_newest(workspace):
    with pytest.raises(SpbuildError, match=r"^no vulkan build in ") as err:
        find_build(workspace, "vulkan")
    with pytest.raises(SpbuildError, match=r"^no build in "):
        find_build(workspace, None)
    assert "spbuild build --vulkan" in (err.value.hint or "")

    for i, backend in enumerate(("cpu", "vulkan")):
        d = workspace.build_dir(backend)
        d.mkdir(parents=True)
        BuildRecord(backend, str(d), "a" * 40, [], ["llama-server"], {}, {}).save()
        os.utime(d / "spbuild-build.json", (1000 + i, 1000 + i))
    assert find_build(workspace, "cpu").backend == "cpu"
    assert find_build(workspace, None).backend == "vulkan"
    with pytest.raises(SpbuildError):
        find_build(workspace, "cuda")
    # a sanitizer build, however new, only when asked for
    with pytest.raises(SpbuildError, match="no sanitizer build") as err:
        find_build(workspace, None, sanitized=True)
    assert "--sanitize address,undefined" in (err.value.hint or "")
    d = workspace.build_dir("cpu-asan-ubsan")
    d.mkdir(parents=True)
    BuildRecord("cpu", str(d), "a" * 40, [], ["llama-server"], {}, {}, sanitize=["address", "undefined"]).save()
    assert find_build(workspace, None).backend == "vulkan"
    assert find_build(workspace, None, sanitized=True).build_dir == str(d)
