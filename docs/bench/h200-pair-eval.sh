#!/usr/bin/env bash
# The Qwen2.5-Coder 0.5B -> 1.5B Instruct quality table of docs/quality.md on the H200, in as few device seconds as a
# lease allows: the first call starts this detached (setsid), beside the build of llama-server (h200-bench-eval.sh
# build with TARGETS=llama-server RANDOM_MODELS=0); the calls after it carry the pair's parts (h200-bench-eval.sh
# pair); this waits for the build and the verified pair, then runs one eval per length into /tmp/evals, each
# results.json growing with every row, and a last call copies them under $OUT (`collect`).
#   setsid nohup bash docs/bench/h200-pair-eval.sh run LENGTHS ARGS... &   # e.g. 8192,32000,16384 --seeds 1
#   bash docs/bench/h200-pair-eval.sh collect SECONDS   # wait up to SECONDS for the run to end, then gzip its results
#                                                       # into $OUT
set -euo pipefail
W=/tmp/spbench-eval
R=/tmp/evals
case "$1" in
run)
    mkdir -p "$R"
    until [ -x "$W/build/bin/llama-server" ] && ! pgrep -f "cmake --build" > /dev/null \
          && [ -f "$W/qwen2.5-coder-0.5b-instruct.gguf" ] && [ ! -f "$W/pair.cat" ]; do sleep 3; done
    for n in ${2//,/ }; do
        OUT=$R MODELS=pair bash docs/bench/h200-bench-eval.sh eval "$n" "pair-$n" "${@:3}" > "$R/run-$n.out" 2>&1 || true
    done
    touch "$R/ALL_DONE"
    ;;
collect)
    for _ in $(seq 1 "$2"); do [ -f "$R/ALL_DONE" ] && break; sleep 1; done
    for d in "$R"/pair-*/; do
        name=$(basename "$d")
        [ -f "$d/results.json" ] && gzip -c "$d/results.json" > "$OUT/$name.json.gz"
        [ -f "$d/results.md" ] && cp "$d/results.md" "$OUT/$name.md"
    done
    tail -n 3 "$R"/pair-*.log || true
    ;;
esac
