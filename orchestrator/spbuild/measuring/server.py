"""A llama-server process on a free local port: started, waited for, asked over HTTP, stopped. The integration tests
and the benchmarks run the built server through it, in the manner of upstream's tools/server/tests/utils.py."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import requests

from spbuild.errors import SpbuildError

# the harness chooses where the server listens and asks it there: a user's own address would leave it asking nobody
OWN_ADDRESS_FLAGS = ("--port", "--host")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _merged_env(env: dict[str, str | None] | None) -> dict[str, str]:
    """This process's environment with `env` on top; a None value removes the variable."""
    merged = {**os.environ, **(env or {})}
    return {key: value for key, value in merged.items() if value is not None}


def refuse_own_address(args: list[str]) -> None:
    """Refuses --port and --host among the server's arguments (the last one would win over the harness's own, and the
    harness would wait for a server that listens elsewhere)."""
    given = [arg for arg in map(str, args) if arg in OWN_ADDRESS_FLAGS or arg.startswith(tuple(f + "=" for f in OWN_ADDRESS_FLAGS))]
    if given:
        raise SpbuildError(f"the server's arguments set {', '.join(given)}: the harness starts llama-server on a free "
                           "local port of its own and talks to it there",
                           hint="Remove --port and --host from --server-args.")


class ServerProcess:
    """A llama-server on a free local port, in the manner of upstream's tools/server/tests/utils.py."""

    def __init__(self, binary: Path, args: list[str], env: dict[str, str | None] | None = None, log: Path | None = None):
        refuse_own_address(args)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        out = log.open("w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen([str(binary), "--host", "127.0.0.1", "--port", str(self.port), *args],
                                     stdout=out, stderr=subprocess.STDOUT, env=_merged_env(env))

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"llama-server not ready after {timeout} s: {self.log_tail()}")

    def log_tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log and self.log.exists() else ""

    def request(self, method: str, path: str, data: dict | None = None, timeout: float = 600) -> requests.Response:
        return requests.request(method, f"{self.url}{path}", json=data, timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
