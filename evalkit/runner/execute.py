"""Run a plan on one adapter: batched prefills, then fork/extend/answer per question.

Every question is answered twice over from one state: greedy generation (cut at the stop
strings) and forced choice, `score(state, [" " + candidate ids ...])`, unless the model's suite
entry turns forced choice off (`forced_choice: false`: score() is never called, so a served
sample costs one request). A served model counts what each sample sends (`metered`: its
tokens_sent and requests). State ownership follows
evalkit.model_adapters.protocol: `extend` may consume its state, so a state that is still needed is forked
first; the last user of a state consumes it without a copy.

Failure isolation: an exception while answering a question becomes that sample's `error`; one
while prefilling or extending a shared prefix fails only the questions under it. The run goes on.
KeyboardInterrupt is never caught here.
"""
from __future__ import annotations

import contextlib
import math
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from evalkit.model_adapters.protocol import prefill_batch
from evalkit.render import ANSWER_STOP, continuation_ids
from evalkit.result import SampleResult
from evalkit.runner.plan import Node, Plan, Request, Unit, chain, length_buckets
from evalkit.scoring import score_sample


@dataclass(frozen=True)
class ModelRun:
    """An adapter plus what every sample of it records."""

    adapter: Any
    name: str
    model_hash: str
    state_kind: str
    stop: tuple[str, ...] = ANSWER_STOP
    max_new_tokens: int | None = None  # overrides each question's own budget when set
    arrivals: str | None = None        # a served model's load: poisson:R/s, trace:.., closed:C
    forced_choice: bool = True         # False: no score() call, no forced-choice metric

    @property
    def served(self) -> bool:
        return self.arrivals is not None  # every served model runs under a load (closed:C)


def prompt_chars(item: Request) -> int:
    """Characters of the prompt's content (context up to the question, question, answer
    prefix). Chat-template markup is not counted, so the number compares across tokenizers."""
    p, q = item.probe, item.question
    ctx = sum(len(s.text) for s in p.context[: q.after_segment])
    question = len(q.text) + len(q.answer_prefix)
    return ctx + question + (0 if p.chat else 2)  # plain probes: "\n" text "\n" prefix


def base_sample(run: ModelRun, item: Request, prompt_tokens: int | None = None) -> SampleResult:
    p, q = item.probe, item.question
    return SampleResult(
        model=run.name, model_hash=run.model_hash, task=p.task, task_version=p.task_version,
        probe_id=p.id, probe_hash=p.hash, question=item.qi, kind=q.kind,
        target_length=p.meta.target_length,
        prompt_tokens=item.prompt_tokens if prompt_tokens is None else prompt_tokens,
        prompt_chars=prompt_chars(item), depth=p.meta.depth, load=p.meta.load,
        distance=q.distance, seed=p.meta.seed, prediction=None, gold=list(q.gold),
        candidates=list(q.candidates), state_kind=run.state_kind, arrivals=run.arrivals)


def error_text(e: BaseException) -> str:
    """`Type: message (at file:line)` of the innermost frame: enough to find the bug."""
    msg = "".join(traceback.format_exception_only(type(e), e)).strip()
    tb = traceback.extract_tb(e.__traceback__)
    return f"{msg} (at {tb[-1].filename}:{tb[-1].lineno})" if tb else msg


def failed(run: ModelRun, item: Request, e: BaseException) -> SampleResult:
    s = base_sample(run, item)
    s.error = error_text(e)
    # a served request's ServerError says why and after how many attempts; anything else
    # (a bad token id, a broken score) is "other"
    s.error_cause = getattr(e, "cause", None) or "other"
    s.attempts = getattr(e, "attempts", None)
    return s


IN_SINKS = "in_sinks"


def in_sinks(run: ModelRun, item: Request) -> SampleResult:
    """The flagged sample of a question whose fact starts inside the model's attention sinks:
    the sinks are kept exact, so recalling it would not measure the state. Flagged, not
    failed, like an over-length prompt: the grid put it there (several facts spread over a
    short context reach its first tokens), not a fault; the run says which models and S."""
    s = base_sample(run, item)
    s.flag = IN_SINKS
    return s


def answer(run: ModelRun, item: Request, state: Any, *, consume: bool, feed: bool = True,
           due: float | None = None) -> SampleResult:
    """Answer `item` from `state` (the context before its question; with feed=False, the
    whole prompt). With consume=False the state is forked first and stays intact. `due`: the
    time.monotonic() the request was due (--arrivals), the start of its response time."""
    sample = base_sample(run, item)
    t0 = time.monotonic()
    serving = run.adapter.serving  # a served model counts what it sends
    with serving.metered() if serving is not None else contextlib.nullcontext() as sent:
        sample, timing = _answer(run, item, state, sample, consume=consume, feed=feed)
    if sent is not None:
        sample.tokens_sent, sample.requests = sent.tokens, sent.requests
    if timing is not None:  # a served request: its whole time, from the first send
        sample.ttft_s, sample.service_s = timing.ttft_s, timing.service_s
        sample.attempts = timing.attempts
        sample.latency_s = timing.service_s if due is None else timing.done_at - due
    else:  # in process, or a failure: until now
        sample.latency_s = time.monotonic() - (t0 if due is None else due)
    return sample


