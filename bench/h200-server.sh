#!/usr/bin/env bash
# The server benchmark of docs/benchmarks.md on the H200 device: builds the patched tree (llama-server,
# llama-specprefill) and the unpatched pin (llama-server) side by side, makes the random 8B/1.5B models, then runs
# `bench.py measure` (through the server). Carried in .carry/: tree.tar.xz (git archive of the spbuild branch), series.diff (pin..branch,
# reverse-applied for the unpatched tree), ggml-vocab-llama-bpe.gguf.
#   bash bench/h200-server.sh build     # ~5 min on 16 cores
#   bash bench/h200-server.sh run SIZES  # e.g. 32768,131072
set -euo pipefail
W=/tmp/spbench
REPO=$PWD
source bench/h200-common.sh
case "$1" in
build)
    rm -rf "$W" && unpack_tree "$W/patched"
    cp -r "$W/patched" "$W/plain"
    (cd "$W/plain" && git apply -R --exclude="ggml/src/ggml-vulkan/*" "$REPO/.carry/series.diff")
    cmake -S "$W/patched" -B "$W/patched/build" "${CM[@]}" > "$W/configure-patched.log"
    cmake -S "$W/plain" -B "$W/plain/build" "${CM[@]}" > "$W/configure-plain.log"
    cmake --build "$W/patched/build" --target llama-server llama-specprefill -j 10 > "$W/build-patched.log" 2>&1 &
    cmake --build "$W/plain/build" --target llama-server -j 6 > "$W/build-plain.log" 2>&1
    wait
    ls -la "$W/patched/build/bin" "$W/plain/build/bin" | grep -E "llama-(server|specprefill)"
    python3 orchestrator/spbuild/measuring/bench.py make-model --tree "$W/patched" --shape 8b "$W/target.gguf"
    python3 orchestrator/spbuild/measuring/bench.py make-model --tree "$W/patched" --shape 1.5b "$W/draft.gguf"
    ;;
run)
    # the patched server, spec prefill on and off per request; the unpatched build's server is not part of this run
    python3 orchestrator/spbuild/measuring/bench.py measure --bin "$W/patched/build/bin" --target "$W/target.gguf" \
        --draft "$W/draft.gguf" --sizes "$2" --p 0.1 --window 0,8192 --repeat 3 --warmup 1 --no-plots \
        --out "$OUT/bench"
    ;;
esac
