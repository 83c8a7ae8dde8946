"""`spbuild rebase` and `--bisect` on synthetic upstream repositories: a clean rebase, offsets, a real conflict
(an upstream commit that edits the lines a patch touches), `--continue` after a fix by hand, the pin not moving on
a failed build, a green build and test run moving pin.toml and patches/, and bisect finding a planted first-bad
commit."""

from __future__ import annotations

import json
from pathlib import Path

import git
import pytest
from spbuild.building import cmake
from spbuild.errors import SpbuildError
from spbuild.tree import patches, sources
from spbuild.tree.pin import Pin, load_pin
from spbuild.upstream import bisect, rebase

NO_BUILD = rebase.RebaseOptions(build=False)


def advance(h, upstream, message: str, edits: list[tuple[str, str, str]]) -> str:
    """A new upstream commit (on a clone of the session's upstream) that applies `edits`; returns its id."""
    for rel, old, new in edits:
        path = upstream / rel
        text = path.read_text() if path.exists() else ""
        assert old in text
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace(old, new, 1))
    return h.commit_all(upstream, message)


@pytest.fixture
def up(h, upstream, tmp_path):
    """A private clone of the two-commit upstream, to add commits to."""
    h.git(tmp_path, "clone", "-q", str(upstream.path), "up")
    repo = tmp_path / "up"
    h.git(repo, "checkout", "-q", "-B", "main", upstream.c2)
    return repo


@pytest.fixture
def setup(h, up, upstream, tmp_path, workspace):
    """Project (two patches on the pin c1) and the fetched tree, from the private upstream."""
    pin = Pin(url=str(up), commit=upstream.c1, pypi=None)
    project = h.make_project(tmp_path / "project", pin, upstream, [h.PATCH_COMMON, h.PATCH_GGML])
    sources.fetch(pin, workspace, sources.SourceSpec.parse(str(up)))
    patches.apply_series(project, pin, workspace.source_dir)
    return project, pin


def statuses(report) -> dict[str, str]:
    return {p.name: p.status for p in report.patches}


def test_clean_rebase_reports_every_patch_and_leaves_the_pin(h, up, setup, workspace):
    project, pin = setup
    target = advance(h, up, "upstream: docs only", [("docs.md", "later\n", "later, and more\n")])
    before = project.pin_file.read_text()
    report = rebase.start(project, workspace, pin, target, NO_BUILD)
    assert statuses(report) == {"0001-common-say-hello.patch": rebase.CLEAN, "0002-ggml-tweak-line-9.patch": rebase.CLEAN}
    assert report.status == "applied"
    tree = rebase.rebase_tree(workspace)
    assert h.git(tree, "log", "--format=%s", f"{target}..HEAD").splitlines() == [
        "ggml: tweak line 9", "common: say hello", patches.OVERLAY_SUBJECT]
    assert project.pin_file.read_text() == before  # no --update-pin
    # the report is on disk, as JSON and Markdown, and names the target
    [json_file] = rebase.reports_dir(workspace).glob("rebase-*.json")
    data = json.loads(json_file.read_text())
    assert data["target"]["commit"] == target and data["status"] == "applied"
    assert "| 0001-common-say-hello.patch | clean |" in json_file.with_suffix(".md").read_text()
    # the pinned tree was not touched
    assert patches.TreeState.load(git.Repo(workspace.source_dir)).fingerprint == patches.fingerprint(project, pin)


def test_a_rebase_in_a_fresh_working_folder_fetches_the_pin_first(h, up, upstream, tmp_path, workspace):
    # as `spbuild build` does: no `spbuild fetch` needed before it
    pin = Pin(url=str(up), commit=upstream.c1, pypi=None)
    project = h.make_project(tmp_path / "project", pin, upstream, [h.PATCH_COMMON, h.PATCH_GGML])
    assert not workspace.source_dir.exists()
    target = advance(h, up, "upstream: docs only", [("docs.md", "later\n", "later, and more\n")])
    report = rebase.start(project, workspace, pin, target, NO_BUILD)
    assert report.status == "applied", report
    assert git.Repo(workspace.source_dir).commit(pin.commit).hexsha == pin.commit


