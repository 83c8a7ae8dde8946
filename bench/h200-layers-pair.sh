#!/usr/bin/env bash
# Issue 31's H200 measurements in one lease: the CUDA build (patch 0016's K-layer graphs), the TTFT of the random 8B
# target / 1.5B draft at 32K and 128K for every scorer and layer count, then on the real Qwen2.5-Coder pair the quality
# (spbuild eval at 8K-30K) and the cost (spbuild bench at 16K and 30K) of the 0.5B draft's whole depth and first
# half against the 1.5B target's own first 6, 10 and 14 of 28 layers. Ordered by what a 30-minute lease must not
# miss: 128K (the aim), the pair's quality and cost, then 32K.
# The first call starts `chain` detached from a copy of the repository (later calls replace the working tree); the
# calls after it each carry one part of the pair (.carry/pair/partNN, cut with
#   cat 1.5b.gguf 0.5b.gguf | split -b 52000000 -d -a 2 - .carry/pair/part
# and .carry/pair.sha256) for `bash bench/h200-bench-eval.sh pair`; `collect` packs what is done into $OUT.
#   cp -a . /tmp/sprepo && (cd /tmp/sprepo && setsid nohup bash bench/h200-layers-pair.sh chain > /tmp/chain.log 2>&1 &)
#   bash bench/h200-layers-pair.sh collect
set -euo pipefail
W=/tmp/spbench-eval
O=/tmp/chain-out
case "$1" in
chain)
    mkdir -p "$O"
    export PYTHONPATH=$PWD/orchestrator
    step() { echo "$(date +%T) $*"; }
    step build
    TARGETS="llama-server llama-bench" bash bench/h200-bench-eval.sh build
    step "random 128K"
    OUT=$O LAYERS=0,4,8,14 bash bench/h200-layers.sh bench 131072 8192 > /dev/null || step "128K failed"
    if [ "${PAIR:-1}" = 1 ]; then  # PAIR=0: the random models only (a lease too short for the pair's 31 parts)
        step "waiting for the pair"
        until [ -f "$W/qwen2.5-coder-0.5b-instruct.gguf" ] && [ ! -f "$W/pair.cat" ]; do sleep 3; done
        pair=(--target "$W/qwen2.5-coder-1.5b-instruct.gguf" --draft "$W/qwen2.5-coder-0.5b-instruct.gguf")
        step "pair evals"
        run_eval() {  # NAME LENGTHS WINDOW SCORER LAYERS
            python3 -m spbuild.eval_cli --bin "$W/build/bin" "${pair[@]}" --source-tree "$W/src" --lengths "$2" \
                --depths 0.1,0.5,0.9 --p 0.3 --window "$3" --seeds 1 --scorers "$4" --layers "$5" --no-plots \
                --server-args "-ngl 99 -nglpd 99 -fa on" --out "$O/$1" > "$O/$1.log" 2>&1 || step "$1 failed"
        }
        (run_eval eval-draft-short 8192,16384 0 draft 0,12; run_eval eval-draft-30k 30000 8192 draft 0,12) &
        (run_eval eval-self-short 8192,16384 0 self 6,10,14; run_eval eval-self-30k 30000 8192 self 6,10,14) &
        wait
        step "pair bench"
        python3 -m spbuild.bench measure --bin "$W/build/bin" "${pair[@]}" --sizes 16384,30000 --p 0.3 --window 0,8192 \
            --layers 0,6,10,12,14 --scorers draft,self --repeat 3 --warmup 1 --no-plots --out "$O/pair-bench" \
            --server-args "-ngl 99 -nglpd 99 -fa on -b 4096 -ub 1024" > "$O/pair-bench.log" 2>&1 || step "pair bench failed"
    fi
    step "random 32K"
    OUT=$O LAYERS=0,4,7,8,12,14 bash bench/h200-layers.sh bench 32768 0,8192 > /dev/null || step "32K failed"
    step done
    ;;
collect)
    tail -n 4 /tmp/chain.log
    tar -czf "$OUT/chain-out.tar.gz" -C "$O" . && ls -la "$OUT"
    ;;
esac
