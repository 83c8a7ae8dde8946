#!/usr/bin/env bash
# The real Qwen2.5-Coder pair on the GPU in one lease: the CUDA build, then side by side on the GPU the quality
# (spbuild eval, chat prompts, every kind, 8K-16K whole and 30K windowed, p=0.3) of the 0.5B draft's whole depth and
# first half against the 1.5B target's own first 6, 10 and 14 of 28 layers (issue 31), and the tools eval's calls
# under protect and off, one turn and three (issue 30); then, alone on the GPU, the random 8B target scoring for
# itself at 128K (its first 4 and 8 of 32 layers against the full prefill).
# Carried in the first call: .carry/tree.tar.xz, ggml-vocab-llama-bpe.gguf, pair.sha256 and pylib/ (the wheels the tools
# eval needs, bench/h200-common.sh).
# The first call starts `chain` detached from a copy of the repository (later calls replace the working tree); the
# calls after it each carry one part of the pair (.carry/pair/partNN, cut with
#   cat 1.5b.gguf 0.5b.gguf | split -b 52000000 -d -a 2 - .carry/pair/part
# and .carry/pair.sha256) for `bash bench/h200-bench-eval.sh pair`; `collect` packs what is done into $OUT.
#   cp -a . /tmp/sprepo && (cd /tmp/sprepo && setsid nohup bash bench/h200-layers-pair.sh chain > /tmp/chain.log 2>&1 &)
#   bash bench/h200-layers-pair.sh collect
# QUALITY=self SELF_LAYERS=4 TOOLS=0: the quality of the target's first 4 layers alone, with only the target carried
# (`bash bench/h200-bench-eval.sh target` per part, part00..part21)
set -euo pipefail
W=/tmp/spbench-eval
O=/tmp/chain-out
case "$1" in
chain)
    mkdir -p "$O"
    source bench/h200-common.sh
    export PYTHONPATH=$PWD/orchestrator$(carried_wheels)
    step() { echo "$(date +%T) $*"; }
    step build
    # SELF128=1: also the random models and, at the end, the 128K bench (a lease of 30 minutes has no room for both)
    RANDOM_MODELS=${SELF128:-0} TARGETS="llama-server llama-bench" bash bench/h200-bench-eval.sh build
    step "waiting for the pair"
    until [ -f "$W/qwen2.5-coder-0.5b-instruct.gguf" ] && [ ! -f "$W/pair.cat" ]; do sleep 3; done
    pair=(--target "$W/qwen2.5-coder-1.5b-instruct.gguf" --draft "$W/qwen2.5-coder-0.5b-instruct.gguf")
    step "pair evals"
    run_eval() {  # NAME LENGTHS WINDOW ARGS...: one eval into $O/NAME, its log beside it
        python3 -m spbuild.measuring.eval_cli --bin "$W/build/bin" "${pair[@]}" --source-tree "$W/src" --lengths "$2" \
            --depths 0.1,0.5,0.9 --p 0.3 --window "$3" --seeds 1 --no-plots "${@:4}" \
            --server-args "-ngl 99 -nglpd 99 -fa on" --out "$O/$1" > "$O/$1.log" 2>&1 || step "$1 failed"
        step "$1 done"
    }
    quality=(--chat --kinds all)
    tools=(--kinds tools --tool-guards protect,off --turns 1,3)
    if [ "${QUALITY:-1}" = 1 ]; then  # QUALITY=0: the tools eval alone (the layer quality is measured: 2026-12-07)
        (run_eval draft-short 8192,16384 0 "${quality[@]}" --scorers draft --layers 0,12
         run_eval draft-30k 30000 8192 "${quality[@]}" --scorers draft --layers 0,12) &
        (run_eval self-short 8192,16384 0 "${quality[@]}" --scorers self --layers 6,10,14
         run_eval self-30k 30000 8192 "${quality[@]}" --scorers self --layers 6,10,14) &
    elif [ "${QUALITY}" = self ]; then  # the target's own first SELF_LAYERS only (`target` carries no draft)
        run_eval self-short 8192,16384 0 "${quality[@]}" --scorers self --layers "${SELF_LAYERS:-4}"
    fi
    if [ "${TOOLS:-1}" = 1 ]; then
        (run_eval tools-short 8192,16384 0 "${tools[@]}"; run_eval tools-30k 30000 8192 "${tools[@]}") &
    fi
    wait
    if [ "${SELF128:-0}" = 1 ]; then  # alone on the GPU: TTFT side by side with the full prefill
        step "random 128K, self"
        OUT=$O NAME=self-128k P=0.1 WINDOW=8192 EXTRA_BENCH_ARGS="--layers 4,8 --scorers self" \
            bash bench/h200-bench-eval.sh bench 131072 > /dev/null || step "128K failed"
        step "random 128K, the draft's whole depth (the same machine's reference)"
        OUT=$O NAME=draft-128k P=0.1 WINDOW=8192 bash bench/h200-bench-eval.sh bench 131072 > /dev/null ||
            step "128K draft failed"
    fi
    step done
    ;;
collect)
    tail -n 4 /tmp/chain.log
    tar -czf "$OUT/chain-out.tar.gz" -C "$O" . && ls -la "$OUT"
    ;;
esac
