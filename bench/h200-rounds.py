"""The 128K windowed request through llama-server under a few server settings, side by side in one run, spec prefill
only (the full-prefill baseline is the bench's): where the draft's prefill time goes when the windows are scored in
one round or in two, and with larger ubatches. Run on the H200 after h200-bench-eval.sh's build and models:
    python3 bench/h200-rounds.py OUT_DIR 'NAME=ARGS' ...   e.g.  'two-rounds=--spec-prefill-ctx 131840'
Each setting: its own server, 1 warm-up and REPEAT (3) measured requests (p=0.1, window 8192); with FULL also one
full-prefill request for the settings FULL names (comma-separated: those that change the target's prefill too)."""
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "orchestrator"))
from spbuild.measuring.bench import ServerLeg, make_prompt, stream_ttft  # noqa: E402

W = Path("/tmp/spbench-eval")
N = 131072
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
prompt = make_prompt(N)
rows = []
for spec in sys.argv[2:]:
    name, args = spec.split("=", 1)
    # the bench's server (its context and draft-context cap); a setting's flags follow the bench's own, so they win
    leg = ServerLeg(W / "build" / "bin", W / "target.gguf", W / "draft.gguf", N,
                    ["-ngl", "99", "-fa", "on", "-b", "4096", "-ub", "1024", *args.split()], ["-nglpd", "99"],
                    out / f"{name}.log")
    server = leg.server
    try:
        runs = [stream_ttft(server, prompt, {"p": 0.1, "window": 8192, "return_kept": False})
                for _ in range(1 + int(os.environ.get("REPEAT", "3")))][1:]
        full = stream_ttft(server, prompt, {"enabled": False})[0] if name in os.environ.get("FULL", "").split(",") else None
    finally:
        leg.close()
    sp = [t["spec_prefill"] for _, t in runs]
    med = lambda k: statistics.median(s[k] for s in sp)  # noqa: E731
    row = {"name": name, "args": args, "ttft_ms": statistics.median(t for t, _ in runs),
           "ttft_all": [round(t) for t, _ in runs], "full_ttft_ms": full,
           **{k: med(k) for k in ("score_draft_prefill_ms", "score_query_ms", "sparse_prefill_ms", "score_setup_ms")},
           "n_windows": sp[0]["n_windows"], "n_parallel": sp[0]["n_parallel"]}
    rows.append(row)
    print(json.dumps(row), flush=True)
(out / "rounds.json").write_text(json.dumps(rows, indent=1) + "\n")
