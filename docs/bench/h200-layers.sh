#!/usr/bin/env bash
# Scoring with the first K layers of the draft, and the target scoring for itself (-mpd self), on the H200: the CUDA
# build and the random 8B target / 1.5B draft in one call, then one `spbuild bench` run per size in which one server
# per scorer (the draft's, the target's own) measures every layer count side by side with the full prefill.
# Carried in .carry/: tree.tar.xz and ggml-vocab-llama-bpe.gguf, as docs/bench/h200-bench-eval.sh says.
#   bash docs/bench/h200-layers.sh build          # CUDA build (llama-server, llama-bench) beside the random models
#   bash docs/bench/h200-layers.sh bench 32768 0,8192    # SIZES WINDOWS: results into $OUT/layers-SIZES
set -euo pipefail
W=/tmp/spbench-eval
source docs/bench/h200-common.sh
export PYTHONPATH=$PWD/orchestrator
case "$1" in
build)
    rm -rf "$W/src" "$W/build" && mkdir -p "$W" && unpack_tree "$W/src"
    python3 -m spbuild.bench make-model --tree "$W/src" --shape 8b --ctx 262144 "$W/target.gguf" > "$W/make-target.log" 2>&1 &
    python3 -m spbuild.bench make-model --tree "$W/src" --shape 1.5b --ctx 262144 "$W/draft.gguf" > "$W/make-draft.log" 2>&1 &
    cmake -S "$W/src" -B "$W/build" "${CM[@]}" > "$W/configure.log"
    cmake --build "$W/build" --target llama-server llama-bench -j 16 > "$W/build.log" 2>&1 || { tail -30 "$W/build.log"; exit 1; }
    wait
    ls -la "$W/build/bin" | grep -E "llama-(server|bench)"; ls -la "$W"/*.gguf
    ;;
bench)
    name=layers-$2
    python3 -m spbuild.bench measure --bin "$W/build/bin" --target "$W/target.gguf" --draft "$W/draft.gguf" \
        --sizes "$2" --p "${P:-0.1}" --window "$3" --layers "${LAYERS:-0,4,8,12}" --scorers draft,self \
        --repeat 3 --warmup 1 --no-plots --out "$OUT/$name" --server-args "-ngl 99 -fa on -b 4096 -ub 1024" \
        > "$OUT/$name.log" 2>&1 || { tail -20 "$OUT/$name.log"; exit 1; }
    cp "$OUT/$name/results.md" "$OUT/$name.md"  # files under $OUT itself come back for sure
    cp "$OUT/$name/results.json" "$OUT/$name.json"
    cat "$OUT/$name.md"
    ;;
esac
