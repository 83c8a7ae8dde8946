"""`spbuild build`: check the machine, apply the series, configure and build, with progress and a summary."""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from spbuild.building import cmake, doctor, install, toolchain, vulkan_toolchain
from spbuild.console import console, info, log_path, run_logged, warn
from spbuild.errors import BuildError, SpbuildError, ToolMissing
from spbuild.project import Project, Workspace
from spbuild.tree import patches, sources
from spbuild.tree.pin import Pin

BUILD_RECORD = "spbuild-build.json"
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)$")
_ERROR_LINE = re.compile(r"(\berror\b:|fatal error:|CMake Error|undefined reference|ninja: error)", re.IGNORECASE)


@dataclass
class BuildRecord:
    backend: str
    build_dir: str
    commit: str
    patches: list[str]
    targets: list[str]
    artifacts: dict[str, str]
    defines: dict[str, str]
    shader_warning: str | None = None
    elapsed_s: float = 0.0
    log: str = ""
    source: str = ""  # the llama.cpp tree it was built from (its gguf-py writes the tests' models)
    glslc: dict | None = None  # a Vulkan build's shader compiler and headers (vulkan_toolchain.Choice)
    sanitize: list[str] = field(default_factory=list)  # the sanitizers it was built with (cmake.SANITIZERS)

    def save(self) -> None:
        (Path(self.build_dir) / BUILD_RECORD).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, build_dir: Path) -> BuildRecord | None:
        try:
            return cls(**json.loads((build_dir / BUILD_RECORD).read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None


@dataclass
class BuildRequest:
    config: cmake.BuildConfig
    jobs: int | None = None
    build_dir: Path | None = None
    skip_checks: bool = False
    force_patch: bool = False
    glslc: str = "auto"  # vulkan_toolchain.MODES, or a glslc path
    install_deps: bool = False  # install what the doctor finds missing, with the platform's package manager


def first_error(lines: list[str], context: int = 4) -> str | None:
    for index, line in enumerate(lines):
        if _ERROR_LINE.search(line):
            return "\n".join(lines[index : index + context])
    return None


def _preflight(backend: str) -> doctor.Report:
    report = doctor.diagnose(backend, probe_device=False)
    if report.failures:
        lines = [f"{c.name}: {c.detail}" + "".join(f"\n      {a}" for a in c.advice()) for c in report.failures]
        raise ToolMissing(
            f"the {backend} build needs what this machine lacks:\n  - " + "\n  - ".join(lines),
            hint=f"`spbuild build --{backend} --install-deps` installs them (or install the above yourself); "
                 f"`spbuild doctor --backend {backend}` shows the full report.",
        )
    return report


def _run_with_progress(argv: list[str], log: Path, title: str) -> tuple[int, list[str]]:
    tail: list[str] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("[dim]{task.fields[step]}"))
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(title, total=None, step="")

        def on_line(line: str) -> None:
            match = _NINJA_STEP.match(line)
            if match:
                done, total, what = int(match.group(1)), int(match.group(2)), match.group(3)
                progress.update(task, completed=done, total=total, step=what[-60:])
            else:
                tail.append(line)
                del tail[:-400]

        code = run_logged(argv, log, on_line=on_line)
    return code, tail


def artifact_paths(build_dir: Path, targets: list[str]) -> dict[str, str]:
    found = {}
    for target in targets:
        for candidate in (build_dir / "bin" / target, build_dir / "bin" / f"{target}.exe"):
            if candidate.exists():
                found[target] = str(candidate)
    return found


def compile_tree(source: Path, build_dir: Path, config: cmake.BuildConfig, log: Path,
                 jobs: int | None = None) -> tuple[list[str], dict[str, str]]:
    """Configure and build `source` as it is into `build_dir`; return the targets and the artifacts found."""
    cmake_tool, ninja_tool = toolchain.cmake(), toolchain.ninja()
    if cmake_tool is None or ninja_tool is None:
        raise ToolMissing("CMake or Ninja is missing", hint="pip install cmake ninja")
    build_dir.mkdir(parents=True, exist_ok=True)
    configure = cmake.configure_argv(cmake_tool.path, ninja_tool.path, source, build_dir, config)
    code, tail = _run_with_progress(configure, log, "configure")
    if code != 0:
        raise BuildError(f"CMake configure failed:\n{first_error(tail, 8) or chr(10).join(tail[-15:])}",
                         hint=f"Full log: {log}")
    targets = config.targets or cmake.default_targets(config, source)
    code, tail = _run_with_progress(cmake.build_argv(cmake_tool.path, build_dir, targets, jobs), log,
                                    f"build {' '.join(targets)}")
    if code != 0:
        raise BuildError(f"build failed:\n{first_error(tail) or chr(10).join(tail[-15:])}", hint=f"Full log: {log}")
    return targets, artifact_paths(build_dir, targets)


def build(project: Project, workspace: Workspace, pin: Pin, request: BuildRequest) -> BuildRecord:
    config = request.config
    started = time.monotonic()
    source = sources.ensure_fetched(pin, workspace)

    if request.install_deps:
        install.fix(config.backend, workspace.logs_dir, tests=project.has_tests)
    if not request.skip_checks:
        _preflight(config.backend)
    applied = patches.apply_series(project, pin, source, force=request.force_patch)
    for note in applied.notes:
        warn(note)
    info(f"series: {len(applied.applied)} patch(es) and {applied.overlay_files} overlay file(s) "
         f"{'already applied' if applied.reused else 'applied'}")

    build_dir = (request.build_dir or workspace.build_dir(config.name)).resolve()
    log = log_path(workspace.logs_dir, f"build-{config.name}")
    info(f"full log: {log}")
    config, glslc = pinned_config(config, pin, source, workspace, request.glslc)
    targets, artifacts = compile_tree(source, build_dir, config, log, request.jobs)
    record = BuildRecord(
        backend=config.backend,
        build_dir=str(build_dir),
        commit=pin.commit,
        patches=applied.applied,
        targets=targets,
        artifacts=artifacts,
        defines=cmake.cmake_defines(config),
        shader_warning=glslc.warning() if glslc else None,
        elapsed_s=round(time.monotonic() - started, 1),
        log=str(log),
        source=str(source),
        glslc=glslc.to_dict() if glslc else None,
        sanitize=list(config.sanitize),
    )
    record.save()
    return record


def pinned_config(config: cmake.BuildConfig, pin: Pin, source: Path, workspace: Workspace,
                  glslc_mode: str) -> tuple[cmake.BuildConfig, vulkan_toolchain.Choice | None]:
    """What a build of `pin`'s tree adds to the user's configuration (whose own -D definitions win): the build
    number a snapshot's commit cannot count, and a Vulkan build's glslc and headers."""
    defines = dict(config.defines)
    if pin.build is not None:
        defines.setdefault("LLAMA_BUILD_NUMBER", str(pin.build))
    choice = None
    if config.backend == "vulkan":
        choice = vulkan_toolchain.choose(glslc_mode, source, workspace.toolchain_dir)
        info(f"glslc: {choice.summary()}")
        if choice.note:
            info(f"      {choice.note}")
        defines = {**choice.defines(), **defines}
    return replace(config, defines=defines), choice


def all_builds(workspace: Workspace) -> list[BuildRecord]:
    root = workspace.root / "build"
    candidates = [BuildRecord.load(d) for d in sorted(root.glob("*"))] if root.is_dir() else []
    return [r for r in candidates if r is not None]


def find_build(workspace: Workspace, backend: str | None, sanitized: bool = False) -> BuildRecord:
    """The build `spbuild test` should use: the named backend's, or the most recent one; a sanitizer build only when
    asked for (it is slower, and CPU-only), and then only one."""
    root = workspace.root / "build"
    records = [r for r in all_builds(workspace)
               if (backend is None or r.backend == backend) and bool(r.sanitize) == sanitized]
    if not records:
        which = ("sanitizer " if sanitized else "") + (f"{backend} build" if backend else "build")
        how = "spbuild build --sanitize address,undefined" if sanitized else f"spbuild build --{backend or 'vulkan'}"
        raise SpbuildError(f"no {which} in {root}", hint=f"Run `{how}` first.")
    return max(records, key=lambda r: (Path(r.build_dir) / BUILD_RECORD).stat().st_mtime)
