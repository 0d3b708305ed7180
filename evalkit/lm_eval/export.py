"""evalkit tasks as lm-eval tasks: an lm-eval include path (`evalkit lm-eval-export`).

    evalkit lm-eval-export --tasks needle,multikey --tokenizer PATH --lengths 512,1024 --out DIR
    lm_eval run --include_path DIR --tasks evalkit_needle --model evalkit --model_args name=oracle

For every task and length the folder gets (L = target length in the tokenizer's tokens):
- data/<task>_<L>.jsonl: one lm-eval doc per probe question: the prompt text (context up to the
  question, the question and the answer prefix), gold, candidates and the probe's coordinates
  (probe id/hash, length, depth, load, distance) so lm-eval's samples can be joined with evalkit's.
- evalkit_<task>_<L>.yaml: a generate_until task answered as evalkit's runner answers it: greedy,
  each question's own token budget (max_new_tokens) and stop strings -- set per doc by
  utils.EvalkitGenerateTask -- scored in process_results by every generation metric
  registered in evalkit.scoring that applies to the task's question kinds (so a needle task
  reports no mqar_accuracy, which applies to MQAR's queries only).
  Stop strings: `stop` if given (match the run's generation.stop), else a probe's own
  meta.extra "stop", else the built-in tasks' convention evalkit.render.ANSWER_STOP
  ("\\n", "."): every fact ends with "." right after its value.
- evalkit_<task>_choice_<L>.yaml (tasks whose questions carry candidates): the same prompts as
  lm-eval multiple_choice over " " + candidate, scored by the registered forced-choice metrics
  (evalkit's forced_choice counts ties as wrong, unlike lm-eval's acc).
- tags: evalkit_<task> (every length, generation and forced choice), evalkit_<task>_choice
  (forced choice only), and evalkit (everything), so `--tasks evalkit_needle` runs all
  exported lengths both ways, each reported as its own task.
- utils.py: a copy of evalkit/lm_eval/include/utils.py (the YAMLs' `!function`s).
- evalkit_export.json: what was exported (tokenizer hash, grid, task config hashes, counts,
  the metrics utils.py computes) and the sha256 of every file the export wrote.

The folder may exist: the export replaces only files a previous export wrote and that are
unchanged since (by the sha256 in its evalkit_export.json), and removes such files it no longer
writes. Any other file in the way is an error naming it, raised before anything is written.

Data are local JSON lines read by lm-eval through `dataset_path: json` with absolute
`data_files` paths (the datasets json builder resolves relative paths against the working
directory, not the YAML): moving the folder means exporting again.

Prompt text is what evalkit renders (render.py), joined into one string: lm-eval models tokenize
that string as a whole, so the token count can differ by a few tokens from evalkit's
piecewise rendering (which tokenizes each segment on its own); `prompt_tokens` records evalkit's.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from evalkit import atomic, scoring
from evalkit.digest import sha256_file
from evalkit.owned_folder import refuse_foreign

MANIFEST = "evalkit_export.json"
WRITTEN_BY = "evalkit lm-eval-export"
UTILS = Path(__file__).parent / "include" / "utils.py"


def default_stop() -> tuple[str, ...]:
    """The built-in tasks' stop convention (evalkit.render.ANSWER_STOP)."""
    from evalkit.render import ANSWER_STOP

    return tuple(ANSWER_STOP)


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


def metrics_for(kind: str, question_kinds: Sequence[str]) -> list[Any]:
    """The registered metrics of `kind` that apply to any of the questions' kinds (what
    utils.py computes for them)."""
    return [m for m in scoring.of_kind(kind) if any(m.applies_to(q) for q in question_kinds)]


def _metric_list(kind: str, question_kinds: Sequence[str]) -> list[dict]:
    return [{"metric": m.name, "aggregation": "mean", "higher_is_better": m.higher_is_better}
            for m in metrics_for(kind, question_kinds)]


def _gen_task_yaml(name: str, tags: list[str], data: Path, max_gen: int, until: list[str],
                   meta: dict, question_kinds: Sequence[str]) -> str:
    cfg = {
        "task": name, "tag": tags, "class": "__fn__",
        "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test", "output_type": "generate_until",
        "doc_to_text": "prompt", "doc_to_target": "{{gold[0]}}",
        "process_results": "__fn__",
        "metric_list": _metric_list(scoring.GENERATION, question_kinds),
        "generation_kwargs": {"until": until, "max_gen_toks": max_gen,
                              "do_sample": False, "temperature": 0.0},
        "repeats": 1, "num_fewshot": 0, "metadata": meta,
    }
    return _yaml_dump(cfg, ["process_results"]).replace(
        "class: __fn__", "class: !function utils.EvalkitGenerateTask")


