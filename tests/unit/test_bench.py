"""The bench's bookkeeping: llama-bench's samples, failures recorded as rows, the table and the plot (real runs:
tests/integration/test_eval_bench.py, and docs/benchmarks.md on a GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spbuild.errors import SpbuildError
from spbuild.measuring import bench, reports
from spbuild.measuring.evaluate import Setting


def _script(path: Path, text: str) -> Path:
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)
    return path


def test_the_draft_prefill_is_read_from_llama_bench_samples(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "llama-bench", """echo '[{"avg_ns": 2000000, "samples_ns": [1000000, 3000000, 2500000]}]'\n""")
    spread, argv = bench.draft_prefill(bin_dir, tmp_path / "d.gguf", 8192, 3, ["-ngl", "99"], tmp_path / "b.log")
    assert (spread.median, spread.low, spread.high, spread.n) == (2.5, 1.0, 3.0, 3)
    assert argv[argv.index("-p") + 1] == "8192" and argv[argv.index("-r") + 1] == "3" and argv[-2:] == ["-ngl", "99"]
    # no llama-bench in the build: no number, and the log says why
    (bin_dir / "llama-bench").unlink()
    spread, _ = bench.draft_prefill(bin_dir, tmp_path / "d.gguf", 8192, 3, [], tmp_path / "b.log")
    assert spread.n == 0 and "spbuild build" in (tmp_path / "b.log").read_text()


def test_a_failing_tool_run_is_a_row_and_the_next_setting_still_runs(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    _script(bin_dir / "llama-specprefill", f"echo run >> {calls}\necho 'no model here' >&2\nexit 1\n")
    leg = bench.ToolLeg(bin_dir, tmp_path / "t.gguf", tmp_path / "d.gguf", 512, [], [], tmp_path)
    plan = bench.Plan([256], [Setting("keep", 0.1), Setting("keep", 0.3, 1024)], repeat=2, warmup=1)
    rows = bench.run(leg, bin_dir, tmp_path / "d.gguf", plan, tmp_path / "out")
    assert [r["setting"] for r in rows] == ["p=0.1 full", "p=0.3 W=1024"]
    assert all("exit code 1" in r["error"] for r in rows)
    assert calls.read_text().count("run") == 2
    assert "no model here" in (tmp_path / "tool-1.log").read_text()
    assert "failed: llama-specprefill failed" in reports.bench_markdown(rows)


def test_a_server_that_does_not_start_stops_the_bench_with_its_log(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "llama-server", "echo 'error: cannot load the model' >&2\nexit 1\n")
    with pytest.raises(SpbuildError, match="cannot load the model"):
        bench.ServerLeg(bin_dir, tmp_path / "t.gguf", tmp_path / "d.gguf", 1024, [], [], tmp_path / "server.log")


def test_a_plan_needs_something_to_measure():
    with pytest.raises(SpbuildError, match="--repeat"):
        bench.Plan([1024], [Setting("keep", 0.1)], repeat=0)
    with pytest.raises(SpbuildError, match="nothing to measure"):
        bench.Plan([], [Setting("keep", 0.1)])
    assert bench.Plan([1024, 2048], [Setting("keep", 0.1), Setting("keep", 0.3)]).steps == 8


def _bench_row(n: int, setting: str, full: float, spec: float, draft: float, sparse: float) -> dict:
    def spread(v: float) -> dict:
        return {"median": v, "low": v * 0.98, "high": v * 1.03, "n": 3}

    bound = full / (draft + sparse)
    return {"n_prompt": n, "setting": setting, "select": "keep", "value": 0.1, "window": 0, "status": "active",
            "reason": "", "n_kept": n // 10, "n_windows": 1, "full_ttft_ms": spread(full), "spec_ttft_ms": spread(spec),
            "queue_ms": spread(0.1), "score_ms": spread(spec - sparse), "score_draft_prefill_ms": spread(draft * 1.05),
            "score_query_ms": spread(30.0), "sparse_prefill_ms": spread(sparse), "draft_prefill_ms": spread(draft),
            "speedup": full / spec, "bound": bound, "of_bound": full / spec / bound,
            "of_bound_in_run": full / spec / (full / (draft * 1.05 + sparse))}


def test_the_bench_table_and_plot_show_speedup_bound_and_phases(tmp_path):
    rows = [_bench_row(n, s, n * 0.1, n * f, n * 0.02, n * 0.01) for n in (8192, 32768)
            for s, f in (("p=0.1 full", 0.034), ("p=0.1 W=8192", 0.04))]
    rows.append({"n_prompt": 131072, "setting": "p=0.1 full", "select": "keep", "value": 0.1, "window": 0,
                 "error": "llama-server answered 400: too long"})
    table = reports.bench_markdown(rows)
    assert ("| 32,768 | p=0.1 full | active | 3,276 | 3,277 [3,211, 3,375] | 1,114 [1,092, 1,148] | **2.94x** | "
            "3.33x | 88% | 91% | 786 (688 + 30) | 328 | 655 [642, 675] |") in table
    assert "| 131,072 | p=0.1 full | failed: llama-server answered 400: too long |" in table
    # results of runs before the in-run bound existed still render
    old = {k: v for k, v in rows[0].items() if k != "of_bound_in_run"}
    assert "| 8,192 | p=0.1 full | active | 819 | 819 [803, 844] | 279 [273, 287] | **2.94x** | 3.33x | 88% | - | " \
        in reports.bench_markdown([old])
    files = reports.write(tmp_path, "bench", {"describe": {"via": "server"}}, rows)
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG" and tmp_path / "bench.png" in files
    assert json.loads((tmp_path / "results.json").read_text())["rows"][0]["bound"] == pytest.approx(10 / 3)


def test_spec_decoding_table_shows_acceptance_and_decode_speed_on_and_off():
    row = {"spec_type": "draft-simple", "n_prompt": 2048, "full_acceptance": 0.89, "sparse_acceptance": 0.91,
           "full_decode_tps": 310.5, "sparse_decode_tps": 305.25, "full_prompt_ms": 900.0, "sparse_prompt_ms": 400.0,
           "sparse_status": "active"}
    undrafted = {**row, "spec_type": "ngram-cache", "full_acceptance": float("nan"), "sparse_acceptance": float("nan")}
    failed = {"spec_type": "draft-eagle3", "error": "llama-server exited with 1: no model"}
    table = bench.spec_decoding_markdown([row, undrafted, failed])
    assert "| draft-simple | 2,048 | 89.0% | 91.0% | 310.5 | 305.2 | 900 | 400 (active) |" in table
    assert "| ngram-cache | 2,048 | - | - |" in table
    assert "| draft-eagle3 | failed: llama-server exited with 1: no model |" in table


def test_a_server_that_does_not_start_is_recorded_and_the_other_types_still_run(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    server = bin_dir / "llama-server"
    server.write_text("#!/bin/sh\necho 'cannot load the model' >&2\nexit 1\n")
    server.chmod(0o755)
    rows = bench.run_spec_decoding(bin_dir, tmp_path / "t.gguf", tmp_path / "d.gguf",
                                   {"draft-simple": (tmp_path / "t.gguf", ["-md", "d.gguf"])}, [256], 0.2, 8,
                                   tmp_path / "out", [], repeat=1)
    assert [r["spec_type"] for r in rows] == ["none", "draft-simple"]
    assert all("exited with 1" in r["error"] for r in rows)
    assert (tmp_path / "out" / "spec-decoding-results.md").exists()


def test_bench_runs_as_a_plain_script_as_the_gpu_scripts_call_it(tmp_path):
    """bench/results/h200-*.sh run `python3 orchestrator/spbuild/measuring/bench.py ...` on a machine without the package installed:
    the package's own modules (bisect, stats) must not shadow the standard library's there."""
    import os
    import subprocess
    import sys

    script = Path(bench.__file__)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-I", str(script), "measure", "--help"], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--via {server,tool}" in proc.stdout