def _answer(run: ModelRun, item: Request, state: Any, sample: SampleResult, *, consume: bool,
            feed: bool) -> tuple[SampleResult, Any]:
    """`sample` answered (or the failed sample instead), and the served request's Timing."""
    model, q = run.adapter, item.question
    try:
        s = state if consume else model.fork(state)
        if feed:
            s = model.extend(s, list(item.question_ids))
        budget = run.max_new_tokens or q.max_new_tokens
        if model.serving is not None:  # a served model times its request
            sample.prediction, timing = model.serving.generate_timed(s, budget,
                                                                     stop=list(run.stop))
        else:
            sample.prediction, timing = model.generate(s, budget, stop=list(run.stop)), None
        logprobs = None
        if run.forced_choice and len(q.candidates) >= 2:
            conts = [continuation_ids(model.tokenizer, c) for c in q.candidates]
            logprobs = [float(x) for x in model.score(s, conts)]
            if not all(map(math.isfinite, logprobs)):
                # NaN weights or a NaN config value: a score of 0 would look like forgetting.
                raise FloatingPointError(f"score() returned non-finite log-probabilities "
                                         f"{logprobs} for {q.candidates}: the model's numbers "
                                         f"are broken (NaN weights or config?)")
            sample.candidate_logprobs = logprobs
        sample.scores = score_sample(sample.prediction, q.gold, logprobs, q.kind)
        if model.state_parts is not None:  # kind and bytes as measured from this state's tensors
            measured = model.state_parts(s)
            if measured is None:  # a served model without a config: unknown, never 0
                sample.state_bytes, sample.state_kind = None, "unknown"
            else:
                sample.state_bytes, sample.state_kind = int(measured.total), measured.kind
        else:
            sample.state_bytes = int(model.state_bytes(s))
    except Exception as e:  # one bad sample must not end the run
        return failed(run, item, e), None
    return sample, timing


def _run_subtree(run: ModelRun, node: Node, state: Any, emit: Callable[[SampleResult], None]) -> None:
    """Depth-first over the trie below a prefilled `node`, streaming the state down it."""
    model = run.adapter
    stack: list[tuple[Node, Any, tuple[int, ...]]] = [(node, state, ())]
    while stack:
        node, state, pending = stack.pop()
        if pending:
            try:
                state = model.extend(state, list(pending))
            except Exception as e:
                for it in node.subtree_items():
                    emit(failed(run, it, e))
                continue
        children = [chain(c) for c in node.children.values()]
        for j, item in enumerate(node.items):
            emit(answer(run, item, state, consume=(j == len(node.items) - 1 and not children)))
        # Fork for every child but the last (which consumes the state), before any extends.
        branches = []
        for k, (ids, end) in enumerate(children):
            if k == len(children) - 1:
                branches.append((end, state, ids))
                continue
            try:
                branches.append((end, model.fork(state), ids))
            except Exception as e:
                for it in end.subtree_items():
                    emit(failed(run, it, e))
        stack.extend(reversed(branches))


def _run_unit(run: ModelRun, unit: Unit, state: Any, emit: Callable[[SampleResult], None]) -> None:
    if unit.item is not None:
        emit(answer(run, unit.item, state, consume=True, feed=False))
    else:
        _run_subtree(run, unit.node, state, emit)


def _prefill(run: ModelRun, batch: Sequence[Unit]) -> list[tuple[Any, BaseException | None]]:
    """States for a batch; if the batched call fails, each unit is retried alone so only the
    unit that is actually broken fails."""
    model = run.adapter
    try:
        states = prefill_batch(model, [list(u.prefix) for u in batch])
        if len(states) != len(batch):
            raise RuntimeError(f"prefill_batch returned {len(states)} states for {len(batch)} prompts")
        return [(s, None) for s in states]
    except Exception as e:
        if len(batch) == 1:
            return [(None, e)]
    out = []
    for u in batch:
        try:
            out.append((model.prefill(list(u.prefix)), None))
        except Exception as e:
            out.append((None, e))
    return out


def execute(run: ModelRun, plan: Plan, emit: Callable[[SampleResult], None],
            batch_size: int = 1) -> None:
    """Answer every question of `plan`, calling `emit` once per sample as soon as it is done."""
    for batch in length_buckets(plan.units, batch_size):
        prefilled = _prefill(run, batch)
        for i, unit in enumerate(batch):
            state, err = prefilled[i]
            prefilled[i] = (None, None)  # drop our reference: the unit may consume the state
            if err is not None:
                for it in unit.items():
                    emit(failed(run, it, err))
            else:
                _run_unit(run, unit, state, emit)
            del state
