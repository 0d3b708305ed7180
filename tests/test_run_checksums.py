"""DONE records the sha256 of a finished run's outputs (issue 12 item 10): publish and compare
refuse a file changed after the run, in one line naming it; --resume rebuilds it. Runs written
before DONE held checksums stay readable, and their files are still checked for validity."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from evalkit.cli import main as cli_main

from runner_support import read_samples, small_run, without_latency


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    return small_run(tmp_path_factory.mktemp("sums"))


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def old_format(run_dir: Path) -> Path:
    """The DONE the runner wrote before it recorded checksums."""
    done = json.loads((run_dir / "DONE").read_text())
    del done["sha256"]
    (run_dir / "DONE").write_text(json.dumps(done))
    return run_dir


def cli(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli_main([*map(str, argv)])
    return rc, capsys.readouterr().err


def board(capsys, run_dir: Path, to: Path) -> bytes:
    rc, err = cli(capsys, "publish", run_dir, "--to", to, "--bootstrap", "100")
    assert rc == 0, err
    return (to / "results.csv").read_bytes().replace(str(run_dir).encode(), b"RUN")


def test_done_records_the_outputs_sha256(finished):
    import hashlib

    sums = json.loads((finished / "DONE").read_text())["sha256"]
    assert sums == {n: hashlib.sha256((finished / n).read_bytes()).hexdigest()
                    for n in ("samples.jsonl", "results.json", "provenance.json")}


@pytest.mark.parametrize("name", ["samples.jsonl", "results.json", "provenance.json"])
def test_an_edited_output_is_refused_by_publish_and_compare(finished, tmp_path, capsys, name):
    edited = copy(finished, tmp_path / "edited")
    f = edited / name
    # a plausible hand edit: still valid JSON, a score (or a date) changed
    f.write_text(f.read_text().replace("1.0", "0.0").replace("20", "19", 1))
    rc, err = cli(capsys, "publish", edited, "--to", tmp_path / "lb", "--bootstrap", "100")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{f}: not the file the run wrote" in err and not (tmp_path / "lb").exists()
    rc, err = cli(capsys, "compare", finished, edited, "--out", tmp_path / "cmp")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and f"{f}: not the file" in err
    assert not (tmp_path / "cmp").exists()


def test_a_removed_output_or_a_corrupt_marker_is_refused(finished, tmp_path, capsys):
    gone = copy(finished, tmp_path / "gone")
    (gone / "provenance.json").unlink()
    rc, err = cli(capsys, "publish", gone, "--to", tmp_path / "lb")
    assert rc == 2 and f"{gone / 'provenance.json'}: not the file the run wrote" in err
    marker = copy(finished, tmp_path / "marker")
    done = json.loads((marker / "DONE").read_text())
    (marker / "DONE").write_text(json.dumps({**done, "sha256": ["x"]}))
    rc, err = cli(capsys, "publish", marker, "--to", tmp_path / "lb")
    assert rc == 2 and f"{marker / 'DONE'}: field 'sha256' should map" in err


def test_resume_rebuilds_an_edited_run(finished, tmp_path, capsys):
    edited = copy(finished, tmp_path / "e" / finished.name)  # the run id is the folder's name
    (edited / "samples.jsonl").write_text((edited / "samples.jsonl").read_text()
                                          .replace("1.0", "0.0"))
    rc, err = cli(capsys, "run", "--resume", edited, "--no-progress")  # from its cache
    assert rc == 0, err
    assert without_latency(read_samples(edited)) == without_latency(read_samples(finished))
    def rows(csv_bytes: bytes) -> list[list[str]]:  # the resume's own date aside
        header, *body = csv.reader(csv_bytes.decode().splitlines())
        i = header.index("run_created")
        return [r[:i] + r[i + 1:] for r in body]

    assert rows(board(capsys, edited, tmp_path / "a")) == rows(board(capsys, finished, tmp_path / "b"))


def test_a_run_from_before_checksums_is_read_as_before(finished, tmp_path, capsys):
    old = old_format(copy(finished, tmp_path / "old"))
    assert board(capsys, old, tmp_path / "a") == board(capsys, finished, tmp_path / "b")


@pytest.mark.parametrize("fmt", ["stamped", "old"])
def test_garbage_provenance_json_is_refused_naming_it(finished, tmp_path, capsys, fmt):
    r = copy(finished, tmp_path / "r")
    if fmt == "old":
        old_format(r)
    (r / "provenance.json").write_text("{oops")
    rc, err = cli(capsys, "publish", r, "--to", tmp_path / "lb")
    assert rc == 2 and str(r / "provenance.json") in err and "Traceback" not in err


def test_non_utf8_bytes_in_an_old_run_name_the_file_and_line(finished, tmp_path, capsys):
    r = old_format(copy(finished, tmp_path / "r"))
    lines = (r / "samples.jsonl").read_bytes().splitlines(keepends=True)
    (r / "samples.jsonl").write_bytes(b"".join(lines[:2] + [b"\xfb" + lines[2]] + lines[3:]))
    rc, err = cli(capsys, "publish", r, "--to", tmp_path / "lb")
    assert rc == 2 and f"{r / 'samples.jsonl'}:3: not valid JSON" in err
