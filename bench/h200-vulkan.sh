#!/usr/bin/env bash
# The Vulkan toolchain table of docs/benchmarks.md on the H200: the patched tree built three ways, one after the
# other on the same machine: Vulkan with Debian 12's glslc and headers, Vulkan with the toolchain `spbuild build
# --vulkan` chooses on Debian 12 (Debian trixie's glslc and headers, <workdir>/toolchain, chosen and probed by
# spbuild.building.vulkan_toolchain on the device itself), and CUDA. Then llama-bench prefill of the random 8B model,
# llama-specprefill --baseline at 32K, and full against windowed scoring at 32K (bench.py measure --via tool, with warm-ups) on each.
# Carried in .carry/ (the machine has no network):
#   tree.tar.xz        git archive of the spbuild branch (unused backends, docs and models left out):
#     git -C .spbuild/src/llama.cpp archive --format=tar spbuild -- . ':!models' ':!docs' ':!ggml/src/ggml-opencl' \
#       ':!ggml/src/ggml-sycl' ':!ggml/src/ggml-hexagon' ':!ggml/src/ggml-metal' ':!ggml/src/ggml-et' | xz > .carry/tree.tar.xz
#   tc-trixie.tar.xz   the toolchain folder as spbuild installs it (vulkan_toolchain.install)
#   debs-bookworm.tar  Debian 12's glslc, libshaderc1, libvulkan-dev, spirv-headers, and the Vulkan loader and GL
#                      dispatch libraries NVIDIA's Vulkan driver needs (libvulkan1 libglvnd0 libegl1 libgl1 libglx0
#                      libopengl0 libgles2)
#   ggml-vocab-llama-bpe.gguf
#   bash bench/h200-vulkan.sh vulkan   # setup, both Vulkan builds side by side, models
#   bash bench/h200-vulkan.sh cuda     # the CUDA build
#   bash bench/h200-vulkan.sh run      # the measurements, into $OUT
#   bash bench/h200-vulkan.sh server SIZES   # after `vulkan`: spbuild bench through the trixie build's
#                                           # llama-server (TARGET/DRAFT: other models, e.g. h200-bench-eval.sh's)
#   bash bench/h200-vulkan.sh ops      # after `vulkan`: upstream's test-backend-ops for MUL_MAT and
#                                           # FLASH_ATTN_EXT on the H200's Vulkan device, with both toolchains
set -euo pipefail
W=/tmp/spvk
source bench/h200-common.sh
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
case "$1" in
ops)
    for b in vk-debian12 vk-trixie; do
        cmake -S "$W/src" -B "$W/$b" -DLLAMA_BUILD_TESTS=ON >> "$W/configure-$b.log" 2>&1
        cmake --build "$W/$b" --target test-backend-ops -j 8 > "$W/build-ops-$b.log" 2>&1 &
    done
    wait
    mkdir -p "$OUT"
    # subsets that fit a device call (the whole MUL_MAT set takes longer than 4 min)
    CASES=("MUL_MAT type_a=f16,type_b=f32,m=[0-9]+,n=(1|16|256|512),"
           "MUL_MAT type_a=(q4_0|q8_0),type_b=f32,m=[0-9]+,n=(16|256|512),"
           "FLASH_ATTN_EXT hsk=128,hsv=128,nh=4,nr23=\\[4,1\\]")
    for b in vk-debian12 vk-trixie; do
        for i in "${!CASES[@]}"; do
            op=${CASES[$i]%% *}; pattern=${CASES[$i]#* }; rc=0
            timeout 120 "$W/$b/bin/test-backend-ops" test -b Vulkan0 -o "$op" -p "$pattern" > "$OUT/ops-$b-$i.log" 2>&1 || rc=$?
            echo "$b $op $pattern: exit $rc, $(grep -E "tests passed" "$OUT/ops-$b-$i.log" | tail -1)"
        done
    done
    ;;
vulkan)
    rm -rf "$W" && mkdir -p "$W" && unpack_tree "$W/src"
    tar -xf .carry/debs-bookworm.tar -C "$W"
    for d in libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2; do dpkg -x "$W"/debs/${d}_*.deb /; done
    ldconfig
    mkdir -p "$W/bookworm"
    for d in glslc libshaderc1 libvulkan-dev spirv-headers; do dpkg -x "$W"/debs/${d}_*.deb "$W/bookworm"; done
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$W/bookworm/usr/lib/x86_64-linux-gnu" \
        "$W/bookworm/usr/bin/glslc" > "$W/bookworm/glslc" && chmod +x "$W/bookworm/glslc"
    mkdir -p "$W/workdir" && tar -xJf .carry/tc-trixie.tar.xz -C "$W/workdir" && mv "$W/workdir/tc-test" "$W/workdir/toolchain"
    "$W/bookworm/glslc" --version | head -1
    read -r -a TC <<< "$(toolchain_defines "$W")"
    echo "toolchain defines: ${TC[*]}"
    SYS=(-DVulkan_GLSLC_EXECUTABLE="$W/bookworm/glslc" -DVulkan_INCLUDE_DIR="$W/bookworm/usr/include"
         -DSPIRV-Headers_DIR="$W/bookworm/usr/share/cmake/SPIRV-Headers")
    cmake -S "$W/src" -B "$W/vk-debian12" "${VK[@]}" "${SYS[@]}" > "$W/configure-vk-debian12.log" 2>&1
    cmake -S "$W/src" -B "$W/vk-trixie" "${VK[@]}" "${TC[@]}" > "$W/configure-vk-trixie.log" 2>&1
    grep -h "supported by glslc" "$W"/configure-vk-*.log
    cmake --build "$W/vk-debian12" --target llama-bench llama-specprefill -j 8 > "$W/build-vk-debian12.log" 2>&1 &
    cmake --build "$W/vk-trixie" --target llama-bench llama-specprefill llama-server -j 8 > "$W/build-vk-trixie.log" 2>&1 &
    if [ "${2:-}" != nomodels ]; then
        python3 orchestrator/spbuild/measuring/bench.py make-model --tree "$W/src" --shape 8b "$W/target.gguf"
        python3 orchestrator/spbuild/measuring/bench.py make-model --tree "$W/src" --shape 1.5b "$W/draft.gguf"
    fi
    wait
    ls -la "$W"/vk-*/bin/llama-bench "$W"/vk-*/bin/llama-specprefill
    "$W/vk-trixie/bin/llama-bench" --list-devices 2>&1 | grep -i -E "vulkan|matrix" | head -4
    ;;
