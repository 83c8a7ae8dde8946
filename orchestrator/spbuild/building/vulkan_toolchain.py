"""Which glslc and Vulkan headers a Vulkan build uses, and a modern pair where the system's lack the fast paths.

ggml-vulkan compiles its cooperative-matrix and integer-dot shaders only when glslc compiles its feature probes
(`vulkan-shaders/feature-tests/*.comp`) and the Vulkan headers define the matching extensions. Debian 12's glslc
(shaderc 2023.2) compiles none of the probes and its headers (1.3.239) define neither cooperative-matrix extension;
measured on an H200, that build prefilled 5-6x slower than one with a modern toolchain.

The modern toolchain is Debian 13 (trixie)'s glslc, its libraries and its Vulkan and SPIR-V headers, unpacked from the
archive's .debs (InRelease checked with gpgv where the keyring is there, every file by the sha256 the signed index
lists) into `<workdir>/toolchain/`. trixie's glslc needs glibc 2.38, so a wrapper starts it through trixie's own
loader with a private library path; the install fails if any library would come from the host.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import platform
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import requests

from spbuild.errors import ToolMissing

SUITE = "trixie"
MIRROR = "https://deb.debian.org/debian"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# glslc and exactly what its ELF files need (readelf -d: libshaderc.so.1, libstdc++, libgcc_s, libc/libm and the
# loader); the install's leak check fails if a newer trixie needs more
GLSLC_PACKAGES = ("glslc", "libshaderc1", "libstdc++6", "libgcc-s1", "libc6")
HEADER_PACKAGES = ("libvulkan-dev", "spirv-headers")
_HEADER_PARTS = ("usr/include/vulkan", "usr/include/vk_video", "usr/include/spirv", "usr/share/cmake/SPIRV-Headers")
_LIB_DIR = "usr/lib/x86_64-linux-gnu"
# the fast paths a GPU can use, each needing a glslc extension and (for the coopmat ones) a header define
FAST_PATHS: dict[str, str | None] = {
    "GL_KHR_cooperative_matrix": "VK_KHR_cooperative_matrix",
    "GL_NV_cooperative_matrix2": "VK_NV_cooperative_matrix2",
    "GL_EXT_integer_dot_product": None,
}
MODES = ("auto", "system", "toolchain")  # or a path to a glslc


class ToolchainError(ToolMissing):
    """The modern toolchain could not be installed or did not pass its checks."""


# --- probing --------------------------------------------------------------------------------------------------


def feature_probes(tree: Path) -> dict[str, Path]:
    """{extension: probe shader} as the tree's ggml-vulkan CMakeLists names them."""
    vulkan = tree / "ggml" / "src" / "ggml-vulkan"
    text = (vulkan / "CMakeLists.txt").read_text() if (vulkan / "CMakeLists.txt").is_file() else ""
    found = re.findall(r'test_shader_extension_support\(\s*"([^"]+)"\s*"[^"]*/feature-tests/([^"/]+)"', text)
    return {ext: vulkan / "vulkan-shaders" / "feature-tests" / name for ext, name in found}


