"""The prefill draft on another machine through ggml's RPC backend: llama.cpp's own rpc-server on 127.0.0.1, started
and killed by the tests. The remote scores like a local draft; a remote that dies costs the request a full prefill
(error_fallback, with the reason), never the server, and spec prefill then stays off until the server restarts.

Needs a build with `spbuild build --rpc` (rpc-server and the RPC backend)."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from spbuild.building.cmake import rpc_server_target
from spbuild.measuring.bench import make_prompt as words
from spbuild.measuring.server import free_port

pytestmark = pytest.mark.build

PROMPT = words(2000, seed=21)


class RpcServer:
    def __init__(self, binary, log) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(self.port), "-d", "CPU"],
                                     stdout=log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, log.read_text()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"rpc-server not listening: {log.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def rpc_server(build, source_tree, tmp_path) -> Iterator[RpcServer]:
    server = RpcServer(build.binary(rpc_server_target(source_tree)), tmp_path / "rpc-server.log")
    yield server
    server.kill()


def _args(bpe_models, *extra: str, target_device: str = "none") -> list[str]:
    # extra first: --rpc must register its devices before --device names one
    return [*extra, "-m", str(bpe_models["target"]), "-mpd", str(bpe_models["draft"]), "--device", target_device,
            "-c", "16384", "-np", "2", "--spec-prefill-p", "0.2", "--spec-prefill-min-tokens", "256", "--slots"]


def _remote_draft(rpc: RpcServer) -> list[str]:
    return ["--rpc", rpc.address, "-devpd", "RPC0", "-nglpd", "99"]


def _complete(server, prompt: str, **fields) -> dict:
    response = server.request("POST", "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0,
                                                      "cache_prompt": False, "return_tokens": True, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def test_the_remote_draft_keeps_what_the_local_draft_keeps(build, tool, rpc_server, bpe_models, server_factory):
    local = tool.run("-m", bpe_models["target"], "-mpd", bpe_models["draft"], "--device", "none", "-c", "8192",
                     "-n", "4", "--temp", "0", "--spec-prefill-p", "0.2", prompt=PROMPT)
    remote = tool.run("-m", bpe_models["target"], "-mpd", bpe_models["draft"], "--device", "none", "-c", "8192",
                      "-n", "4", "--temp", "0", "--spec-prefill-p", "0.2", "--rpc", rpc_server.address,
                      "-devpd", "RPC0", "-nglpd", "99", prompt=PROMPT)
    assert local.returncode == 0 and remote.returncode == 0, remote.stderr[-2000:]
    assert remote.report["status"] == "sparse", remote.report
    assert remote.report["kept"] == local.report["kept"]

    remote_server = server_factory(_args(bpe_models, *_remote_draft(rpc_server)))
    on_remote = _complete(remote_server, PROMPT)
    remote_server.stop()  # rpc-server serves one client at a time
    on_host = _complete(server_factory(_args(bpe_models)), PROMPT)
    sp = on_remote["timings"]["spec_prefill"]
    assert sp["status"] == "active", sp
    assert sp["device"] == f"RPC0 ({rpc_server.address})", sp
    assert on_host["timings"]["spec_prefill"]["device"] == "CPU"
    assert sp["n_kept"] == on_host["timings"]["spec_prefill"]["n_kept"]
    assert on_remote["tokens"] == on_host["tokens"]

    # and the reverse: the target on the remote device, the prefill draft local
    reverse = _complete(server_factory(_args(bpe_models, "--rpc", rpc_server.address, "-ngl", "99", "-devpd", "none",
                                             target_device="RPC0")), PROMPT)
    assert reverse["timings"]["spec_prefill"]["device"] == "CPU"
    assert reverse["timings"]["spec_prefill"]["n_kept"] == sp["n_kept"]
    assert reverse["tokens"] == on_host["tokens"]


def _wait_for_scoring(server, slot: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        slots = server.request("GET", "/slots").json()
        if next(s for s in slots if s["id"] == slot)["spec_prefill"]["state"] == "scoring":
            return
        time.sleep(0.005)
    raise TimeoutError("the slot never started scoring")


def test_a_remote_that_dies_costs_a_full_prefill_not_the_server(rpc_server, bpe_models, server_factory):
    server = server_factory(_args(bpe_models, *_remote_draft(rpc_server)))
    assert _complete(server, PROMPT)["timings"]["spec_prefill"]["status"] == "active"

    # killed while a request is being scored
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(_complete(server, words(6000, seed=22), id_slot=0)))
    worker.start()
    _wait_for_scoring(server, 0)
    rpc_server.kill()
    worker.join(timeout=300)
    sp = result["timings"]["spec_prefill"]
    assert sp["status"] == "error_fallback", sp
    assert "RPC0" in sp["reason"] and "lost its connection" in sp["reason"], sp
    assert "stays off until the server restarts" in sp["reason"], sp  # said at the first failure
    assert server.request("GET", "/health").status_code == 200

    # then: every later request is prefilled in full at once, saying why; other slots and requests go on
    later = _complete(server, PROMPT, id_slot=1)["timings"]["spec_prefill"]
    assert later["status"] == "error_fallback" and "stays off until the server restarts" in later["reason"], later
    assert _complete(server, PROMPT, spec_prefill={"enabled": False})["timings"]["spec_prefill"]["status"] == "disabled"
    assert server.request("GET", "/health").status_code == 200


def test_a_remote_killed_between_requests(rpc_server, bpe_models, server_factory):
    server = server_factory(_args(bpe_models, *_remote_draft(rpc_server)))
    assert _complete(server, PROMPT)["timings"]["spec_prefill"]["status"] == "active"
    rpc_server.kill()
    sp = _complete(server, words(1500, seed=23))["timings"]["spec_prefill"]
    assert sp["status"] == "error_fallback" and "lost its connection" in sp["reason"], sp
    assert server.request("GET", "/health").status_code == 200


def test_an_rpc_address_with_no_server_fails_at_startup_with_the_reason(build, bpe_models):
    closed = f"127.0.0.1:{free_port()}"
    proc = subprocess.run([build.binary("llama-server"), *_args(bpe_models), "--rpc", closed, "-devpd", "RPC0",
                           "--port", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode > 0, proc.returncode  # an error exit, not a signal
    assert f"cannot use the RPC server {closed}" in proc.stdout + proc.stderr


def test_draft_prefill_after_query_steps_keeps_the_schedulers_plan_on_the_cpu_too(tool, rpc_server, tiny_models):
    """The scheduler re-plan check of test_specprefill.py (GGML_SCHED_DEBUG_REALLOC=1 aborts when a prefill ubatch
    outgrows the plan a query step left) needs a device beside the CPU: an RPC device serving the CPU gives the CPU
    build one, so the check runs where no GPU or lavapipe is."""
    from harness import words_prompt

    model = tiny_models["llama"]
    result = tool.run("-m", model, "-mpd", model, "--rpc", rpc_server.address, "--device", "RPC0", "-devpd", "RPC0",
                      "-ngl", "99", "-nglpd", "99", "-fa", "on", "-ub", "128", "--repeat", "2", "-c", "8192",
                      "--spec-prefill-ctx", "16384",
                      "-n", "6", "--temp", "0", "--spec-prefill-min-tokens", "256", prompt=words_prompt(500),
                      env={"GGML_SCHED_DEBUG_REALLOC": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = result.report
    assert len(report["repeats"]) == 2
    assert report["status"] == "sparse", report["reason"]
    assert report["reduced_on"] == "RPC0"
    assert report["n_prompt"] > 4 * 128  # several prefill ubatches
