"""Requests in flight for a served model: a closed loop of `cap` at once, or an open loop.

    closed loop (no --arrivals): items in plan order (the questions of one context together,
        so the server's prefix cache sees a shared prefix back to back); the next request is
        sent when one of the `cap` in flight ends
    open loop (--arrivals): items in due order; each is sent at its due time whatever is in
        flight. `cap` (MAX_OPEN) only bounds the threads: a request due while `cap` are open
        waits, and its queue_s is how late it was sent, from its due time (counted, so the
        board can say so). That includes the wait of the requests before it: one held at the
        cap holds every later one due meanwhile, which is then sent late without meeting the
        cap itself

A served adapter's state is token ids on the client, so each question is prefilled with its
whole context and answered on its own thread: nothing is shared between threads but the
client. `emit` runs on the calling thread only (the cache and the sample list are not
thread-safe). Request threads are daemons, so a request the server never answers cannot keep
the process alive. Ctrl-C (or SIGTERM, which evalkit run turns into one) calls the adapter's
abort(): every open request ends within about a second, the answered ones are emitted (so
they are in the cache for --resume), and the interrupt goes on up.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Sequence

from evalkit.result import SampleResult
from evalkit.runner.execute import ModelRun, answer, failed
from evalkit.runner.plan import Request

MAX_OPEN = 1024      # open requests under --arrivals: far above rate x timeout of any board
WAKE_S = 1.0         # the longest one wait lasts: loops re-check instead of blocking for good
ABORT_WAIT_S = 5.0   # after abort(), how long the answered requests get to come back


def _one(run: ModelRun, item: Request, due: float | None) -> SampleResult:
    context = [t for piece in item.rendered.context[: item.after] for t in piece]
    try:
        if context:
            return answer(run, item, run.adapter.prefill(context), consume=True, due=due)
        return answer(run, item, run.adapter.prefill(list(item.question_ids)), consume=True,
                      feed=False, due=due)
    except Exception as e:  # a prefill refusal (bad ids): this sample only
        return failed(run, item, e)


class _Open:
    """Requests on their own daemon threads; results come back through a queue."""

    def __init__(self, run: ModelRun, emit: Callable[[SampleResult], None]) -> None:
        self.run, self.emit = run, emit
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.open = 0

    def send(self, item: Request, due: float | None, **fields) -> None:
        def work() -> None:
            try:
                s = _one(self.run, item, due)
                for k, v in fields.items():
                    setattr(s, k, v)
                self.done.put(s)
            except BaseException as e:  # a bug: surfaces on the calling thread
                self.done.put(e)

        threading.Thread(target=work, daemon=True, name="evalkit-req").start()
        self.open += 1

    def settle(self, timeout: float, keep: Callable[[SampleResult], bool] = lambda s: True) -> None:
        """Wait up to `timeout` for a request to end; emit it and whatever else has ended."""
        try:
            got = [self.done.get(timeout=max(timeout, 0.0))]
        except queue.Empty:
            return
        while True:
            try:
                got.append(self.done.get_nowait())
            except queue.Empty:
                break
        self.open -= len(got)
        for r in got:
            if isinstance(r, BaseException):
                raise r
            if keep(r):
                self.emit(r)


def execute_concurrent(run: ModelRun, items: Sequence[Request],
                       emit: Callable[[SampleResult], None], cap: int,
                       due: Sequence[float] | None = None) -> None:
    """Answer `items` with up to `cap` requests open. `due`: each item's due time in seconds
    from now, in the items' order (ascending; evalkit.runner.arrivals), for an open loop;
    None: a closed loop of `cap`."""
    if due is not None and len(due) != len(items):
        raise ValueError(f"{len(due)} arrival times for {len(items)} requests")
    reqs = _Open(run, emit)
    t0 = time.monotonic()
    held_until = -float("inf")  # when the loop last got past the cap
    try:
        for k, item in enumerate(items):
            at = None if due is None else t0 + due[k]
            while at is not None and (left := at - time.monotonic()) > 0:
                reqs.settle(min(left, WAKE_S)) if reqs.open else time.sleep(min(left, WAKE_S))
            if reqs.open >= cap:  # closed loop: the usual; open loop: the cap, counted
                while reqs.open >= cap:
                    reqs.settle(WAKE_S)
                held_until = time.monotonic()
            if at is None:
                reqs.send(item, None)
                continue
            # held at the cap after it fell due (itself, or behind an earlier request): it
            # waited from its due time, not from when the loop reached it
            late = time.monotonic() - at if held_until > at else 0.0
            reqs.send(item, at, due_s=due[k], queue_s=max(late, 0.0))
        while reqs.open:
            reqs.settle(WAKE_S)
    except BaseException:  # Ctrl-C, SIGTERM: stop the open requests, keep the answered ones
        if run.adapter.serving is not None:  # a served model: end what the server still runs
            run.adapter.serving.abort()
        end = time.monotonic() + ABORT_WAIT_S
        while reqs.open and (left := end - time.monotonic()) > 0:
            reqs.settle(min(left, WAKE_S), keep=lambda s: s.error is None)
        raise
