"""evalkit tasks as lm-eval tasks: `evalkit lm-eval-export` writes an lm-eval include path.

    evalkit lm-eval-export --tasks needle,multikey --tokenizer PATH --lengths 512,1024 --out DIR
    lm_eval run --include_path DIR --tasks evalkit_needle --model evalkit --model_args name=oracle

For every task and length the folder gets (L = target length in the tokenizer's tokens):
- data/<task>_<L>.jsonl: one lm-eval doc per probe question: the prompt text (context up to the
  question, the question and the answer prefix), gold, candidates and the probe's coordinates
  (probe id/hash, length, depth, load, distance) so lm-eval's samples can be joined with evalkit's.
- evalkit_<task>_<L>.yaml: a generate_until task answered as evalkit's runner answers it: greedy,
  each question's own token budget (max_new_tokens) and stop strings -- set per doc by
  utils.EvalkitGenerateTask -- scored by evalkit.scoring (exact_match, contains,
  normalized_match, string_match_all, string_match_part, partial_credit) in process_results.
  Stop strings: `stop` if given (match the run's generation.stop), else a probe's own
  meta.extra "stop", else the built-in tasks' convention evalkit.render.ANSWER_STOP
  ("\\n", "."): every fact ends with "." right after its value.
- evalkit_<task>_choice_<L>.yaml (tasks whose questions carry candidates): the same prompts as
  lm-eval multiple_choice over " " + candidate, scored by evalkit's strict forced choice
  (ties count as wrong, unlike lm-eval's acc).
- tags: evalkit_<task> (every length), evalkit_<task>_choice, and evalkit (everything), so
  `--tasks evalkit_needle` runs all exported lengths, each reported as its own task.
- evalkit_export.json: what was exported (tokenizer hash, grid, task config hashes, counts).

Data are local JSON lines read by lm-eval through `dataset_path: json` with absolute
`data_files` paths (the datasets json builder resolves relative paths against the working
directory, not the YAML): moving the folder means exporting again.

Prompt text is what evalkit renders (render.py), joined into one string: lm-eval models tokenize
that string as a whole, so the token count can differ by a few tokens from evalkit's
piecewise rendering (which tokenizes each segment on its own); `prompt_tokens` records evalkit's.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from evalkit import atomic
from evalkit.cli import csv_list

GEN_METRICS = ("exact_match", "contains", "normalized_match", "string_match_all",
               "string_match_part", "partial_credit")


def default_stop() -> tuple[str, ...]:
    """The built-in tasks' stop convention (evalkit.render.ANSWER_STOP)."""
    from evalkit.render import ANSWER_STOP

    return tuple(ANSWER_STOP)


UTILS_PY = '''"""Written by `evalkit lm-eval-export`: scores lm-eval results with evalkit.scoring."""
from lm_eval.api.task import ConfigurableTask

from evalkit.scoring import GENERATION_METRICS, forced_choice


class EvalkitGenerateTask(ConfigurableTask):
    """generate_until with each question's own token budget and the probe's stop strings, as
    evalkit's runner answers it (a plain YAML task has one generation_kwargs for every doc)."""

    def __init__(self, config=None, **kwargs):
        # lm-eval hands the whole YAML over, including the `class` key TaskConfig rejects
        super().__init__(config={k: v for k, v in (config or {}).items() if k != "class"},
                         **kwargs)

    def construct_requests(self, doc, ctx, **kwargs):
        req = super().construct_requests(doc, ctx, **kwargs)
        for r in req if isinstance(req, list) else [req]:
            r.arguments[1]["max_gen_toks"] = int(doc["max_new_tokens"])
            r.arguments[1]["until"] = list(doc["stop"])
        return req


def process_results(doc, results):
    prediction = results[0]
    return {name: fn(prediction, doc["gold"]) for name, fn in GENERATION_METRICS.items()}


def process_results_choice(doc, results):
    # multiple_choice results: one (loglikelihood, is_greedy) per candidate, gold first
    lls = [r[0] if isinstance(r, (list, tuple)) else r for r in results]
    return {"forced_choice": forced_choice(lls)}
'''


def _prompt_texts(probe: Any, tokenizer: Any) -> list[str]:
    """One prompt string per question: the text render.py tokenizes piece by piece."""
    from evalkit.render import Renderer

    ctx, qs = Renderer(tokenizer, probe.chat).texts(probe)
    return ["".join(ctx[: q.after_segment]) + qs[i] for i, q in enumerate(probe.questions)]


