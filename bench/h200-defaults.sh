#!/usr/bin/env bash
# The new defaults (p=0.3, lookahead 8, question_lines 2) on the H200 in one lease: the CUDA build with the random
# 8B/1.5B models, then the TTFT bench at the defaults through llama-server (alone on the GPU), then the real pair's
# quality at 32K (full-prompt and windows of 8K) and at 8K-16K in windows, side by side. Carried as
# h200-bench-eval.sh says (tree, vocabulary, pair.sha256 with the first call, the pair's parts one a call after it).
#   bash bench/h200-defaults.sh start      # first call: everything detached, then the carried part(s) if any
#   bash bench/h200-defaults.sh quality    # or, without the bench: the server alone, then the evals of windows
#                                               # at the defaults (32K full/8K, 16K 4K/8K, 8K 2K/4K)
#   bash bench/h200-bench-eval.sh pair     # each later call, with its part
#   bash bench/h200-defaults.sh collect S  # wait up to S seconds for the evals, then everything into $OUT
set -euo pipefail
W=/tmp/spbench-eval
case "$1" in
start)
    mkdir -p "$W" /tmp/bench-out
    cp .carry/pair.sha256 "$W/"
    setsid nohup bash -c '
        TARGETS="llama-server llama-bench" bash bench/h200-bench-eval.sh build > /tmp/build.out 2>&1
        OUT=/tmp/bench-out P=0.3 WINDOW=0,8192 NAME=bench-defaults \
            bash bench/h200-bench-eval.sh bench 32768,131072 > /tmp/bench.out 2>&1
        touch /tmp/bench.done' > /dev/null 2>&1 &
    for job in "a 32768 --p 0.2,0.3 --window 0,8192 --seeds 1" "b 8192,16384 --p 0.3 --window 2048,4096 --seeds 1"; do
        # shellcheck disable=SC2086
        setsid nohup bash -c "until [ -f /tmp/bench.done ]; do sleep 2; done
            bash bench/h200-pair-eval.sh run $job" > /dev/null 2>&1 &
    done
    if compgen -G ".carry/pair/part*" > /dev/null; then bash bench/h200-bench-eval.sh pair; fi
    ;;
quality)
    mkdir -p "$W"
    rm -f "$W/pair.cat" "$W/pair.done"  # a machine that restarted mid-transfer starts over
    cp .carry/pair.sha256 "$W/"
    setsid nohup bash -c 'TARGETS=llama-server RANDOM_MODELS=0 bash bench/h200-bench-eval.sh build \
        > /tmp/build.out 2>&1' > /dev/null 2>&1 &
    for job in "a 32768 --p 0.3 --window 0,8192 --seeds 1" "b 16384 --p 0.3 --window 4096,8192 --seeds 1" \
               "c 8192 --p 0.3 --window 2048,4096 --seeds 1"; do
        # shellcheck disable=SC2086
        setsid nohup bash bench/h200-pair-eval.sh run $job > /dev/null 2>&1 &
    done
    if compgen -G ".carry/pair/part*" > /dev/null; then bash bench/h200-bench-eval.sh pair; fi
    ;;
collect)
    cp /tmp/bench-out/*.md /tmp/bench-out/*.json /tmp/bench-out/*.log "$OUT/" 2>/dev/null || true
    bash bench/h200-pair-eval.sh collect "$2"
    tail -n 5 /tmp/build.out /tmp/bench.out || true
    ;;
esac