cuda)
    cmake -S "$W/src" -B "$W/cuda" "${CM[@]}" > "$W/configure-cuda.log" 2>&1
    cmake --build "$W/cuda" --target llama-bench llama-specprefill -j 16 > "$W/build-cuda.log" 2>&1
    ls -la "$W/cuda/bin/llama-bench" "$W/cuda/bin/llama-specprefill"
    ;;
server)
    mkdir -p "$OUT"
    python3 orchestrator/spbuild/measuring/bench.py measure --bin "$W/vk-trixie/bin" --target "${TARGET:-$W/target.gguf}" \
        --draft "${DRAFT:-$W/draft.gguf}" --sizes "$2" --p 0.1,0.3 --window 0,8192 --repeat 3 --warmup 1 --no-plots \
        --out "$OUT/bench-vulkan"
    zgrep -h -E "reduced on|scoring on the host|cannot set up scoring" "$OUT/bench-vulkan/server.log" | sort | uniq -c
    ;;
run)
    mkdir -p "$OUT"
    for b in vk-debian12 vk-trixie cuda; do
        "$W/$b/bin/llama-bench" -m "$W/target.gguf" -p 8192,32768 -n 0 -fa 1 -b 4096 -ub 1024 -r 1 -o json \
            > "$OUT/llama-bench-$b.json" 2> "$OUT/llama-bench-$b.log" || echo "$b: llama-bench failed"
        python3 -c "import json,sys; [print(sys.argv[1], r['n_prompt'], round(r['avg_ts'])) for r in json.load(open(sys.argv[2]))]" \
            "$b" "$OUT/llama-bench-$b.json" || true
    done
    for b in vk-debian12 vk-trixie cuda; do
        python3 orchestrator/spbuild/measuring/bench.py measure --via tool --bin "$W/$b/bin" --target "$W/target.gguf" \
            --draft "$W/draft.gguf" --sizes 32768 --p 0.1 --window 0,8192 --repeat 3 --warmup 1 --no-plots \
            --server-args "-b 4096 -ub 1024 -ngl 99 -nglpd 99 -fa on" --draft-args "" --out "$OUT/run-$b" \
            > "$OUT/run-$b.log" 2>&1 || echo "$b: bench.py measure failed"
        tail -6 "$OUT/run-$b.log"
    done
    ;;
esac
