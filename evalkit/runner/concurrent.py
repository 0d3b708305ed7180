"""Requests in flight for a served model: up to `concurrency` questions at once.

    plan items, in plan order (the questions of one context together, so the server's prefix
    cache sees a shared prefix back to back) -> a bounded thread pool -> emit as each finishes

A served adapter's state is token ids on the client, so each question is prefilled with its
whole context and answered on its own: nothing is shared between threads but the client.
`emit` runs on the calling thread only (the cache and the sample list are not thread-safe).
Results do not depend on the concurrency except where the server's batched kernels are not
bit-exact (a test counts such samples).
"""
from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Callable

from evalkit.result import SampleResult
from evalkit.runner.execute import ModelRun, answer, failed
from evalkit.runner.plan import Plan, Request


def _one(run: ModelRun, item: Request) -> SampleResult:
    context = [t for piece in item.rendered.context[: item.after] for t in piece]
    try:
        if context:
            return answer(run, item, run.adapter.prefill(context), consume=True)
        return answer(run, item, run.adapter.prefill(list(item.question_ids)), consume=True,
                      feed=False)
    except Exception as e:  # a prefill refusal (bad ids): this sample only
        return failed(run, item, e)


def execute_concurrent(run: ModelRun, plan: Plan, emit: Callable[[SampleResult], None],
                       concurrency: int) -> None:
    items = list(plan.items())
    pending: set[Future] = set()
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="evalkit-req") as pool:
        try:
            for item in items:
                if len(pending) >= concurrency:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for f in done:
                        emit(f.result())
                pending.add(pool.submit(_one, run, item))
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    emit(f.result())
        except BaseException:  # Ctrl-C: finished samples are emitted; the rest is dropped
            for f in pending:
                f.cancel()
            raise
