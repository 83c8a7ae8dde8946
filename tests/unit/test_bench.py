"""The benchmark's configuration matrix and its table (the runs themselves need a GPU: docs/benchmarks.md)."""

from __future__ import annotations

from spbuild import bench


def test_each_scoring_place_adds_its_configs_with_its_environment():
    configs = bench.default_configs(8192, ["auto", "host"])
    names = [c.name for c in configs]
    assert names[:4] == ["p=0.1 full", "p=0.1 window 8K", "p=0.3 full", "p=0.3 window 8K"]
    assert names[4:] == [n + " [host scoring]" for n in names[:4]]
    assert all(c.env == {} for c in configs[:4])
    assert all(c.env == {"LLAMA_SPEC_PREFILL_SCORING": "host"} for c in configs[4:])
    windowed = configs[1]
    assert windowed.args[windowed.args.index("--spec-prefill-window") + 1] == "8192"


def test_table_shows_the_scoring_phases_and_the_speedup():
    row = {"n_prompt": 32769, "config": "p=0.1 full", "kept": 3360, "windows": 1, "parallel": 1, "score_ms": 867.0,
           "score_draft_prefill_ms": 812.0, "score_query_ms": 48.0, "score_over_draft": 1.4, "prefill_ms": 127.0,
           "ttft_ms": 1006.0, "baseline_ttft_ms": 2382.0, "speedup": 2.37}
    table = bench.markdown([row])
    assert "| 32,769 | p=0.1 full | 3,360 | 1 (1) | 867 (812 + 48) | 1.40x | 127 | 1,006 | 2,382 | **2.37x** |" in table


def test_a_failed_run_is_recorded_and_the_run_goes_on(tmp_path):
    """A benchmark process that fails, or writes no report, becomes a row that says so; the next config still runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    tool = bin_dir / "llama-specprefill"
    tool.write_text(f"#!/bin/sh\necho run >> {calls}\necho 'no model here' >&2\nexit 1\n")
    tool.chmod(0o755)
    rows = bench.run(bin_dir, tmp_path / "t.gguf", tmp_path / "d.gguf", [100], 8192, tmp_path / "out", [], [],
                     only=["p=0.1 full", "p=0.3 full"], draft_bench=False)
    assert [(r["config"], r["status"], r["reason"]) for r in rows] == [
        ("p=0.1 full", "failed", "exit code 1"), ("p=0.3 full", "failed", "exit code 1")]
    assert calls.read_text().count("run") == 2
    assert "failed: exit code 1" in (tmp_path / "out" / "results.md").read_text()
    assert "no model here" in (tmp_path / "out" / "run-100-0.log").read_text()


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
