#!/usr/bin/env bash
# The remote-draft measurement of docs/benchmarks.md on the H200 device: a CUDA build with the RPC backend, the
# random 8B target and 1.5B prefill draft, ggml-rpc-server serving the same GPU on 127.0.0.1, then llama-server with
# the draft local and with the draft on RPC0: startup time, bytes over loopback (the weights, then per request), and
# TTFT of a 32K prompt. Loopback has no network in the way: the bytes say what a real link must carry.
# Carried in .carry/: tree.tar.xz and ggml-vocab-llama-bpe.gguf (see h200-spec-decoding.sh).
#   bash bench/h200-rpc.sh build   # ~5 min
#   bash bench/h200-rpc.sh run
set -euo pipefail
W=/tmp/sprpc
source bench/h200-common.sh
CM+=(-DGGML_RPC=ON)
MK=(python3 orchestrator/spbuild/measuring/bench.py make-model --tree "$W/src" --ctx 40960)
case "$1" in
build)
    rm -rf "$W" && unpack_tree "$W/src"
    cmake -S "$W/src" -B "$W/build" "${CM[@]}" > "$W/configure.log"
    cmake --build "$W/build" --target llama-server ggml-rpc-server -j 16 > "$W/build.log" 2>&1 &
    "${MK[@]}" --shape 8b "$W/target.gguf"
    "${MK[@]}" --shape 1.5b "$W/draft.gguf"
    wait
    ls -la "$W/build/bin/llama-server" "$W/build/bin/ggml-rpc-server"
    ;;
run)
    "$W/build/bin/ggml-rpc-server" -H 127.0.0.1 -p 50052 -d CUDA0 > "$W/rpc-server.log" 2>&1 &
    RPC=$!
    sleep 3
    PYTHONPATH=orchestrator/spbuild python3 - "$W" <<'PY'
import sys, time
from pathlib import Path
import bench
W = Path(sys.argv[1])
def lo_bytes():
    for line in open("/proc/net/dev"):
        if line.strip().startswith("lo:"):
            f = line.split(":")[1].split()
            return int(f[0])
prompt = bench.make_prompt(32768)
common = ["-m", str(W / "target.gguf"), "-mpd", str(W / "draft.gguf"), "-c", "33280", "-np", "1", "-ngl", "99",
          "-nglpd", "99", "-fa", "on", "-b", "4096", "-ub", "1024", "--spec-prefill-p", "0.1",
          "--spec-prefill-ctx", "49152"]
for name, extra in (("local", []), ("rpc", ["--rpc", "127.0.0.1:50052", "-devpd", "RPC0"])):
    b0, t0 = lo_bytes(), time.monotonic()
    server = bench._started(W / "build/bin/llama-server", common + extra, W / f"server-{name}.log")
    t_load, b_load = time.monotonic() - t0, lo_bytes() - b0
    try:
        bench._ttft(server, bench.make_prompt(2048, seed=7), {})
        runs = []
        for _ in range(2):
            b1 = lo_bytes()
            ms, timings = bench._ttft(server, prompt, {})
            runs.append((ms, timings["spec_prefill"], lo_bytes() - b1))
        ms, sp, b_req = min(runs, key=lambda r: r[0])
        print(f"{name}: ready in {t_load:.1f} s, {b_load / 1e9:.2f} GB over loopback while loading; 32K TTFT {ms:.0f} ms "
              f"(score {sp['score_ms']:.0f} ms, {sp['status']}, kept {sp['n_kept']}, device {sp.get('device')}), "
              f"{b_req / 1e6:.1f} MB over loopback per request", flush=True)
    finally:
        server.stop()
PY
    kill $RPC
    ;;
esac
