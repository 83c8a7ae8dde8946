# Shared by the H200 scripts (sourced, from the repository root): the CUDA configure flags and the carried tree.
CM=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF)

# the device has no jsonschema (the tools eval validates calls with it) and no network: pure-Python wheels carried in
# .carry/pylib (jsonschema 4.17.3, attrs, pyrsistent: `pip download --no-deps --only-binary=:all: --platform any`)
# are imported from where they lie
carried_wheels() {
    local w out=""
    for w in "$PWD"/.carry/pylib/*.whl; do [ -f "$w" ] && out="$out:$w"; done
    echo "$out"
}

# unpack_tree DIR: the patched tree from .carry/tree.tar.xz, with the llama-bpe vocabulary the random models use
unpack_tree() {
    mkdir -p "$1/models"
    tar -xJf .carry/tree.tar.xz -C "$1"
    cp .carry/ggml-vocab-llama-bpe.gguf "$1/models/"
}

# the Vulkan configure flags, before the glslc and headers are chosen
VK=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_VULKAN=ON -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF
    -DVulkan_LIBRARY=/usr/lib/x86_64-linux-gnu/libvulkan.so.1)

# toolchain_defines DIR: the CMake definitions spbuild chooses and hands over for the toolchain folder carried to
# DIR/workdir/toolchain (install() finds it complete), one -D a word; the choice's summary goes to stderr
toolchain_defines() {
    PYTHONPATH=$PWD/orchestrator python3 - "$1" <<'EOF'
import sys
from pathlib import Path
from spbuild.building import vulkan_toolchain as vt
w = Path(sys.argv[1])
choice = vt.choose("toolchain", w / "src", w / "workdir" / "toolchain")
print(choice.summary(), file=sys.stderr)
print(" ".join(f"-D{k}={v}" for k, v in choice.defines().items()))
EOF
}

# vulkan_loader: the Vulkan loader and GL dispatch packages carried in .gl/ (NVIDIA's Vulkan driver needs them; the
# device has the driver's ICD file but no loader)
vulkan_loader() {
    export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
}
