#!/usr/bin/env bash
# The real Qwen2.5-Coder pair (and the random 8B/1.5B at 128K) on the GPU in one lease: the CUDA build, then the named
# steps, group after group; the steps of one group (one argument, names joined by '+') run side by side.
#   chain GROUP...   e.g. chain bench128 pair quality-self+tools-p tools-turns30k
# Steps:
#   bench128        the random 8B target scoring for itself at 128K, p=0.1, windows of 8192 (SELF128_LAYERS of its
#                   32 layers, default 4,8; DRAFT128=1 adds the 1.5B draft's whole depth as the same lease's
#                   reference); runs before `pair` so that the GPU works while the parts arrive
#   pair            wait until the carried parts make the pair (or the target alone: `target` calls)
#   quality-layers  spbuild eval --chat --kinds all, 8K-16K whole and 30K windowed, p=0.3: the 0.5B draft's whole depth
#                   and first half against the 1.5B's own first 6, 10 and 14 of 28 layers (issue 31)
#   quality-self    the same cases, the 1.5B's own first SELF_LAYERS (default 4) only (no draft needed)
#   tools           the tools eval under protect and off, 1 and 3 turns, 8K-16K whole and 30K windowed (issue 30)
#   tools-p         the tools eval's calls against p (TOOLS_P, default 0.3,0.6,0.9,0.99), protect, one turn, 8K-16K:
#                   how far the calls move when little or almost nothing is dropped (TOOLS_SCORER=self: the 1.5B's
#                   own first 4 layers score, for a lease that carries the target alone)
#   tools-turns30k  three tool rounds at 30K in windows of 8192, protect and off: TTFT per turn (alone on the GPU)
# Carried in the first call: .carry/tree.tar.xz, ggml-vocab-llama-bpe.gguf, pair.sha256 and pylib/ (the wheels the tools
# eval needs, bench/h200-common.sh).
# The first call starts `chain` detached from a copy of the repository (later calls replace the working tree); the
# calls after it each carry one part of the pair (.carry/pair/partNN, cut with
#   cat 1.5b.gguf 0.5b.gguf | split -b 52000000 -d -a 2 - .carry/pair/part
# and .carry/pair.sha256) for `bash bench/h200-bench-eval.sh pair` (or `target`: part00..part21, the 1.5B alone, where
# no step needs the draft); `collect` packs what is done into $OUT.
#   cp -a . /tmp/sprepo && (cd /tmp/sprepo && setsid nohup bash bench/h200-layers-pair.sh chain ... > /tmp/chain.log 2>&1 &)
#   bash bench/h200-layers-pair.sh collect
set -euo pipefail
W=/tmp/spbench-eval
O=/tmp/chain-out
step() { echo "$(date +%T) $*"; }

pair=(--target "$W/qwen2.5-coder-1.5b-instruct.gguf" --draft "$W/qwen2.5-coder-0.5b-instruct.gguf")
run_eval() {  # NAME LENGTHS WINDOW ARGS...: one eval into $O/NAME, its log beside it
    python3 -m spbuild.measuring.eval_cli --bin "$W/build/bin" "${pair[@]}" --source-tree "$W/src" --lengths "$2" \
        --depths 0.1,0.5,0.9 --window "$3" --seeds 1 --no-plots --p 0.3 "${@:4}" \
        --server-args "-ngl 99 -nglpd 99 -fa on" --out "$O/$1" > "$O/$1.log" 2>&1 || step "$1 failed"
    step "$1 done"
}
quality=(--chat --kinds all)
tools=(--kinds tools --tool-guards protect,off)

run_step() {
    case "$1" in
    bench128)
        step "random 128K, self"
        OUT=$O NAME=self-128k P=0.1 WINDOW=8192 EXTRA_BENCH_ARGS="--layers ${SELF128_LAYERS:-4,8} --scorers self" \
            bash bench/h200-bench-eval.sh bench 131072 > /dev/null || step "128K failed"
        if [ "${DRAFT128:-0}" = 1 ]; then
            step "random 128K, the draft's whole depth (the same machine's reference)"
            OUT=$O NAME=draft-128k P=0.1 WINDOW=8192 bash bench/h200-bench-eval.sh bench 131072 > /dev/null ||
                step "128K draft failed"
        fi
        ;;
    pair)
        step "waiting for the pair"
        until [ -f "$W/qwen2.5-coder-0.5b-instruct.gguf" ] && [ ! -f "$W/pair.cat" ]; do sleep 3; done
        ;;
    quality-layers)
        (run_eval draft-short 8192,16384 0 "${quality[@]}" --scorers draft --layers 0,12
         run_eval draft-30k 30000 8192 "${quality[@]}" --scorers draft --layers 0,12) &
        run_eval self-short 8192,16384 0 "${quality[@]}" --scorers self --layers 6,10,14
        run_eval self-30k 30000 8192 "${quality[@]}" --scorers self --layers 6,10,14
        wait
        ;;
    quality-self)
        run_eval self-short 8192,16384 0 "${quality[@]}" --scorers self --layers "${SELF_LAYERS:-4}"
        run_eval self-30k 30000 8192 "${quality[@]}" --scorers self --layers "${SELF_LAYERS:-4}"
        ;;
    tools)
        run_eval tools-short 8192,16384 0 "${tools[@]}" --turns 1,3
        run_eval tools-30k 30000 8192 "${tools[@]}" --turns 1,3
        ;;
    tools-p)
        run_eval tools-p 8192,16384 0 --kinds tools --tool-guards protect --turns 1 --p "${TOOLS_P:-0.3,0.6,0.9,0.99}" \
            --scorers "${TOOLS_SCORER:-draft}" $([ "${TOOLS_SCORER:-draft}" = self ] && echo --layers 4)
        ;;
    tools-turns30k)
        run_eval tools-turns30k 30000 8192 "${tools[@]}" --turns 3
        ;;
    *)
        step "unknown step $1"; return 1
        ;;
    esac
}

case "$1" in
chain)
    mkdir -p "$O"
    source bench/h200-common.sh
    export PYTHONPATH=$PWD/orchestrator$(carried_wheels)
    step build
    random=0
    [[ " ${*:2} " == *bench128* ]] && random=1  # the random models only where a step benches them
    RANDOM_MODELS=$random TARGETS="llama-server llama-bench" bash bench/h200-bench-eval.sh build
    for group in "${@:2}"; do
        step "group $group"
        IFS=+ read -ra steps <<< "$group"
        for s in "${steps[@]}"; do run_step "$s" & done
        wait
    done
    step done
    ;;
collect)
    tail -n 4 /tmp/chain.log
    tar -czf "$OUT/chain-out.tar.gz" -C "$O" . && ls -la "$OUT"
    ;;
esac
