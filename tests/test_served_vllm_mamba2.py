"""The served adapter against vLLM serving the shipped, trained recall-mamba2-tiny (a
transformers Mamba2ForCausalLM, 7 layers, state 501,760 B, trained on the same batches as
recall-gla-tiny by `evalkit train-tiny --only recall-mamba2-tiny`) behind --api-key: parity with
transformers in-process, the server killed mid-run then `--resume`d against a restart, and the
key kept out of every file. One server serves the module (killed and started once more by the
kill test): each start costs 60-100 s on 2 cores. Run by `make test-vllm`."""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalkit.cli import main as evalkit_main
from vllm_support import (VllmServer, by_key, check_parity, read_samples, run_suite, served,
                         vllm_python, write_suite)

pytestmark = pytest.mark.vllm

SERVED_NAME = "recall-mamba2-tiny"
KEY_ENV = "EVALKIT_TEST_VLLM_KEY"
KEY = "evalkit-test-key-" + secrets.token_hex(16)  # what no file may contain
# the kill test's suite: enough samples that the kill lands mid-run
KILL_TASKS = [{"name": "needle", "lengths": [256, 512], "depths": [0.1, 0.5, 0.9]}]
KILL_SAMPLES = 4


@pytest.fixture(scope="module")
def mamba2_dir() -> Path:
    vllm_python()  # skips without vLLM
    from evalkit.model_adapters.embedded import TINY_DIR

    folder = TINY_DIR / "recall-mamba2-tiny"
    assert (folder / "model.safetensors").is_file(), (
        f"{folder} has no weights: train them with `evalkit train-tiny --config "
        f"configs/train_tiny.yaml --out model_adapters/tiny --only recall-mamba2-tiny`")
    return folder


@pytest.fixture(scope="module")
def mamba2_server(mamba2_dir, tmp_path_factory):
    # served under a name, as `make standard-served` serves it: vLLM's default name is the
    # folder's absolute path, which would put the clone's location into the model's identity
    server = VllmServer(mamba2_dir, tmp_path_factory.mktemp("vllm"),
                        extra=("--api-key", KEY, "--served-model-name", SERVED_NAME))
    try:
        print(f"\nvLLM serving the Mamba-2: ready in {server.start():.0f} s")
        yield server
    finally:
        server.stop()