def test_offsets_are_reported_per_hunk(h, up, setup, workspace):
    project, pin = setup
    target = advance(h, up, "upstream: a header", [("common/common.cpp", "common line 1\n",
                                                     "// header a\n// header b\n// header c\ncommon line 1\n")])
    report = rebase.start(project, workspace, pin, target, NO_BUILD)
    outcome = next(p for p in report.patches if p.name.startswith("0001"))
    assert outcome.status == rebase.OFFSET
    assert outcome.offsets == ["common/common.cpp: hunk #1 at line 7 (offset 3 lines)"]


def test_conflict_names_patch_hunk_and_upstream_commit_then_continue(h, up, setup, workspace):
    project, pin = setup
    target = advance(h, up, "upstream: rework line 6", [("common/common.cpp", "common line 6\n", "common line 6 reworked\n")])
    report = rebase.start(project, workspace, pin, target, NO_BUILD)
    conflict = report.patches[0]
    assert report.status == rebase.CONFLICT and conflict.status == rebase.CONFLICT
    assert conflict.files == ["common/common.cpp"]
    assert conflict.hunks and conflict.hunks[0].startswith("common/common.cpp:")
    # the upstream commit that touched those lines, found through history
    assert any("upstream: rework line 6" in c for c in conflict.upstream_changes)
    # the later patch was tried too (survey), and it applies
    assert report.patches[1].status == rebase.CLEAN
    assert report.patches[1].after_skipped == ["0001-common-say-hello.patch"]
    tree = rebase.rebase_tree(workspace)
    assert (tree / ".git").exists() and "<<<<<<<" in (tree / "common/common.cpp").read_text()
    assert "spbuild rebase --continue" in report.next_step

    with pytest.raises(SpbuildError, match="already in progress"):
        rebase.start(project, workspace, pin, target, NO_BUILD)
    with pytest.raises(SpbuildError, match="not resolved"):
        rebase.resume(project, workspace, NO_BUILD)

    # the maintainer resolves with plain git, then continues
    text = (tree / "common/common.cpp").read_text()
    resolved = text.split("<<<<<<<")[0] + "common line 6 reworked\nhello from a patch\n" + text.split(">>>>>>>")[1].split("\n", 1)[1]
    (tree / "common/common.cpp").write_text(resolved)
    h.git(tree, "add", "common/common.cpp")
    report = rebase.resume(project, workspace, NO_BUILD)
    assert statuses(report) == {"0001-common-say-hello.patch": rebase.RESOLVED, "0002-ggml-tweak-line-9.patch": rebase.CLEAN}
    assert report.status == "applied"
    candidate = Path(report.candidate_patches)
    assert sorted(p.name for p in candidate.glob("*.patch")) == ["0001-common-say-hello.patch", "0002-ggml-tweak-line-9.patch"]
    assert "reworked" in (candidate / "0001-common-say-hello.patch").read_text()

    rebase.abort(workspace)
    assert not tree.exists() and rebase.in_progress(workspace) is None


def _cmake_upstream(h, up, fails: bool) -> str:
    body = 'message(FATAL_ERROR "upstream broke the build")\n' if fails else \
        'add_custom_target(hello ALL COMMAND ${CMAKE_COMMAND} -E echo hello)\n'
    cmakelists = f"cmake_minimum_required(VERSION 3.14)\nproject(standin NONE)\n{body}"
    return advance(h, up, "upstream: a build", [("CMakeLists.txt", "", cmakelists)])


def _options(update_pin: bool) -> rebase.RebaseOptions:
    return rebase.RebaseOptions(update_pin=update_pin, config=cmake.BuildConfig(targets=["hello"], test_helpers=False))


def test_pin_does_not_move_when_the_build_fails(h, up, setup, workspace):
    project, pin = setup
    target = _cmake_upstream(h, up, fails=True)
    pin_before = project.pin_file.read_text()
    patches_before = {p.name: p.read_bytes() for p in project.patches_dir.iterdir()}
    report = rebase.start(project, workspace, pin, target, _options(update_pin=True))
    assert report.status == "build failed" and not report.pin_updated
    assert "upstream broke the build" in report.build.detail
    assert project.pin_file.read_text() == pin_before
    assert {p.name: p.read_bytes() for p in project.patches_dir.iterdir()} == patches_before
    assert rebase.in_progress(workspace) is not None  # fix it in the worktree, then --continue


