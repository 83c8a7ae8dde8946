"""Patch health: what each patch of the series touches upstream, and whether the workspace tree matches the series.

The series is meant to stay small hooks into our own `cpp/` files; the numbers here (files, hunks, lines per
upstream file) make growth visible in `spbuild status` and in every rebase report.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import git

from spbuild.project import Project
from spbuild.tree import patches
from spbuild.tree.pin import Pin

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class FileChange:
    path: str
    new: bool  # the patch creates the file (it is ours, not an upstream file)
    added: int = 0
    removed: int = 0
    hunks: list[tuple[int, int]] = field(default_factory=list)  # (start, count) on the base side


@dataclass
class PatchHealth:
    name: str
    subject: str
    files: list[FileChange]

    @property
    def upstream_files(self) -> list[FileChange]:
        return [f for f in self.files if not f.new]

    @property
    def upstream_lines(self) -> int:
        return sum(f.added + f.removed for f in self.upstream_files)

    @property
    def hunks(self) -> int:
        return sum(len(f.hunks) for f in self.upstream_files)

    def to_dict(self) -> dict:
        return {"name": self.name, "subject": self.subject, "upstream_files": len(self.upstream_files),
                "hunks": self.hunks, "upstream_lines": self.upstream_lines,
                "files": [asdict(f) for f in self.files]}


def parse_patch(path: Path) -> PatchHealth:
    """Files, hunks and changed lines of one `git format-patch` file."""
    subject, files = "", []
    current: FileChange | None = None
    in_subject = False
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("Subject: "):
            subject, in_subject = line.removeprefix("Subject: ").removeprefix("[PATCH] "), True
            continue
        if in_subject:
            if line.startswith(" "):
                subject += line
                continue
            in_subject = False
        if line.startswith("diff --git "):
            current = FileChange(line.split(" b/", 1)[-1], new=False)
            files.append(current)
        elif current is None:
            continue
        elif line.startswith("new file mode"):
            current.new = True
        elif match := _HUNK.match(line):
            count = int(match.group(2)) if match.group(2) is not None else 1
            current.hunks.append((int(match.group(1)), count))
        elif line.startswith("+") and not line.startswith("+++ "):
            current.added += 1
        elif line.startswith("-") and not line.startswith("--- "):
            current.removed += 1
    return PatchHealth(path.name, subject.strip(), files)


def series_health(project: Project) -> list[PatchHealth]:
    return [parse_patch(p) for p in patches.read_series(project)]


def totals(health: list[PatchHealth]) -> dict:
    touched = {f.path for h in health for f in h.upstream_files}
    return {"patches": len(health), "upstream_files": len(touched), "hunks": sum(h.hunks for h in health),
            "upstream_lines": sum(h.upstream_lines for h in health)}


@dataclass
class TreeStatus:
    present: bool
    matches: bool  # the tree's branch is the series applied to the pin, as the project holds it now
    detail: str
    local_work: list[str]


def tree_status(project: Project, pin: Pin, tree: Path) -> TreeStatus:
    try:
        repo = git.Repo(tree)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return TreeStatus(False, False, f"no tree at {tree} (run `spbuild fetch`)", [])
    state = patches.TreeState.load(repo)
    work = patches.local_work(repo, state, project)
    if state is None:
        return TreeStatus(True, False, "the series is not applied (run `spbuild patch`)", work)
    if state.fingerprint != patches.fingerprint(project, pin):
        return TreeStatus(True, False, "the tree was patched from another pin, cpp/ or patches/ (the next build "
                          "re-applies)", work)
    if not patches.holds(repo, state):
        return TreeStatus(True, False, f"HEAD moved off the patched branch ({state.head[:12]})", work)
    return TreeStatus(True, True, f"branch {patches.BRANCH} = pin + cpp/ + {len(state.patches)} patch(es)", work)
