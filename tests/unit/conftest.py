"""Shared fixtures for spbuild's unit tests: throw-away git repositories, a synthetic patch-set project, a workspace.

Everything lives under pytest's tmp_path; git runs with no system or global configuration, so the tests see
neither this machine's settings nor the network.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from dataclasses import dataclass
from types import SimpleNamespace
from pathlib import Path

import pytest

from spbuild.project import Project, Workspace
from spbuild.tree import patches as sp_patches
from spbuild.tree import sources
from spbuild.tree.pin import Pin, PypiMirror

REPO_ROOT = Path(__file__).resolve().parents[2]

# Fixed identity and dates for the commits the fixtures make (never for what spbuild itself commits: those must
# get fresh committer dates, or "HEAD did not move" could not be told apart from "re-applied identically").
_FIXTURE_ENV = {
    "GIT_AUTHOR_NAME": "Fixture Author",
    "GIT_AUTHOR_EMAIL": "author@example.invalid",
    "GIT_COMMITTER_NAME": "Fixture Committer",
    "GIT_COMMITTER_EMAIL": "committer@example.invalid",
    "GIT_AUTHOR_DATE": "2024-01-02T03:04:05+00:00",
    "GIT_COMMITTER_DATE": "2024-01-02T03:04:05+00:00",
}


@pytest.fixture(autouse=True, scope="session")
def _hermetic_git(tmp_path_factory: pytest.TempPathFactory):
    """No system/global git config (no signing, aliases, noprefix diffs...), no prompts, no inherited GIT_DIR."""
    home = tmp_path_factory.mktemp("home")
    global_config = home / "gitconfig"
    global_config.write_text("[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GIT_CONFIG_NOSYSTEM", "1")
        mp.setenv("GIT_CONFIG_GLOBAL", str(global_config))
        mp.setenv("GIT_TERMINAL_PROMPT", "0")
        mp.setenv("GIT_ALLOW_PROTOCOL", "file")
        # no package index either: a port that refuses at once (snapshot listings fail fast and say so)
        mp.setenv("SPBUILD_INDEX_URL", "http://127.0.0.1:9/simple")
        for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_CEILING_DIRECTORIES",
                    "SPBUILD_WORKDIR", "SPBUILD_PROJECT", "SPBUILD_BACKEND", "VULKAN_SDK"):
            mp.delenv(var, raising=False)
        yield


def git(cwd: Path, *args: str, check: bool = True) -> str:
    """Run git in `cwd` with the fixture identity; return stripped stdout."""
    proc = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **_FIXTURE_ENV},
                          capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed in {cwd}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def tree_id(repo: Path, rev: str = "HEAD") -> str:
    return git(repo, "rev-parse", f"{rev}^{{tree}}")


def lines(n: int, prefix: str) -> str:
    return "".join(f"{prefix} line {i}\n" for i in range(1, n + 1))


@dataclass(frozen=True)
class Upstream:
    path: Path
    c1: str  # the pin
    c2: str  # a later commit that changes common/common.cpp line 3


def _make_upstream(root: Path) -> Upstream:
    root.mkdir(parents=True)
    git(root, "init", "-q")
    (root / "README.md").write_text("llama.cpp stand-in\n")
    (root / "common").mkdir()
    (root / "common" / "common.cpp").write_text(lines(12, "common"))
    (root / "ggml" / "src").mkdir(parents=True)
    (root / "ggml" / "src" / "ggml.c").write_text(lines(12, "ggml"))
    c1 = commit_all(root, "upstream: first")
    git(root, "tag", "v1")
    text = (root / "common" / "common.cpp").read_text().replace("common line 3\n", "common line 3 (upstream edit)\n")
    (root / "common" / "common.cpp").write_text(text)
    (root / "docs.md").write_text("later\n")
    c2 = commit_all(root, "upstream: second")
    return Upstream(root, c1, c2)


@pytest.fixture(scope="session")
def upstream(tmp_path_factory: pytest.TempPathFactory, _hermetic_git) -> Upstream:
    """A two-commit stand-in for llama.cpp. Read-only for the tests: copy it (clone) before changing anything."""
    return _make_upstream(tmp_path_factory.mktemp("upstream") / "llama.cpp")


@pytest.fixture
def pin(upstream: Upstream) -> Pin:
    return Pin(url=str(upstream.path), commit=upstream.c1, pypi=None)


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "ws")


def mirror_spec(upstream: Upstream) -> sources.SourceSpec:
    return sources.SourceSpec.parse(str(upstream.path))


# --- patches made the way a developer makes them: commits in a clone, then `git format-patch` --------------


Edit = tuple[str, str, str]  # (path, old text, new text)


def make_patch_files(upstream: Upstream, base: str, commits: list[tuple[str, list[Edit]]], out: Path,
                     scratch: Path) -> list[Path]:
    """Commit each (subject, edits) on `base` in a scratch clone and format-patch them into `out`."""
    git(scratch.parent, "clone", "-q", str(upstream.path), scratch.name)
    git(scratch, "checkout", "-q", "--detach", base)
    for subject, edits in commits:
        for rel, old, new in edits:
            path = scratch / rel
            text = path.read_text() if path.exists() else ""
            assert old in text, f"{old!r} not in {rel}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text.replace(old, new, 1))
        commit_all(scratch, f"{subject}\n\nWhy: a test patch.")
    out.mkdir(parents=True, exist_ok=True)
    names = git(scratch, "format-patch", *sp_patches.FORMAT_PATCH_ARGS, "-o", str(out),
                f"{base}..HEAD").splitlines()
    return [Path(n) for n in names]


PATCH_COMMON: tuple[str, list[Edit]] = (
    "common: say hello", [("common/common.cpp", "common line 6\n", "common line 6\nhello from a patch\n")])
PATCH_GGML: tuple[str, list[Edit]] = (
    "ggml: tweak line 9", [("ggml/src/ggml.c", "ggml line 9\n", "ggml line 9 (tweaked)\n")])


def write_series(project_root: Path, files: list[Path]) -> None:
    (project_root / "patches" / "series").write_text("".join(f"{p.name}\n" for p in files))


def pin_toml(pin: Pin) -> str:
    return f'[upstream]\nurl = "{pin.url}"\ncommit = "{pin.commit}"\n'


def make_project(root: Path, pin: Pin, upstream: Upstream, commits: list[tuple[str, list[Edit]]],
                 overlay: dict[str, str] | None = None, base: str | None = None) -> Project:
    """A patch-set project at `root`: pin.toml for `pin`, cpp/ from `overlay`, and one patch per commit
    (made on `base`, the pin unless given)."""
    (root / "cpp").mkdir(parents=True)
    (root / "pin.toml").write_text(pin_toml(pin))
    for rel, text in (overlay if overlay is not None else {"common/new-file.cpp": "// new in the overlay\n"}).items():
        (root / "cpp" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "cpp" / rel).write_text(text)
    scratch = root.parent / f"scratch-{root.name}"
    files = make_patch_files(upstream, base or pin.commit, commits, root / "patches", scratch) if commits else []
    (root / "patches").mkdir(exist_ok=True)
    write_series(root, files)
    return Project(root, is_checkout=True)


@pytest.fixture
def project(tmp_path: Path, pin: Pin, upstream: Upstream) -> Project:
    """cpp/common/new-file.cpp plus two patches (common.cpp, ggml.c) against the pin."""
    return make_project(tmp_path / "project", pin, upstream, [PATCH_COMMON, PATCH_GGML])


@pytest.fixture
def tree(pin: Pin, workspace: Workspace, upstream: Upstream) -> Path:
    """The workspace's llama.cpp tree, fetched (from the upstream as a mirror) and at the pin."""
    result = sources.fetch(pin, workspace, mirror_spec(upstream))
    assert result.tree == workspace.source_dir
    return result.tree


