"""Property: random byte-level corruption of a finished run's samples.jsonl, results.json or a
cache entry gives a clear error (naming the file) or a correct recompute, never a wrong result."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evalkit.cli import main as cli_main

from runner_support import read_samples, small_run, without_latency

PROPS = settings(max_examples=30, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, bytes, list[dict]]:
    root = tmp_path_factory.mktemp("corrupt")
    out = small_run(root)
    board = root / "board"
    assert cli_main(["publish", str(out), "--to", str(board), "--bootstrap", "100"]) == 0
    return out, (board / "results.csv").read_bytes(), without_latency(read_samples(out))


def corrupt(data: bytes, op: str, pos: int, byte: int) -> bytes:
    pos %= max(1, len(data))
    if op == "flip":
        new = (data[pos] ^ (byte or 1)) & 0xFF
        return data[:pos] + bytes([new]) + data[pos + 1:]
    if op == "truncate":
        return data[:pos]
    return data[:pos] + bytes([byte]) + data[pos:]


corruption = st.tuples(st.sampled_from(["flip", "truncate", "insert"]),
                       st.integers(0, 2**20), st.integers(0, 255))


def _copy(src: Path, tmp: Path) -> Path:
    dst = tmp / "copy"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


@PROPS
@given(name=st.sampled_from(["samples.jsonl", "results.json"]), how=corruption)
def test_corrupt_outputs_never_publish_a_wrong_board(finished, tmp_path, capsys, name, how):
    src, want_csv, _ = finished
    run_dir = _copy(src, tmp_path)
    f = run_dir / name
    f.write_bytes(corrupt(f.read_bytes(), *how))
    board = tmp_path / "board"
    shutil.rmtree(board, ignore_errors=True)
    capsys.readouterr()
    rc = cli_main(["publish", str(run_dir), "--to", str(board), "--bootstrap", "100"])
    err = capsys.readouterr().err
    if rc == 0:  # the corruption changed nothing the board reads: the board is the same
        got = (board / "results.csv").read_text().replace(str(run_dir), str(src))
        assert got == want_csv.decode(), (name, how)
    else:
        assert rc == 2 and str(f) in err and "Traceback" not in err, (name, how, err)


@settings(PROPS, max_examples=15)
@given(how=corruption)
def test_corrupt_cache_entry_is_recomputed_or_refused(finished, tmp_path, capsys, how):
    src, _, want_samples = finished
    run_dir = _copy(src, tmp_path)
    entries = sorted((run_dir / "cache").rglob("*.json"))
    assert entries
    victim = entries[how[1] % len(entries)]
    victim.write_bytes(corrupt(victim.read_bytes(), *how))
    (run_dir / "DONE").unlink()  # an interrupted run: --resume must rebuild from the cache
    capsys.readouterr()
    rc = cli_main(["run", "--resume", str(run_dir), "--no-progress"])
    err = capsys.readouterr().err
    if rc == 0:
        assert without_latency(read_samples(run_dir)) == want_samples, how
        assert (run_dir / "DONE").is_file()
    else:  # only a corrupt manifest is refused (its entries' provenance is unknown)
        assert rc == 2 and victim.name in err and "Traceback" not in err, (victim, how, err)
