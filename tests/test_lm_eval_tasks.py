"""evalkit tasks as lm-eval tasks: export an include path, run it with lm-eval itself.

The oracle copies any single fact it has seen, so on the exported needle tasks it must score
1.0 through lm-eval exactly as it does through evalkit.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import REPO, TINY_TOKENIZER

LENGTHS = (256, 512)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from evalkit.cli import main

    out = tmp_path_factory.mktemp("lm-eval-export")
    rc = main(["lm-eval-export", "--tasks", "needle", "--tokenizer", str(TINY_TOKENIZER),
               "--lengths", ",".join(map(str, LENGTHS)), "--depths", "0.5", "--loads", "3",
               "--samples", "2", "--out", str(out)])
    assert rc == 0
    return out


def export_into(out, *lengths: int, seed: int = 0) -> int:
    from evalkit.cli import main

    return main(["lm-eval-export", "--tasks", "needle", "--tokenizer", str(TINY_TOKENIZER),
                 "--lengths", ",".join(map(str, lengths)), "--depths", "0.5", "--loads", "1",
                 "--samples", "1", "--seed", str(seed), "--out", str(out)])


def tree(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("name", ["utils.py", "evalkit_export.json", "data/needle_256.jsonl",
                                  "evalkit_needle_256.yaml"])
def test_export_never_replaces_a_users_file(tmp_path, capsys, name):
    """Issue 12: `lm-eval-export --out DIR` replaced the user's own DIR/utils.py and
    DIR/evalkit_export.json. It refuses, naming the file, and writes nothing."""
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text('{"mine": true}\n')
    (tmp_path / "NOTES.md").write_text("my notes\n")
    before = tree(tmp_path)
    assert export_into(tmp_path, 256) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / name) in err and "not written by evalkit" in err
    assert tree(tmp_path) == before


def test_export_again_replaces_only_its_own_files(tmp_path, capsys):
    (tmp_path / "NOTES.md").write_text("my notes\n")
    assert export_into(tmp_path, 256) == 0
    first = json.loads((tmp_path / "evalkit_export.json").read_text())
    assert set(first["files"]) == set(tree(tmp_path)) - {"NOTES.md", "evalkit_export.json"}
    assert export_into(tmp_path, 512) == 0  # its own files: replaced, or removed when stale
    assert set(tree(tmp_path)) == {"NOTES.md", "evalkit_export.json", "utils.py",
                                   "data/needle_512.jsonl", "evalkit_needle_512.yaml",
                                   "evalkit_needle_choice_512.yaml"}
    assert (tmp_path / "NOTES.md").read_text() == "my notes\n"
    # A file the export wrote and the user changed since is the user's now.
    edited = tmp_path / "evalkit_needle_512.yaml"
    edited.write_text(edited.read_text() + "# my change\n")
    before = tree(tmp_path)
    capsys.readouterr()
    assert export_into(tmp_path, 256) == 2
    err = capsys.readouterr().err
    assert str(edited) in err and "changed since evalkit wrote it" in err
    assert tree(tmp_path) == before


def test_export_writes_an_include_path(exported):
    from lm_eval.tasks._yaml_loader import load_yaml

    manifest = json.loads((exported / "evalkit_export.json").read_text())
    made = manifest["tasks"]["needle"]["lm_eval_tasks"]
    assert set(made) == {f"evalkit_needle_{n}" for n in LENGTHS} | {
        f"evalkit_needle_choice_{n}" for n in LENGTHS}
    lines = (exported / "data" / "needle_256.jsonl").read_text().splitlines()
    docs = [json.loads(x) for x in lines]
    assert len(docs) == 2
    for d in docs:  # the fact is in the prompt, which is sized in the tokenizer's tokens
        assert d["gold"][0] in d["prompt"] and abs(d["prompt_tokens"] - 256) <= 2
        assert d["gold"][0] == d["candidates"][0] and d["max_new_tokens"] > 0
        assert d["stop"] == ["\n", "."]  # the built-in tasks' convention: facts end with "."
    cfg = load_yaml(exported / "evalkit_needle_256.yaml", resolve_func=True)
    assert cfg["tag"] == ["evalkit_needle", "evalkit"] and callable(cfg["process_results"])


def test_lm_eval_runs_the_exported_tasks_on_the_oracle(exported):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import evalkit.lm_eval.bridge  # noqa: F401  -- registers --model "evalkit"
    from evalkit.model_adapters.models import load_model

    tm = TaskManager(include_path=str(exported), include_defaults=False)
    out = simple_evaluate(model="evalkit", model_args="name=oracle", task_manager=tm,
                          tasks=["evalkit_needle"],  # both ways: the choice tasks share the tag
                          log_samples=True, bootstrap_iters=0)
    res = out["results"]
    for n in LENGTHS:
        assert res[f"evalkit_needle_{n}"]["exact_match,none"] == 1.0
        assert res[f"evalkit_needle_{n}"]["partial_credit,none"] == 1.0
        assert res[f"evalkit_needle_choice_{n}"]["forced_choice,none"] == 1.0
    # lm-eval asked each question as evalkit's runner does (its own budget and stop strings)
    # and got what the adapter itself answers to the same prompt.
    oracle = load_model("oracle")
    for s in out["samples"]["evalkit_needle_256"]:
        doc, (_, gen_kwargs) = s["doc"], s["arguments"][0]
        assert gen_kwargs["max_gen_toks"] == doc["max_new_tokens"]
        assert gen_kwargs["until"] == doc["stop"]
        ids = oracle.tokenizer(doc["prompt"])["input_ids"]
        direct = oracle.generate(oracle.prefill(ids), doc["max_new_tokens"], doc["stop"])
        assert s["filtered_resps"][0] == direct and direct.strip() == doc["gold"][0]


@pytest.mark.slow  # a child interpreter: lm-eval's CLI indexes all its tasks (~10 s) first
def test_plain_lm_eval_command_knows_the_evalkit_model(exported, tmp_path):
    """`lm-eval run --model evalkit ...` through the installable .pth hook (here added as a
    site dir of a child interpreter, exactly as site-packages .pth files are processed)."""
    from evalkit.lm_eval.cli import install_hook

    site_dir = tmp_path / "site"
    site_dir.mkdir()
    install_hook(site_dir)
    script = textwrap.dedent(f"""
        import site, sys
        site.addsitedir({str(site_dir)!r})
        assert "evalkit.lm_eval.bridge" not in sys.modules  # lazy until asked
        from lm_eval.__main__ import cli_evaluate   # what the `lm-eval` console script runs
        sys.argv = ["lm-eval", "run", "--model", "evalkit", "--model_args", "name=oracle",
                    "--include_path", {str(exported)!r}, "--tasks", "evalkit_needle_256",
                    "--limit", "1", "--output_path", {str(tmp_path / "out")!r}]
        cli_evaluate()
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = list((tmp_path / "out").rglob("results_*.json"))
    assert results, proc.stdout[-2000:]
    data = json.loads(results[0].read_text())
    assert data["results"]["evalkit_needle_256"]["exact_match,none"] == 1.0
    assert data["config"]["model"] == "evalkit"


