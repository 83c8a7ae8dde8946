from __future__ import annotations

from pathlib import Path

import pytest

from spbuild.building import cmake
from spbuild.building.cmake import BuildConfig, cmake_defines, default_targets, parse_define
from spbuild.errors import SpbuildError

BACKEND_SWITCH = {
    "vulkan": "GGML_VULKAN",
    "cuda": "GGML_CUDA",
    "sycl": "GGML_SYCL",
    "hip": "GGML_HIP",
    "metal": "GGML_METAL",
}
ALL_SWITCHES = set(BACKEND_SWITCH.values())


def test_backends_are_the_six_known():
    assert set(cmake.BACKENDS) == {"cpu", *BACKEND_SWITCH}


@pytest.mark.parametrize("backend", cmake.BACKENDS)
@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_backend_switch_and_common_defaults(backend, machine):
    defines = cmake_defines(BuildConfig(backend=backend), machine=machine)
    switch = BACKEND_SWITCH.get(backend)
    assert {k for k in ALL_SWITCHES if defines.get(k) == "ON"} == ({switch} if switch else set())
    assert defines["GGML_NATIVE"] == "OFF"
    assert defines["LLAMA_USE_PREBUILT_UI"] == "OFF"
    assert defines["LLAMA_BUILD_APP"] == "OFF"
    assert defines["LLAMA_BUILD_SERVER"] == "ON"
    assert defines["CMAKE_BUILD_TYPE"] == "Release"
    assert "GGML_RPC" not in defines


def test_sycl_uses_the_oneapi_compilers():
    defines = cmake_defines(BuildConfig(backend="sycl"), machine="x86_64")
    assert (defines["CMAKE_C_COMPILER"], defines["CMAKE_CXX_COMPILER"]) == ("icx", "icpx")
    assert "CMAKE_CXX_COMPILER" not in cmake_defines(BuildConfig(backend="vulkan"), machine="x86_64")


@pytest.mark.parametrize("machine", ["x86_64", "AMD64"])
def test_portable_x86_flags(machine):
    defines = cmake_defines(BuildConfig(), machine=machine)
    for flag in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"):
        assert defines[flag] == "ON"
    assert "GGML_AVX512" not in defines


@pytest.mark.parametrize("machine", ["aarch64", "arm64"])
def test_no_x86_flags_on_arm(machine):
    defines = cmake_defines(BuildConfig(backend="vulkan"), machine=machine)
    assert not [k for k in defines if k in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2")]
    assert defines["GGML_NATIVE"] == "OFF"


def test_variants():
    config = BuildConfig(backend="cuda", rpc=True, debug=True, test_helpers=False)
    defines = cmake_defines(config, machine="x86_64")
    assert defines["GGML_RPC"] == "ON"
    assert defines["CMAKE_BUILD_TYPE"] == "Debug"
    assert defines["LLAMA_BUILD_TESTS"] == "OFF"
    assert config.name == "cuda-rpc-debug"
    assert BuildConfig(backend="vulkan").name == "vulkan"
    assert cmake_defines(BuildConfig(), machine="x86_64")["LLAMA_BUILD_TESTS"] == "ON"


def test_sanitizer_builds_use_llamas_own_options_in_a_folder_of_their_own():
    config = BuildConfig(sanitize=["undefined", "address"])
    defines = cmake_defines(config, machine="x86_64")
    assert {k: defines[k] for k in ("LLAMA_SANITIZE_ADDRESS", "LLAMA_SANITIZE_UNDEFINED", "GGML_SANITIZE_ADDRESS",
                                    "GGML_SANITIZE_UNDEFINED")} == dict.fromkeys(
        ("LLAMA_SANITIZE_ADDRESS", "LLAMA_SANITIZE_UNDEFINED", "GGML_SANITIZE_ADDRESS", "GGML_SANITIZE_UNDEFINED"), "ON")
    assert "LLAMA_SANITIZE_THREAD" not in defines
    assert defines["CMAKE_BUILD_TYPE"] == "RelWithDebInfo"
    assert config.name == "cpu-asan-ubsan"
    assert BuildConfig(sanitize=["thread"]).name == "cpu-tsan"


@pytest.mark.parametrize(("config", "message"), [
    ({"sanitize": ["memory"]}, "unknown sanitizer memory"),
    ({"sanitize": ["address"], "backend": "vulkan"}, "CPU backend only"),
    ({"sanitize": ["address", "thread"]}, "cannot be combined"),
])
def test_sanitizer_builds_refuse_what_cannot_work(config, message):
    with pytest.raises(SpbuildError, match=message):
        BuildConfig(**config)


def test_user_defines_override_defaults():
    config = BuildConfig(backend="vulkan", defines={"GGML_NATIVE": "ON", "GGML_VULKAN": "OFF", "GGML_AVX2": "OFF",
                                                     "CMAKE_CUDA_ARCHITECTURES": "90"})
    defines = cmake_defines(config, machine="x86_64")
    assert defines["GGML_NATIVE"] == "ON"
    assert defines["GGML_VULKAN"] == "OFF"
    assert defines["GGML_AVX2"] == "OFF"
    assert defines["CMAKE_CUDA_ARCHITECTURES"] == "90"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("FOO=1", ("FOO", "1")),
        ("-DFOO=1", ("FOO", "1")),
        ("FOO:BOOL=ON", ("FOO", "ON")),
        ("FOO=", ("FOO", "")),
        ("FOO=a=b", ("FOO", "a=b")),
    ],
)
def test_parse_define(text, expected):
    assert parse_define(text) == expected


