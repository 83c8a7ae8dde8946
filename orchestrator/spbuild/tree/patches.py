"""The patch series: `cpp/` (new files) committed as one overlay commit on a branch at the pin, then
`patches/` applied in `series` order with `git am -3`; and the way back, `export`, from branch to files.

Idempotent: a state file in the tree's git dir records what was applied (a fingerprint of the pin, the overlay
and the patches) and the branch head it produced. A tree that matches is left alone; a stale one is reset and
re-applied, unless it carries local work, which is never thrown away without --force.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import git

from spbuild.errors import OverlayCollision, PatchConflict, SpbuildError
from spbuild.project import Project
from spbuild.tree.pin import Pin

BRANCH = "spbuild"
OVERLAY_SUBJECT = "spbuild: cpp/ overlay"
STATE_FILE = "spbuild-patch.json"
IDENTITY = ("-c", "user.name=spbuild", "-c", "user.email=spbuild@localhost")
# Stable across git versions and repositories, so that export after apply is byte-identical.
FORMAT_PATCH_ARGS = ("--zero-commit", "--no-signature", "--full-index", "-N", "--no-renames")


def read_series(project: Project) -> list[Path]:
    """Patch files in application order; blank lines and `#` comments are ignored."""
    names = []
    for line in project.series_file.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    paths = [project.patches_dir / name for name in names]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise SpbuildError(f"patches/series names missing files: {', '.join(missing)}")
    return paths


def overlay_files(project: Project) -> list[Path]:
    """Files of the `cpp/` overlay, relative to it (= their path in the llama.cpp tree)."""
    root = project.overlay_dir
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def fingerprint(project: Project, pin: Pin) -> str:
    digest = hashlib.sha256(pin.commit.encode())
    for rel in overlay_files(project):
        digest.update(b"\0overlay\0" + str(rel).encode() + b"\0" + (project.overlay_dir / rel).read_bytes())
    for patch in read_series(project):
        digest.update(b"\0patch\0" + patch.name.encode() + b"\0" + patch.read_bytes())
    return digest.hexdigest()


@dataclass
class TreeState:
    fingerprint: str
    head: str
    overlay_commit: str
    patches: list[str]

    @classmethod
    def load(cls, repo: git.Repo) -> TreeState | None:
        path = Path(repo.git_dir) / STATE_FILE
        try:
            return cls(**json.loads(path.read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None

    def save(self, repo: git.Repo) -> None:
        (Path(repo.git_dir) / STATE_FILE).write_text(json.dumps(self.__dict__, indent=2))

    @staticmethod
    def clear(repo: git.Repo) -> None:
        (Path(repo.git_dir) / STATE_FILE).unlink(missing_ok=True)


@dataclass
class PatchResult:
    applied: list[str]
    overlay_files: int
    reused: bool
    notes: list[str] = field(default_factory=list)


def _open(tree: Path) -> git.Repo:
    try:
        return git.Repo(tree)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as err:
        raise SpbuildError(f"no llama.cpp source at {tree}", hint="Run `spbuild fetch` first.") from err


def _dirty_paths(repo: git.Repo) -> list[str]:
    out = repo.git.status("--porcelain", "--untracked-files=all")
    return [line[3:] for line in out.splitlines() if line.strip()]


def _am_in_progress(repo: git.Repo) -> bool:
    return (Path(repo.git_dir) / "rebase-apply").exists()


def local_work(repo: git.Repo, state: TreeState | None, project: Project) -> list[str]:
    """What a reset would destroy: uncommitted edits, and commits made after the recorded apply. A tree file that
    equals its cpp/ source is not work: cpp/ keeps it (copying cpp/ files into the tree is how one iterates)."""
    tree = Path(repo.working_tree_dir or "")

    def is_copy_of_overlay(path: str) -> bool:
        source = project.overlay_dir / path
        return source.is_file() and (tree / path).is_file() and source.read_bytes() == (tree / path).read_bytes()

    work = [f"uncommitted: {p}" for p in _dirty_paths(repo) if not is_copy_of_overlay(p)]
    if _am_in_progress(repo):
        work.append("a `git am` session in progress")
    if state is not None and repo.head.is_valid() and repo.head.commit.hexsha != state.head:
        try:
            ahead = int(repo.git.rev_list("--count", f"{state.head}..HEAD"))
        except git.GitCommandError:
            ahead = 1
        if ahead:
            work.append(f"{ahead} commit(s) on {BRANCH} not exported to patches/")
    return work


def commit_overlay(repo: git.Repo, project: Project) -> tuple[str, int]:
    tree = Path(repo.working_tree_dir or "")
    files = overlay_files(project)
    for rel in files:  # check them all before copying any: a refusal must leave the tree clean
        if (tree / rel).exists():
            raise OverlayCollision(
                f"cpp/{rel} would overwrite upstream file {rel}",
                hint="cpp/ holds only new files; change upstream files with a patch in patches/.",
            )
    for rel in files:
        dest = tree / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(project.overlay_dir / rel, dest)
    if files:
        repo.git.add("--force", "--", *map(str, files))
    repo.git.execute(["git", *IDENTITY, "commit", "--quiet", "--allow-empty", "--no-verify", "-m",
                      f"{OVERLAY_SUBJECT}\n\n{len(files)} new file(s) from llama-specprefill's cpp/ folder."])
    return repo.head.commit.hexsha, len(files)


def _conflict_hunks(tree: Path, files: list[str]) -> list[str]:
    hunks = []
    for name in files:
        try:
            lines = (tree / name).read_text(errors="replace").splitlines()
        except OSError:
            continue
        start = None
        for number, line in enumerate(lines, 1):
            if line.startswith("<<<<<<< "):
                start = number
            elif line.startswith(">>>>>>> ") and start is not None:
                hunks.append(f"{name}:{start}-{number}")
                start = None
    return hunks


_PATCH_FAILED = re.compile(r"error: patch failed: (\S+):(\d+)")


def _hunk_range(patch: Path, name: str, start: int) -> str:
    """`name:start-end`: the lines of `name` the patch's hunk starting at `start` expects (git names only the start)."""
    current, in_header = None, False
    for line in patch.read_text(errors="replace").splitlines():
        if line.startswith("diff --git "):
            current, in_header = None, True
        elif in_header and line.startswith("--- "):
            current = line[4:].removeprefix("a/")
        elif line.startswith("@@ -"):
            in_header = False
            match = re.match(r"@@ -(\d+)(?:,(\d+))? ", line)
            if match and current == name and int(match.group(1)) == start:
                count = int(match.group(2)) if match.group(2) is not None else 1
                return f"{name}:{start}-{start + max(count, 1) - 1}"
    return f"{name}:{start}"