def test_run_lm_eval_tasks_writes_results_and_samples(exported, tmp_path):
    """What `evalkit run --lm-eval-tasks` calls: options per model, as the runner passes them,
    and the task index it checked the names against."""
    from evalkit.lm_eval.run import LmEvalTasks, run_lm_eval_tasks

    out = tmp_path / "lm_eval"
    tasks = LmEvalTasks(["evalkit_needle_choice_256"], include_path=exported,
                        include_defaults=False)
    res = run_lm_eval_tasks(["oracle", "forgetful"], tasks, output_dir=out, limit=1,
                            model_options={"oracle": {"order": 8}})
    files = res["models"]["oracle"]["evalkit_files"]
    saved = json.loads((out / "oracle" / "results.json").read_text())
    assert saved["results"]["evalkit_needle_choice_256"]["forced_choice,none"] == 1.0
    rows = (out / "oracle" / "samples_evalkit_needle_choice_256.jsonl").read_text().splitlines()
    assert len(rows) == 1 and files["samples"]["evalkit_needle_choice_256"].endswith(".jsonl")
    # the one index served both models, each with its own task metadata (its tokenizer)
    assert set(res["models"]) == {"oracle", "forgetful"}
    assert [(p["model"], p["status"], p["reused"]) for p in res["pairs"]] == [
        ("oracle", "scored", False), ("forgetful", "scored", False)]
    assert res["failed"] == 0 and res["problems"] == []
    assert "forced_choice,none" in res["models"]["forgetful"]["results"][
        "evalkit_needle_choice_256"]
    assert (out / "forgetful" / "results.json").is_file()
    with pytest.raises(ValueError, match="unknown lm-eval task.*no_such_task"):
        LmEvalTasks(["evalkit_needle_choice_256", "no_such_task"], include_path=exported,
                    include_defaults=False)
    # one shape of options: a flat dict of options is refused, naming what it is not
    with pytest.raises(ValueError, match=r"maps each model to its options.*\['order'\] are not"):
        run_lm_eval_tasks(["oracle"], tasks, output_dir=out, model_options={"order": 8})


def test_export_stopped_midway_still_owns_what_it_wrote(tmp_path, monkeypatch):
    """An export that stops between files (here: the disk fills on the third) leaves a folder
    the next export may still replace: the manifest is written first and names every file."""
    from evalkit import atomic

    assert export_into(tmp_path, 256) == 0
    real, calls = atomic.write_text, []

    def disk_full_on_third(path, text):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real(path, text)

    monkeypatch.setattr(atomic, "write_text", disk_full_on_third)
    # another seed: other data in the files it did replace; a full disk is a run failure (1)
    assert export_into(tmp_path, 256, 512, seed=1) == 1
    assert len(calls) == 3
    monkeypatch.setattr(atomic, "write_text", real)
    assert export_into(tmp_path, 512) == 0
    assert set(json.loads((tmp_path / "evalkit_export.json").read_text())["files"]) == {
        "utils.py", "data/needle_512.jsonl", "evalkit_needle_512.yaml",
        "evalkit_needle_choice_512.yaml"}