def compiles(glslc: Path, shader: Path) -> bool:
    """glslc compiles the shader as ggml's CMake asks it to. CMake only greps stderr for "extension not supported",
    so a glslc that does not even start passes there; here the exit status counts."""
    try:
        proc = subprocess.run([str(glslc), "-o", os.devnull, "-fshader-stage=compute", "--target-env=vulkan1.3",
                               str(shader)], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


# what each shader extension ggml-vulkan probes for gives (bf16 is not a fast path here: no glslc we ship has it)
FEATURES: dict[str, str] = {
    "GL_KHR_cooperative_matrix": "tensor-core matmul (coopmat)",
    "GL_NV_cooperative_matrix2": "NVIDIA coopmat2 matmul and flash attention",
    "GL_EXT_integer_dot_product": "int8 dot-product matmul for quantized models",
    "GL_EXT_bfloat16": "bf16 matmul",
}


def probe(glslc: Path, tree: Path | None) -> dict[str, bool]:
    """{extension: glslc compiles its probe}: the tree's own feature tests where a fetched tree has them, else a
    minimal shader requiring each extension of FEATURES (before anything is fetched)."""
    probes = feature_probes(tree) if tree is not None else {}
    if probes:
        return {ext: compiles(glslc, shader) for ext, shader in probes.items()}
    with tempfile.TemporaryDirectory() as tmp:
        result = {}
        for ext in FEATURES:
            shader = Path(tmp) / f"{ext}.comp"
            shader.write_text(f"#version 460\n#extension {ext} : require\nvoid main() {{}}\n")
            result[ext] = compiles(glslc, shader)
        return result


def version(glslc: Path) -> str:
    try:
        proc = subprocess.run([str(glslc), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.splitlines()[0].strip() if proc.returncode == 0 and proc.stdout else ""


def header_defines(include: Path | None) -> dict[str, bool]:
    """Which fast-path extensions the Vulkan headers in `include` (None: the system's) define."""
    candidates = [include] if include else [Path(os.environ.get("VULKAN_SDK", "/nonexistent")) / "include",
                                            Path("/usr/include"), Path("/usr/local/include")]
    core = next((c / "vulkan" / "vulkan_core.h" for c in candidates if (c / "vulkan" / "vulkan_core.h").is_file()), None)
    text = core.read_text(errors="replace") if core else ""
    return {define: bool(re.search(rf"#define {define} 1\b", text)) for define in filter(None, FAST_PATHS.values())}


def system_glslc() -> Path | None:
    sdk = os.environ.get("VULKAN_SDK")
    if sdk and (Path(sdk) / "bin" / "glslc").is_file():
        return Path(sdk) / "bin" / "glslc"
    found = shutil.which("glslc")
    return Path(found) if found else None


# --- the choice -------------------------------------------------------------------------------------------------


@dataclass
class Choice:
    glslc: str
    origin: str  # system | toolchain (Debian trixie, unpacked) | given (--glslc PATH)
    version: str
    extensions: dict[str, bool]  # every probe of the tree
    include: str = ""  # Vulkan headers, where not the system's
    spirv_cmake: str = ""  # SPIRV-Headers' CMake package, where not the system's
    headers: dict[str, bool] = field(default_factory=dict)
    note: str = ""

    @property
    def fast_paths(self) -> list[str]:
        """The fast paths the build compiles: glslc has the extension, and the headers the define it needs."""
        return [ext for ext, define in FAST_PATHS.items()
                if self.extensions.get(ext) and (define is None or self.headers.get(define))]

    def defines(self) -> dict[str, str]:
        out = {"Vulkan_GLSLC_EXECUTABLE": self.glslc}
        if self.include:
            out["Vulkan_INCLUDE_DIR"] = self.include
        if self.spirv_cmake:
            out["SPIRV-Headers_DIR"] = self.spirv_cmake
        return out

    def summary(self) -> str:
        paths = ", ".join(p.removeprefix("GL_") for p in self.fast_paths) or "none (slow shader paths)"
        return f"{self.version or 'glslc'} ({self.origin}: {self.glslc}); fast paths: {paths}"

    def warning(self) -> str | None:
        missing = [ext for ext in FAST_PATHS if ext not in self.fast_paths]
        if not missing:
            return None
        return (f"this build's glslc ({self.origin}: {self.version}) or Vulkan headers lack {', '.join(missing)}: "
                "it works, but takes slow shader paths on GPUs that have those features. " + self.note)

    def to_dict(self) -> dict:
        return asdict(self)


def _system_choice(tree: Path) -> Choice | None:
    glslc = system_glslc()
    if glslc is None:
        return None
    return Choice(str(glslc), "system", version(glslc), probe(glslc, tree), headers=header_defines(None))


def choose(mode: str, tree: Path, toolchain_dir: Path) -> Choice:
    """The glslc (and headers) for a Vulkan build. auto: the system's when it has every fast path, else the
    modern toolchain when it installs and passes the probes the system's fails, else the system's (with a note)."""
    if mode not in MODES:
        given = Path(mode).expanduser()
        if not given.is_file() or not version(given):
            raise ToolMissing(f"--glslc {mode}: not a glslc that runs", hint="Give the path of a glslc executable.")
        found = probe(given, tree)
        if not any(found.values()) and not _compiles_plain(given):
            raise ToolMissing(f"--glslc {mode} does not compile a plain compute shader")
        return Choice(str(given.resolve()), "given", version(given), found, headers=header_defines(None))
    system = _system_choice(tree)
    if mode == "system":
        if system is None:
            raise ToolMissing("glslc not found", hint="Install glslc, or use --glslc toolchain.")
        return system
    if mode == "auto" and system is not None and len(system.fast_paths) == len(FAST_PATHS):
        return system
    try:
        modern = install(toolchain_dir)
    except ToolchainError as err:
        if mode == "toolchain" or system is None:
            raise
        system.note = f"a modern glslc was not installed ({err}); the build uses the system's"
        return system
    choice = Choice(str(modern.glslc), "toolchain", version(modern.glslc), probe(modern.glslc, tree),
                    str(modern.include), str(modern.spirv_cmake), header_defines(modern.include),
                    note=f"Debian {SUITE}'s glslc and headers, in {toolchain_dir}")
    if mode == "auto" and system is not None and len(choice.fast_paths) <= len(system.fast_paths):
        system.note = f"the modern toolchain adds no fast path ({choice.summary()}); the build uses the system's"
        return system
    return choice


def _compiles_plain(glslc: Path) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        shader = Path(tmp) / "plain.comp"
        shader.write_text("#version 450\nlayout(local_size_x = 1) in;\nvoid main() {}\n")
        return compiles(glslc, shader)


# --- the modern toolchain: Debian trixie's .debs ----------------------------------------------------------------


@dataclass(frozen=True)
class Installed:
    glslc: Path  # the wrapper
    include: Path
    spirv_cmake: Path


def supported_here() -> str | None:
    """Why the trixie toolchain cannot run here, or None."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"it is built for Linux x86_64, this is {platform.system()} {platform.machine()}"
    if shutil.which("dpkg-deb") is None:
        return "dpkg-deb (to unpack .debs) is missing"
    return None


def install(dest: Path, suite: str = SUITE, mirror: str = MIRROR) -> Installed:
    """Unpack trixie's glslc and headers into `dest` once; later calls reuse them."""
    dest = dest.resolve()
    done = dest / "complete"
    result = Installed(dest / "glslc", dest / "root" / "usr" / "include",
                       dest / "root" / "usr" / "share" / "cmake" / "SPIRV-Headers")
    if done.is_file() and result.glslc.is_file():
        return result
    reason = supported_here()
    if reason:
        raise ToolchainError(f"the modern glslc cannot be used here: {reason}")
    index = packages_index(suite, mirror)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{dest.name}.", dir=dest.parent))
    try:
        for name in GLSLC_PACKAGES + HEADER_PACKAGES:
            _unpack(_download(index, name, mirror, staging / "debs"), staging / "root")
        shutil.rmtree(staging / "debs")
        _prune(staging / "root")
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _write_wrapper(dest)
    _check_install(dest, result)
    done.write_text("".join(f"{name} {index[name]['version']}\n" for name in GLSLC_PACKAGES + HEADER_PACKAGES))
    return result


def _get(url: str) -> bytes:
    try:
        response = requests.get(url, timeout=300)
        response.raise_for_status()
    except requests.RequestException as err:
        raise ToolchainError(f"cannot download {url}: {err}") from err
    return response.content


def _release(suite: str, mirror: str) -> str:
    """The suite's signed Release text, checked with gpgv against Debian's archive keyring where both exist."""
    signed = _get(f"{mirror}/dists/{suite}/InRelease")
    if shutil.which("gpgv") and KEYRING.is_file():
        proc = subprocess.run(["gpgv", "--keyring", str(KEYRING), "--output", "-", "-"], input=signed,
                              capture_output=True)
        if proc.returncode != 0:
            raise ToolchainError(f"{suite}'s InRelease fails its signature check: {proc.stderr.decode()[-300:]}",
                                 hint="Update debian-archive-keyring, or use --glslc system.")
        return proc.stdout.decode()
    text = signed.decode(errors="replace")
    body = re.search(r"-----BEGIN PGP SIGNED MESSAGE-----\n(?:.+\n)*?\n(.*?)-----BEGIN PGP SIGNATURE", text, re.DOTALL)
    if not body:
        raise ToolchainError(f"cannot read {suite}'s InRelease")
    return body.group(1)  # without gpgv: the https transport and the sha256 chain below


def packages_index(suite: str = SUITE, mirror: str = MIRROR) -> dict[str, dict]:
    release = _release(suite, mirror)
    wanted = "main/binary-amd64/Packages.xz"
    listed = re.search(rf"^ ([0-9a-f]{{64}})\s+\d+\s+{re.escape(wanted)}$", release.split("SHA256:", 1)[-1], re.MULTILINE)
    if not listed:
        raise ToolchainError(f"{suite}'s Release does not list {wanted}")
    data = _get(f"{mirror}/dists/{suite}/{wanted}")
    if hashlib.sha256(data).hexdigest() != listed.group(1):
        raise ToolchainError(f"{wanted} does not match its sha256 in {suite}'s Release (a mirror mid-sync? retry)")
    index: dict[str, dict] = {}
    for stanza in lzma.decompress(data).decode("utf-8", "replace").split("\n\n"):
        fields = dict(re.findall(r"^([\w-]+): (.*)$", stanza, re.MULTILINE))
        if "Package" in fields and fields["Package"] not in index:
            index[fields["Package"]] = {"version": fields.get("Version", ""), "filename": fields.get("Filename", ""),
                                        "sha256": fields.get("SHA256", "")}
    missing = [n for n in GLSLC_PACKAGES + HEADER_PACKAGES if n not in index]
    if missing:
        raise ToolchainError(f"{suite} has no package {', '.join(missing)}")
    return index


def _download(index: dict[str, dict], name: str, mirror: str, folder: Path) -> Path:
    entry = index[name]
    data = _get(f"{mirror}/{entry['filename']}")
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ToolchainError(f"{entry['filename']} does not match the sha256 the index lists")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / Path(entry["filename"]).name
    path.write_bytes(data)
    return path


def _unpack(deb: Path, root: Path) -> None:
    proc = subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError(f"dpkg-deb -x {deb.name}: {proc.stderr.strip()}")


# what the toolchain uses of the unpacked packages; the rest (docs, locales, gconv modules) goes
_KEEP = ("usr/bin/glslc", _LIB_DIR, "usr/lib64", *_HEADER_PARTS, "usr/share/pkgconfig")


def _prune(root: Path) -> None:
    for path in sorted(root.rglob("*"), key=lambda p: -len(p.parts)):
        rel = path.relative_to(root).as_posix()
        if any(rel == keep or rel.startswith(keep + "/") or keep.startswith(rel + "/") for keep in _KEEP):
            continue
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    gconv = root / _LIB_DIR / "gconv"
    if gconv.is_dir():
        shutil.rmtree(gconv)


def _loader(dest: Path) -> list[str]:
    loader = dest / "root" / _LIB_DIR / "ld-linux-x86-64.so.2"
    if not loader.exists():
        raise ToolchainError(f"no {_LIB_DIR}/ld-linux-x86-64.so.2 in trixie's libc6 (its layout changed?)")
    # --inhibit-cache: never fall back to the host's ld.so.cache (its glibc is older)
    return [str(loader), "--inhibit-cache", "--library-path", str(dest / "root" / _LIB_DIR)]


def _write_wrapper(dest: Path) -> None:
    """A wrapper that finds the unpacked root beside itself, so the folder can move (or travel to another machine)."""
    lib = f'"$D/root/{_LIB_DIR}"'
    (dest / "glslc").write_text(
        f"#!/bin/sh\n# Debian {SUITE}'s glslc, started through its own glibc loader\n"
        'D=$(dirname "$(readlink -f "$0")")\n'
        f'exec "$D/root/{_LIB_DIR}/ld-linux-x86-64.so.2" --inhibit-cache --library-path {lib} --argv0 "$0" '
        '"$D/root/usr/bin/glslc" "$@"\n')
    (dest / "glslc").chmod(0o755)


def _check_install(dest: Path, result: Installed) -> None:
    if not version(result.glslc):
        raise ToolchainError(f"{result.glslc} does not run")
    listing = subprocess.run([*_loader(dest), "--list", str(dest / "root" / "usr" / "bin" / "glslc")],
                             capture_output=True, text=True).stdout
    leaks = [line.strip() for line in listing.splitlines() if "=>" in line and str(dest) not in line]
    if leaks:
        raise ToolchainError(f"trixie's glslc would load host libraries: {'; '.join(leaks)}")
    defined = header_defines(result.include)
    if not all(defined.values()):
        raise ToolchainError(f"{SUITE}'s Vulkan headers lack {[d for d, ok in defined.items() if not ok]}")
    for part in _HEADER_PARTS:
        if not (dest / "root" / part).exists():
            raise ToolchainError(f"{SUITE}'s headers have no {part}")
