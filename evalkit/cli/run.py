"""`evalkit run`: evaluate models on tasks and write a run directory.

    evalkit run --config configs/quick.yaml
    evalkit run --models oracle,forgetful --tasks "needle*,multikey" --lengths 512,1024 \\
                --depths 0.1,0.5,0.9 --samples 4 --output runs/try1
    evalkit run --resume runs/try1            # continue a killed or interrupted run
    evalkit run --config configs/quick.yaml --output runs/quick --resume   # start or continue
    torchrun --nproc-per-node 4 -m evalkit run --config configs/standard.yaml

--resume reuses the cache: finished samples are not recomputed (failed ones are retried) and
the results equal an uninterrupted run's; a run directory that does not exist yet is started.
`--resume DIR` alone reuses DIR/config.json; with a config or flags, their config hash must
match the run's.

Flags override the config file's keys (grid flags beat per-task overrides); --tasks and
--models replace the config's lists; a --models name the config's `models:` list declares
keeps its declared spec and options (`--config configs/standard-twins.yaml --models
smollm2-135m-gdn-w64-s4-state-off` runs that one row). --tasks takes names, globs ("needle*")
and groups ("all", or a suite's `groups:`). The sample cache lives in RUN_DIR/cache unless --cache-dir names a
store shared between runs (safe: entries are keyed by model identity, probe and settings).
--log-samples also writes probes.jsonl (every probe, so any prompt can be re-rendered);
samples.jsonl is always written.

Exit status: 0 when every sample was evaluated (an over-length prompt, or a fact inside a
model's attention sinks, is flagged, not failed);
1 when any sample failed (each failure is in samples.jsonl with its error; the rest of the run
is complete) or an lm-eval task failed on a model (one line each; the other pairs are scored),
or when the system failed mid-run (a full disk: one line naming the file; the run directory is
resumable); 2 for bad input (nothing is run, and a new run directory is removed
again); 130 when interrupted (Ctrl-C or SIGTERM: the
run directory is resumable with --resume).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import yaml

from evalkit.cli import csv_list
from evalkit.runner import rundir
from evalkit.runner.suite import SuiteConfig, SuiteError, load_suite, override, resolve, validate


def _model_args(text: str) -> dict:
    """`k=v,k2=v2`; values are read as YAML scalars (ints, floats, booleans, strings)."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"expected key=value pairs, got {part!r}")
        out[key.strip()] = yaml.safe_load(value) if value else ""
    return out


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="evaluate models on tasks; write runs/<run-id>/",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="suite YAML (e.g. configs/quick.yaml)")
    p.add_argument("--models", type=csv_list(str), help="comma-separated model names, NAME:PATH or paths")
    p.add_argument("--model-args", type=_model_args, help="k=v,... load options for --models")
    p.add_argument("--tasks", type=csv_list(str), help="comma-separated task names, globs or groups")
    p.add_argument("--include", action="append", help="folder of task YAMLs (repeatable)")
    p.add_argument("--plugins", action="append",
                   help="Python file or module registering models (repeatable)")
    p.add_argument("--lengths", type=csv_list(int), help="target prompt lengths, model tokens")
    p.add_argument("--depths", type=csv_list(float), help="fact depths in [0, 1]")
    p.add_argument("--loads", type=csv_list(int), help="facts per probe")
    p.add_argument("--samples", type=int, help="probes per grid cell")
    p.add_argument("--limit", type=float, help="at most N probes per task (a fraction if < 1)")
    p.add_argument("--seed", type=int)
    p.add_argument("--batch-size", type=int, help="prefills per batch (bucketed by length)")
    p.add_argument("--threads", type=int,
                   help="torch CPU threads per process (1 is often fastest on busy cores)")
    p.add_argument("--output", help="the run directory (default: RUNS_DIR/<UTC time>-<config hash>)")
    p.add_argument("--runs-dir", default="runs", help="where default run directories go")
    p.add_argument("--log-samples", action="store_true", default=None,
                   help="also write probes.jsonl")
    p.add_argument("--resume", nargs="?", const=True, metavar="RUN_DIR",
                   help="continue a run (RUN_DIR, or the --output directory)")
    p.add_argument("--cache-dir", help="shared sample cache (default: RUN_DIR/cache)")
    p.add_argument("--lm-eval-tasks", type=csv_list(str), help="lm-eval task names to run as well")
    p.add_argument("--arrivals", metavar="poisson:RATE|trace:FILE",
                   help="an open-loop load on a served model: each request is sent when it is "
                        "due (RATE requests per second, seeded; or offsets in seconds, one per "
                        "line), whatever is in flight, and its response time runs from then; "
                        "without it, `concurrency` requests are kept in flight (closed loop)")
    p.add_argument("--shard", metavar="I/N",
                   help="run only the I-th of N disjoint parts of the suite's plan (one per "
                        "machine); `evalkit publish` merges the N run folders")
    p.add_argument("--allow-downloads", action="store_true",
                   help="let Hugging Face libraries download (models, tokenizers, lm-eval "
                        "data); by default the run is offline and uses local files only")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def _absolute_paths(paths: list[str] | None) -> list[str]:
    return [str(Path(p).expanduser().resolve()) if Path(p).expanduser().exists() or p.endswith(".py")
            else p for p in paths or []]


