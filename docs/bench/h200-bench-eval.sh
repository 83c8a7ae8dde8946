#!/usr/bin/env bash
# `spbuild bench` and `spbuild eval` on the H200 device, which has no spbuild workspace and no network: the modules
# run as `python3 -m spbuild.bench measure` and `python3 -m spbuild.evaluate` with the build's bin/ folder (they need
# only NumPy, requests and the tree's gguf-py; plots are drawn afterwards here with `spbuild report DIR`).
# Carried in .carry/: tree.tar.xz (git archive of the spbuild branch, as docs/bench/h200-vulkan.sh says),
# ggml-vocab-llama-bpe.gguf; for `gemma`, one part of Gemma 3 270M per call (split -b 52M -d of the GGUF into
# .carry/gemma/gemma.partNN, and its sha256 in .carry/gemma/sha256), so that no call carries more than 64 MiB.
#   bash docs/bench/h200-bench-eval.sh build            # CUDA build (server, tool, llama-bench) and the random models
#   bash docs/bench/h200-bench-eval.sh gemma            # append the carried part(s) of Gemma; checks the sha256 when whole
#   bash docs/bench/h200-bench-eval.sh bench SIZES      # e.g. 8192,32768,65536,131072: TTFT, phases, bound, into $OUT
#   bash docs/bench/h200-bench-eval.sh eval LENGTHS     # e.g. 8192,16384,30720: Gemma 3 270M quality, into $OUT
set -euo pipefail
W=/tmp/spbench-eval
source docs/bench/h200-common.sh
export PYTHONPATH=$PWD/orchestrator
case "$1" in
build)
    rm -rf "$W/src" "$W/build" && unpack_tree "$W/src"
    cmake -S "$W/src" -B "$W/build" "${CM[@]}" > "$W/configure.log"
    cmake --build "$W/build" --target llama-server llama-specprefill llama-bench -j 16 > "$W/build.log" 2>&1
    python3 -m spbuild.bench make-model --tree "$W/src" --shape 8b "$W/target.gguf" &
    python3 -m spbuild.bench make-model --tree "$W/src" --shape 1.5b "$W/draft.gguf"
    wait
    ls -la "$W/build/bin" | grep -E "llama-(server|specprefill|bench)"
    ;;
gemma)
    mkdir -p "$W"
    for part in .carry/gemma/gemma.part*; do cat "$part" >> "$W/gemma.gguf"; echo "appended $part"; done
    want=$(cut -d' ' -f1 .carry/gemma/sha256)
    if [ "$(sha256sum "$W/gemma.gguf" | cut -d' ' -f1)" = "$want" ]; then echo "gemma.gguf complete"; fi
    ;;
bench)
    python3 -m spbuild.bench measure --bin "$W/build/bin" --target "$W/target.gguf" --draft "$W/draft.gguf" \
        --sizes "$2" --p 0.1,0.3 --window 0,8192 --repeat 3 --warmup 1 --no-plots --out "$OUT/bench-cuda"
    ;;
eval)
    python3 -m spbuild.evaluate --bin "$W/build/bin" --target "$W/gemma.gguf" --lengths "$2" \
        --depths 0.1,0.5,0.9 --p 0.1,0.2,0.3 --window 0,2048,4096 --server-args "-ngl 99 -nglpd 99 -fa on" --no-plots \
        --out "$OUT/eval-gemma"
    ;;
esac