# --- a fake llama-cpp-python sdist ------------------------------------------------------------------------

SDIST_TOP = "pkg-1.0"
SDIST_GITDIR = ".git/modules/vendor/llama.cpp"


def make_sdist(upstream: Upstream, where: Path, name: str = "pkg-1.0.tar.gz") -> Path:
    """An sdist laid out like llama-cpp-python's: the vendored tree plus its submodule git dir, a one-commit
    shallow clone whose config points at the builder's worktree and includes a credentials file. The include
    is deliberately unparsable, so a fetch that kept this config would fail."""
    top = where / "sdist-src" / SDIST_TOP
    gitdir = top / SDIST_GITDIR
    gitdir.parent.mkdir(parents=True)
    git(gitdir.parent, "clone", "-q", "--bare", "--depth=1", "--branch", "v1", f"file://{upstream.path}", gitdir.name)
    (gitdir / "config").write_text(
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = ../../../../vendor/llama.cpp\n"
        '[includeIf "gitdir:/"]\n\tpath = ci-credentials.inc\n'
    )
    (gitdir / "ci-credentials.inc").write_text("this is [not valid git config\n")
    (top / "vendor" / "llama.cpp").mkdir(parents=True)
    (top / "vendor" / "llama.cpp" / "README.md").write_text("llama.cpp stand-in\n")
    (top / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
    sdist = where / name
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(top, arcname=SDIST_TOP)
    return sdist


def mirror_for(sdist: Path, sha256: str) -> PypiMirror:
    # The index is never contacted when the sdist is given as a file; a port that refuses at once
    # keeps a regression from waiting on DNS.
    return PypiMirror(package="pkg", version="1.0", filename=sdist.name, sha256=sha256,
                      index="http://127.0.0.1:9/simple", tree="vendor/llama.cpp", gitdir=SDIST_GITDIR)


@pytest.fixture(scope="session")
def h() -> SimpleNamespace:
    """The helpers above, for test modules (which do not import conftest)."""
    return SimpleNamespace(
        REPO_ROOT=REPO_ROOT, git=git, commit_all=commit_all, tree_id=tree_id, mirror_spec=mirror_spec,
        make_patch_files=make_patch_files, make_project=make_project, write_series=write_series,
        PATCH_COMMON=PATCH_COMMON, PATCH_GGML=PATCH_GGML, make_sdist=make_sdist, mirror_for=mirror_for,
        pin_toml=pin_toml,
    )
