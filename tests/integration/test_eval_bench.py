"""`spbuild eval` and `spbuild bench` for real: the built llama-server and llama-specprefill on the tiny llama-bpe
models, short runs whose outputs must be complete and consistent with what the binaries did (not their speed; that
is docs/benchmarks.md's)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spbuild.measuring import bench, eval_cli

pytestmark = pytest.mark.build

CPU = "--device none"


def _spbuild(*args: str | Path, workspace) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPBUILD_WORKDIR": str(workspace.root)}
    return subprocess.run([sys.executable, "-m", "spbuild", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=900)


@pytest.fixture(scope="module")
def eval_through_server(build, bpe_models, workspace, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("eval-server")
    build.binary("llama-server")
    proc = _spbuild("eval", "--build-dir", build.record.build_dir, "--target", bpe_models["target"], "--draft",
                    bpe_models["draft"], "--lengths", "1024,1536", "--depths", "0.3", "--kinds",
                    "needle,multikey,multihop,distributed,temporal,vartrack", "--p", "0.2,1.0", "--window", "0,512",
                    "--server-args", CPU, "--out", out, workspace=workspace)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


@pytest.mark.slow  # the module's eval through the server: 18 s on 2 cores
def test_eval_writes_every_case_under_every_setting(eval_through_server):
    out, proc = eval_through_server
    document = json.loads((out / "results.json").read_text())
    rows = document["rows"]
    assert document["complete"] is True
    assert len(document["cases"]) == 12 and len(document["settings"]) == 4 and len(rows) == 48
    assert {(r["case"], r["setting"]) for r in rows} == {(c["id"], s["name"]) for c in document["cases"]
                                                         for s in document["settings"]}
    assert all(r["status"] in ("active", "kept_all") for r in rows), [r for r in rows if r["status"] == "failed"]
    # the two-step sizing with the server's tokenizer lands near the asked length
    for r in rows:
        assert abs(r["n_prompt"] - r["n_tokens"]) / r["n_tokens"] < 0.05, r
    for name in ("results.md", "eval-vs-p.png", "eval-vs-length.png", "cases.jsonl", "server.log"):
        assert (out / name).stat().st_size > 0, name
    assert "## By setting" in proc.stderr and "wrote" in proc.stderr


@pytest.mark.slow  # the module's eval through the server: 18 s on 2 cores
def test_eval_rows_agree_with_what_the_server_kept(eval_through_server):
    out, _ = eval_through_server
    rows = json.loads((out / "results.json").read_text())["rows"]
    for r in rows:
        # the kept ranges the server returned add up to the n_kept it reported
        assert r["n_kept"] == r["timings"]["n_kept"], r
        assert 0 <= r["evidence_tokens_kept"] <= r["evidence_tokens"] and r["evidence_tokens"] > 0
        assert r["evidence_retained"] == (r["evidence_lines_kept"] == r["evidence_lines"])
        if r["value"] == 1.0:
            # everything kept: a dense prefill, so the answer must be the full prefill's, token for token
            assert r["status"] == "kept_all" and r["n_kept"] == r["n_prompt"] and r["evidence_retained"]
            assert r["agree"] and r["spec_answer"] == r["full_answer"], r
        else:
            assert r["status"] == "active" and r["n_kept"] < 0.5 * r["n_prompt"]
    scored = [r for r in rows if r["status"] == "active"]
    assert all((r["n_windows"] > 1) == (r["window"] == 512) for r in scored), [(r["window"], r["n_windows"])
                                                                              for r in scored]
    summary = {s["setting"]: s for s in json.loads((out / "results.json").read_text())["summary"]}
    assert summary["p=1 full"]["agreement"]["rate"] == 1.0 and summary["p=1 full"]["retention"]["rate"] == 1.0


def test_eval_through_the_tool_reads_the_same_cases(build, bpe_models, tmp_path):
    out = tmp_path / "eval-tool"
    code = eval_cli.main(["--bin", str(build.binary("llama-specprefill").parent), "--via", "tool", "--target",
                          str(bpe_models["target"]), "--draft", str(bpe_models["draft"]), "--lengths", "1024",
                          "--depths", "0.5", "--kinds", "needle,vartrack", "--p", "0.2,1.0", "--window", "0",
                          "--server-args", CPU, "--out", str(out), "--no-plots"])
    assert code == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert len(rows) == 4 and not list(out.glob("*.png"))
    # one process per case and setting, the first of each case with --baseline for the full answer
    assert len(list((out / "tool").glob("run-*.json"))) == 4
    for r in rows:
        assert r["status"] == ("kept_all" if r["value"] == 1.0 else "active")
        if r["value"] == 1.0:
            assert r["agree"] and r["evidence_retained"] and r["n_kept"] == r["n_prompt"]


def test_eval_in_chat_form_renders_each_case_with_the_servers_template(build, bpe_models, tmp_path):
    """--chat: each case is a user message the server's chat template wraps (/apply-template), and that rendered
    prompt is what both prefills get; the tool has no template and refuses."""
    out = tmp_path / "eval-chat"
    common = ["--bin", str(build.binary("llama-server").parent), "--target", str(bpe_models["target"]), "--draft",
              str(bpe_models["draft"]), "--lengths", "1024", "--depths", "0.5", "--kinds", "needle", "--p", "0.2",
              "--window", "0", "--server-args", CPU, "--no-plots", "--chat"]
    assert eval_cli.main([*common, "--out", str(out)]) == 0
    (case,) = [json.loads(line) for line in (out / "cases.jsonl").read_text().splitlines()]
    assert case["chat"] and case["id"].endswith("-chat")
    message = f"Question: {case['question']}\nAnswer in one short sentence."
    # the template's markers around the message: the prompt goes on past the question, to the assistant's turn
    assert message in case["prompt"] and not case["prompt"].endswith(message)
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    assert row["status"] == "active" and row["evidence_retained"] in (True, False)
    assert eval_cli.main([*common, "--via", "tool", "--out", str(tmp_path / "tool")]) == 1


@pytest.mark.parametrize("via", ["server", "tool"])
def test_eval_compares_the_drafts_layers_and_the_target_scoring_itself_in_one_run(via, build, bpe_models, tmp_path):
    """--layers and --scorers: the same cases under the draft's whole depth, its first layer and the target's own
    first layer (one server per scorer, or -mpd self for the tool), each row naming its setting and scorer."""
    out = tmp_path / f"eval-layers-{via}"
    code = eval_cli.main(["--bin", str(build.binary("llama-server").parent), "--via", via, "--target",
                          str(bpe_models["target"]), "--draft", str(bpe_models["draft"]), "--lengths", "1024",
                          "--depths", "0.5", "--kinds", "needle,vartrack", "--p", "0.2", "--window", "0",
                          "--layers", "0,1", "--scorers", "draft,self", "--server-args", CPU, "--out", str(out),
                          "--no-plots"])
    assert code == 0
    document = json.loads((out / "results.json").read_text())
    rows = document["rows"]
    names = ["p=0.2 full", "p=0.2 full layers=1", "p=0.2 full self", "p=0.2 full layers=1 self"]
    assert [s["name"] for s in document["settings"]] == names and document["scorers"] == ["draft", "self"]
    assert sorted((r["case"], r["setting"]) for r in rows) == sorted((c["id"], n) for c in document["cases"]
                                                                    for n in names)
    assert all(r["status"] == "active" for r in rows), [r for r in rows if r["status"] != "active"]
    assert {r["scorer"] for r in rows if r["setting"].endswith("self")} == {"self"}
    if via == "server":
        assert (out / "server.log").stat().st_size > 0 and "'self'" in (out / "server-self.log").read_text()
    # the target's first layer alone and the target given as its own draft at one layer keep the same tokens: the
    # tool's self runs are the target's weights
    by = {(r["case"], r["setting"]): r for r in rows}
    for case in document["cases"]:
        assert by[(case["id"], "p=0.2 full")]["kept_ranges"] != by[(case["id"], "p=0.2 full layers=1")]["kept_ranges"]


def test_eval_refuses_bad_options_before_starting_anything(build, workspace, tmp_path):
    proc = _spbuild("eval", "--build-dir", build.record.build_dir, "--kinds", "needle,riddle", "--target",
                    tmp_path / "none.gguf", "--out", tmp_path, workspace=workspace)
    assert proc.returncode == 1 and "unknown task kind: riddle" in proc.stderr
    proc = _spbuild("bench", "--build-dir", build.record.build_dir, "--window", "100", "--target",
                    tmp_path / "t.gguf", "--draft", tmp_path / "d.gguf", "--out", tmp_path, workspace=workspace)
    assert proc.returncode == 1 and "at least 256" in proc.stderr


@pytest.mark.parametrize("via", ["server", "tool"])
def test_bench_measures_both_prefills_side_by_side_with_phases_and_bound(via, build, bpe_models, workspace, tmp_path):
    build.binary("llama-bench")
    out = tmp_path / f"bench-{via}"
    proc = _spbuild("bench", "--build-dir", build.record.build_dir, "--via", via, "--target", bpe_models["target"],
                    "--draft", bpe_models["draft"], "--sizes", "1024,2048", "--p", "0.2", "--window", "0,512",
                    "--repeat", "2", "--warmup", "1", "--server-args", CPU, "--draft-args", "", "--bench-args", "",
                    "--out", out, workspace=workspace)
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = json.loads((out / "results.json").read_text())
    rows = document["rows"]
    assert document["complete"] is True
    assert [(r["n_prompt"], r["setting"]) for r in rows] == [(1024, "p=0.2 full"), (1024, "p=0.2 W=512"),
                                                            (2048, "p=0.2 full"), (2048, "p=0.2 W=512")]
    for r in rows:
        assert "error" not in r, r
        assert r["status"] == "active" and 0 < r["n_kept"] < r["n_prompt"]
        for key in ("full_ttft_ms", "spec_ttft_ms", "score_ms", "score_draft_prefill_ms", "score_query_ms",
                    "sparse_prefill_ms", "draft_prefill_ms"):
            spread = r[key]
            # the tool's full prefills are the baselines of every setting's process: 2 each
            n = 2 * 2 if key == "full_ttft_ms" and via == "tool" else 2  # 2 settings x 2 repetitions
            assert spread["n"] == n and 0 < spread["low"] <= spread["median"] <= spread["high"], (key, spread)
        assert r["speedup"] == pytest.approx(r["full_ttft_ms"]["median"] / r["spec_ttft_ms"]["median"])
        assert r["bound"] == pytest.approx(r["full_ttft_ms"]["median"] / (r["draft_prefill_ms"]["median"] +
                                                                         r["sparse_prefill_ms"]["median"]))
        # the phases fit inside the TTFT they are part of
        assert r["score_draft_prefill_ms"]["median"] + r["score_query_ms"]["median"] <= r["score_ms"]["median"] * 1.01
        assert 0 < r["score_reduce_ms"]["median"] < r["score_query_ms"]["median"]
        assert r["score_ms"]["median"] < r["spec_ttft_ms"]["median"]
        assert (r["n_windows"] > 1) == (r["window"] == 512)
        assert math.isfinite(r["of_bound"])
        # the same ratio with the draft prefill the scoring timed in these requests
        in_run = r["full_ttft_ms"]["median"] / (r["score_draft_prefill_ms"]["median"] + r["sparse_prefill_ms"]["median"])
        assert r["of_bound_in_run"] == pytest.approx(r["speedup"] / in_run)
    assert document["command"][0] == ("llama-server" if via == "server" else "llama-specprefill")
    assert {r["scorer"] for r in rows} == {"draft"} and all(r["variant"] == "" for r in rows)
    table = (out / "results.md").read_text()
    assert table.count("| active |") == 4 and "[lowest, highest]" in table
    assert (out / "bench.png").stat().st_size > 0
    assert "[lowest, highest]" in proc.stderr  # the table, printed as it is


def test_bench_measures_layer_counts_and_the_target_scoring_itself_side_by_side(build, bpe_models, tmp_path):
    """One bench run, two servers (the draft's and the target's own), one full prefill measured for all rows."""
    build.binary("llama-bench")
    code = bench.main(["measure", "--bin", str(build.bin_dir), "--target", str(bpe_models["target"]), "--draft",
                       str(bpe_models["draft"]), "--sizes", "1024", "--p", "0.3", "--window", "0", "--layers", "0,1",
                       "--scorers", "draft,self", "--repeat", "1", "--warmup", "0", "--server-args", CPU,
                       "--draft-args", "", "--bench-args", "", "--out", str(tmp_path), "--no-plots"])
    assert code == 0
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(r["setting"], r["scorer"]) for r in rows] == [("p=0.3 full", "draft"), ("p=0.3 full layers=1", "draft"),
                                                          ("p=0.3 full self", "self"),
                                                          ("p=0.3 full layers=1 self", "self")]
    assert all(r["status"] == "active" and "error" not in r for r in rows), rows
    assert len({r["full_ttft_ms"]["median"] for r in rows}) == 1
    assert (tmp_path / "server-self.log").stat().st_size > 0


def test_bench_module_runs_without_a_workspace(build, bpe_models, tmp_path):
    """`python -m spbuild.measuring.bench measure --bin`: the form a bare GPU machine runs."""
    build.binary("llama-bench")
    code = bench.main(["measure", "--bin", str(build.bin_dir), "--target", str(bpe_models["target"]), "--draft",
                       str(bpe_models["draft"]), "--sizes", "1024", "--p", "0.3", "--window", "0", "--repeat", "1",
                       "--warmup", "0", "--server-args", CPU, "--draft-args", "", "--bench-args", "", "--out",
                       str(tmp_path), "--no-plots"])
    assert code == 0
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert len(rows) == 1 and rows[0]["spec_ttft_ms"]["n"] == 1


def _children(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def test_a_terminated_eval_stops_its_server(build, bpe_models, workspace, tmp_path):
    """SIGTERM (a CI timeout, a kill) unwinds like Ctrl-C: the llama-server the run started does not outlive it."""
    import signal
    import time

    env = {**os.environ, "SPBUILD_WORKDIR": str(workspace.root)}
    proc = subprocess.Popen([sys.executable, "-m", "spbuild", "eval", "--build-dir", build.record.build_dir,
                             "--target", str(bpe_models["target"]), "--draft", str(bpe_models["draft"]), "--lengths",
                             "2048", "--seeds", "20", "--server-args", CPU, "--out", str(tmp_path)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    servers: list[int] = []
    while time.monotonic() < deadline and not (tmp_path / "results.json").exists():
        servers = _children(proc.pid) or servers
        time.sleep(0.2)
    assert servers and (tmp_path / "results.json").exists(), "the eval did not get going"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert not [pid for pid in servers if Path(f"/proc/{pid}").exists()], "llama-server outlived the eval"
    # what it measured so far is kept, and says so
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["complete"] is False and document["rows"]
