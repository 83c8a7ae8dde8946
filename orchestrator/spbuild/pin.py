"""The pinned upstream commit and the mirrors that carry it (`pin.toml`)."""

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
    """An sdist on a Python package index that vendors the pinned tree with its git metadata."""

    package: str
    version: str
    filename: str
    sha256: str
    index: str
    tree: str
    gitdir: str


@dataclass(frozen=True)
class Pin:
    url: str
    commit: str
    pypi: PypiMirror | None
    date: str = ""
    subject: str = ""

    @property
    def short(self) -> str:
        return self.commit[:12]

    def describe(self) -> str:
        text = f"{self.url} @ {self.short}"
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
        fields = {k: _require(pypi_table, k, where) for k in ("package", "version", "filename", "sha256", "tree", "gitdir")}
        fields["sha256"] = fields["sha256"].lower()
        if not _SHA256.match(fields["sha256"]):
            raise SpbuildError(f"{where}: sha256 must be 64 hex digits")
        pypi = PypiMirror(index=pypi_table.get("index", "https://pypi.org/simple"), **fields)
    return Pin(
        url=url,
        commit=commit,
        pypi=pypi,
        date=str(upstream.get("date", "")),
        subject=str(upstream.get("subject", "")),
    )


def load_pin(path: Path) -> Pin:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise SpbuildError(f"pin file {path} not found") from err
    return parse_pin(text, origin=str(path))