def apply_one(repo: git.Repo, patch: Path, stop_at_conflict: bool) -> None:
    try:
        repo.git.execute(["git", *IDENTITY, "am", "--3way", "--quiet", "--whitespace=nowarn", str(patch)])
    except git.GitCommandError as err:
        output = f"{err.stdout}\n{err.stderr}"
        files = repo.git.diff("--name-only", "--diff-filter=U").split()
        hunks = _conflict_hunks(Path(repo.working_tree_dir or ""), files)
        failed = _PATCH_FAILED.findall(output)
        if not files and not failed:
            # When am cannot fall back to a 3-way merge (a shallow tree lacks the patch's base blobs) it reports
            # only that; the plain apply's report says which hunk failed.
            try:
                repo.git.apply("--check", str(patch))
            except git.GitCommandError as check:
                output += f"\n{check.stderr}"
                failed = _PATCH_FAILED.findall(str(check.stderr))
        hunks += [f"{_hunk_range(patch, name, int(line))} (hunk does not apply)"
                  for name, line in failed if f"{name}:" not in " ".join(hunks)]
        for name, _ in failed:
            if name not in files:
                files.append(name)
        if not files:
            files = sorted(set(
                re.findall(r"error: (\S+?): (?:patch does not apply|does not exist in index|already exists in)", output)
                + re.findall(r"error: invalid object \d+ [0-9a-f]+ for '([^']+)'", output)
            ))
        if not stop_at_conflict:
            repo.git.am("--abort")
        raise PatchConflict(patch.name, files, hunks, output) from err


