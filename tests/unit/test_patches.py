from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from spbuild.errors import PatchConflict, SpbuildError
from spbuild.project import Project, Workspace
from spbuild.tree import patches, sources


def head(h, tree) -> str:
    return h.git(tree, "rev-parse", "HEAD")


def reflog_len(h, tree) -> int:
    return len(h.git(tree, "reflog", "show", "HEAD").splitlines())


def subjects(h, tree, rev_range) -> list[str]:
    return h.git(tree, "log", "--reverse", "--format=%s", rev_range).splitlines()


def assert_clean_at_pin(h, tree, pin):
    assert head(h, tree) == pin.commit
    assert h.git(tree, "rev-parse", "--abbrev-ref", "HEAD") == patches.BRANCH
    assert h.git(tree, "status", "--porcelain", "--untracked-files=all") == ""
    assert not (tree / ".git" / "rebase-apply").exists()


# --- series and overlay listing -----------------------------------------------------------------------------


def test_read_series_skips_comments_and_blank_lines(project):
    names = [p.name for p in patches.read_series(project)]
    assert names == ["0001-common-say-hello.patch", "0002-ggml-tweak-line-9.patch"]
    project.series_file.write_text("# the series\n\n0002-ggml-tweak-line-9.patch  # second first\n"
                                   "0001-common-say-hello.patch\n")
    assert [p.name for p in patches.read_series(project)] == ["0002-ggml-tweak-line-9.patch",
                                                              "0001-common-say-hello.patch"]


def test_read_series_names_missing_files(project):
    project.series_file.write_text("0001-common-say-hello.patch\n0099-gone.patch\n")
    with pytest.raises(SpbuildError, match="0099-gone.patch"):
        patches.read_series(project)


