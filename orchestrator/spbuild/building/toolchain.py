"""Finding build tools: the system's when recent enough, else the ones the `cmake` and `ninja` PyPI packages ship."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

MIN_CMAKE = (3, 19)  # ggml-vulkan's minimum; the top level needs 3.14
MIN_NINJA = (1, 10)


@dataclass(frozen=True)
class Tool:
    name: str
    path: Path
    version: tuple[int, ...]
    origin: str  # "system" or "PyPI"

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


def tool_version(path: str | Path, arg: str = "--version") -> tuple[int, ...] | None:
    try:
        out = subprocess.run([str(path), arg], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(g) for g in match.groups() if g is not None) if match else None


def _pypi_bin(module: str) -> Path | None:
    try:
        if module == "cmake":
            import cmake

            return Path(cmake.CMAKE_BIN_DIR) / "cmake"
        import ninja

        return Path(ninja.BIN_DIR) / "ninja"
    except (ImportError, AttributeError):
        return None


def find_tool(name: str, minimum: tuple[int, ...]) -> Tool | None:
    system = shutil.which(name)
    pypi = _pypi_bin(name)
    candidates = [(system, "system")] if system and (pypi is None or Path(system).resolve() != pypi.resolve()) else []
    candidates.append((str(pypi) if pypi else None, "PyPI"))
    for path, origin in candidates:
        if path and Path(path).exists():
            version = tool_version(path)
            if version and version >= minimum:
                return Tool(name, Path(path), version, origin)
    return None


def cmake() -> Tool | None:
    return find_tool("cmake", MIN_CMAKE)


def ninja() -> Tool | None:
    return find_tool("ninja", MIN_NINJA)
