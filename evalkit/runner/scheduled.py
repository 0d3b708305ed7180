"""An open loop's schedule (`--arrivals`): every task's planned requests of one served model,
sent at their due times in one schedule over the model's whole plan (evalkit.runner.arrivals),
and its samples reused only whole.

    the model's planned requests (every task, _Session.plan_pair) -> due times (seed)
    -> this part finished before without a failure, on every rank? reuse it whole
       : offer the whole part again (run_items with due times) -> mark it done if none failed

A function of the run loop's session (run.py), split out as the one concept with its own rules:
a load is what was offered, so a union of two invocations is never one load.
"""
from __future__ import annotations

import hashlib
import sys
from typing import Any

from evalkit.runner.concurrent import MAX_OPEN
from evalkit.runner.execute import ModelRun
from evalkit.runner.plan import Request
from evalkit.runner.suite import SuiteError


def run_scheduled(session: Any, run: ModelRun, arrivals: Any,
                  planned: list[tuple[list[Request], list[Request]]]) -> None:
    """Send every task's planned requests at their due times in one schedule over the
    model's whole plan (evalkit.runner.arrivals), whatever this invocation sends of it.
    `session`: run.py's _Session (not imported: run.py imports this module)."""
    key = lambda it: f"{it.probe.task}\0{it.probe.hash}\0{it.qi}"
    whole = [key(it) for _, sent in planned for it in sent]
    seed = session.resolved.suite.seed
    try:
        due = arrivals.schedule(whole, seed=seed)
    except ValueError as e:
        raise SuiteError(f"model {run.name!r}: {e}") from None
    todo = sorted((it for left, _ in planned for it in left), key=lambda it: due[key(it)])
    # The schedule, exactly: what a sample measured under it was measured under. The
    # process with its exact rate (a float's JSON is its repr: poisson:12.34567 and
    # :12.34571 differ, where the 6-digit label does not) or the trace's content; the
    # seed and every request of the schedule (they fix each due time and what queues
    # beside it); the shard and rank that sent this part; the cap on open requests.
    schedule = {"process": arrivals.config(), "seed": seed,
                "requests": hashlib.sha256("\n".join(sorted(set(whole))).encode()).hexdigest(),
                "shard": session.shard.as_dict(), "ranks": session.dist.world,
                "max_open": MAX_OPEN}
    material = session.material(run, schedule)
    part = {**material, "rank": session.dist.rank}
    # A load is what was offered. This part's samples are reused only together, when
    # the whole part was offered in one invocation and answered without a failure
    # (SampleCache.schedule_done). Otherwise the whole part is offered again: sending
    # only what failed or was cut off would put those requests under a lighter load
    # than the label says (the review: 10 timeouts of 16 at poisson:10/s vanished on
    # --resume, sent alone), and a union of two invocations is not one load.
    hits = _whole(session, run, material, todo) if session.cache.schedule_done(part) else None
    # every rank's part from the cache, or every rank offers its part again: one rank
    # sending alone would meet a lighter load than the schedule's
    everywhere = session.dist.gather(hits is not None)
    if session.dist.broadcast(everywhere is not None and all(everywhere)):
        session.samples += hits
        session.cached += len(hits)
        return
    when = [due[key(it)] for it in todo]
    if session.dist.is_main:
        where = "" if session.shard.count == 1 else f" (shard {session.shard}: its part)"
        first = f", the first due in {when[0]:.1f} s" if when and when[0] >= 1 else ""
        print(f"evalkit run: {run.name} under {arrivals.label}: {len(whole)} requests, "
              f"expected to take {arrivals.expected_s(len(whole)):,.0f} s; {len(todo)} to "
              f"send here{where}{first}", file=sys.stderr)
    done = len(session.samples)
    try:
        session.run_items(run, todo, f"{run.name} | {arrivals.label}", material, due=when)
    except KeyboardInterrupt:
        print(f"evalkit run: {run.name} under {arrivals.label}: the schedule was cut "
              f"short, so a resume offers it again whole (its answered samples are not "
              f"reused alone: they would not be one load)", file=sys.stderr)
        raise
    answered = [d for _, d in session.samples[done:]]
    if len(answered) == len(todo) and not any(d["error"] for d in answered):
        session.cache.mark_schedule_done(part, len(todo))
    elif session.dist.is_main:
        print(f"evalkit run: {run.name} under {arrivals.label}: "
              f"{sum(bool(d['error']) for d in answered)} of {len(todo)} requests failed; "
              f"they count as measured. A resume (or a run sharing this cache) offers the "
              f"whole schedule again, never the failed requests alone", file=sys.stderr)

def _whole(session: Any, run: ModelRun, material: dict, todo: list[Request]
           ) -> list[tuple[tuple, dict]] | None:
    """Every sample of a finished schedule part from the cache, or None (an entry is gone
    or fails its check, so the part is offered again)."""
    hits = []
    for item in todo:
        hit = session.cache.get(session.cache.key(material, item.probe.hash, item.qi))
        if hit is None:
            return None
        hit.model = run.name
        hits.append((item.order, hit.to_dict()))
    return hits