def probe_docs(probe: Any, tokenizer: Any, stop: Sequence[str] | None = None) -> list[dict]:
    from evalkit.render import prompt_length

    stop = list(stop or dict(probe.meta.extra).get("stop") or default_stop())
    docs = []
    for i, (q, text) in enumerate(zip(probe.questions, _prompt_texts(probe, tokenizer))):
        docs.append({
            "id": f"{probe.id}/q{i}", "probe_id": probe.id, "probe_hash": probe.hash,
            "task": probe.task, "task_version": probe.task_version, "question": i,
            "kind": q.kind, "prompt": text, "gold": list(q.gold),
            "candidates": list(q.candidates), "max_new_tokens": q.max_new_tokens,
            "target_length": probe.meta.target_length,
            "prompt_tokens": prompt_length(probe, tokenizer, i),
            "depth": float(q.depth), "load": probe.meta.load, "distance": q.distance,
            "seed": probe.meta.seed, "tokenizer_hash": probe.meta.tokenizer_hash,
            "stop": stop,
        })
    return docs


def _yaml_dump(obj: dict, function_keys: Sequence[str] = ()) -> str:
    """YAML text; values of `function_keys` become lm-eval `!function` references."""
    import yaml

    text = yaml.safe_dump(obj, sort_keys=False, allow_unicode=True, width=1000)
    for key in function_keys:
        text = text.replace(f"{key}: __fn__", f"{key}: !function utils.{key}")
    return text


def _gen_task_yaml(name: str, tags: list[str], data: Path, max_gen: int, until: list[str],
                   meta: dict) -> str:
    cfg = {
        "task": name, "tag": tags, "class": "__fn__",
        "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test", "output_type": "generate_until",
        "doc_to_text": "prompt", "doc_to_target": "{{gold[0]}}",
        "process_results": "__fn__",
        "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True}
                        for m in GEN_METRICS],
        "generation_kwargs": {"until": until, "max_gen_toks": max_gen,
                              "do_sample": False, "temperature": 0.0},
        "repeats": 1, "num_fewshot": 0, "metadata": meta,
    }
    return _yaml_dump(cfg, ["process_results"]).replace(
        "class: __fn__", "class: !function utils.EvalkitGenerateTask")


def _choice_task_yaml(name: str, tags: list[str], data: Path, meta: dict) -> str:
    cfg = {
        "task": name, "tag": tags,
        "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test", "output_type": "multiple_choice",
        "doc_to_text": "prompt", "doc_to_choice": "candidates", "doc_to_target": 0,
        "target_delimiter": " ",  # continuations are " " + value, as evalkit scores them
        "process_results": "__fn__",
        "metric_list": [{"metric": "forced_choice", "aggregation": "mean",
                         "higher_is_better": True}],
        "num_fewshot": 0, "metadata": meta,
    }
    return _yaml_dump(cfg, ["process_results"]).replace(
        "process_results: !function utils.process_results",
        "process_results: !function utils.process_results_choice")


def _version_number(version: str) -> float:
    """lm-eval wants a number; evalkit versions are strings ("1", "2.1"), kept in metadata."""
    try:
        return float(version)
    except ValueError:
        return 1.0