def test_green_build_and_tests_move_pin_and_patches(h, up, setup, workspace):
    project, pin = setup
    (project.root / "tests" / "integration").mkdir(parents=True)
    (project.root / "tests" / "integration" / "test_standin.py").write_text(
        "import os\n\ndef test_build_dir_given():\n    assert os.path.isdir(os.environ['SPBUILD_BUILD_DIR'])\n")
    target = _cmake_upstream(h, up, fails=False)
    report = rebase.start(project, workspace, pin, target, _options(update_pin=True))
    assert report.build.ok and report.tests.ok and report.tests.passed == 1, report.markdown()
    assert report.status == "green" and report.pin_updated
    moved = load_pin(project.pin_file)
    assert moved.commit == target and moved.url == pin.url
    # patches/ now apply to the new pin: the pinned tree re-applies on the next build, cleanly
    assert rebase.in_progress(workspace) is None and not rebase.rebase_tree(workspace).exists()
    result = patches.apply_series(project, moved, workspace.source_dir)
    assert result.applied == ["0001-common-say-hello.patch", "0002-ggml-tweak-line-9.patch"]


def test_green_run_then_update_pin_does_not_build_and_test_again(h, up, setup, workspace):
    project, pin = setup
    (project.root / "tests" / "integration").mkdir(parents=True)
    marker = workspace.root / "test-runs"
    (project.root / "tests" / "integration" / "test_standin.py").write_text(
        f"def test_counts():\n    with open({str(marker)!r}, 'a') as f:\n        f.write('x')\n")
    target = _cmake_upstream(h, up, fails=False)
    report = rebase.start(project, workspace, pin, target, _options(update_pin=False))
    assert report.status == "green" and not report.pin_updated
    assert "--update-pin" in report.next_step
    report = rebase.resume(project, workspace, _options(update_pin=True))
    assert report.pin_updated and report.build is None and report.tests is None
    assert marker.read_text() == "x"  # the tests ran once
    assert load_pin(project.pin_file).commit == target


def test_an_upstream_file_where_cpp_has_one_is_reported(h, up, setup, workspace):
    project, pin = setup
    target = advance(h, up, "upstream: adds our file", [("common/new-file.cpp", "", "// upstream's own\n")])
    report = rebase.start(project, workspace, pin, target, NO_BUILD)
    assert report.status == "overlay conflict"
    assert "cpp/common/new-file.cpp would overwrite upstream file common/new-file.cpp" in report.overlay
    assert {p.status for p in report.patches} == {rebase.NOT_TRIED}
    assert rebase.in_progress(workspace) is None  # nothing to continue: cpp/ must change first


def test_tests_failing_keep_the_pin(h, up, setup, workspace):
    project, pin = setup
    (project.root / "tests" / "integration").mkdir(parents=True)
    (project.root / "tests" / "integration" / "test_standin.py").write_text("def test_fails():\n    assert False\n")
    target = _cmake_upstream(h, up, fails=False)
    before = project.pin_file.read_text()
    report = rebase.start(project, workspace, pin, target, _options(update_pin=True))
    assert report.status == "tests failed" and report.tests.failed == 1 and not report.pin_updated
    assert report.tests.failures == ["tests.integration.test_standin::test_fails"]
    assert project.pin_file.read_text() == before