def apply_series(project: Project, pin: Pin, tree: Path, *, force: bool = False,
                 stop_at_conflict: bool = False) -> PatchResult:
    repo = _open(tree)
    wanted = fingerprint(project, pin)
    state = TreeState.load(repo)
    work = local_work(repo, state, project)

    notes: list[str] = []
    if state is not None and state.fingerprint == wanted and not _am_in_progress(repo) and not holds(repo, state):
        # checked out or reset since: building this tree would build without the series
        notes.append(f"the tree's HEAD no longer holds the applied series ({BRANCH} at {state.head[:12]}): re-applying")
        work = [w for w in work if "not exported" not in w]
    elif state is not None and state.fingerprint == wanted and not _am_in_progress(repo):
        if work:
            notes.append("building with local changes in the tree: " + "; ".join(work[:5]))
        return PatchResult(state.patches, len(overlay_files(project)), reused=True, notes=notes)

    if work and not force:
        raise SpbuildError(
            "patches/ or cpp/ changed, and the patched tree has local work a re-apply would discard:\n"
            + "\n".join(f"  - {w}" for w in work[:10]),
            hint=f"Save it with `spbuild export-patches`, or discard it with `spbuild patch --force` (tree: {tree}).",
        )
    if _am_in_progress(repo):
        repo.git.am("--abort")
    TreeState.clear(repo)

    if stop_at_conflict:
        # apply in the tree itself, so that a conflict stays there to be resolved
        repo.git.checkout("--force", "-B", BRANCH, pin.commit)
        repo.git.clean("-fdq")
        overlay_commit, n_overlay, applied = _build_branch(repo, project, stop_at_conflict=True)
    else:
        try:
            head, overlay_commit, n_overlay, applied = _build_branch_aside(repo, project, pin)
        except PatchConflict:
            # leave the pristine pin, so that no half-patched tree gets built
            repo.git.checkout("--force", "-B", BRANCH, pin.commit)
            repo.git.clean("-fdq")
            raise
        # moving the branch rewrites only the files whose content changed, so a rebuild recompiles only those
        repo.git.checkout("--force", "-B", BRANCH, head)
        repo.git.clean("-fdq")
    TreeState(wanted, repo.head.commit.hexsha, overlay_commit, applied).save(repo)
    return PatchResult(applied, n_overlay, reused=False, notes=notes)


def holds(repo: git.Repo, state: TreeState) -> bool:
    """HEAD is the recorded branch head or a descendant of it (commits made on top are local work, not a loss)."""
    if not repo.head.is_valid():
        return False
    try:
        repo.git.merge_base("--is-ancestor", state.head, "HEAD")
    except git.GitCommandError:
        return False
    return True


def _build_branch(repo: git.Repo, project: Project, *, stop_at_conflict: bool) -> tuple[str, int, list[str]]:
    """Commit the overlay and apply the series on the checked-out commit of `repo`."""
    overlay_commit, n_overlay = commit_overlay(repo, project)
    applied = []
    for patch in read_series(project):
        apply_one(repo, patch, stop_at_conflict)
        applied.append(patch.name)
    return overlay_commit, n_overlay, applied


def _build_branch_aside(repo: git.Repo, project: Project, pin: Pin) -> tuple[str, str, int, list[str]]:
    """Build the patched commits in a scratch worktree at the pin, leaving the tree's files untouched; return the
    head commit, the overlay commit, the overlay's file count and the applied patches."""
    tree = Path(repo.working_tree_dir or "").resolve()
    scratch = tree.with_name(tree.name + ".apply")
    if scratch.exists():
        shutil.rmtree(scratch)
    repo.git.worktree("prune")
    repo.git.worktree("add", "--detach", "--force", str(scratch), pin.commit)
    try:
        aside = git.Repo(scratch)
        overlay_commit, n_overlay, applied = _build_branch(aside, project, stop_at_conflict=False)
        return aside.head.commit.hexsha, overlay_commit, n_overlay, applied
    finally:
        repo.git.worktree("remove", "--force", str(scratch))


@dataclass
class ExportResult:
    written: list[str]
    removed: list[str]
    overlay_synced: list[str]
    changed: bool


def _overlay_commit(repo: git.Repo, pin: Pin) -> str:
    for commit in repo.iter_commits(f"{pin.commit}..HEAD", reverse=True):
        if commit.summary == OVERLAY_SUBJECT:
            return commit.hexsha
        break
    raise SpbuildError(
        f"the tree's branch does not start with the `{OVERLAY_SUBJECT}` commit",
        hint="Run `spbuild patch` to create the branch, then commit your work on top of it.",
    )


