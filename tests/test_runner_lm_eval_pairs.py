"""lm-eval's stored pairs (output_dir/<model>/pairs/<task>.json) are read back only when they
are what was written (a sha256 over key, entry and result) by the same code (the hash of
evalkit's source is in the key): an edited file, or a changed evalkit, evaluates the pair
again (issue 41). Before, a pair file had neither and was read back whatever had changed."""
import json
import shutil

from test_lm_eval_ruler_offline import doc, write_task


def test_an_edited_pair_or_other_code_is_evaluated_again(tmp_path, monkeypatch):
    from evalkit.lm_eval.run import LmEvalTasks, run_lm_eval_tasks
    from evalkit import code_version
    from evalkit.runner import provenance

    tasks_dir, out = tmp_path / "tasks", tmp_path / "lm_eval"
    tasks_dir.mkdir()
    write_task(tasks_dir, "t_gold", [doc(7, ["7"], max_length=1024)])
    tasks = LmEvalTasks(["t_gold"], include_path=tasks_dir, include_defaults=False)
    reused = lambda: [p["reused"] for p in run_lm_eval_tasks(
        ["oracle"], tasks, output_dir=out)["pairs"]]
    assert reused() == [False] and reused() == [True]
    pair = out / "oracle" / "pairs" / "t_gold.json"
    stored = json.loads(pair.read_text())
    assert stored["key"]["evalkit_code"] == provenance.code_hash() and len(stored["sha256"]) == 64

    # a hand-edited result (still valid JSON, the same key): not read back
    stored["result"]["results"]["t_gold"]["1024,none"] = 0.25
    pair.write_text(json.dumps(stored))
    assert reused() == [False]
    assert json.loads(pair.read_text())["result"]["results"]["t_gold"]["1024,none"] == 1.0

    # evalkit's source changed (an edited copy of what the hash reads): evaluated again
    copies = [shutil.copytree(r, tmp_path / "src" / r.name,
                              ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.bin", "*.safetensors", "*.png"))
              for r in code_version.source_roots()]
    bridge = tmp_path / "src" / "evalkit" / "lm_eval" / "bridge.py"
    bridge.write_text(bridge.read_text() + "\n# a changed bridge\n")
    monkeypatch.setattr(code_version, "source_roots", lambda: copies)
    provenance.code_hash.cache_clear()
    try:
        assert reused() == [False] and reused() == [True]
    finally:
        provenance.code_hash.cache_clear()
