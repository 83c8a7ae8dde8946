"""Where things live: the patch-set project (pin, cpp/ overlay, patches/) and the working state."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from spbuild.errors import SpbuildError

WORKDIR_ENV = "SPBUILD_WORKDIR"
PROJECT_ENV = "SPBUILD_PROJECT"
WORKDIR_NAME = ".spbuild"

# A wheel carries the patch set here; a checkout of the repository takes precedence over it.
_PACKAGED_DATA = Path(__file__).resolve().parent / "data"


def _is_project(path: Path) -> bool:
    return (path / "pin.toml").is_file() and (path / "patches" / "series").is_file() and (path / "cpp").is_dir()


@dataclass(frozen=True)
class Project:
    """The patch set: `pin.toml`, `cpp/` (new files) and `patches/` (changes to upstream files)."""

    root: Path
    is_checkout: bool

    @property
    def pin_file(self) -> Path:
        return self.root / "pin.toml"

    @property
    def overlay_dir(self) -> Path:
        return self.root / "cpp"

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def series_file(self) -> Path:
        return self.patches_dir / "series"

    @property
    def has_tests(self) -> bool:
        """A checkout with the test suite (an installed spbuild carries none)."""
        return self.is_checkout and (self.root / "tests").is_dir()

    @classmethod
    def locate(cls, explicit: Path | None = None, start: Path | None = None) -> Project:
        """The project given explicitly or by $SPBUILD_PROJECT, else the checkout around `start`, else the wheel's copy."""
        chosen = explicit or (Path(os.environ[PROJECT_ENV]) if os.environ.get(PROJECT_ENV) else None)
        if chosen is not None:
            chosen = chosen.resolve()
            if not _is_project(chosen):
                raise SpbuildError(
                    f"{chosen} is not a llama-specprefill checkout (it needs pin.toml, cpp/ and patches/series)",
                    hint="Point --project (or $SPBUILD_PROJECT) at the repository root.",
                )
            return cls(chosen, is_checkout=True)
        here = (start or Path.cwd()).resolve()
        for candidate in (here, *here.parents):
            if _is_project(candidate):
                return cls(candidate, is_checkout=True)
        if _is_project(_PACKAGED_DATA):
            return cls(_PACKAGED_DATA, is_checkout=False)
        raise SpbuildError(
            "cannot find the patch set (pin.toml, cpp/, patches/)",
            hint="Run spbuild inside a llama-specprefill checkout, or pass --project.",
        )


@dataclass(frozen=True)
class Workspace:
    """All working state in one ignored folder: sources, downloads, builds, logs, generated models."""

    root: Path

    @classmethod
    def resolve(cls, project: Project, explicit: Path | None = None) -> Workspace:
        if explicit is not None:
            return cls(explicit.resolve())
        if os.environ.get(WORKDIR_ENV):
            return cls(Path(os.environ[WORKDIR_ENV]).resolve())
        if project.is_checkout:
            return cls(project.root / WORKDIR_NAME)
        return cls(Path.home() / ".cache" / "spbuild")

    @property
    def source_dir(self) -> Path:
        return self.root / "src" / "llama.cpp"

    @property
    def downloads_dir(self) -> Path:
        return self.root / "downloads"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def toolchain_dir(self) -> Path:
        """Toolchains spbuild provides itself (a modern glslc and Vulkan headers)."""
        return self.root / "toolchain"

    def build_dir(self, backend: str) -> Path:
        return self.root / "build" / backend

    def ensure(self) -> None:
        for path in (self.root, self.downloads_dir, self.logs_dir):
            path.mkdir(parents=True, exist_ok=True)
