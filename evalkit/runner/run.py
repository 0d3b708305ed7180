"""The run loop: for each model, for each task, generate probes, plan, execute, record.

    probes (per tokenizer) -> items (one per question) -> over-length, fact in sinks? flag : plan
    plan units (this --shard's part), sharded over ranks -> cached? reuse : execute -> cache
      (a served model under --arrivals: every task's requests in one schedule over the
      model's whole plan, each sent at its due time; evalkit.runner.arrivals)
    -> gather on rank 0
    rank 0: sort samples in suite order -> aggregate -> write the run directory, DONE last

A KeyboardInterrupt (Ctrl-C, or SIGTERM via evalkit run) stops the loop between two samples
(a served model's open requests are aborted, evalkit.runner.concurrent): every finished
sample is already in the cache, so `--resume` continues where it stopped and
ends with the same results.json as an uninterrupted run.
"""
from __future__ import annotations

import gc
from collections import Counter
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from evalkit import __version__
from evalkit.model_adapters.protocol import check_identity
from evalkit.probe import Probe
from evalkit.render import Rendered, render
from evalkit.result import SampleResult
from evalkit.runner import aggregate, distributed, provenance, rundir
from evalkit.runner import arrivals as loads
from evalkit.runner import shard as shards
from evalkit.runner.cache import CacheError, SampleCache
from evalkit.runner.concurrent import MAX_OPEN, execute_concurrent
from evalkit.runner.execute import ModelRun, base_sample, execute, failed, in_sinks
from evalkit.runner.plan import Request, build_plan
from evalkit.runner.model_identity import check_distinct_models, check_same_as_before, model_hash
from evalkit.runner.scheduled import run_scheduled
from evalkit.runner.suite import (ResolvedModel, ResolvedSuite, ResolvedTask, SuiteConfig,
                                  SuiteError)
from evalkit.runner.plugins import plugin_modules
from evalkit.user_modules import code_of, owned_imports
from evalkit.taskspec import generate_probes
from evalkit.tokenization import tokenizer_hash


@dataclass
class RunOutcome:
    run_dir: Path
    rank: int = 0
    results: dict | None = None      # rank 0 of a finished run only
    samples: int = 0
    failed: int = 0
    flagged: int = 0
    cached: int = 0                  # reused from the cache in this invocation (all ranks)
    computed: int = 0                # evaluated in this invocation (all ranks)
    interrupted: bool = False
    wall_s: float = 0.0
    prefill: dict = field(default_factory=dict)
    top_error: tuple[str, int] | None = None  # the most common sample error and its count
    capped: int = 0                  # requests sent late for the cap on open requests


def _generation_key(run: ModelRun, schedule: dict | None = None) -> dict:
    """How a sample was asked for: decoding, and the load it was answered under (a closed
    loop's label, exact: closed:C; an open loop's whole schedule, `schedule`)."""
    key = {"stop": list(run.stop), "max_new_tokens": run.max_new_tokens, "decoding": "greedy",
           "forced_choice": "sum-logprob, ' ' + candidate" if run.forced_choice else "off"}
    if run.arrivals is not None:  # a sample answered under load is not an unloaded one
        key["arrivals"] = schedule if schedule is not None else run.arrivals
    return key


