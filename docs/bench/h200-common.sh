# Shared by the H200 scripts (sourced, from the repository root): the CUDA configure flags and the carried tree.
CM=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF)

# unpack_tree DIR: the patched tree from .carry/tree.tar.xz, with the llama-bpe vocabulary the random models use
unpack_tree() {
    mkdir -p "$1/models"
    tar -xJf .carry/tree.tar.xz -C "$1"
    cp .carry/ggml-vocab-llama-bpe.gguf "$1/models/"
}
