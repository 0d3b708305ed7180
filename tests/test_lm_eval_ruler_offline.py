"""Issue 31: lm-eval tasks through `evalkit run` without a traceback.

One failing (model, task) pair costs that pair only (a failed entry with one line naming the
model, the task, the function that raised and the error; exit status 1); `--resume` evaluates
only the failed pairs again; documents with an empty gold list are counted, not scored; a task
whose data would have to be downloaded is refused before any network access; nltk's false
"Downloaded punkt_tab" line never reaches the user. Real models, the real lm-eval package.
"""
import inspect
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from helpers import REPO

pytest.importorskip("lm_eval")
pytest.importorskip("wonderwords")  # lm-eval's RULER code imports it

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
MODELS = ("recall-gla-tiny", "smollm2-135m")


def evalkit(args, timeout=900):
    """`python -m evalkit ...` as a user runs it: its own interpreter, so every line that
    importing RULER prints is in its output (in this process it may be imported already)."""
    return subprocess.run([sys.executable, "-m", "evalkit", *args], cwd=REPO,
                          env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True,
                          timeout=timeout)


def lm_eval_block(run_dir):
    return json.loads((run_dir / "results.json").read_text())["lm_eval"]


def by_pair(block):
    return {(p["model"], p["task"]): p for p in block["pairs"]}


def check_clear_line(pair, err):
    """A failed pair: one line, in the command's stderr, naming model, task, function, error."""
    line = pair["line"]
    assert "\n" not in line and f"evalkit run: {line}" in err.splitlines()
    assert line.startswith(f"lm-eval task {pair['task']} on model {pair['model']} failed in ")
    assert pair["raised_in"] and f"failed in {pair['raised_in']}: {pair['error']}" in line


# -- data from the internet: refused before any network access -------------------------------