def _choice_task_yaml(name: str, tags: list[str], data: Path, meta: dict,
                      question_kinds: Sequence[str]) -> str:
    cfg = {
        "task": name, "tag": tags,
        "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test", "output_type": "multiple_choice",
        "doc_to_text": "prompt", "doc_to_choice": "candidates", "doc_to_target": 0,
        "target_delimiter": " ",  # continuations are " " + value, as evalkit scores them
        "process_results": "__fn__",
        "metric_list": _metric_list(scoring.FORCED_CHOICE, question_kinds),
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


def _owned_files(out: Path) -> dict[str, set[str]]:
    """{relative path: accepted sha256s} of the files an export wrote into `out` ({} if none).
    Raises ValueError if evalkit_export.json is there but is not an export's manifest."""
    path = out / MANIFEST
    if not path.exists():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        manifest = None
    if not (isinstance(manifest, dict) and manifest.get("written_by") == WRITTEN_BY
            and isinstance(manifest.get("files"), dict)):
        raise ValueError(f"{path}: exists and was not written by evalkit (not a manifest of "
                         f"`{WRITTEN_BY}`); move it or choose another --out")
    owned: dict[str, set[str]] = {}
    # "pending": the hashes being replaced while an export writes (it may have stopped midway)
    for table in (manifest["files"], manifest.get("pending") or {}):
        for rel, sha in table.items():
            owned.setdefault(rel, set()).add(sha)
    return owned


def _check_out(out: Path, planned: Sequence[str]) -> dict[str, str]:
    """Refuse, naming the file, to touch a file in `out` that an export did not write as it
    is now. Returns {relative path: sha256} of the existing files the export will replace or
    remove (those of a previous export)."""
    owned = _owned_files(out)
    existing = {}
    for rel in dict.fromkeys([*planned, *owned]):
        path = out / rel
        if path.exists() or path.is_symlink():
            existing[rel] = sha256_file(path) if path.is_file() and not path.is_symlink() else ""

    def why_not_ours(path: Path) -> str | None:
        rel = path.relative_to(out).as_posix()
        if existing[rel] in owned.get(rel, ()):
            return None
        return "changed since evalkit wrote it" if rel in owned else f"not written by {WRITTEN_BY}"

    refuse_foreign((out / rel for rel in existing), why_not_ours, command=WRITTEN_BY,
                   flag="--out")
    return existing


def export_tasks(tasks: Sequence[str], out_dir: str | Path, *, tokenizer: Any,
                 lengths: Sequence[int] | None = None, depths: Sequence[float] | None = None,
                 loads: Sequence[int] | None = None, samples: int | None = None, seed: int = 0,
                 include_paths: Sequence[str | Path] = (), choice: bool = True,
                 stop: Sequence[str] | None = None) -> dict:
    """Write lm-eval task YAMLs, utils.py and jsonl data for `tasks` into `out_dir`.

    `tokenizer`: a tokenizer object or a path (folder or tokenizer.json); lengths are in its
    tokens. `stop`: stop strings for every question (default: see the module doc).
    Every probe is built before anything is written. Returns the manifest (also written to
    evalkit_export.json, last).
    """
    from evalkit.taskspec import discover, generate_probes, grid
    from evalkit.tokenization import load_tokenizer, tokenizer_hash

    if not tasks:
        raise ValueError("lm-eval export: name at least one task (see `evalkit tasks`)")
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
    reg = discover(include_paths)
    specs = [reg.get(t) for t in tasks]
    out = Path(out_dir).expanduser().resolve()
    files: dict[str, str] = {"utils.py": UTILS.read_text(encoding="utf-8")}
    manifest: dict[str, Any] = {
        "written_by": WRITTEN_BY, "tokenizer_hash": tokenizer_hash(tok), "seed": seed,
        "stop": list(stop) if stop else None,
        "metrics": {kind: [m.name for m in scoring.of_kind(kind)] for kind in scoring.KINDS},
        "tasks": {}}
    for spec in specs:
        points = grid(spec, lengths=lengths, depths=depths, loads=loads, samples=samples,
                      seed=seed)
        by_length: dict[int, list[dict]] = {}
        for point, probe in zip(points, generate_probes(spec, tok, points)):
            by_length.setdefault(point.length, []).extend(probe_docs(probe, tok, stop))
        entry = {"version": spec.version, "config_hash": spec.config_hash(), "lm_eval_tasks": {}}
        base = f"evalkit_{spec.name}".replace("-", "_").replace(".", "_")
        for length, docs in sorted(by_length.items()):
            data = f"data/{spec.name}_{length}.jsonl"
            files[data] = "".join(json.dumps(d, sort_keys=True, ensure_ascii=False) + "\n"
                                  for d in docs)
            meta = {"version": _version_number(spec.version), "evalkit_task": spec.name,
                    "evalkit_task_version": spec.version,
                    "evalkit_config_hash": spec.config_hash(), "target_length": length,
                    "tokenizer_hash": manifest["tokenizer_hash"], "seed": seed}
            name = f"{base}_{length}"
            max_gen = max(d["max_new_tokens"] for d in docs)
            kinds = sorted({d["kind"] for d in docs})
            files[f"{name}.yaml"] = _gen_task_yaml(name, [base, "evalkit"], out / data, max_gen,
                                                   docs[0]["stop"], meta, kinds)
            entry["lm_eval_tasks"][name] = {"docs": len(docs), "output_type": "generate_until"}
            if choice and all(len(d["candidates"]) >= 2 for d in docs):
                cname = f"{base}_choice_{length}"
                files[f"{cname}.yaml"] = _choice_task_yaml(
                    cname, [base, f"{base}_choice", "evalkit"], out / data, meta, kinds)
                entry["lm_eval_tasks"][cname] = {"docs": len(docs),
                                                 "output_type": "multiple_choice"}
        manifest["tasks"][spec.name] = entry
    existing = _check_out(out, list(files))
    new = {rel: hashlib.sha256(text.encode("utf-8")).hexdigest() for rel, text in files.items()}
    stale = {rel: sha for rel, sha in existing.items() if rel not in files}
    # The manifest goes first, so a stopped export still owns every file it has written.
    atomic.write_json(out / MANIFEST, {**manifest, "files": {**stale, **new},
                                       "pending": {r: existing[r] for r in files if r in existing}})
    for rel, text in files.items():
        atomic.write_text(out / rel, text)
    for rel in stale:
        (out / rel).unlink()
    manifest["files"] = new
    atomic.write_json(out / MANIFEST, manifest)
    return manifest
