"""evalkit.owned_folder: the one way a command writes a folder (publish, compare,
lm-eval-export, train-*, the SmolLM2 conversion each go through it; their own tests check
their evidence of ownership)."""
import pytest

from evalkit.owned_folder import building, refuse_foreign, stage_for


def _tree(folder):
    return {p.relative_to(folder).as_posix(): p.read_text() for p in folder.rglob("*")
            if p.is_file()}


def test_a_failed_build_leaves_the_folder_exactly_as_it_was(tmp_path):
    target = tmp_path / "board"
    target.mkdir()
    (target / "a.txt").write_text("old\n")
    with pytest.raises(RuntimeError, match="midway"):
        with building(target) as stage:
            (stage / "a.txt").write_text("new\n")
            raise RuntimeError("midway")
    assert _tree(target) == {"a.txt": "old\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["board"]  # no stage, no old copy


def test_a_build_replaces_the_folder_whole(tmp_path):
    target = tmp_path / "board"
    target.mkdir()
    (target / "stale.txt").write_text("old\n")
    with building(target) as stage:
        (stage / "a.txt").write_text("new\n")
        assert not (target / "a.txt").exists()  # nothing shows before the swap
    assert _tree(target) == {"a.txt": "new\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["board"]


def test_a_killed_runs_stage_is_removed_by_the_next(tmp_path):
    leftover = tmp_path / ".m.tmp"
    (leftover / "half").mkdir(parents=True)
    (leftover / "half" / "x.bin").write_bytes(b"\0")
    stage = stage_for(tmp_path / "m")
    assert stage == leftover and list(stage.iterdir()) == []


def test_a_foreign_path_is_refused_by_name_and_kept(tmp_path):
    mine, theirs = tmp_path / "ours.json", tmp_path / "notes.md"
    mine.write_text("{}")
    theirs.write_text("my notes\n")
    missing = tmp_path / "not-yet.json"
    why = lambda p: None if p.suffix == ".json" else "not written by evalkit demo"
    refuse_foreign([mine, missing], why, command="evalkit demo", flag="--out")  # all ours
    with pytest.raises(ValueError) as e:
        refuse_foreign([mine, theirs], why, command="evalkit demo", flag="--out")
    assert str(e.value) == (f"{theirs}: not written by evalkit demo; evalkit demo never replaces "
                            f"or removes a file it did not write (move it away, or choose "
                            f"another --out)")
    assert theirs.read_text() == "my notes\n"
