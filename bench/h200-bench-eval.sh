#!/usr/bin/env bash
# `spbuild bench` and `spbuild eval` on the H200 device, which has no spbuild workspace and no network: the modules
# run as `python3 -m spbuild.measuring.bench measure` and `python3 -m spbuild.measuring.eval_cli` with the build's bin/ folder (they need
# only NumPy, requests and the tree's gguf-py; plots are drawn afterwards here with `spbuild report DIR`).
# Carried in .carry/: tree.tar.xz (git archive of the spbuild branch, as bench/h200-vulkan.sh says),
# ggml-vocab-llama-bpe.gguf; for `gemma`, one part of Gemma 3 270M per call, cut with dd into .carry/gN/gemma.partNN
# (sized so that a call's carry stays under 64 MiB: 44 MiB beside the tree, 60 MiB alone), its sha256 in
# .carry/gemma.sha256.
#   bash bench/h200-bench-eval.sh build            # CUDA build (server, tool, llama-bench) and the random models
#   bash bench/h200-bench-eval.sh gemma DIR        # append DIR's part(s) of Gemma; says when the sha256 matches
#   bash bench/h200-bench-eval.sh bench SIZES      # e.g. 8192,32768,65536,131072: TTFT, phases, bound, into $OUT
#                                                       # (P=0.1 WINDOW=8192 to measure fewer settings; NAME=dir
#                                                       # under $OUT; BUILD=vk-trixie: h200-query-steps.sh's Vulkan;
#                                                       # EXTRA_SERVER_ARGS appended to the server's arguments,
#                                                       # EXTRA_BENCH_ARGS to spbuild.measuring.bench's)
#   bash bench/h200-bench-eval.sh pair             # append the carried parts of the Qwen2.5-Coder pair (the
#                                                       # 1.5B target then the 0.5B draft, cut with split -b 52000000
#                                                       # into .carry/pair/partNN, sha256s in .carry/pair.sha256), each
#                                                       # once; splits and verifies both once all are there
#   bash bench/h200-bench-eval.sh target           # the same parts up to the 1.5B target's end (part21), for
#                                                       # `self` alone: the draft's name is left empty
#   bash bench/h200-bench-eval.sh eval LENGTHS NAME [ARGS]   # quality into $OUT/NAME: Gemma 3 270M, or with
#                                                       # MODELS=pair the Qwen2.5-Coder pair; ARGS go to
#                                                       # spbuild.measuring.eval_cli (--seeds 3); EXTRA_SERVER_ARGS to the server
set -euo pipefail
W=/tmp/spbench-eval
source bench/h200-common.sh
export PYTHONPATH=$PWD/orchestrator$(carried_wheels)
# the Qwen2.5-Coder pair's parts (.carry/pair/partNN of `cat 1.5b 0.5b | split -b 52000000`): this call's copied
# beside the earlier ones; prints the bytes they hold together
PAIR_TARGET_SIZE=1117320768 PAIR_DRAFT_SIZE=491400064
gather_pair_parts() {
    mkdir -p "$W/pair-parts"
    cp .carry/pair/part* "$W/pair-parts/"
    cat "$W"/pair-parts/part* | wc -c
}
case "$1" in
build)
    rm -rf "$W/src" "$W/build" && unpack_tree "$W/src"
    cmake -S "$W/src" -B "$W/build" "${CM[@]}" > "$W/configure.log"
    cmake --build "$W/build" --target ${TARGETS:-llama-server llama-specprefill llama-bench} -j 16 > "$W/build.log" 2>&1
    [ "${RANDOM_MODELS:-1}" = 1 ] || exit 0  # RANDOM_MODELS=0: the eval of real models needs none
    # trained context above 128K: a slot is capped at the model's training context, and a 131,072-token prompt needs
    # the answer's tokens beside it
    python3 -m spbuild.measuring.bench make-model --tree "$W/src" --shape 8b --ctx 262144 "$W/target.gguf" &
    python3 -m spbuild.measuring.bench make-model --tree "$W/src" --shape 1.5b --ctx 262144 "$W/draft.gguf"
    wait
    ls -la "$W/build/bin" | grep -E "llama-(server|specprefill|bench)"
    ;;
