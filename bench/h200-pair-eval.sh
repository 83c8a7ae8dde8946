#!/usr/bin/env bash
# The Qwen2.5-Coder 0.5B -> 1.5B Instruct quality table of docs/quality.md on the H200, in as few device seconds as a
# lease allows: the first call starts one or more of these detached (setsid), beside the build of llama-server
# (h200-bench-eval.sh build with TARGETS=llama-server RANDOM_MODELS=0); the calls after it carry the pair's parts
# (h200-bench-eval.sh pair); each job waits for the build and the verified pair, then runs one eval per length into
# /tmp/evals (several jobs share the GPU side by side), each results.json growing with every row, and a last call
# copies them under $OUT (`collect`).
#   setsid nohup bash bench/h200-pair-eval.sh run JOB LENGTHS ARGS... &   # e.g. a 8192,16384 --seeds 1
#   bash bench/h200-pair-eval.sh collect SECONDS   # wait up to SECONDS for every job to end, then gzip the
#                                                       # results into $OUT
set -euo pipefail
W=/tmp/spbench-eval
R=/tmp/evals
case "$1" in
run)
    mkdir -p "$R"
    job=$2
    touch "$R/$job.started"
    until [ -x "$W/build/bin/llama-server" ] && ! pgrep -f "cmake --build" > /dev/null \
          && [ -f "$W/qwen2.5-coder-0.5b-instruct.gguf" ] && [ ! -f "$W/pair.cat" ]; do sleep 3; done
    for n in ${3//,/ }; do
        OUT=$R MODELS=pair bash bench/h200-bench-eval.sh eval "$n" "pair-$job-$n" "${@:4}" \
            > "$R/run-$job-$n.out" 2>&1 || true
    done
    touch "$R/$job.done"
    ;;
collect)
    for _ in $(seq 1 "$2"); do
        pending=0
        for s in "$R"/*.started; do [ -f "${s%.started}.done" ] || pending=1; done
        [ $pending = 0 ] && break
        sleep 1
    done
    for d in "$R"/pair-*/; do
        name=$(basename "$d")
        [ -f "$d/results.json" ] && gzip -c "$d/results.json" > "$OUT/$name.json.gz"
        [ -f "$d/results.md" ] && cp "$d/results.md" "$OUT/$name.md"
    done
    tail -n 3 "$R"/pair-*.log || true
    ;;
esac