class _Session:
    """State of one invocation on one rank."""

    def __init__(self, resolved: ResolvedSuite, path: Path, cache: SampleCache,
                 dist: distributed.Dist, progress: bool, lm_eval_tasks: Any = None,
                 shard: shards.Shard = shards.WHOLE, earlier: dict | None = None) -> None:
        self.resolved, self.path, self.cache, self.dist = resolved, path, cache, dist
        self.shard = shard
        # a resumed run's models as they loaded before: a model whose identity changed since
        # (other weights, another served model) is refused, not silently evaluated afresh
        self.earlier_models: dict[str, dict] = dict((earlier or {}).get("models") or {})
        self.on_model: Any = None  # called with the models loaded so far (the start record)
        self.lm_eval_tasks = lm_eval_tasks                # LmEvalTasks on rank 0 when asked for
        self.progress = progress and dist.is_main
        self.samples: list[tuple[tuple, dict]] = []   # (sort key, SampleResult dict)
        self.models: dict[str, dict] = {}
        self.pairs: list[dict] = []                   # prefill stats per model x task
        self.probes: dict[str, dict] = {}             # hash -> probe dict (--log-samples)
        self._probe_memo: dict[tuple[str, str], list[Probe]] = {}
        self.maxima: dict[str, int | None] = {}
        # the user modules each model's samples depend on (the cache key's code): the suite's
        # plugins, its tasks' generators, the model's factory (evalkit.user_modules)
        self.run_owners = plugin_modules(resolved.suite.plugins) + sorted(
            {t.spec.generator.__module__ for t in resolved.tasks})
        self.owners: dict[str, list[str]] = {}
        self.cached = self.computed = self.tokens_run = 0

    # -- models ---------------------------------------------------------------------------
    def run_model(self, mi: int, m: ResolvedModel) -> None:
        import torch

        from evalkit.model_adapters.models import load_model

        from evalkit.model_adapters.models import resolve_spec

        factory = resolve_spec(m.spec)[0].factory.__module__
        self.owners[m.name] = self.run_owners + [factory]
        try:
            with owned_imports(factory):  # a plugin's model may import more as it loads
                adapter = load_model(m.spec, **m.options)
        except (TypeError, ValueError) as e:  # unknown or bad options: the user's input
            raise SuiteError(f"{self.resolved.source}: model {m.name!r} ({m.spec}): "
                             f"{e}") from e
        identity = provenance.jsonable(check_identity(dict(adapter.identity()), m.spec))
        mhash = model_hash(m.spec, identity, m.options)
        # the adapter's kind, measured from its cache at load (hf adapters), never the
        # registry's static state_kind; each sample then records its own measured state
        kind = str(adapter.state_kind)
        check_same_as_before(self.earlier_models, self.path, m, identity, mhash)
        same = [n for n, d in self.models.items() if d["hash"] == mhash]
        if same:
            raise SuiteError(f"{self.resolved.source}: models {same[0]!r} and {m.name!r} are the "
                             f"same model (identical identity and options); list it once")
        self._check_lengths(mi, m.name, adapter.max_length)
        self.models[m.name] = {**identity, "hash": mhash, "spec": m.spec,
                               "options": provenance.jsonable(m.options), "state_kind": kind,
                               "max_length": adapter.max_length,
                               "trained_length": adapter.trained_length,
                               **({"published": m.published} if m.published else {}),
                               **({} if m.forced_choice else {"forced_choice": False})}
        if self.on_model is not None:
            self.on_model({**self.earlier_models, **self.models})
        gen = self.resolved.suite.generation
        arrivals = self.resolved.arrivals if m.served else None  # in-process: unloaded
        load = (arrivals.label if arrivals is not None else loads.closed(adapter.serving.concurrency)
                ) if m.served else None
        run = ModelRun(adapter, m.name, mhash, kind, tuple(gen.stop), gen.max_new_tokens, load,
                       m.forced_choice)
        torch.manual_seed(self.resolved.suite.seed)
        for task in self.resolved.tasks:  # every grid problem surfaces before any evaluation
            self.probes_for(task, adapter.tokenizer)
        if arrivals is not None:  # one schedule over every task: planned first, then sent
            run_scheduled(self, run, arrivals, [self.plan_pair(run, mi, ti, task, None)
                                                for ti, task in enumerate(self.resolved.tasks)])
        else:
            material = self.material(run)
            for ti, task in enumerate(self.resolved.tasks):
                todo, _ = self.plan_pair(run, mi, ti, task, material)
                self.run_items(run, todo, f"{run.name} | {task.name}", material)
        del run, adapter
        gc.collect()

    def user_code(self) -> list[str]:
        """The user modules the run's samples depend on, by content (provenance.json)."""
        return code_of(set(self.run_owners).union(*self.owners.values()))

    def material(self, run: ModelRun, schedule: dict | None = None) -> dict:
        """The cache key material every sample of `run` shares (SampleCache.key). The code is
        read now, after the model loaded: a plugin may import more as it builds its model."""
        return {"model_hash": run.model_hash, "code": provenance.code_key(self.owners[run.name]),
                "generation": _generation_key(run, schedule)}

    def _check_lengths(self, mi: int, name: str, max_len: int | None) -> None:
        """Refuse a target length beyond every model's maximum before building its probes
        (such probes would all be flagged, after costing time and memory to make). Maxima are
        known as models load, so with several models the check runs at the last one."""
        self.maxima[name] = max_len
        if mi != len(self.resolved.models) - 1 or None in self.maxima.values():
            return
        longest = max(self.maxima.values())
        for task in self.resolved.tasks:
            for L in task.lengths:
                if L > longest:
                    limits = ", ".join(f"{n} max_length {v}" for n, v in self.maxima.items())
                    raise SuiteError(f"{self.resolved.source}: task {task.name!r}: length {L} is "
                                     f"beyond every model's maximum ({limits}); choose lengths "
                                     f"up to {longest}")

    def probes_for(self, task: ResolvedTask, tokenizer: Any) -> list[Probe]:
        """The task's probes for this tokenizer (lengths are in its tokens), made once."""
        key = (task.name, tokenizer_hash(tokenizer))
        if key not in self._probe_memo:
            # generate_probes checks every probe and that no two are alike; its errors name
            # the task, the generator and the grid point.
            self._probe_memo[key] = list(generate_probes(task.spec, tokenizer, task.points))
        return self._probe_memo[key]

    # -- one model x task -------------------------------------------------------------------
    def plan_pair(self, run: ModelRun, mi: int, ti: int, task: ResolvedTask,
                  material: dict | None) -> tuple[list[Request], list[Request]]:
        """(the requests to answer here: this shard's and rank's, not cached; every request of
        the pair's whole plan, what a load's schedule covers). Records flagged and cached ones.
        `material`: the cache key material, None for an open loop (whose samples are reused
        only as a whole schedule: run_scheduled looks them up)."""
        adapter, dist = run.adapter, self.dist
        max_len = adapter.max_length
        sinks = int(self.models[run.name].get("sinks") or 0)  # tokens kept exact at the start
        probes = self.probes_for(task, adapter.tokenizer)
        direct: list[tuple[tuple, SampleResult]] = []  # settled without running the model
        items: list[Request] = []
        for pi, probe in enumerate(probes):
            if self.resolved.suite.log_samples:
                self.probes.setdefault(probe.hash, probe.to_dict())
            try:
                rendered = render(probe, adapter.tokenizer)
            except Exception as e:  # e.g. a chat template that cannot stream turns
                empty = Rendered((), tuple(() for _ in probe.questions))
                direct += [((mi, ti, pi, qi), failed(run, Request(probe, qi, empty), e))
                           for qi in range(len(probe.questions))]
                continue
            for qi in range(len(probe.questions)):
                item = Request(probe, qi, rendered, (mi, ti, pi, qi))
                if max_len is not None and item.prompt_tokens > max_len:
                    s = base_sample(run, item)
                    s.flag = "over_length"  # never cut: a cut prompt measures something else
                    direct.append((item.order, s))
                elif probe.questions[qi].fact_token < sinks:  # recalled from the sinks, not the state
                    direct.append((item.order, in_sinks(run, item)))
                else:
                    items.append(item)

        full = build_plan(items)  # the same on every rank: global prefill statistics
        if self.shard.count > 1:  # this shard's part (a shared prefix never straddles two)
            full = build_plan([it for u in self.shard.take(full.units) for it in u.items()])
        self.pairs.append({"model": run.name, "task": task.name, "served": run.served,
                           "tokens_prefilled": None if run.served else full.tokens_prefilled,
                           "prompt_tokens": full.prompt_tokens, "questions": full.n_items})
        for order, s in dist.shard(self.shard.take(direct)):
            self.samples.append((order, s.to_dict()))

        todo: list[Request] = []
        for unit in dist.shard(full.units):
            for item in unit.items():
                hit = None if material is None else self.cache.get(
                    self.cache.key(material, item.probe.hash, item.qi))
                if hit is None:
                    todo.append(item)
                else:
                    hit.model = run.name  # the same model may be named differently elsewhere
                    self.samples.append((item.order, hit.to_dict()))
                    self.cached += 1
        return sorted(todo, key=lambda it: it.order), items

    def run_items(self, run: ModelRun, todo: list[Request], desc: str, material: dict,
                  due: list[float] | None = None) -> None:
        """Answer `todo`, caching each sample as it ends. `due`: an open loop's due times;
        else a served model keeps `concurrency` requests in flight (a closed loop) and an
        in-process one runs the plan with its shared prefixes."""
        if not todo:
            return
        plan = build_plan(todo)
        self.tokens_run += 0 if run.served else plan.tokens_prefilled  # served: as sent
        order = {(it.probe.task, it.probe.hash, it.qi): it.order for it in todo}
        bar = _bar(len(todo), desc, self.progress)

        def emit(s: SampleResult) -> None:
            self.cache.put(self.cache.key(material, s.probe_hash, s.question), s)
            self.samples.append((order[(s.task, s.probe_hash, s.question)], s.to_dict()))
            self.computed += 1
            self.tokens_run += s.tokens_sent or 0
            bar.update(1)
            if s.error is not None and not bar.disable:
                bar.write(f"evalkit run: sample {s.probe_id} q{s.question} failed: {s.error}")

        try:
            if due is not None:
                execute_concurrent(run, todo, emit, MAX_OPEN, due)
            elif run.served:
                execute_concurrent(run, list(plan.items()), emit,
                                   run.adapter.serving.concurrency)
            else:
                execute(run, plan, emit, batch_size=self.resolved.suite.batch_size)
        finally:
            bar.close()


@contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """torch's CPU thread count set to `n` for the evaluation, restored after (a library call
    must not change its caller's process)."""
    if not n:
        yield
        return
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="q", file=sys.stderr, dynamic_ncols=True,
                mininterval=0.5, disable=not enabled)


def _task_info(resolved: ResolvedSuite) -> dict[str, dict]:
    return {t.name: {"version": t.spec.version, "config_hash": t.spec.config_hash(),
                     "source": t.spec.shown_source,
                     "grid": {"lengths": list(t.lengths), "depths": list(t.depths),
                              "loads": list(t.loads), "samples": t.samples,
                              "probes": len(t.points)}}
            for t in resolved.tasks}


def _run_lm_eval(resolved: ResolvedSuite, tasks: Any, path: Path, progress: bool) -> dict:
    from evalkit.lm_eval.run import run_lm_eval_tasks

    suite = resolved.suite
    return provenance.jsonable(run_lm_eval_tasks(
        [m.spec for m in resolved.models], tasks,
        output_dir=path / "lm_eval", limit=suite.limit, seed=suite.seed,
        log_samples=suite.log_samples,
        model_options={m.spec: m.options for m in resolved.models},
        # RULER-style tasks size their data from these: the suite's lengths.
        max_seq_lengths=list(suite.lengths) if suite.lengths else None, progress=progress))