def test_bisect_finds_the_planted_first_bad_commit(h, up, setup, workspace, upstream):
    project, pin = setup
    ids = []
    for i in range(1, 7):
        if i == 4:  # the planted break: upstream rewrites the line PATCH_GGML edits
            ids.append(advance(h, up, "upstream: rewrite ggml line 9", [("ggml/src/ggml.c", "ggml line 9\n", "ggml line nine\n")]))
        else:
            ids.append(advance(h, up, f"upstream: docs {i}", [("docs.md", "later", f"later {i}")]))
    h.git(workspace.source_dir, "fetch", "-q", str(up), "main")
    report = bisect.bisect(project, workspace, pin, f"{upstream.c2}..{ids[-1]}")
    verdicts = {v.name: v for v in report.verdicts}
    assert verdicts["0001-common-say-hello.patch"].first_bad == ""
    broken = verdicts["0002-ggml-tweak-line-9.patch"]
    assert broken.first_bad == ids[3][:12] and broken.last_good == ids[2][:12]
    assert broken.files == ["ggml/src/ggml.c"]
    assert any("rewrite ggml line 9" in c for c in broken.upstream_changes)
    assert len(report.probed) < len(report.points)  # a search, not a scan


# --- the command line -----------------------------------------------------------------------------------------


def test_cli_rebase_exit_codes_and_status(h, up, setup, workspace, capsys):
    from spbuild.cli import main

    def output() -> str:
        captured = capsys.readouterr()
        return captured.out + captured.err

    project, _ = setup
    where = ["--project", str(project.root), "--workdir", str(workspace.root)]
    assert main(["rebase", *where]) == 1
    assert "say one of --onto" in output()
    assert main(["status", *where]) == 0
    out = output()
    assert "0001-common-say-hello" in out and "branch spbuild = pin + cpp/ + 2 patch(es)" in out

    target = advance(h, up, "upstream: rework line 6", [("common/common.cpp", "common line 6\n", "common line 6 x\n")])
    assert main(["rebase", "--onto", target, "--no-build", *where]) == 3  # a conflict
    out = output()
    assert "conflict" in out and "common/common.cpp" in out and "spbuild rebase --continue" in out
    assert main(["status", *where]) == 0
    assert "rebase onto" in output()
    assert main(["rebase", "--abort", *where]) == 0
    assert rebase.in_progress(workspace) is None


def test_health_counts_upstream_lines_but_not_new_files(h, upstream, tmp_path):
    from spbuild.upstream import health

    pin = Pin(url=str(upstream.path), commit=upstream.c1, pypi=None)
    new_file = ("add a file", [("common/added.cpp", "", "one\ntwo\n")])
    project = h.make_project(tmp_path / "p", pin, upstream, [h.PATCH_COMMON, new_file])
    first, second = health.series_health(project)
    assert first.subject == "common: say hello"
    assert [(f.path, f.added, f.removed, f.new) for f in first.files] == [("common/common.cpp", 1, 0, False)]
    assert first.upstream_lines == 1 and first.hunks == 1
    assert second.upstream_files == [] and second.upstream_lines == 0  # a new file is ours, not an upstream hook
    assert health.totals([first, second]) == {"patches": 2, "upstream_files": 1, "hunks": 1, "upstream_lines": 1}


def test_cpp_edits_during_a_rebase_replace_the_worktree_overlay(h, up, setup, workspace):
    """Fixing cpp/ for the new upstream: --continue rebuilds the worktree's overlay commit from cpp/, patches on top."""
    project, pin = setup
    target = advance(h, up, "upstream: docs", [("docs.md", "later\n", "later, again\n")])
    rebase.start(project, workspace, pin, target, NO_BUILD)
    (project.overlay_dir / "common" / "new-file.cpp").write_text("// fixed for the new upstream\n")
    report = rebase.resume(project, workspace, NO_BUILD)
    tree = rebase.rebase_tree(workspace)
    assert (tree / "common" / "new-file.cpp").read_text() == "// fixed for the new upstream\n"
    assert h.git(tree, "log", "--format=%s", f"{target}..HEAD").splitlines() == [
        "ggml: tweak line 9", "common: say hello", patches.OVERLAY_SUBJECT]
    assert report.status == "applied"
    # an amended overlay commit in the worktree as well: one of the two must go
    h.git(tree, "checkout", "-q", "HEAD~2")
    (tree / "common" / "new-file.cpp").write_text("// amended in the worktree\n")
    h.git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    (project.overlay_dir / "common" / "new-file.cpp").write_text("// and edited in cpp/ again\n")
    with pytest.raises(SpbuildError, match="cpp/ changed in the project, and the overlay commit was amended"):
        rebase.resume(project, workspace, NO_BUILD)
