"""Issue 12 regressions for `evalkit publish`: a leaderboard folder keeps what publish did not
write, concurrent publishes do not collide, sizes are bounded, faults are one line."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.cli import main as cli_main
from runner_support import small_run


@pytest.fixture(scope="module")
def a_run(tmp_path_factory) -> Path:
    return small_run(tmp_path_factory.mktemp("pubrun"))


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_publish_keeps_files_it_did_not_write(a_run, tmp_path, capsys):
    board = tmp_path / "lb"
    assert cli_main(["publish", str(a_run), "--to", str(board)]) == 0
    written = set(_files(board))
    (board / "NOTES.md").write_text("my notes\n")
    (board / "extra").mkdir()
    (board / "extra" / "data.csv").write_text("a,b\n1,2\n")
    (board / "extra" / "empty").mkdir()
    (board / "plots" / "mine.txt").write_text("mine\n")
    (tmp_path / "elsewhere").mkdir()
    (board / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert cli_main(["publish", str(a_run), "--to", str(board)]) == 0
    assert (board / "NOTES.md").read_text() == "my notes\n"
    assert (board / "extra" / "data.csv").read_text() == "a,b\n1,2\n"
    assert (board / "extra" / "empty").is_dir()
    assert (board / "plots" / "mine.txt").read_text() == "mine\n"
    assert os.readlink(board / "linked") == str(tmp_path / "elsewhere")
    listed = json.loads((board / "results.json").read_text())["files"]
    assert set(listed) == written  # it lists exactly what it wrote, and nothing else


def test_a_foreign_file_where_publish_writes_is_refused_naming_it(a_run, tmp_path, capsys):
    board = tmp_path / "lb"
    assert cli_main(["publish", str(a_run), "--to", str(board)]) == 0
    doc = json.loads((board / "results.json").read_text())
    doc["files"].remove("README.md")  # as if the user had put README.md there themselves
    (board / "results.json").write_text(json.dumps(doc))
    (board / "README.md").write_text("the user's own readme\n")
    before = _files(board)
    capsys.readouterr()
    assert cli_main(["publish", str(a_run), "--to", str(board)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(board / "README.md") in err
    assert _files(board) == before


def test_bootstrap_is_bounded_naming_the_flag(a_run, tmp_path, capsys):
    rc = cli_main(["publish", str(a_run), "--to", str(tmp_path / "lb"), "--bootstrap",
                   "1000000000"])
    err = capsys.readouterr().err
    assert rc == 2 and "--bootstrap" in err and "100,000" in err
    assert not (tmp_path / "lb").exists()


def test_disk_full_mid_publish_is_one_line_exit_1_and_keeps_the_old_board(a_run, tmp_path,
                                                                           capsys, monkeypatch):
    board = tmp_path / "lb"
    assert cli_main(["publish", str(a_run), "--to", str(board)]) == 0
    (board / "NOTES.md").write_text("keep me\n")
    before = _files(board)
    real = Path.write_text

    def full(self, *a, **k):
        if self.name == "README.md":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    capsys.readouterr()
    assert cli_main(["publish", str(a_run), "--to", str(board)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No space left on device" in err and "README.md" in err
    assert _files(board) == before
    assert [p.name for p in tmp_path.iterdir()] == ["lb"]  # no temporary folder left


_SYNCHRONIZED = """
import sys, time
from evalkit.cli import main
import evalkit.leaderboard.publish, evalkit.leaderboard.plots, matplotlib.pyplot  # imports done
start = float(sys.argv[1])
time.sleep(max(0.0, start - time.time()))  # every process starts publishing at once
sys.exit(main(["publish", sys.argv[2], "--to", sys.argv[3]]))
"""


def test_concurrent_publishes_to_one_folder_all_succeed(a_run, tmp_path):
    """Real processes, started in the same instant so that their swaps overlap."""
    import time

    board = tmp_path / "lb"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    for _ in range(2):
        start = time.time() + 8  # after every process has imported
        procs = [subprocess.Popen([sys.executable, "-c", _SYNCHRONIZED, str(start), str(a_run),
                                   str(board)], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(3)]
        results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
        assert [rc for _, _, rc in results] == [0] * 3, [err for _, err, _ in results]
    doc = json.loads((board / "results.json").read_text())
    assert doc["format"].startswith("evalkit-leaderboard/") and (board / "README.md").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lb"]  # no .old-/.new- left over


def _waiting_on_a_lock(pid: int) -> bool:
    """/proc/locks lists a process blocked in flock with '->'."""
    return any("->" in line and f" {pid} " in line
               for line in Path("/proc/locks").read_text().splitlines())


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux /proc/locks")
def test_a_publish_waits_while_another_one_holds_the_folder(a_run, tmp_path):
    """The swap is serialized: while one publish holds the lock, another one does not touch
    the target (before the fix it swapped regardless, racing the holder's renames)."""
    import fcntl
    import time

    board = tmp_path / "lb"
    fd = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a publish in progress holds
    try:
        proc = subprocess.Popen([sys.executable, "-m", "evalkit", "publish", str(a_run), "--to",
                                 str(board)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 240
        while proc.poll() is None and not _waiting_on_a_lock(proc.pid):
            assert time.time() < deadline
            time.sleep(0.1)
        assert not board.exists() and proc.poll() is None
    finally:
        os.close(fd)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert (board / "README.md").exists()
