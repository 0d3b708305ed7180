"""`evalkit run --shard I/N` splits one suite into N disjoint run folders whose samples are the
unsharded run's; `evalkit publish` merges them into the same board, and refuses a set that is
incomplete, overlapping or of two splits. A resume that would mix two models is refused."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from evalkit.cli import main as evalkit_main
from runner_support import build_tokenizer, read_samples, suite_dict, without_latency

# run-specific columns of results.csv: everything else is a cell's content
RUN_COLUMNS = {"run_id", "run_ids", "run_dir", "run_created", "latency_s"}


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shard")
    models = ("oracle", {"name": "forgetful", "options": {"capacity": 300}})
    cfg = suite_dict(build_tokenizer(root / "tok"), models=models, lengths=[64, 128],
                     depths=[0.0, 0.5, 1.0], loads=[1], samples=2)
    path = root / "suite.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run(suite: Path, out: Path, *extra: str) -> int:
    return evalkit_main(["run", "--config", str(suite), "--output", str(out), "--no-progress",
                         *extra])


def _key(s: dict) -> tuple:
    return (s["model"], s["task"], s["probe_hash"], s["question"])


def _cells(board: Path) -> pd.DataFrame:
    df = pd.read_csv(board / "results.csv")
    df = df[[c for c in df.columns if c not in RUN_COLUMNS and not c.startswith("latency")]]
    return df.sort_values(list(df.columns[:6])).reset_index(drop=True)


def test_three_shards_are_the_whole_run(suite_file, tmp_path, capsys):
    assert _run(suite_file, tmp_path / "whole") == 0
    whole = {_key(s): s for s in without_latency(read_samples(tmp_path / "whole"))}
    parts = []
    for i in (1, 2, 3):
        assert _run(suite_file, tmp_path / f"s{i}", "--shard", f"{i}/3") == 0
        res = json.loads((tmp_path / f"s{i}" / "results.json").read_text())
        assert res["shard"] == {"index": i, "count": 3}
        parts.append({_key(s): s for s in without_latency(read_samples(tmp_path / f"s{i}"))})
    assert "this is shard 3/3" in capsys.readouterr().out
    assert all(parts), [len(p) for p in parts]  # every shard got work
    keys = [k for p in parts for k in p]
    assert len(keys) == len(set(keys)) == len(whole)  # disjoint, and together the whole
    merged = {k: v for p in parts for k, v in p.items()}
    assert merged == whole  # the same answers, scores and flags, sample for sample

    assert evalkit_main(["publish", str(tmp_path / "whole"), "--to", str(tmp_path / "b1")]) == 0
    assert evalkit_main(["publish", *(str(tmp_path / f"s{i}") for i in (3, 1, 2)),
                         "--to", str(tmp_path / "b3")]) == 0
    pd.testing.assert_frame_equal(_cells(tmp_path / "b1"), _cells(tmp_path / "b3"))

    # incomplete, overlapping (the same shard in two folders), or two splits: refused
    def refused(*runs: str, to: str) -> str:
        capsys.readouterr()
        assert evalkit_main(["publish", *(str(tmp_path / r) for r in runs),
                             "--to", str(tmp_path / to)]) == 2
        return capsys.readouterr().err

    assert re.search(r"incomplete shards.*missing 2/3", refused("s1", "s3", to="b4"))
    shutil.copytree(tmp_path / "s2", tmp_path / "s2-copy")
    assert re.search(r"shard 2/3 .* given twice", refused("s1", "s2", "s3", "s2-copy", to="b5"))
    assert _run(suite_file, tmp_path / "h1", "--shard", "1/2") == 0
    assert "split it 2 and 3 ways" in refused("s1", "s2", "s3", "h1", to="b6")
    assert not any((tmp_path / b).exists() for b in ("b4", "b5", "b6"))


@pytest.mark.parametrize("bad, why", [("0/3", "I must be in 1..3"), ("4/3", "I must be in 1..3"),
                                      ("1/0", "N must be in"), ("a/b", "expected I/N"),
                                      ("1/99999", "N must be in")])
def test_bad_shard_is_refused_before_work(suite_file, tmp_path, capsys, bad, why):
    assert _run(suite_file, tmp_path / "r", "--shard", bad) == 2
    assert why in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_resume_keeps_its_shard_and_refuses_another(suite_file, tmp_path, capsys):
    out = tmp_path / "r"
    assert _run(suite_file, out, "--shard", "2/3") == 0
    first = without_latency(read_samples(out))
    assert evalkit_main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert without_latency(read_samples(out)) == first  # still shard 2/3, from the cache
    capsys.readouterr()
    assert _run(suite_file, out, "--resume", str(out), "--shard", "1/3") == 2
    assert "it runs shard 2/3, this is 1/3" in capsys.readouterr().err
    assert without_latency(read_samples(out)) == first


def test_resume_refuses_a_model_that_changed(tmp_path, capsys):
    """Other weights under the same path (or another model behind the same URL): the finished
    samples are another model's, so the resume is refused, naming what changed."""
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"first")
    cfg = suite_dict(build_tokenizer(tmp_path / "tok"),
                     models=({"name": "w", "spec": "weighted-oracle",
                              "options": {"weights": str(weights)}},),
                     lengths=[64], depths=[0.5], loads=[1], samples=2)
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    assert _run(suite, out) == 0
    prov = json.loads((out / "provenance.json").read_text())
    assert "w" in prov["models"]
    before = (out / "samples.jsonl").read_bytes()
    weights.write_bytes(b"second")
    capsys.readouterr()
    assert evalkit_main(["run", "--resume", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "model 'w' (weighted-oracle) is not the model this run started with" in err
    assert "weights_hash" in err and "Traceback" not in err
    assert (out / "samples.jsonl").read_bytes() == before and (out / "DONE").exists()
    weights.write_bytes(b"first")  # the same model again: the resume goes through
    assert evalkit_main(["run", "--resume", str(out), "--no-progress"]) == 0