@pytest.mark.parametrize("text", ["FOO", "=1", "-D=1", ""])
def test_parse_define_rejects(text):
    with pytest.raises(SpbuildError, match="bad -D") as err:
        parse_define(text)
    assert "KEY=VALUE" in (err.value.hint or "")


def test_unknown_backend():
    with pytest.raises(SpbuildError, match="bogus") as err:
        BuildConfig(backend="bogus")
    assert "vulkan" in (err.value.hint or "")


def test_default_targets(tmp_path: Path):
    assert default_targets(BuildConfig(test_helpers=False), tmp_path) == ["llama-server"]
    with_helpers = default_targets(BuildConfig(), tmp_path)
    assert with_helpers == ["llama-server", *cmake.TEST_HELPER_TARGETS]
    assert "rpc-server" not in with_helpers
    assert default_targets(BuildConfig(rpc=True, test_helpers=False), tmp_path) == ["llama-server", "rpc-server"]
    # the tree names the RPC server's target (ggml-rpc-server at the pin)
    (tmp_path / "tools" / "rpc").mkdir(parents=True)
    (tmp_path / "tools" / "rpc" / "CMakeLists.txt").write_text("set(TARGET ggml-rpc-server)\nadd_executable(${TARGET} rpc-server.cpp)\n")
    assert default_targets(BuildConfig(rpc=True, test_helpers=False), tmp_path) == ["llama-server", "ggml-rpc-server"]

    (tmp_path / "tools" / "specprefill").mkdir(parents=True)
    assert "llama-specprefill" not in default_targets(BuildConfig(), tmp_path)  # the folder alone is not enough
    (tmp_path / "tools" / "specprefill" / "CMakeLists.txt").write_text("# tool\n")
    assert default_targets(BuildConfig(test_helpers=False), tmp_path) == ["llama-server", "llama-specprefill"]
    # llama-bench, for `spbuild bench`, where the tree has it
    (tmp_path / "tools" / "llama-bench").mkdir(parents=True)
    (tmp_path / "tools" / "llama-bench" / "CMakeLists.txt").write_text("# bench\n")
    assert default_targets(BuildConfig(test_helpers=False), tmp_path) == ["llama-server", "llama-specprefill",
                                                                          "llama-bench"]


def test_configure_and_build_argv(tmp_path: Path):
    config = BuildConfig(backend="vulkan", defines={"X": "1"})
    argv = cmake.configure_argv(Path("/bin/cmake"), Path("/bin/ninja"), tmp_path / "src", tmp_path / "b", config)
    assert argv[:7] == ["/bin/cmake", "-S", str(tmp_path / "src"), "-B", str(tmp_path / "b"), "-G", "Ninja"]
    assert "-DCMAKE_MAKE_PROGRAM=/bin/ninja" in argv
    assert "-DGGML_VULKAN=ON" in argv and "-DGGML_NATIVE=OFF" in argv and "-DX=1" in argv
    assert cmake.build_argv(Path("/bin/cmake"), tmp_path / "b", ["a", "b"], 4) == [
        "/bin/cmake", "--build", str(tmp_path / "b"), "--target", "a", "b", "--parallel", "4"]
    assert "--parallel" not in cmake.build_argv(Path("/bin/cmake"), tmp_path / "b", ["a"], None)
