#!/usr/bin/env bash
# Where a query step's time goes (docs/benchmarks.md, "What a query step costs"): CUDA build of the tool and
# llama-bench, the random 1.5B model as draft and target (the target's prefill is not what is measured), at 8K and 32K:
# the draft's plain decode at depth with and without CUDA graphs, then the tool's query steps with lookahead 8 and 1,
# without CUDA graphs, and with the rows reduced on the host. Carried as bench/h200-bench-eval.sh says.
#   bash bench/h200-probe-steps.sh     # about 350 s on a cold machine, 240 of them the build
set -uo pipefail
W=/tmp/spbench-eval
source bench/h200-common.sh
export PYTHONPATH=$PWD/orchestrator
mkdir -p "$OUT"
t0=$(date +%s)
rm -rf "$W/src" "$W/build" && unpack_tree "$W/src"
cmake -S "$W/src" -B "$W/build" "${CM[@]}" > "$W/configure.log" 2>&1
cmake --build "$W/build" --target llama-specprefill llama-bench -j 16 > "$W/build.log" 2>&1 || { tail -30 "$W/build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
python3 -m spbuild.measuring.bench make-model --tree "$W/src" --shape 1.5b --ctx 65536 "$W/draft.gguf" > /dev/null 2>&1
echo "model at $(( $(date +%s) - t0 )) s"
B=$W/build/bin
for d in 8192 32768; do
  GGML_CUDA_DISABLE_GRAPHS=1 "$B/llama-bench" -m "$W/draft.gguf" -p 0 -n 8 -d $d -fa 1 -b 4096 -ub 1024 -r 3 -o json 2>/dev/null > "$OUT/nog-$d.json"
  "$B/llama-bench" -m "$W/draft.gguf" -p 0 -n 8 -d $d -fa 1 -b 4096 -ub 1024 -r 3 -o json 2>/dev/null > "$OUT/g-$d.json"
  python3 -c "import json,sys; [print(sys.argv[2], 'decode at depth', r['n_depth'], round(1e3/r['avg_ts'], 3), 'ms/token') for f in sys.argv[1:2] for r in json.load(open(f))]" "$OUT/g-$d.json" graphs
  python3 -c "import json,sys; [print(sys.argv[2], 'decode at depth', r['n_depth'], round(1e3/r['avg_ts'], 3), 'ms/token') for f in sys.argv[1:2] for r in json.load(open(f))]" "$OUT/nog-$d.json" nographs
done
run() {  # name, env, extra server args
  local name=$1; shift; local envs=$1; shift
  env $envs python3 -m spbuild.measuring.bench measure --via tool --bin "$B" --target "$W/draft.gguf" --draft "$W/draft.gguf" \
      --sizes 8192,32768 --p 0.1 --window 0 --repeat 3 --warmup 1 --no-plots \
      --server-args "-b 4096 -ub 1024 -ngl 99 -nglpd 99 -fa on $*" --draft-args "" --out "$W/$name" > "$W/$name.log" 2>&1 || { echo "$name failed"; tail -5 "$W/$name.log"; }
  python3 - "$name" "$W/$name/results.json" <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[2]))["rows"]:
    m = lambda k: r[k]["median"]
    print(f"{sys.argv[1]} N={r['n_prompt']}: spec TTFT {m('spec_ttft_ms'):.1f} score {m('score_ms'):.1f} draft prefill {m('score_draft_prefill_ms'):.1f} "
          f"query {m('score_query_ms'):.2f} reduce {m('score_reduce_ms'):.2f} sparse {m('sparse_prefill_ms'):.1f} llama-bench pp {m('draft_prefill_ms'):.1f}")
PY
}
run look8 "X=1"
run look1 "X=1" --spec-prefill-lookahead 1
run look8-nographs "GGML_CUDA_DISABLE_GRAPHS=1"
run look8-host "LLAMA_SPEC_PREFILL_SCORING=host"
echo "done at $(( $(date +%s) - t0 )) s"
