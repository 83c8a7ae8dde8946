"""Subprocesses run with their output logged: a missing program is an SpbuildError, and a child never outlives an
error or Ctrl-C in the caller."""

from __future__ import annotations

import os
import sys

import pytest

from spbuild.console import run_logged
from spbuild.errors import SpbuildError


def test_output_goes_to_the_log_and_each_line_to_the_callback(tmp_path):
    log = tmp_path / "run.log"
    lines: list[str] = []
    code = run_logged([sys.executable, "-c", "print('one'); print('two'); raise SystemExit(3)"], log,
                      on_line=lines.append)
    assert code == 3
    assert lines == ["one", "two"]
    assert "one\ntwo\n" in log.read_text()


def test_a_program_that_cannot_start_is_an_spbuild_error(tmp_path):
    with pytest.raises(SpbuildError, match="cannot run /no/such/program") as err:
        run_logged(["/no/such/program", "--flag"], tmp_path / "run.log")
    assert "/no/such/program --flag" in (err.value.hint or "")


def test_the_child_is_killed_when_the_caller_fails(tmp_path):
    pid_file = tmp_path / "pid"
    script = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
              "print('ready', flush=True); time.sleep(60)")

    def boom(line: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_logged([sys.executable, "-c", script], tmp_path / "run.log", on_line=boom)
    pid = int(pid_file.read_text())
    # killed and reaped: no such process any more
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
