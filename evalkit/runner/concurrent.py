"""Requests in flight for a served model: up to `concurrency` questions at once.

    plan items, in plan order (the questions of one context together, so the server's prefix
    cache sees a shared prefix back to back) -> [--arrivals: wait until each is due]
    -> a bounded thread pool -> emit as each finishes

A served adapter's state is token ids on the client, so each question is prefilled with its
whole context and answered on its own: nothing is shared between threads but the client.
`emit` runs on the calling thread only (the cache and the sample list are not thread-safe).
Results do not depend on the concurrency except where the server's batched kernels are not
bit-exact (a test counts such samples).
"""
from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Callable, Sequence

from evalkit.result import SampleResult
from evalkit.runner.execute import ModelRun, answer, failed
from evalkit.runner.plan import Plan, Request


def _one(run: ModelRun, item: Request, queue_s: float | None) -> SampleResult:
    context = [t for piece in item.rendered.context[: item.after] for t in piece]
    try:
        if context:
            s = answer(run, item, run.adapter.prefill(context), consume=True)
        else:
            s = answer(run, item, run.adapter.prefill(list(item.question_ids)), consume=True,
                       feed=False)
    except Exception as e:  # a prefill refusal (bad ids): this sample only
        s = failed(run, item, e)
    s.queue_s = queue_s
    return s


def execute_concurrent(run: ModelRun, plan: Plan, emit: Callable[[SampleResult], None],
                       concurrency: int, due: Sequence[float] | None = None) -> None:
    """Answer `plan` with up to `concurrency` requests in flight. `due`: each item's send time
    in seconds from now (evalkit.runner.arrivals), in plan order; None: as soon as a slot is
    free. An item due while every slot is busy waits; the wait is its queue_s."""
    items = list(plan.items())
    if due is not None and len(due) < len(items):
        raise ValueError(f"{len(due)} arrival times for {len(items)} requests")
    pending: set[Future] = set()

    def settle(timeout: float | None = None) -> None:
        nonlocal pending
        done, pending = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
        for f in done:
            emit(f.result())

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="evalkit-req") as pool:
        try:
            for k, item in enumerate(items):
                if due is not None:  # until it is due, emit what finishes meanwhile
                    while (left := t0 + due[k] - time.monotonic()) > 0:
                        settle(left) if pending else time.sleep(left)
                while len(pending) >= concurrency:
                    settle()
                queue = None if due is None else max(0.0, time.monotonic() - t0 - due[k])
                pending.add(pool.submit(_one, run, item, queue))
            while pending:
                settle()
        except BaseException:  # Ctrl-C: finished samples are emitted; the rest is dropped
            for f in pending:
                f.cancel()
            raise