def _absolute_trace(text: str | None) -> str | None:
    if text and text.startswith("trace:"):
        return "trace:" + str(Path(text[6:]).expanduser().resolve())
    return text


def build_suite(args) -> tuple[SuiteConfig, str, str | None]:
    """(suite, its source label, the run directory to resume or None)."""
    resume_dir = None
    if args.resume is True:
        if not args.output:
            raise SuiteError("--resume needs the run directory: --resume RUN_DIR, or --output RUN_DIR")
        resume_dir = args.output
    elif args.resume:
        if args.output and Path(args.output).resolve() != Path(args.resume).resolve():
            raise SuiteError(f"--resume {args.resume} and --output {args.output} name different "
                             f"run directories")
        resume_dir = args.resume

    if resume_dir and not (args.config or args.models or args.tasks):
        doc = rundir.stored_config(Path(resume_dir))  # resume reuses the stored config
        where = str(Path(resume_dir) / rundir.CONFIG)
        suite, source = validate(doc.get("suite"), where), doc.get("source") or where
    elif args.config:
        suite, source = load_suite(args.config), args.config
    else:
        suite, source = SuiteConfig(), "command line"

    if args.model_args and not args.models:
        raise SuiteError("--model-args applies to --models; give the models too "
                         "(or put options in the config's models list)")
    changes = {
        "models": _chosen_models(suite, source, args.models, args.model_args)
        if args.models else None,
        "tasks": [{"name": t} for t in args.tasks] if args.tasks else None,
        "include": list(suite.include) + _absolute_paths(args.include) if args.include else None,
        "plugins": list(suite.plugins) + _absolute_paths(args.plugins) if args.plugins else None,
        "lengths": args.lengths, "depths": args.depths, "loads": args.loads,
        "samples": args.samples, "limit": args.limit, "seed": args.seed,
        "batch_size": args.batch_size, "threads": args.threads, "log_samples": args.log_samples,
        "cache_dir": str(Path(args.cache_dir).resolve()) if args.cache_dir else None,
        "lm_eval_tasks": args.lm_eval_tasks,
        "arrivals": _absolute_trace(args.arrivals),
    }
    if any(v is not None for v in changes.values()):
        suite = override(suite, "command line", **changes)
    return suite, source, resume_dir


def _chosen_models(suite: SuiteConfig, source: str, names: list[str],
                   model_args: dict | None) -> list[dict]:
    """--models' entries. A name the suite's `models:` list declares picks that entry as
    declared (its spec and options: `--models NAME-state-off` runs that row alone, e.g. one
    run folder per model); any other name is loaded as given, with --model-args."""
    declared = {m.name: m for m in suite.models}
    entries = []
    for name in names:
        if name in declared:
            if model_args:
                raise SuiteError(f"--models {name}: {source} declares this model with its own "
                                 f"options; drop --model-args, or declare another name in the "
                                 f"config's models list")
            entries.append(declared[name].model_dump())
        else:
            _not_a_row_typo(name, declared, source)
            entries.append({"name": name, "options": model_args or {}})
    return entries


def _not_a_row_typo(name: str, declared: dict, source: str) -> None:
    """A name close to one of the suite's rows that is no model either: say which row."""
    import difflib

    from evalkit.model_adapters.models import model_names

    close = difflib.get_close_matches(name, list(declared), n=1)
    if close and name not in model_names() and ":" not in name and not Path(name).exists():
        raise SuiteError(f"--models {name}: no such row in {source} and no such model; did "
                         f"you mean its row {close[0]!r}?")


def _say_in_sinks(results: dict) -> None:
    """Name the models and S behind samples flagged in_sinks (one line, on stderr)."""
    from evalkit.runner.execute import IN_SINKS

    n = ((results.get("summary") or {}).get("flags") or {}).get(IN_SINKS, 0)
    if not n:
        return
    sinks = {m: d.get("sinks") for m, d in (results.get("models") or {}).items()
             if isinstance(d, dict) and d.get("sinks")}
    which = ", ".join(f"{m}'s first {s} tokens" for m, s in sorted(sinks.items()))
    print(f"evalkit run: {n} samples flagged {IN_SINKS}, not evaluated: the asked fact starts "
          f"inside the attention sinks ({which}, kept exact), where recalling it would not "
          f"measure the state; larger depths or lengths avoid them", file=sys.stderr)


def _say_unanswered(results: dict) -> None:
    """Name the tasks on which every model's generated answers scored 0 (evalkit.unanswered)."""
    from evalkit.unanswered import NOTE, unanswered_tasks

    for task, metric in unanswered_tasks(results.get("rows") or []).items():
        print(f"evalkit run: nothing answered {task} by generation (every model's {metric} is "
              f"0.00): {NOTE}", file=sys.stderr)