@pytest.fixture
def keyed(monkeypatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY_ENV


def test_mamba2_parity_in_process_vs_served(mamba2_server, mamba2_dir, keyed, tmp_path):
    rows = run_suite(tmp_path, "mamba2", [
        {"name": "local", "spec": f"hf:{mamba2_dir}"},
        served(mamba2_server.url, mamba2_dir, "vllm", api_key_env=keyed, concurrency=4)])
    check_parity(rows, "local", "vllm")
    assert {r["state_kind"] for r in rows} != {"kv"}  # the recurrent formula, not a KV cache
    # the board says the same: the served rows against their in-process reference
    assert evalkit_main(["publish", str(tmp_path / "mamba2"), "--to", str(tmp_path / "b")]) == 0
    readme = (tmp_path / "b" / "README.md").read_text()
    table = readme[readme.index("### Numerical tolerance"):readme.index("### Goodput")]
    (row,) = [l for l in table.splitlines() if l.startswith("| vllm @ ")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "local" and int(cells[3]) <= 0.05 * int(cells[2])
    assert float(cells[4].split()[0]) <= 1e-3, row


def _cached(run_dir: Path) -> int:
    return sum(1 for _ in (run_dir / "cache" / "entries").glob("*/*.json"))


def test_killed_mid_run_then_resumed(mamba2_server, mamba2_dir, keyed, tmp_path, capsys):
    # concurrency 1: one request at a time, so the numbers do not depend on batching
    model = served(mamba2_server.url, mamba2_dir, "vllm", api_key_env=keyed, concurrency=1,
                   retries=2, backoff_s=0.2, timeout_s=60)
    cfg = write_suite(tmp_path, "kill", [model], tasks=KILL_TASKS, samples=KILL_SAMPLES)
    out, log = tmp_path / "killed", tmp_path / "killed.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "evalkit", "run", "--config", str(cfg),
                                 "--output", str(out), "--no-progress"], stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        t0 = time.monotonic()
        while _cached(out) < 4:  # some samples done: now the server dies
            assert proc.poll() is None, f"the run ended before the kill:\n{log.read_text()}"
            assert time.monotonic() - t0 < 300, "no sample finished within 300 s"
            time.sleep(0.05)
        t_kill = time.monotonic()
        mamba2_server.kill()
        rc = proc.wait(timeout=120)  # bounded retries: it ends on its own, well before this
        ended_s = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    text = log.read_text()
    rows = read_samples(out)
    failed = [r["error"] for r in rows if r["error"]]
    with capsys.disabled():
        print(f"\nkilled after {len(rows) - len(failed)}/{len(rows)} samples; the run ended "
              f"{ended_s:.1f} s later (exit {rc}); its errors: {sorted(set(failed))[:2]}")
    assert rc == 1 and "Traceback" not in text and "samples failed" in text, text[-2000:]
    assert 4 <= len(rows) - len(failed) < len(rows)
    assert all("connection failed" in e or "server is down" in e for e in failed), failed[:3]
    assert ended_s < 60

    restart_s = mamba2_server.start()  # the same port: the run's config holds the URL
    t0 = time.monotonic()
    capsys.readouterr()
    assert evalkit_main(["run", "--resume", str(out), "--no-progress"]) == 0
    resumed_s, said = time.monotonic() - t0, capsys.readouterr().out
    with capsys.disabled():
        print(f"restarted in {restart_s:.0f} s; --resume finished in {resumed_s:.1f} s: "
              f"{said.splitlines()[0] if said else ''}")
    assert f"{len(rows) - len(failed)} from cache" in said  # the same model: nothing redone

    whole = run_suite(tmp_path, "whole", [model], tasks=KILL_TASKS, samples=KILL_SAMPLES)
    a, b = by_key(read_samples(out), "vllm"), by_key(whole, "vllm")
    assert a.keys() == b.keys() and all(r["error"] is None for r in a.values())
    fields = ("prediction", "candidate_logprobs", "scores")
    differ = [k for k in a if any(a[k][f] != b[k][f] for f in fields)]
    assert not differ, [(a[k]["prediction"], b[k]["prediction"]) for k in differ[:3]]


def test_the_key_works_and_is_in_no_file(mamba2_server, mamba2_dir, keyed, tmp_path, capsys,
                                         monkeypatch):
    tasks = [{"name": "needle", "lengths": [256], "depths": [0.5]}]
    rows = run_suite(tmp_path, "keyed", [served(mamba2_server.url, mamba2_dir, "vllm",
                                                api_key_env=keyed)], tasks=tasks)
    assert rows and all(r["error"] is None for r in rows)
    board = tmp_path / "board"
    assert evalkit_main(["publish", str(tmp_path / "keyed"), "--to", str(board)]) == 0
    files = [p for d in (tmp_path / "keyed", board) for p in d.rglob("*") if p.is_file()]
    assert len(files) > 5 and (board / "index.html").is_file()
    leaks = [str(p) for p in files if KEY.encode() in p.read_bytes()]
    with capsys.disabled():
        print(f"the key: in none of {len(files)} files (run folder and board)")
    assert not leaks

    def fails(name: str, **opts) -> str:
        """A run that must fail with one line and exit status 1, no traceback."""
        capsys.readouterr()
        cfg = write_suite(tmp_path, name, [served(mamba2_server.url, mamba2_dir, name, **opts)],
                          tasks=tasks)
        rc = evalkit_main(["run", "--config", str(cfg), "--output", str(tmp_path / name),
                           "--no-progress"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1 and len(err) == 1 and "Traceback" not in err[0], err
        assert KEY not in err[0]
        return err[0]

    no_key = fails("nokey")
    assert "HTTP 401 Unauthorized" in no_key and "api_key_env=NAME" in no_key
    monkeypatch.setenv("EVALKIT_TEST_WRONG_KEY", "not-the-key")
    assert "refused the API key in $EVALKIT_TEST_WRONG_KEY" in fails(
        "wrongkey", api_key_env="EVALKIT_TEST_WRONG_KEY")


def test_resume_against_another_served_model_is_refused(mamba2_server, mamba2_dir, keyed,
                                                        tmp_path, capsys):
    """The same URL now serves a model under another name: resuming would mix two models'
    samples, so it is refused, naming what changed (last in the module: it restarts the
    module's server under that name)."""
    tasks = [{"name": "needle", "lengths": [256], "depths": [0.5]}]
    run_suite(tmp_path, "first", [served(mamba2_server.url, mamba2_dir, "vllm",
                                          api_key_env=keyed)], tasks=tasks)
    out = tmp_path / "first"
    before = (out / "samples.jsonl").read_bytes()
    mamba2_server.stop()
    other = VllmServer(mamba2_dir, tmp_path / "logs", port=mamba2_server.port,
                       extra=("--api-key", KEY, "--served-model-name", "another-model"))
    try:
        other.start()
        capsys.readouterr()
        assert evalkit_main(["run", "--resume", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err
    finally:
        other.stop()
    assert "is not the model this run started with" in err and "served_model" in err, err
    assert "another-model" in err and "Traceback" not in err
    assert (out / "samples.jsonl").read_bytes() == before and (out / "DONE").exists()
