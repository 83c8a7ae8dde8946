#!/usr/bin/env bash
# Scoring with the first K layers of the draft, and the target scoring for itself (-mpd self), on the H200: the CUDA
# build with the random 8B target / 1.5B draft (h200-bench-eval.sh build), then one `spbuild bench` run per size in
# which one server per scorer (the draft's, the target's own) measures every layer count side by side with the full
# prefill. Carried in .carry/: tree.tar.xz and ggml-vocab-llama-bpe.gguf, as bench/h200-bench-eval.sh says.
#   bash bench/h200-layers.sh build                 # CUDA build (llama-server, llama-bench) and the models
#   bash bench/h200-layers.sh bench 32768 0,8192    # SIZES WINDOWS: results into $OUT/layers-SIZES
#                                                        # (P=0.1 and LAYERS=0,4,8,12 by default)
set -euo pipefail
case "$1" in
build)
    TARGETS="llama-server llama-bench" bash bench/h200-bench-eval.sh build
    ;;
bench)
    NAME=layers-$2 P=${P:-0.1} WINDOW=$3 EXTRA_BENCH_ARGS="--layers ${LAYERS:-0,4,8,12} --scorers draft,self" \
        bash bench/h200-bench-eval.sh bench "$2"
    ;;
esac