def _shard(args, resume_dir: str | None):
    """--shard I/N; a resume without it keeps the shard its config.json records."""
    from evalkit.runner import shard

    try:
        if args.shard is not None:
            return shard.parse(args.shard)
        if resume_dir and (Path(resume_dir) / rundir.CONFIG).is_file():
            where = str(Path(resume_dir) / rundir.CONFIG)
            return shard.from_dict(rundir.stored_config(Path(resume_dir)).get("shard"), where)
    except ValueError as e:
        raise SuiteError(str(e)) from None
    return shard.WHOLE


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


@contextmanager
def _offline(on: bool) -> Iterator[None]:
    """The Hugging Face libraries' offline switches on for the command, restored after (an
    in-process caller keeps its own). huggingface_hub and datasets read them when imported,
    so a copy already imported (a caller's) is switched too."""
    if not on:
        yield
        return
    before = {k: os.environ.get(k) for k in OFFLINE}
    mods = [(sys.modules.get(m), names) for m, names in (
        ("huggingface_hub.constants", ("HF_HUB_OFFLINE",)),
        ("datasets.config", ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")))]
    saved = [(m, n, getattr(m, n)) for m, names in mods if m is not None for n in names
             if hasattr(m, n)]
    os.environ.update({k: "1" for k in OFFLINE})
    for m, n, _ in saved:
        setattr(m, n, True)
    try:
        yield
    finally:
        for k, v in before.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        for m, n, v in saved:
            setattr(m, n, v)


def run(args) -> int:
    with _offline(not args.allow_downloads):  # from the first model lookup on
        return _run(args)


def _run(args) -> int:
    from evalkit.runner.aggregate import prefill_line
    from evalkit.runner.concurrent import MAX_OPEN
    from evalkit.runner.run import run_suite

    suite, source, resume_dir = build_suite(args)
    resolved = resolve(suite, source)
    part = _shard(args, resume_dir)
    # SIGTERM (kill, a batch scheduler, torchrun) stops the run the way Ctrl-C does.
    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTERM, _raise_interrupt)
    from evalkit.lm_eval.quiet import no_bars

    try:  # --no-progress: no bar at all, the libraries' too (transformers' weight loading)
        with no_bars(args.no_progress):
            out = run_suite(resolved, output=resume_dir or args.output,
                            resume=resume_dir is not None, runs_root=args.runs_dir,
                            progress=not args.no_progress, argv=sys.argv, shard=part)
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    if out.rank != 0:
        return 0
    if out.interrupted:
        print(f"evalkit run: interrupted; {out.computed} new samples are saved in the cache. "
              f"Resume with: evalkit run --resume {out.run_dir}", file=sys.stderr)
        return 130
    lm = (out.results or {}).get("lm_eval") or {}
    if resolved.tasks or not lm:  # an lm-eval-only run has no evalkit samples to count
        print(f"evalkit run: {out.samples} samples: {out.samples - out.failed - out.flagged} "
              f"scored, {out.failed} failed, {out.flagged} flagged ({out.cached} from cache, "
              f"{out.computed} evaluated) in {out.wall_s:.1f}s")
        print(f"evalkit run: {prefill_line(out.prefill)}")
    else:
        print(f"evalkit run: lm-eval tasks only, in {out.wall_s:.1f}s")
    if lm:
        print(f"evalkit run: lm-eval: {len(lm['pairs']) - lm['failed']} of {len(lm['pairs'])} "
              f"(model, task) pairs scored ({lm['reused']} read back from an earlier "
              f"invocation); results in {out.run_dir}/lm_eval/ "
              f"(and under 'lm_eval' in results.json)")
        if lm.get("board"):  # evalkit.lm_eval.rows: what `evalkit publish` puts on the board
            print(f"evalkit run: lm-eval: {lm['board']['rows']} documents with their answers "
                  f"and scores in {out.run_dir}/{lm['board']['samples']}, published beside "
                  f"the other tasks by `evalkit publish {out.run_dir} --to DIR`")
        for line in lm["problems"]:  # failed pairs, documents left out for an empty gold list
            print(f"evalkit run: {line}", file=sys.stderr)
    print(f"evalkit run: wrote {out.run_dir}/results.json and samples.jsonl")
    _say_in_sinks(out.results or {})
    _say_unanswered(out.results or {})
    if part.count > 1:
        print(f"evalkit run: this is shard {part} of config {resolved.config_hash[:12]}: "
              f"publish it with the other {part.count - 1} (`evalkit publish DIR...`)")
    if out.capped:
        print(f"evalkit run: {out.capped} requests were sent late, waiting for the cap of "
              f"{MAX_OPEN} open requests (their queue_s): the load was not fully open",
              file=sys.stderr)
    if out.failed:
        text, n = out.top_error or ("", 0)
        common = f"{n} of them: {text[:300]}; " if n else ""
        print(f"evalkit run: {out.failed} samples failed ({common}see 'error' in "
              f"samples.jsonl); exit status 1", file=sys.stderr)
    if lm.get("failed"):
        print(f"evalkit run: {lm['failed']} lm-eval task(s) failed (above); `evalkit run "
              f"--resume {out.run_dir}` retries only those; exit status 1", file=sys.stderr)
    return 1 if out.failed or lm.get("failed") else 0
