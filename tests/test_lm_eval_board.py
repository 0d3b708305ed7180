"""Issue 58 item 5: lm-eval results on the board. A run with --lm-eval-tasks alone keeps each
document's prediction and scores as evalkit sample rows (RUN_DIR/lm_eval/samples.jsonl) and
publishes them with the board's intervals (before: "samples.jsonl: no samples"); --limit is
applied before RULER builds its documents (before: 500 per length, whatever the limit);
--no-progress silences every bar, and neither git's "fatal: not a git repository" (lm-eval's
`git describe` outside a checkout) nor lm-eval's "No aggregation function defined for metric
512" (RULER's YAML lists only its default lengths) is printed."""
import csv
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("wonderwords")  # lm-eval's RULER code imports it

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def evalkit(*args, cwd):
    return subprocess.run([sys.executable, "-m", "evalkit", *args], capture_output=True,
                          text=True, env=ENV, cwd=cwd, timeout=900)


def test_an_lm_eval_only_run_publishes_its_documents(tmp_path):
    run = tmp_path / "run"
    proc = evalkit("run", "--models", "recall-gla-tiny", "--lm-eval-tasks", "niah_single_1",
                   "--lengths", "512", "--limit", "2", "--no-progress", "--output", str(run),
                   cwd=tmp_path)  # not a git checkout
    assert proc.returncode == 0, proc.stderr[-3000:]
    err = proc.stderr
    assert f"2 documents with their answers and scores in {run}/lm_eval/samples.jsonl" in \
        proc.stdout, proc.stdout
    # no evalkit samples to count: the run says it ran lm-eval tasks only, not "0 samples"
    assert proc.stdout.startswith("evalkit run: lm-eval tasks only, in "), proc.stdout
    assert "0 samples" not in proc.stdout
    assert "fatal: not a git repository" not in err
    assert "No aggregation function defined" not in err
    assert "Custom kwargs can be passed" not in err  # evalkit gives the metadata it advises
    assert "it/s]" not in err and "s/it]" not in err and "Generating synthetic" not in err, err

    rows = [json.loads(line) for line in (run / "lm_eval" / "samples.jsonl").open()]
    assert [r["probe_id"] for r in rows] == ["niah_single_1/doc0", "niah_single_1/doc1"]
    pair = json.loads((run / "lm_eval" / "recall-gla-tiny" / "pairs" / "niah_single_1.json")
                      .read_text())
    assert pair["result"]["n-samples"]["niah_single_1"]["effective"] == 2
    # RULER's own metric, per document, as lm-eval scored it: its mean is lm-eval's result
    mean = sum(r["scores"]["string_match_all"] for r in rows) / 2
    assert mean == pair["result"]["results"]["niah_single_1"]["512,none"]
    for r in rows:
        assert r["task"] == "niah_single_1" and r["target_length"] == 512
        assert r["gold"] and r["gold"][0].isdigit() and isinstance(r["prediction"], str)
        assert 0 < r["prompt_tokens"] <= 512 and "word_match" in r["scores"]
    results = json.loads((run / "results.json").read_text())
    assert results["lm_eval"]["board"]["tasks"]["niah_single_1"]["version"] == "1.0"
    assert results["lm_eval"]["board"]["rows"] == 2

    proc = evalkit("publish", str(run), "--to", str(tmp_path / "board"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (tmp_path / "board" / "results.csv").open() as f:
        [row] = [r for r in csv.DictReader(f) if r["task"] == "niah_single_1"]
    assert row["model"] == "recall-gla-tiny" and row["target_length"] == "512"
    assert row["n"] == "2" and float(row["string_match_all"]) == mean
    # one model on the board: the rows carry the run's hash of it, as its own samples would
    assert row["model_hash"] == results["models"]["recall-gla-tiny"]["hash"]
    lo, hi = float(row["string_match_all_lo"]), float(row["string_match_all_hi"])
    assert 0 <= lo <= mean <= hi <= 1 and hi > lo  # the board's interval over the 2 documents

    # a hand-edited rows file is refused by name, as samples.jsonl is
    (run / "lm_eval" / "samples.jsonl").write_text("".join(
        json.dumps({**r, "prediction": "edited"}) + "\n" for r in rows))
    proc = evalkit("publish", str(run), "--to", str(tmp_path / "board2"), cwd=tmp_path)
    assert proc.returncode != 0 and "lm_eval/samples.jsonl: not the file the run wrote" in \
        proc.stderr, proc.stderr[-2000:]


def test_limit_is_applied_before_ruler_builds_its_documents():
    """Capped at 2, RULER builds 2 documents, and they are the first 2 of its full 500."""
    from evalkit.lm_eval.run import LmEvalTasks
    from evalkit.lm_eval.ruler_nltk import import_prepare_niah
    from evalkit.lm_eval.ruler_tasks import limited_generation
    from evalkit.model_adapters.reference import DEFAULT_TOKENIZER

    import_prepare_niah()
    tasks = LmEvalTasks(["niah_single_1"])
    meta = {"max_seq_lengths": [256], "tokenizer": str(DEFAULT_TOKENIZER)}

    def docs(limit):
        import random

        random.seed(0)
        with limited_generation(limit, tasks.dataset_functions):
            task = tasks.manager(meta).load(["niah_single_1"])["tasks"]["niah_single_1"]
        return list(task.eval_docs)

    capped, full = docs(2), docs(None)
    assert len(capped) == 2 and len(full) > 400  # 500 made, less those that did not fit
    assert capped == full[:2]


def test_no_progress_silences_the_libraries_bars_too(tmp_path):
    """transformers drew its "Loading weights" bar for a softmax model under --no-progress."""
    proc = evalkit("run", "--models", "recall-softmax-tiny", "--tasks", "needle", "--lengths",
                   "256", "--depths", "0.5", "--loads", "1", "--samples", "1", "--no-progress",
                   "--output", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "it/s]" not in proc.stderr and "Loading weights" not in proc.stderr, proc.stderr
