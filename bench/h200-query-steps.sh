#!/usr/bin/env bash
# The query steps on CUDA and on Vulkan, side by side on one H200 (docs/benchmarks.md, "The query steps"): the
# patched tree built for CUDA and for Vulkan with the toolchain `spbuild build --vulkan` chooses on Debian 12 (trixie's
# glslc and headers), the random 8B/1.5B models, then per build: the draft's plain decode at depth (llama-bench) and
# llama-specprefill at 32K, full-prompt and windowed scoring, with the reduction's share of the query steps.
# Shares its folder with bench/h200-bench-eval.sh (the CUDA build in $W/build, the models), so that script's
# `bench` runs after this one's `build` and `models`.
# Carried: .carry/tree.tar.xz, .carry/ggml-vocab-llama-bpe.gguf (as h200-bench-eval.sh says), .carry/tc-trixie.tar.xz
# (the toolchain folder as spbuild installs it: tar -C .spbuild -c toolchain | xz), .gl/ (the Vulkan loader and GL
# dispatch packages, as the device's README says: libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2).
#   bash bench/h200-query-steps.sh build     # both builds (server, tool, llama-bench), side by side; a build cut
#                                                 # by the call's time limit goes on where it stopped when run again
#   bash bench/h200-query-steps.sh models    # random 8B target and 1.5B draft, trained to 256K
#   bash bench/h200-query-steps.sh steps     # the measurements, into $OUT (SIZES=32768 WINDOW=0,8192)
set -euo pipefail
W=/tmp/spbench-eval
source bench/h200-common.sh
export PYTHONPATH=$PWD/orchestrator
vulkan_loader
case "$1" in
build)
    if [ ! -f "$W/configured" ]; then  # configured once a machine: a second `build` resumes a cut one
        rm -rf "$W/src" "$W/build" "$W/vk-trixie" && unpack_tree "$W/src"
        mkdir -p "$W/workdir" && tar -xJf .carry/tc-trixie.tar.xz -C "$W/workdir"
        read -r -a TC <<< "$(toolchain_defines "$W")"
        cmake -S "$W/src" -B "$W/build" "${CM[@]}" > "$W/configure-cuda.log" 2>&1
        cmake -S "$W/src" -B "$W/vk-trixie" "${VK[@]}" "${TC[@]}" > "$W/configure-vk-trixie.log" 2>&1
        touch "$W/configured"
    fi
    grep -h "supported by glslc" "$W/configure-vk-trixie.log" || true
    T=(--target llama-server llama-specprefill llama-bench)
    cmake --build "$W/build" "${T[@]}" -j 10 > "$W/build-cuda.log" 2>&1 &
    cmake --build "$W/vk-trixie" "${T[@]}" -j 8 > "$W/build-vk-trixie.log" 2>&1 &
    wait
    ls -la "$W"/build/bin/llama-s* "$W"/vk-trixie/bin/llama-s*
    "$W/vk-trixie/bin/llama-bench" --list-devices 2>&1 | grep -i -E "vulkan|matrix" | head -4
    ;;
models)
    python3 -m spbuild.measuring.bench make-model --tree "$W/src" --shape 8b --ctx 262144 "$W/target.gguf" &
    python3 -m spbuild.measuring.bench make-model --tree "$W/src" --shape 1.5b --ctx 262144 "$W/draft.gguf"
    wait
    ;;
steps)
    mkdir -p "$OUT"
    for b in build vk-trixie; do
        mkdir -p "$OUT/steps-$b"
        # the draft's own decode, 8 tokens after a prompt of each size: what a query step costs without the capture
        "$W/$b/bin/llama-bench" -m "$W/draft.gguf" -p 0 -n 8 -d "${SIZES:-32768}" -fa 1 -b 4096 -ub 1024 -r 2 -o json \
            > "$OUT/decode-$b.json" 2> "$OUT/steps-$b/decode.log" || echo "$b: llama-bench failed"
        python3 -c "import json,sys; [print(sys.argv[1], 'decode at depth', r['n_depth'], round(1e3/r['avg_ts'], 2), 'ms/token') for r in json.load(open(sys.argv[2]))]" \
            "$b" "$OUT/decode-$b.json" || true
        python3 -m spbuild.measuring.bench measure --via tool --bin "$W/$b/bin" --target "$W/target.gguf" \
            --draft "$W/draft.gguf" --sizes "${SIZES:-32768}" --p 0.1 --window "${WINDOW:-0,8192}" --repeat 3 --warmup 1 \
            --no-plots --server-args "-b 4096 -ub 1024 -ngl 99 -nglpd 99 -fa on" --draft-args "" --out "$OUT/steps-$b" \
            > "$OUT/steps-$b.log" 2>&1 || echo "$b: bench.py measure failed"
        cp "$OUT/steps-$b/results.md" "$OUT/steps-$b.md" || true  # a file under $OUT itself comes back for sure
        python3 - "$b" "$OUT/steps-$b/results.json" <<'EOF' || true
import json, sys
for r in json.load(open(sys.argv[2]))["rows"]:
    m = lambda k: r[k]["median"]
    print(f"{sys.argv[1]} N={r['n_prompt']} {r['setting']}: TTFT {m('spec_ttft_ms'):.0f} vs {m('full_ttft_ms'):.0f} ms "
          f"({r['speedup']:.2f}x), draft prefill {m('score_draft_prefill_ms'):.0f} ms, query steps "
          f"{m('score_query_ms'):.1f} ms of which reduction {m('score_reduce_ms'):.1f} ms, windows {r['n_windows']}")
EOF
    done
    ;;
esac