def commit_files(repo: git.Repo, commit: str, base: str) -> dict[str, bytes]:
    """The files `commit` adds or changes relative to `base`, with their content."""
    paths = [p for p in repo.git.diff_tree("-r", "--name-only", "--no-commit-id", base, commit).split() if p]
    return {
        rel: repo.git.execute(["git", "show", f"{commit}:{rel}"], stdout_as_string=False, strip_newline_in_stdout=False)
        for rel in paths
    }


def export_series(project: Project, pin: Pin, tree: Path, *, check: bool = False) -> ExportResult:
    """Write the branch's commits after the overlay back to patches/ (and the overlay commit's files back to cpp/).
    With check=True nothing is written; `changed` tells whether patches/ or cpp/ differ from the branch."""
    if not project.is_checkout:
        raise SpbuildError("export-patches writes into a checkout of llama-specprefill",
                           hint="Run it inside the repository (or pass --project).")
    repo = _open(tree)
    if _am_in_progress(repo):
        raise SpbuildError("a `git am` is in progress in the tree", hint="Finish it (`git am --continue`) first.")
    dirty = _dirty_paths(repo)
    if dirty:
        raise SpbuildError("the tree has uncommitted changes: " + ", ".join(dirty[:8]),
                           hint="Commit them on the spbuild branch (one commit per patch) first.")
    overlay = _overlay_commit(repo, pin)

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        repo.git.format_patch(*FORMAT_PATCH_ARGS, "-o", str(out), f"{overlay}..HEAD")
        new = {p.name: p.read_bytes() for p in sorted(out.glob("*.patch"))}
    old = {p.name: p.read_bytes() for p in project.patches_dir.glob("*.patch")}
    series_text = "".join(f"{name}\n" for name in sorted(new))
    written = [n for n in sorted(new) if old.get(n) != new[n]]
    removed = sorted(set(old) - set(new))
    series_changed = project.series_file.read_text(encoding="utf-8") != series_text

    # cpp/ is the overlay's source of truth; only an overlay commit amended in the tree flows back into it, and only
    # when cpp/ has not changed since that tree was patched (else one side's work would be lost)
    state = TreeState.load(repo)
    overlay_tree = commit_files(repo, overlay, pin.commit)
    synced: list[str] = []
    stale_overlay: list[str] = []
    if state is not None and state.overlay_commit != overlay:
        applied_overlay = commit_files(repo, state.overlay_commit, pin.commit)
        current = {str(rel): (project.overlay_dir / rel).read_bytes() for rel in overlay_files(project)}
        if current != applied_overlay:
            raise SpbuildError(
                "the overlay commit was amended in the tree, and cpp/ changed too since the tree was patched",
                hint="Keep one: move your cpp/ edits into the tree's overlay commit, or run `spbuild patch --force`.",
            )
        synced = [rel for rel, content in overlay_tree.items() if current.get(rel) != content]
        stale_overlay = sorted(set(current) - set(overlay_tree))
    overlay_changed = bool(synced or stale_overlay)

    changed = bool(written or removed or series_changed or overlay_changed)
    if check or not changed:
        return ExportResult(written, removed, synced + [f"{r} (removed)" for r in stale_overlay], changed)

    for name in removed:
        (project.patches_dir / name).unlink()
    for name in written:
        (project.patches_dir / name).write_bytes(new[name])
    project.series_file.write_text(series_text, encoding="utf-8")
    for rel in synced:
        target = project.overlay_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(overlay_tree[rel])
    for rel in stale_overlay:
        (project.overlay_dir / rel).unlink()
    # the tree matches the project only if cpp/ is what its overlay commit holds; else the next patch re-applies
    in_sync = {str(rel): (project.overlay_dir / rel).read_bytes() for rel in overlay_files(project)} == overlay_tree
    recorded = fingerprint(project, pin) if in_sync else "stale: cpp/ differs from the tree's overlay"
    TreeState(recorded, repo.head.commit.hexsha, overlay, sorted(new)).save(repo)
    synced += [f"{r} (removed)" for r in stale_overlay]
    return ExportResult(written, removed, synced, changed)
