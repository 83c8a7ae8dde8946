from __future__ import annotations

from pathlib import Path

import pytest

from spbuild.errors import SpbuildError
from spbuild.project import Project, Workspace
from spbuild.tree import patches, sources


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def project_files(project: Project) -> dict[str, bytes]:
    return {**snapshot(project.patches_dir), **{f"cpp/{k}": v for k, v in snapshot(project.overlay_dir).items()}}


@pytest.fixture
def applied(project, pin, tree):
    patches.apply_series(project, pin, tree)
    return tree


def test_export_right_after_apply_changes_nothing(project, pin, applied):
    before = project_files(project)
    check = patches.export_series(project, pin, applied, check=True)
    assert not check.changed
    assert (check.written, check.removed, check.overlay_synced) == ([], [], [])
    result = patches.export_series(project, pin, applied)
    assert not result.changed
    assert project_files(project) == before  # byte for byte


def test_export_new_commit_then_reapply_elsewhere(h, tmp_path, project, pin, upstream, applied):
    before = project_files(project)
    path = applied / "ggml" / "src" / "ggml.c"
    path.write_text(path.read_text().replace("ggml line 2\n", "ggml line 2 (from the tree)\n"))
    h.commit_all(applied, "ggml: edit in the tree\n\nWhy: exported by the test.")

    check = patches.export_series(project, pin, applied, check=True)
    assert check.changed and check.written == ["0003-ggml-edit-in-the-tree.patch"]
    assert project_files(project) == before  # check writes nothing

    result = patches.export_series(project, pin, applied)
    assert result.changed
    assert result.written == ["0003-ggml-edit-in-the-tree.patch"]
    assert result.removed == []
    new_patch = project.patches_dir / "0003-ggml-edit-in-the-tree.patch"
    text = new_patch.read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")  # --zero-commit
    assert "Subject: [PATCH] ggml: edit in the tree" in text
    assert "+ggml line 2 (from the tree)" in text
    assert project.series_file.read_text() == (
        "0001-common-say-hello.patch\n0002-ggml-tweak-line-9.patch\n0003-ggml-edit-in-the-tree.patch\n")
    # the earlier patches were rewritten byte-identically
    after = project_files(project)
    for name in ("0001-common-say-hello.patch", "0002-ggml-tweak-line-9.patch", "cpp/common/new-file.cpp"):
        assert after[name] == before[name]

    # export recorded the new state: the tree counts as applied, and a second export is a no-op
    assert not patches.export_series(project, pin, applied, check=True).changed
    assert patches.apply_series(project, pin, applied).reused

    # the exported files rebuild the same tree from scratch
    fresh = sources.fetch(pin, Workspace(tmp_path / "ws2"), h.mirror_spec(upstream)).tree
    result = patches.apply_series(project, pin, fresh)
    assert result.applied[-1] == "0003-ggml-edit-in-the-tree.patch"
    assert h.tree_id(fresh) == h.tree_id(applied)


def test_export_drops_a_reverted_patch(h, project, pin, applied):
    # drop the ggml patch from the branch: reset to the commit before it
    h.git(applied, "reset", "-q", "--hard", "HEAD~1")
    result = patches.export_series(project, pin, applied)
    assert result.removed == ["0002-ggml-tweak-line-9.patch"]
    assert not (project.patches_dir / "0002-ggml-tweak-line-9.patch").exists()
    assert project.series_file.read_text() == "0001-common-say-hello.patch\n"


def test_export_syncs_overlay_changes_back_to_cpp(h, project, pin, applied):
    """An amended overlay commit (via rebase) flows back into cpp/."""
    overlay = h.git(applied, "rev-parse", "HEAD~2")
    h.git(applied, "checkout", "-q", "--detach", overlay)
    (applied / "common" / "new-file.cpp").write_text("// edited in the tree\n")
    (applied / "tools" / "extra").mkdir(parents=True)
    (applied / "tools" / "extra" / "extra.cpp").write_text("// extra\n")
    h.git(applied, "add", "-A")
    h.git(applied, "commit", "-q", "--amend", "--no-edit")
    new_overlay = h.git(applied, "rev-parse", "HEAD")
    h.git(applied, "checkout", "-q", patches.BRANCH)
    h.git(applied, "rebase", "-q", "--onto", new_overlay, overlay, patches.BRANCH)

    result = patches.export_series(project, pin, applied)
    assert result.changed
    assert sorted(result.overlay_synced) == ["common/new-file.cpp", "tools/extra/extra.cpp"]
    assert (project.overlay_dir / "common" / "new-file.cpp").read_text() == "// edited in the tree\n"
    assert (project.overlay_dir / "tools" / "extra" / "extra.cpp").read_text() == "// extra\n"
    assert result.written == []


def test_export_refuses_uncommitted_changes(project, pin, applied):
    (applied / "README.md").write_text("dirty\n")
    before = project_files(project)
    with pytest.raises(SpbuildError, match="uncommitted changes: README.md"):
        patches.export_series(project, pin, applied)
    assert project_files(project) == before


def test_export_needs_the_overlay_commit(project, pin, tree):
    # fetched but never patched: HEAD is the pin itself
    with pytest.raises(SpbuildError, match=patches.OVERLAY_SUBJECT):
        patches.export_series(project, pin, tree)


def test_export_refuses_a_packaged_project(project, pin, applied):
    packaged = Project(project.root, is_checkout=False)
    with pytest.raises(SpbuildError, match="checkout"):
        patches.export_series(packaged, pin, applied)


def test_export_keeps_cpp_files_added_after_the_apply(project, pin, applied):
    """cpp/ is the source of truth: files added or edited there after the tree was patched survive an export, and the
    next apply brings them into the tree."""
    added = project.overlay_dir / "tools" / "new-tool" / "main.cpp"
    added.parent.mkdir(parents=True)
    added.write_text("int main() { return 0; }\n")
    edited = project.overlay_dir / "common" / "new-file.cpp"
    edited.write_text(edited.read_text() + "// edited in cpp/\n")
    before = project_files(project)

    result = patches.export_series(project, pin, applied)

    assert project_files(project) == before
    assert result.overlay_synced == []
    reapplied = patches.apply_series(project, pin, applied)
    assert not reapplied.reused
    assert (applied / "tools" / "new-tool" / "main.cpp").read_text() == "int main() { return 0; }\n"
    assert (applied / "common" / "new-file.cpp").read_text().endswith("// edited in cpp/\n")


def test_export_refuses_when_both_overlay_and_cpp_changed(h, project, pin, applied):
    overlay = h.git(applied, "rev-parse", "HEAD~2")
    h.git(applied, "checkout", "-q", "--detach", overlay)
    (applied / "common" / "new-file.cpp").write_text("// amended in the tree\n")
    h.git(applied, "commit", "-q", "-a", "--amend", "--no-edit")
    new_overlay = h.git(applied, "rev-parse", "HEAD")
    h.git(applied, "checkout", "-q", patches.BRANCH)
    h.git(applied, "rebase", "-q", "--onto", new_overlay, overlay, patches.BRANCH)
    (project.overlay_dir / "common" / "new-file.cpp").write_text("// edited in cpp/ as well\n")
    before = project_files(project)

    with pytest.raises(SpbuildError, match="cpp/ changed too"):
        patches.export_series(project, pin, applied)
    assert project_files(project) == before
