#!/usr/bin/env bash
# The speculative-decoding benchmark of docs/benchmarks.md on the H200 device: builds the patched llama-server (CUDA),
# makes random models (8B-shaped llama target, 1.5B-shaped prefill and draft-simple draft, EAGLE3/DFlash/DSpark drafts
# for the 8B shape, a 1.5B-shaped Qwen3.5 target with an MTP head), then runs `bench.py spec-decoding`. Random
# weights: the numbers say what each type costs per decoded token, not how much a trained draft would accept.
# Carried in .carry/: tree.tar.xz and ggml-vocab-llama-bpe.gguf, made by
#   git -C .spbuild/src/llama.cpp archive --format=tar spbuild | xz -T0 > .carry/tree.tar.xz   (see h200-server.sh)
#   bash bench/h200-spec-decoding.sh build   # ~4 min build, ~4 min models
#   bash bench/h200-spec-decoding.sh run SIZES
set -euo pipefail
W=/tmp/spdec
source bench/h200-common.sh
MK=(python3 orchestrator/spbuild/measuring/bench.py make-model --tree "$W/src" --ctx 32768)
case "$1" in
build)
    rm -rf "$W" && unpack_tree "$W/src"
    cmake -S "$W/src" -B "$W/build" "${CM[@]}" > "$W/configure.log"
    cmake --build "$W/build" --target llama-server -j 16 > "$W/build.log" 2>&1 &
    "${MK[@]}" --shape 8b "$W/target.gguf"
    "${MK[@]}" --shape 1.5b "$W/draft.gguf"
    "${MK[@]}" --shape 8b --kind eagle3 "$W/eagle3.gguf"
    "${MK[@]}" --shape 8b --kind dflash "$W/dflash.gguf"
    "${MK[@]}" --shape 8b --kind dspark "$W/dspark.gguf"
    "${MK[@]}" --shape 1.5b --kind mtp-target "$W/mtp-target.gguf"
    wait
    ls -la "$W/build/bin/llama-server" "$W"/*.gguf
    ;;
run)
    python3 orchestrator/spbuild/measuring/bench.py spec-decoding --bin "$W/build/bin" --target "$W/target.gguf" \
        --prefill-draft "$W/draft.gguf" --draft "$W/draft.gguf" --eagle3 "$W/eagle3.gguf" --dflash "$W/dflash.gguf" \
        --dspark "$W/dspark.gguf" --mtp-target "$W/mtp-target.gguf" --sizes "$2" --p 0.1 --n-predict 128 \
        --server-args "-ngl 99 -nglpd 99 -ngld 99 -fa on -b 4096 -ub 1024" --out "$OUT/bench"
    ;;
esac
