"""The whole suite's own bookkeeping: a test that takes longer than SLOW_SECONDS (setup, call and teardown together)
without the `slow` marker is named at the end of the run, so that `spbuild test --fast` stays fast and the marker
honest as tests grow."""

from __future__ import annotations

from collections import defaultdict

SLOW_SECONDS = 30.0

_seconds: dict[str, float] = defaultdict(float)
_marked_slow: set[str] = set()


def pytest_runtest_logreport(report) -> None:
    _seconds[report.nodeid] += report.duration
    if "slow" in report.keywords:
        _marked_slow.add(report.nodeid)


def pytest_terminal_summary(terminalreporter) -> None:
    unmarked = sorted(((s, n) for n, s in _seconds.items() if s > SLOW_SECONDS and n not in _marked_slow), reverse=True)
    if unmarked:
        terminalreporter.section(f"over {SLOW_SECONDS:.0f} s without the slow marker")
        for seconds, nodeid in unmarked:
            terminalreporter.write_line(f"{seconds:7.1f} s  {nodeid}")