def test_ruler_qa_squad_is_refused_before_any_network_access(tmp_path, capsys, monkeypatch):
    from evalkit.cli import main

    tried = []

    def no_network(self, address, *args):
        tried.append(address)
        raise OSError(f"test: network access to {address}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    out = tmp_path / "run"
    rc = main(["run", "--models", "oracle", "--lm-eval-tasks", "ruler_qa_squad",
               "--lengths", "1024", "--limit", "1", "--output", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and tried == []
    assert "ruler_qa_squad needs SQuAD 2.0's dev set (SQuAD, dev-v2.0.json)" in err
    assert "cannot run offline" in err and "--include_path" in err
    assert not out.exists()  # refused before the run folder was made


@pytest.fixture(scope="module")
def index():
    from lm_eval.tasks import TaskManager

    return TaskManager()


def ruler_tasks(index):
    return index.task_index["ruler"].cfg["task"]


def essay_tasks():
    """RULER's needle tasks whose haystack is Paul Graham's essays, read from lm-eval's source
    (not from evalkit's table)."""
    from evalkit.lm_eval.ruler_nltk import import_prepare_niah

    import_prepare_niah()
    from lm_eval.tasks.ruler import niah_utils

    return {name for name, fn in inspect.getmembers(niah_utils, inspect.isfunction)
            if fn.__module__ == niah_utils.__name__
            and 'get_haystack(type_haystack="essay")' in inspect.getsource(fn)}


def test_offline_table_matches_lm_evals_ruler_code(index):
    from lm_eval.tasks.ruler import qa_utils

    from evalkit.lm_eval import offline

    assert {f.rsplit(".", 1)[1] for f in offline.ESSAY_FUNCTIONS} == essay_tasks()
    for fn, reader in (("get_squad", qa_utils.read_squad), ("get_hotpotqa",
                                                            qa_utils.read_hotpotqa)):
        (need,) = offline.KNOWN[offline.RULER + "qa_utils." + fn][1]
        assert need.source == inspect.signature(reader).parameters["url"].default
    # every task of lm-eval's "ruler" group is refused, or builds from local code only
    refused = {t for t in ruler_tasks(index) if offline.refusals(index, [t])}
    essays_here = offline.in_cache(offline.ESSAYS) and offline.punkt_tab_installed()
    assert refused == {"ruler_qa_squad", "ruler_qa_hotpot"} | (set() if essays_here
                                                                else essay_tasks())


def offline_ruler_tasks(index):
    from evalkit.lm_eval import offline

    return [t for t in ruler_tasks(index) if not offline.refusals(index, [t])]


# -- every RULER task that runs offline, on both embedded models, in one run; then --resume ---
# This run holds the issue's own case: ruler_vt and ruler_cwe on both models (the issue ran them
# with --limit 3; --limit 1 keeps the suite's time down, and cwe's first document on the tiny
# tokenizer already has an empty gold list). Marked slow (still in the default `make test`):
# 12 pairs of a 1K-token prompt and up to 128 greedy tokens, mostly smollm2-135m's, and a child
# interpreter that imports lm-eval and indexes its tasks: minutes on 2 cores.

@pytest.fixture(scope="module")
def offline_run(index, tmp_path_factory):
    tasks = offline_ruler_tasks(index)
    out = tmp_path_factory.mktemp("ruler") / "run"
    proc = evalkit(["run", "--models", ",".join(MODELS), "--lm-eval-tasks", ",".join(tasks),
                    "--lengths", "1024", "--limit", "1", "--output", str(out), "--no-progress"])
    return tasks, out, proc


@pytest.mark.slow
def test_every_offline_ruler_task_scores_or_fails_with_its_line(offline_run):
    tasks, out, proc = offline_run
    text = proc.stdout + proc.stderr
    assert {"niah_single_1", "ruler_vt", "ruler_cwe", "ruler_fwe"} <= set(tasks)
    assert "Traceback" not in text, text[-3000:]
    block = lm_eval_block(out)
    pairs = by_pair(block)
    assert set(pairs) == {(m, t) for m in MODELS for t in tasks}
    for (model, task), pair in pairs.items():
        assert not pair["reused"]
        gold = sum(r["count"] for r in pair["empty_gold"].values())
        if pair["status"] == "failed":
            check_clear_line(pair, proc.stderr)
            continue
        assert pair["status"] == "scored"
        assert 0.0 <= block["models"][model]["results"][task]["1024,none"] <= 1.0
        assert pair["n_samples"][task]["effective"] + gold == 1  # every document told
    for (model, task), pair in pairs.items():  # a scored pair's result is kept for --resume
        stored = out / "lm_eval" / model / "pairs" / f"{task}.json"
        assert stored.is_file() == (pair["status"] == "scored")
    assert all(p["status"] == "scored" for (m, _), p in pairs.items() if m == "smollm2-135m")
    assert pairs[("recall-gla-tiny", "ruler_vt")]["status"] == "scored"
    # RULER's cwe fits no word list into 1,024 of the tiny tokenizer's tokens: the gold list is
    # empty (lm-eval's scorer divided by its length: the traceback)
    cwe = pairs[("recall-gla-tiny", "ruler_cwe")]
    assert cwe["status"] == "failed", cwe
    assert cwe["raised_in"] == "lm_eval.tasks.ruler.cwe_utils.get_cw_dataset"
    assert "empty gold answer list" in cwe["error"]
    assert cwe["empty_gold"]["ruler_cwe"]["count"] == 1 and block["empty_gold"] >= 1
    # the exit status and the closing line count the failed pairs, as failed samples are
    failed = sum(p["status"] == "failed" for p in pairs.values())
    assert block["failed"] == failed and proc.returncode == 1, text[-3000:]
    assert f"{failed} lm-eval task(s) failed" in proc.stderr
    assert f"lm-eval: {len(pairs) - failed} of {len(pairs)} (model, task) pairs scored" \
        in proc.stdout
    # nltk's punkt_tab: neither the failed download nor the false "Downloaded" line
    assert "Downloaded punkt_tab" not in text and "[nltk_data]" not in text


@pytest.mark.slow
def test_resume_evaluates_only_the_failed_pairs(offline_run, capsys):
    from evalkit.cli import main

    _, out, _ = offline_run
    before = lm_eval_block(out)
    failed = {k for k, p in by_pair(before).items() if p["status"] == "failed"}
    assert failed  # recall-gla-tiny's ruler_cwe (else this test checks nothing)
    files = sorted((out / "lm_eval").rglob("pairs/*.json"))
    stamps = {f: (f.stat().st_mtime_ns, f.read_bytes()) for f in files}
    rc = main(["run", "--resume", str(out), "--no-progress"])
    captured = capsys.readouterr()
    block = lm_eval_block(out)
    after = by_pair(block)
    assert set(after) == set(by_pair(before))
    for key, pair in after.items():
        assert pair["reused"] == (key not in failed), (key, pair)
        if key not in failed:  # read back, not evaluated again: the same results
            model, task = key
            assert block["models"][model]["results"][task] == \
                before["models"][model]["results"][task]
    assert {f: (f.stat().st_mtime_ns, f.read_bytes()) for f in files} == stamps
    still = [k for k in failed if after[k]["status"] == "failed"]
    assert rc == (1 if still else 0)
    assert f"({len(after) - len(failed)} read back from an earlier invocation)" in captured.out
    for key in still:
        check_clear_line(after[key], captured.err)


# -- isolation and resume, on local task YAMLs scored by RULER's own scorer ------------------

TASK = """\
task: {name}
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
output_type: generate_until
doc_to_text: "{{{{input}}}}"
doc_to_target: "{{{{outputs}}}}"
process_results: !function lm_eval.tasks.ruler.common_utils.process_results
metric_list:
  - metric: "1024"
    aggregation: !function lm_eval.tasks.ruler.common_utils.aggregate_metrics
    higher_is_better: true
generation_kwargs: {{until: ["\\n"], max_gen_toks: 4, do_sample: false}}
"""


def write_task(folder, name, docs):
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / f"{name}.yaml").write_text(TASK.format(name=name, data=data))


def doc(code, gold, **extra):
    return {"input": f"The code is {code}. The code is {code}. The code is", "outputs": gold,
            **extra}


def test_a_raising_scorer_fails_its_pair_only_and_empty_gold_is_counted(tmp_path):
    from evalkit.lm_eval.run import LmEvalTasks, run_lm_eval_tasks

    tasks_dir, out = tmp_path / "tasks", tmp_path / "lm_eval"
    tasks_dir.mkdir()
    write_task(tasks_dir, "t_gold", [doc(7, ["7"], max_length=1024), doc(8, [], max_length=1024),
                                     doc(9, ["9"], max_length=1024)])
    # RULER's process_results reads doc["max_length"]: without it, lm-eval's scorer raises
    write_task(tasks_dir, "t_broken", [doc(5, ["5"])])
    tasks = LmEvalTasks(["t_broken", "t_gold"], include_path=tasks_dir, include_defaults=False)
    first = run_lm_eval_tasks(["oracle"], tasks, output_dir=out)
    pairs = {p["task"]: p for p in first["pairs"]}
    broken, gold = pairs["t_broken"], pairs["t_gold"]
    assert broken["status"] == "failed" and first["failed"] == 1
    assert broken["raised_in"] == "lm_eval.tasks.ruler.common_utils.process_results"
    assert broken["error"] == "KeyError: 'max_length'"
    assert broken["line"] == ("lm-eval task t_broken on model oracle failed in "
                              "lm_eval.tasks.ruler.common_utils.process_results: "
                              "KeyError: 'max_length'")
    # the pair after the failure ran: the oracle copies every code it was shown
    assert gold["status"] == "scored"
    assert first["models"]["oracle"]["results"]["t_gold"]["1024,none"] == 1.0
    assert gold["empty_gold"]["t_gold"] == {"count": 1, "of": 3, "doc_ids": [1],
                                            "built_by": "datasets.load_dataset('json')"}
    assert gold["n_samples"]["t_gold"]["effective"] == 2 and first["empty_gold"] == 1
    assert first["problems"] == [broken["line"], gold["empty_gold_lines"][0]]
    assert "1 of 3 documents have an empty gold answer list (doc ids 1" in first["problems"][1]

    # the data is fixed; a second call reads the scored pair back and retries the failed one
    write_task(tasks_dir, "t_broken", [doc(5, ["5"], max_length=1024)])
    stored = (out / "oracle" / "pairs" / "t_gold.json").read_bytes()
    again = run_lm_eval_tasks(["oracle"], LmEvalTasks(["t_broken", "t_gold"],
                                                      include_path=tasks_dir,
                                                      include_defaults=False), output_dir=out)
    pairs = {p["task"]: p for p in again["pairs"]}
    assert (pairs["t_broken"]["status"], pairs["t_broken"]["reused"]) == ("scored", False)
    assert (pairs["t_gold"]["status"], pairs["t_gold"]["reused"]) == ("scored", True)
    assert (out / "oracle" / "pairs" / "t_gold.json").read_bytes() == stored
    assert again["failed"] == 0 and again["reused"] == 1
    saved = json.loads((out / "oracle" / "results.json").read_text())
    assert set(saved["results"]) == {"t_broken", "t_gold"}
    # other settings are another key: nothing is read back
    third = run_lm_eval_tasks(["oracle"], tasks, output_dir=out, limit=1)
    assert [p["reused"] for p in third["pairs"]] == [False, False]


def test_a_task_with_remote_data_files_is_refused(tmp_path):
    from evalkit.lm_eval.run import LmEvalTasks

    (tmp_path / "remote.yaml").write_text(textwrap.dedent("""\
        task: t_remote
        dataset_path: json
        dataset_kwargs: {data_files: {test: "https://example.org/test.jsonl"}}
        test_split: test
        output_type: generate_until
        doc_to_text: "{{input}}"
        doc_to_target: "{{outputs}}"
        """))
    (tmp_path / "hub.yaml").write_text(textwrap.dedent("""\
        task: t_hub
        dataset_path: nobody/no_such_data_set_here
        dataset_name: main
        test_split: test
        output_type: generate_until
        doc_to_text: "{{input}}"
        doc_to_target: "{{outputs}}"
        """))
    with pytest.raises(ValueError) as e:
        LmEvalTasks(["t_remote", "t_hub"], include_path=tmp_path, include_defaults=False)
    msg = str(e.value)
    assert "t_remote needs the data files https://example.org/test.jsonl" in msg
    assert "t_hub needs the hub data set nobody/no_such_data_set_here" in msg
    assert "datasets.load_dataset('nobody/no_such_data_set_here', <dataset_name>)" in msg