gemma)
    mkdir -p "$W"
    for part in "$2"/gemma.part*; do cat "$part" >> "$W/gemma.gguf"; echo "appended $part"; done
    want=$(cut -d' ' -f1 .carry/gemma.sha256)
    if [ "$(sha256sum "$W/gemma.gguf" | cut -d' ' -f1)" = "$want" ]; then echo "gemma.gguf complete"; fi
    ;;
pair)
    # parts kept apart and joined in order once all are there, so that a part sent twice or out of order does no harm
    size=$(gather_pair_parts)
    echo "pair: $(ls "$W/pair-parts" | wc -l) parts, $size of $((PAIR_TARGET_SIZE + PAIR_DRAFT_SIZE)) bytes"
    if [ "$size" = $((PAIR_TARGET_SIZE + PAIR_DRAFT_SIZE)) ]; then
        cat "$W"/pair-parts/part* > "$W/pair.cat"
        head -c $PAIR_TARGET_SIZE "$W/pair.cat" > "$W/qwen2.5-coder-1.5b-instruct.gguf"
        tail -c $PAIR_DRAFT_SIZE "$W/pair.cat" > "$W/qwen2.5-coder-0.5b-instruct.gguf"
        (cd "$W" && sha256sum -c "$OLDPWD/.carry/pair.sha256") && rm -r "$W/pair.cat" "$W/pair-parts"
    fi
    ;;
target)
    # the pair's target alone, for `self` scoring: the parts that hold its bytes (.carry/pair/part00..21), each once
    size=$(gather_pair_parts)
    echo "target: $(ls "$W/pair-parts" | wc -l) parts, $size of at least $PAIR_TARGET_SIZE bytes"
    if [ "$size" -ge $PAIR_TARGET_SIZE ]; then
        cat "$W"/pair-parts/part* | head -c $PAIR_TARGET_SIZE > "$W/qwen2.5-coder-1.5b-instruct.gguf"
        (cd "$W" && grep 1.5b "$OLDPWD/.carry/pair.sha256" | sha256sum -c -) && rm -r "$W/pair-parts" &&
            touch "$W/qwen2.5-coder-0.5b-instruct.gguf"  # no draft: the chain waits for both names
    fi
    ;;
bench)
    # BUILD=vk-trixie: the Vulkan build of bench/h200-query-steps.sh; NAME: the folder under $OUT
    name=${NAME:-bench-cuda}
    if [ "${BUILD:-build}" != build ]; then vulkan_loader; fi
    python3 -m spbuild.measuring.bench measure --bin "$W/${BUILD:-build}/bin" --target "$W/target.gguf" --draft "$W/draft.gguf" \
        --sizes "$2" --p "${P:-0.1,0.3}" --window "${WINDOW:-0,8192}" --repeat 3 --warmup 1 --no-plots --out "$OUT/$name" \
        --server-args "-ngl 99 -fa on -b 4096 -ub 1024 ${EXTRA_SERVER_ARGS:-}" ${EXTRA_BENCH_ARGS:-} \
        > "$OUT/$name.log" 2>&1 || { tail -20 "$OUT/$name.log"; exit 1; }
    cp "$OUT/$name/results.md" "$OUT/$name.md"  # files under $OUT itself come back for sure
    cp "$OUT/$name/results.json" "$OUT/$name.json"
    cat "$OUT/$name.md"
    ;;
eval)
    if [ "${MODELS:-gemma}" = pair ]; then
        models=(--target "$W/qwen2.5-coder-1.5b-instruct.gguf" --draft "$W/qwen2.5-coder-0.5b-instruct.gguf")
    else
        models=(--target "$W/gemma.gguf")
    fi
    python3 -m spbuild.measuring.eval_cli --bin "$W/build/bin" "${models[@]}" --source-tree "$W/src" --lengths "$2" \
        --depths 0.1,0.5,0.9 --p 0.1,0.2,0.3 --window 0,2048,4096 --no-plots \
        --server-args "-ngl 99 -nglpd 99 -fa on ${EXTRA_SERVER_ARGS:-}" --out "$OUT/$3" "${@:4}" \
        > "$OUT/$3.log" 2>&1 || { tail -20 "$OUT/$3.log"; exit 1; }
    cp "$OUT/$3/results.md" "$OUT/$3.md"  # files under $OUT itself come back for sure
    cp "$OUT/$3/results.json" "$OUT/$3.json"
    ;;
esac