def run_suite(resolved: ResolvedSuite, *, output: str | Path | None = None, resume: bool = False,
              runs_root: str | Path = "runs", progress: bool = True,
              argv: list[str] | None = None, shard: shards.Shard = shards.WHOLE) -> RunOutcome:
    """Run (or resume) `resolved` into a run directory. Under torchrun, every rank calls this;
    rank 0 writes. `shard`: only that part of the plan (evalkit.runner.shard). Raises
    ValueError subclasses for bad input before any work is done."""
    dist = distributed.setup()
    t0, started = time.perf_counter(), provenance.utc_now()
    suite = resolved.suite

    check_distinct_models(resolved)
    if shard.count > 1 and suite.lm_eval_tasks:
        raise SuiteError(f"--shard {shard}: lm-eval tasks are not split into shards; run "
                         f"--lm-eval-tasks in a run without --shard")
    lm_eval_tasks = None
    if suite.lm_eval_tasks and dist.is_main:
        from evalkit.lm_eval.run import LmEvalTasks  # lazy: lm-eval is heavy to import

        try:  # checked before any work; the same index serves the evaluation at the end
            lm_eval_tasks = LmEvalTasks(suite.lm_eval_tasks)
        except ValueError as e:
            raise SuiteError(f"--lm-eval-tasks: {e}") from e

    document = {**resolved.document(), **({"shard": shard.as_dict()} if shard.count > 1 else {})}
    path, earlier, done, prep = _open_folder(resolved, document, output, runs_root, resume, dist)
    session = _Session(resolved, path, _cache(suite, path), dist, progress, lm_eval_tasks,
                       shard, earlier)
    try:
        outcome = _run(session, earlier, done, argv, t0, started)
    except BaseException:
        if prep is not None:
            prep.close_failed(evaluated=session.computed > 0)
        raise
    if prep is not None:
        prep.release()
    return outcome


def _cache(suite: SuiteConfig, path: Path) -> SampleCache:
    return SampleCache(Path(suite.cache_dir) if suite.cache_dir else path / rundir.CACHE)


def _open_folder(resolved: ResolvedSuite, document: dict, output: str | Path | None,
                 runs_root: str | Path, resume: bool, dist: distributed.Dist
                 ) -> tuple[Path, dict | None, bool, rundir.RunFolder | None]:
    """Rank 0 creates (or checks) and locks the run directory and its cache; every rank learns
    the outcome, a refusal as the same exception, so it ends all ranks instead of leaving them
    waiting in a collective. Returns (path, the earlier run's start record, done, rank 0's
    lock or None)."""
    got: Any = None
    prep: rundir.RunFolder | None = None
    if dist.is_main:
        made = None
        try:
            if output:
                path = Path(output)
            else:
                path = made = rundir.new_run_dir(Path(runs_root), resolved.config_hash)
            prep = rundir.prepare(path, document, resume=resume, created=made is not None)
            _cache(resolved.suite, path)  # a cache that cannot be used is refused here
            got = (str(path), prep.earlier, prep.done)
        except (rundir.RunDirError, CacheError) as e:
            if prep is not None:
                prep.close_failed(evaluated=False)
            elif made is not None:
                made.rmdir()
            got = e
    got = dist.broadcast(got)
    if isinstance(got, BaseException):
        raise got
    path_s, earlier, done = got
    return Path(path_s), earlier, done, prep