def test_overlay_files_are_relative_and_skip_pycache(project):
    (project.overlay_dir / "tools" / "x" / "__pycache__").mkdir(parents=True)
    (project.overlay_dir / "tools" / "x" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    (project.overlay_dir / "tools" / "x" / "CMakeLists.txt").write_text("# x\n")
    assert [str(p) for p in patches.overlay_files(project)] == ["common/new-file.cpp", "tools/x/CMakeLists.txt"]


def test_project_locate(project, tmp_path):
    assert Project.locate(project.root) == project
    assert Project.locate(start=project.root / "cpp" / "common") == project
    with pytest.raises(SpbuildError, match="pin.toml, cpp/ and patches/series"):
        Project.locate(tmp_path)


# --- apply --------------------------------------------------------------------------------------------------


def test_apply_series(h, project, pin, tree):
    result = patches.apply_series(project, pin, tree)
    assert not result.reused
    assert result.applied == ["0001-common-say-hello.patch", "0002-ggml-tweak-line-9.patch"]
    assert result.overlay_files == 1
    assert h.git(tree, "rev-parse", "--abbrev-ref", "HEAD") == patches.BRANCH
    assert subjects(h, tree, f"{pin.commit}..HEAD") == [patches.OVERLAY_SUBJECT, "common: say hello",
                                                         "ggml: tweak line 9"]
    assert h.git(tree, "rev-parse", "HEAD~3") == pin.commit
    # git am keeps the patch's author
    assert h.git(tree, "log", "-1", "--format=%an <%ae>") == "Fixture Author <author@example.invalid>"
    assert (tree / "common" / "new-file.cpp").read_text() == "// new in the overlay\n"
    assert "common line 6\nhello from a patch\ncommon line 7\n" in (tree / "common" / "common.cpp").read_text()
    assert "ggml line 9 (tweaked)\n" in (tree / "ggml" / "src" / "ggml.c").read_text()
    assert h.git(tree, "status", "--porcelain", "--untracked-files=all") == ""
    # the overlay commit holds exactly the cpp/ files
    assert h.git(tree, "diff-tree", "-r", "--name-only", "--no-commit-id", pin.commit, "HEAD~2") == \
        "common/new-file.cpp"
    state = json.loads((tree / ".git" / patches.STATE_FILE).read_text())
    assert state["head"] == head(h, tree)
    assert state["fingerprint"] == patches.fingerprint(project, pin)


def test_a_tree_reset_to_the_pin_is_patched_again(h, project, pin, tree):
    """After a user checks out or resets the tree to the pin, the series is re-applied instead of building the
    unpatched tree as if it were patched."""
    first = patches.apply_series(project, pin, tree)
    patched = head(h, tree)
    h.git(tree, "checkout", "--quiet", "--force", "-B", patches.BRANCH, pin.commit)
    again = patches.apply_series(project, pin, tree)
    assert not again.reused
    assert any("no longer holds the applied series" in n for n in again.notes), again.notes
    assert again.applied == first.applied
    assert h.git(tree, "rev-parse", "HEAD^{tree}") == h.git(tree, "rev-parse", f"{patched}^{{tree}}")
    assert patches.apply_series(project, pin, tree).reused


def test_second_apply_is_reused_and_does_not_touch_the_tree(h, project, pin, tree):
    patches.apply_series(project, pin, tree)
    before, log_before = head(h, tree), reflog_len(h, tree)
    again = patches.apply_series(project, pin, tree)
    assert again.reused
    assert again.notes == []
    assert again.applied == ["0001-common-say-hello.patch", "0002-ggml-tweak-line-9.patch"]
    assert head(h, tree) == before
    assert reflog_len(h, tree) == log_before  # no checkout, no commit, no am


def test_changed_patch_is_reapplied(h, project, pin, tree):
    patches.apply_series(project, pin, tree)
    before = head(h, tree)
    patch = project.patches_dir / "0001-common-say-hello.patch"
    patch.write_text(patch.read_text().replace("+hello from a patch", "+hello from a changed patch"))
    result = patches.apply_series(project, pin, tree)
    assert not result.reused
    assert head(h, tree) != before
    assert "hello from a changed patch\n" in (tree / "common" / "common.cpp").read_text()
    assert "hello from a patch\n" not in (tree / "common" / "common.cpp").read_text()
    assert patches.apply_series(project, pin, tree).reused


def test_changed_overlay_is_reapplied(h, project, pin, tree):
    patches.apply_series(project, pin, tree)
    before = head(h, tree)
    (project.overlay_dir / "common" / "new-file.cpp").write_text("// changed\n")
    (project.overlay_dir / "common" / "second.cpp").write_text("// another\n")
    result = patches.apply_series(project, pin, tree)
    assert not result.reused
    assert result.overlay_files == 2
    assert head(h, tree) != before
    assert (tree / "common" / "new-file.cpp").read_text() == "// changed\n"
    assert (tree / "common" / "second.cpp").read_text() == "// another\n"
    # and a file dropped from cpp/ disappears from the tree
    (project.overlay_dir / "common" / "second.cpp").unlink()
    patches.apply_series(project, pin, tree)
    assert not (tree / "common" / "second.cpp").exists()
    assert h.git(tree, "status", "--porcelain", "--untracked-files=all") == ""


def test_reapply_refuses_to_discard_uncommitted_work_unless_forced(h, project, pin, tree):
    patches.apply_series(project, pin, tree)
    edited = tree / "common" / "common.cpp"
    edited.write_text(edited.read_text() + "my local edit\n")
    # unchanged series: reused, with a note about the local change
    kept = patches.apply_series(project, pin, tree)
    assert kept.reused and any("common/common.cpp" in n for n in kept.notes)

    (project.overlay_dir / "common" / "new-file.cpp").write_text("// changed\n")
    before = head(h, tree)
    with pytest.raises(SpbuildError) as err:
        patches.apply_series(project, pin, tree)
    assert "uncommitted: common/common.cpp" in str(err.value)
    assert "--force" in (err.value.hint or "")
    assert edited.read_text().endswith("my local edit\n")  # nothing was thrown away
    assert head(h, tree) == before

    result = patches.apply_series(project, pin, tree, force=True)
    assert not result.reused
    assert "my local edit" not in edited.read_text()
    assert (tree / "common" / "new-file.cpp").read_text() == "// changed\n"


def test_reapply_refuses_to_discard_unexported_commits(h, project, pin, tree):
    patches.apply_series(project, pin, tree)
    (tree / "mine.txt").write_text("mine\n")
    mine = h.commit_all(tree, "my work")
    (project.overlay_dir / "common" / "new-file.cpp").write_text("// changed\n")
    with pytest.raises(SpbuildError, match=r"1 commit\(s\) on spbuild not exported"):
        patches.apply_series(project, pin, tree)
    assert head(h, tree) == mine
    patches.apply_series(project, pin, tree, force=True)
    assert not (tree / "mine.txt").exists()


def test_cpp_file_may_not_overwrite_an_upstream_file(h, tmp_path, pin, upstream, tree):
    project = h.make_project(tmp_path / "p", pin, upstream, [h.PATCH_GGML],
                             overlay={"common/common.cpp": "// would replace upstream\n"})
    with pytest.raises(SpbuildError, match="cpp/common/common.cpp would overwrite upstream file common/common.cpp"):
        patches.apply_series(project, pin, tree)
    assert (tree / "common" / "common.cpp").read_text().startswith("common line 1\n")


def test_refused_overlay_leaves_no_debris(h, tmp_path, pin, upstream, tree):
    """After a refused overlay, fixing cpp/ and applying again must work without --force."""
    project = h.make_project(tmp_path / "p", pin, upstream, [h.PATCH_GGML],
                             overlay={"aaa/new.cpp": "// new\n", "common/common.cpp": "// would replace upstream\n"})
    with pytest.raises(SpbuildError, match="would overwrite"):
        patches.apply_series(project, pin, tree)
    assert h.git(tree, "status", "--porcelain", "--untracked-files=all") == ""
    (project.overlay_dir / "common" / "common.cpp").unlink()
    result = patches.apply_series(project, pin, tree)
    assert not result.reused
    assert (tree / "aaa" / "new.cpp").read_text() == "// new\n"


def test_apply_needs_a_fetched_tree(project, pin, tmp_path):
    with pytest.raises(SpbuildError, match="no llama.cpp source") as err:
        patches.apply_series(project, pin, tmp_path / "missing")
    assert "spbuild fetch" in (err.value.hint or "")


# --- conflicts ----------------------------------------------------------------------------------------------


@pytest.fixture
def moved_pin(pin, upstream):
    """The pin moved to the newer upstream commit, whose common.cpp line 3 differs."""
    return replace(pin, commit=upstream.c2)


def test_patch_against_changed_upstream_conflicts(h, tmp_path, upstream, moved_pin, workspace):
    edit = ("common: edit line 3", [("common/common.cpp", "common line 3\n", "common line 3 (patched)\n")])
    project = h.make_project(tmp_path / "p", moved_pin, upstream, [h.PATCH_GGML, edit], base=upstream.c1)
    tree = sources.fetch(moved_pin, workspace, h.mirror_spec(upstream)).tree
    with pytest.raises(PatchConflict) as err:
        patches.apply_series(project, moved_pin, tree)
    conflict = err.value
    assert conflict.patch == "0002-common-edit-line-3.patch"
    assert conflict.files == ["common/common.cpp"]
    # the shallow tree lacks the patch's base blob, so there is no 3-way merge: the report names the failed
    # hunk's lines (context 3 around line 3: lines 1-6)
    assert conflict.hunks == ["common/common.cpp:1-6 (hunk does not apply)"]
    assert "0002-common-edit-line-3.patch" in str(conflict)
    assert "common/common.cpp" in str(conflict)
    assert_clean_at_pin(h, tree, moved_pin)
    assert not (tree / ".git" / patches.STATE_FILE).exists()


def test_three_way_conflict_reports_the_line_range(h, tmp_path, pin, upstream, tree):
    ours = ("common: ours", [("common/common.cpp", "common line 6\n", "common line 6 ours\n")])
    theirs = ("common: theirs", [("common/common.cpp", "common line 6\n", "common line 6 theirs\n")])
    project = h.make_project(tmp_path / "p", pin, upstream, [ours])
    (tmp_path / "theirs").mkdir()
    [theirs_file] = h.make_patch_files(upstream, pin.commit, [theirs], tmp_path / "theirs", tmp_path / "scratch2")
    (project.patches_dir / theirs_file.name).write_bytes(theirs_file.read_bytes())
    project.series_file.write_text("0001-common-ours.patch\n0001-common-theirs.patch\n")

    with pytest.raises(PatchConflict) as err:
        patches.apply_series(project, pin, tree)
    conflict = err.value
    assert conflict.patch == "0001-common-theirs.patch"
    assert conflict.files == ["common/common.cpp"]
    ranges = [re.fullmatch(r"common/common\.cpp:(\d+)-(\d+)", hk) for hk in conflict.hunks]
    assert ranges and all(ranges)
    start, end = int(ranges[0].group(1)), int(ranges[0].group(2))
    assert start <= 6 <= end
    assert "rebase" in (conflict.hint or "").lower() or "git am --continue" in (conflict.hint or "")
    assert_clean_at_pin(h, tree, pin)


def test_stop_at_conflict_leaves_the_am_session_then_needs_force(h, tmp_path, pin, upstream, tree):
    ours = ("common: ours", [("common/common.cpp", "common line 6\n", "common line 6 ours\n")])
    theirs = ("common: theirs", [("common/common.cpp", "common line 6\n", "common line 6 theirs\n")])
    project = h.make_project(tmp_path / "p", pin, upstream, [ours])
    [theirs_file] = h.make_patch_files(upstream, pin.commit, [theirs], tmp_path / "theirs", tmp_path / "scratch2")
    (project.patches_dir / theirs_file.name).write_bytes(theirs_file.read_bytes())
    project.series_file.write_text("0001-common-ours.patch\n0001-common-theirs.patch\n")

    with pytest.raises(PatchConflict):
        patches.apply_series(project, pin, tree, stop_at_conflict=True)
    assert (tree / ".git" / "rebase-apply").is_dir()
    assert "<<<<<<< " in (tree / "common" / "common.cpp").read_text()

    project.series_file.write_text("0001-common-ours.patch\n")
    with pytest.raises(SpbuildError, match="git am"):
        patches.apply_series(project, pin, tree)
    assert (tree / ".git" / "rebase-apply").is_dir()
    result = patches.apply_series(project, pin, tree, force=True)
    assert result.applied == ["0001-common-ours.patch"]
    assert not (tree / ".git" / "rebase-apply").exists()
    assert "common line 6 ours\n" in (tree / "common" / "common.cpp").read_text()


def test_fingerprint_depends_on_pin_overlay_and_patches(project, pin, upstream):
    base = patches.fingerprint(project, pin)
    assert patches.fingerprint(project, pin) == base
    assert patches.fingerprint(project, replace(pin, commit=upstream.c2)) != base
    (project.overlay_dir / "common" / "new-file.cpp").write_text("// other\n")
    changed_overlay = patches.fingerprint(project, pin)
    assert changed_overlay != base
    project.series_file.write_text("0001-common-say-hello.patch\n")
    assert patches.fingerprint(project, pin) != changed_overlay


def test_fresh_workspace_reproduces_the_same_tree(h, tmp_path, project, pin, upstream, tree):
    patches.apply_series(project, pin, tree)
    other = sources.fetch(pin, Workspace(tmp_path / "ws2"), h.mirror_spec(upstream)).tree
    patches.apply_series(project, pin, other)
    assert h.tree_id(other) == h.tree_id(tree)