def export_tasks(tasks: Sequence[str], out_dir: str | Path, *, tokenizer: Any,
                 lengths: Sequence[int] | None = None, depths: Sequence[float] | None = None,
                 loads: Sequence[int] | None = None, samples: int | None = None, seed: int = 0,
                 include_paths: Sequence[str | Path] = (), choice: bool = True,
                 stop: Sequence[str] | None = None) -> dict:
    """Write lm-eval task YAMLs, utils.py and jsonl data for `tasks` into `out_dir`.

    `tokenizer`: a tokenizer object or a path (folder or tokenizer.json); lengths are in its
    tokens. `stop`: stop strings for every question (default: see the module doc).
    Returns the manifest (also written to evalkit_export.json).
    """
    from evalkit.taskspec import discover, generate_probes, grid
    from evalkit.tokenization import load_tokenizer, tokenizer_hash

    if not tasks:
        raise ValueError("lm-eval export: name at least one task (see `evalkit tasks`)")
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
    reg = discover(include_paths)
    specs = [reg.get(t) for t in tasks]  # unknown names fail here, before anything is written
    out = Path(out_dir).expanduser().resolve()
    (out / "data").mkdir(parents=True, exist_ok=True)
    atomic.write_text(out / "utils.py", UTILS_PY)
    manifest: dict[str, Any] = {"tokenizer_hash": tokenizer_hash(tok), "seed": seed,
                                "stop": list(stop) if stop else None, "tasks": {}}
    for spec in specs:
        points = grid(spec, lengths=lengths, depths=depths, loads=loads, samples=samples,
                      seed=seed)
        by_length: dict[int, list[dict]] = {}
        for point, probe in zip(points, generate_probes(spec, tok, points)):
            by_length.setdefault(point.length, []).extend(probe_docs(probe, tok, stop))
        entry = {"version": spec.version, "config_hash": spec.config_hash(), "lm_eval_tasks": {}}
        base = f"evalkit_{spec.name}".replace("-", "_").replace(".", "_")
        for length, docs in sorted(by_length.items()):
            data = out / "data" / f"{spec.name}_{length}.jsonl"
            atomic.write_jsonl(data, docs)
            meta = {"version": _version_number(spec.version), "evalkit_task": spec.name,
                    "evalkit_task_version": spec.version,
                    "evalkit_config_hash": spec.config_hash(), "target_length": length,
                    "tokenizer_hash": manifest["tokenizer_hash"], "seed": seed}
            name = f"{base}_{length}"
            max_gen = max(d["max_new_tokens"] for d in docs)
            until = docs[0]["stop"] if docs else list(default_stop())
            atomic.write_text(out / f"{name}.yaml",
                              _gen_task_yaml(name, [base, "evalkit"], data, max_gen, until, meta))
            made = {name: {"docs": len(docs), "output_type": "generate_until"}}
            if choice and docs and all(len(d["candidates"]) >= 2 for d in docs):
                cname = f"{base}_choice_{length}"
                text = _choice_task_yaml(cname, [f"{base}_choice", "evalkit"], data, meta)
                atomic.write_text(out / f"{cname}.yaml", text)
                made[cname] = {"docs": len(docs), "output_type": "multiple_choice"}
            entry["lm_eval_tasks"].update(made)
        manifest["tasks"][spec.name] = entry
    atomic.write_json(out / "evalkit_export.json", manifest)
    return manifest


# -- `evalkit lm-eval-export` -------------------------------------------------------------------


def _unescape(text: str) -> str:
    out = text.encode("utf-8").decode("unicode_escape")
    if not out:
        raise argparse.ArgumentTypeError("a stop string cannot be empty")
    return out


def add_parser(sub) -> None:
    p = sub.add_parser("lm-eval-export",
                       help="write evalkit tasks as an lm-eval include path (YAML + jsonl data)")
    p.add_argument("--tasks", type=csv_list(str), required=True, help="comma-separated task names")
    p.add_argument("--tokenizer", required=True,
                   help="tokenizer folder or tokenizer.json of the model to evaluate "
                        "(lengths are in its tokens)")
    p.add_argument("--lengths", type=csv_list(int))
    p.add_argument("--depths", type=csv_list(float))
    p.add_argument("--loads", type=csv_list(int))
    p.add_argument("--samples", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--include", action="append", default=[], help="folder of task YAMLs")
    p.add_argument("--stop", action="append", type=_unescape,
                   help="a stop string (repeatable; escapes like \\n allowed); default: the "
                        "tasks' convention, newline and period")
    p.add_argument("--no-choice", action="store_true",
                   help="skip the forced-choice (multiple_choice) variants")
    p.add_argument("--out", required=True, help="folder to write (lm-eval --include_path)")
    p.set_defaults(func=run)


def run(args) -> int:
    manifest = export_tasks(args.tasks, args.out, tokenizer=args.tokenizer, lengths=args.lengths,
                            depths=args.depths, loads=args.loads, samples=args.samples,
                            seed=args.seed, include_paths=args.include, choice=not args.no_choice,
                            stop=args.stop)
    for task, entry in manifest["tasks"].items():
        for name, info in entry["lm_eval_tasks"].items():
            print(f"{name}: {info['docs']} docs ({info['output_type']})")
    print(f"include path: {Path(args.out).expanduser().resolve()}  "
          f"(lm_eval run --include_path ... --tasks evalkit_<task>)")
    return 0
