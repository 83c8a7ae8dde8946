"""Terminal output: one console, timed phases, and subprocesses whose full output goes to a log file."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from spbuild.errors import SpbuildError

console = Console(stderr=True, highlight=False, soft_wrap=True)


@contextmanager
def phase(title: str) -> Iterator[None]:
    """A section of a long command: its title now, its duration when it ends."""
    console.rule(f"[bold]{title}", align="left")
    start = time.monotonic()
    try:
        yield
    finally:
        console.print(f"[dim]{title}: {time.monotonic() - start:.1f} s[/dim]")


def info(message: str) -> None:
    console.print(message)


def warn(message: str) -> None:
    console.print(f"[yellow]warning:[/yellow] {message}")


def log_path(logs_dir: Path, name: str) -> Path:
    logs_dir.mkdir(parents=True, exist_ok=True)
    return logs_dir / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.log"


def run_logged(
    argv: Sequence[str | os.PathLike[str]],
    log: Path,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> int:
    """Run `argv`, appending its combined output to `log` and handing each line to `on_line`; return the exit code."""
    with log.open("a", encoding="utf-8", errors="replace") as sink:
        sink.write(f"$ {' '.join(map(str, argv))}\n")
        sink.flush()
        try:
            proc = subprocess.Popen(
                [str(a) for a in argv],
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                bufsize=1,
            )
        except OSError as err:
            raise SpbuildError(f"cannot run {argv[0]}: {err.strerror or err}",
                               hint=f"Command: {' '.join(map(str, argv))}") from err
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                sink.write(line)
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            return proc.wait()
        except BaseException:
            # Ctrl-C or an error in on_line: do not leave the child running behind us
            proc.kill()
            proc.wait()
            raise