def _run(session: _Session, earlier: dict | None, done: bool, argv: list[str] | None,
         t0: float, started: str) -> RunOutcome:
    resolved, path, cache, dist = session.resolved, session.path, session.cache, session.dist
    suite = resolved.suite
    first_start = (earlier or {}).get("started") or started
    resumed = list((earlier or {}).get("resumed", [])) + ([started] if earlier is not None else [])
    tasks = _task_info(resolved)
    def record_start(models: dict) -> None:
        rundir.write_start(path, provenance.collect(
            config_hash=resolved.config_hash, seed=suite.seed, models=models, tasks=tasks,
            started=first_start, resumed=resumed, user_code=session.user_code()))

    if dist.is_main and not done:  # a finished run's provenance stays until it is rewritten
        record_start(dict(session.earlier_models))
        session.on_model = record_start  # each model's identity as it loads: checked on resume

    outcome = RunOutcome(path, rank=dist.rank)
    try:
        with _torch_threads(suite.threads):
            for mi, m in enumerate(resolved.models):
                session.run_model(mi, m)
    except KeyboardInterrupt:
        outcome.interrupted = True

    def execution_record(extra: dict) -> dict:
        return {"started": started, "finished": provenance.utc_now(), "argv": argv,
                "world_size": dist.world, "wall_s": time.perf_counter() - t0, **extra}

    if outcome.interrupted:
        outcome.computed, outcome.cached = session.computed, session.cached
        outcome.wall_s = time.perf_counter() - t0
        if dist.is_main:
            rundir.append_execution(path, execution_record(
                {"interrupted": True, "rank0_computed": session.computed,
                 "rank0_cached": session.cached, "cache": cache.stats()}))
        return outcome

    gathered = dist.gather({"samples": session.samples, "cached": session.cached,
                            "computed": session.computed, "tokens_run": session.tokens_run,
                            "cache": cache.stats()})
    outcome.wall_s = time.perf_counter() - t0
    if not dist.is_main:
        distributed.teardown(dist)
        return outcome

    rows = sorted((row for part in gathered for row in part["samples"]), key=lambda r: r[0])
    samples = [SampleResult.from_dict(d) for _, d in rows]
    prefill = aggregate.prefill_block(session.pairs, samples)
    finished = provenance.utc_now()
    prov = provenance.collect(config_hash=resolved.config_hash, seed=suite.seed,
                              models=session.models, tasks=tasks, started=first_start,
                              finished=finished, resumed=resumed,
                              user_code=session.user_code())
    results = aggregate.build_results(
        run_id=path.name, version=__version__, created=finished,
        config_hash=resolved.config_hash, provenance=prov, models=session.models, tasks=tasks,
        samples=samples, prefill=prefill, suite=suite.name)
    if session.shard.count > 1:  # a part: `evalkit publish` merges all N (leaderboard.shards)
        results["shard"] = session.shard.as_dict()
    if session.lm_eval_tasks is not None:
        results["lm_eval"] = _run_lm_eval(resolved, session.lm_eval_tasks, path,
                                          session.progress)
    totals = {k: sum(p[k] for p in gathered) for k in ("cached", "computed", "tokens_run")}
    cache_stats = {k: sum(p["cache"][k] for p in gathered) for k in ("hits", "misses", "stale")}
    per_rank = [{"computed": p["computed"], "cached": p["cached"]} for p in gathered]
    rundir.append_execution(path, execution_record(
        {"interrupted": False, **totals, "cache": cache_stats, "ranks": per_rank}))
    rundir.finish(path, samples=(s.to_dict() for s in samples), results=results, provenance=prov,
                  probes=list(session.probes.values()) if suite.log_samples else None)
    summ = results["summary"]
    outcome.results = results
    outcome.samples, outcome.failed, outcome.flagged = summ["samples"], summ["failed"], summ["flagged"]
    errors = Counter(s.error for s in samples if s.error)
    outcome.top_error = errors.most_common(1)[0] if errors else None
    outcome.capped = sum(1 for s in samples if s.queue_s)
    outcome.cached, outcome.computed = totals["cached"], totals["computed"]
    outcome.prefill = prefill
    outcome.wall_s = time.perf_counter() - t0
    distributed.teardown(dist)
    return outcome
