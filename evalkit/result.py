"""The per-sample result record: one line of runs/<id>/samples.jsonl.

Pairs with Probe: one SampleResult per (model, probe, question). Aggregation slices results by
(task, target_length, depth, load); the leaderboard reads nothing else.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class SampleResult:
    model: str                    # registered name or path, as given
    model_hash: str               # hash of the model identity (weights, dtype, backend)
    task: str
    task_version: str
    probe_id: str
    probe_hash: str
    question: int                 # index into probe.questions
    kind: str                     # question kind: recall, latest, lookalike, multi...
    target_length: int            # requested prompt length, model tokens
    prompt_tokens: int            # actual prompt length of this question, model tokens
    prompt_chars: int             # the same prompt in characters (comparable across tokenizers)
    depth: float
    load: int
    distance: int                 # tokens from the fact to the question
    seed: int
    prediction: str | None
    gold: list[str]
    candidates: list[str] = field(default_factory=list)
    candidate_logprobs: list[float] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)  # metric name -> value in [0, 1]
    state_bytes: int | None = 0   # None: unknown (a served model without a config); bytes of the recurrent state or KV cache at the question
    state_kind: str = ""          # "recurrent", "kv", "kv-window", "memory"
    # a served model's greedy request: its response time, from when it was due (--arrivals)
    # or sent (closed loop) to its last token, across retries (a failed one: to its failure);
    # in-process: the answer's wall time
    latency_s: float = 0.0
    service_s: float | None = None  # a served model: first send to last token, across retries
    attempts: int | None = None   # a served model: requests sent for it (1 + retries)
    ttft_s: float | None = None   # a served model: to the first streamed token
    due_s: float | None = None    # --arrivals: when it was due, seconds from the schedule's start
    queue_s: float | None = None  # --arrivals: sent this late for the cap on open requests
    arrivals: str | None = None   # a served model's load: "poisson:2/s", "trace:F@sha", "closed:4"
    # a served model: the prompt tokens its requests sent (the greedy prompt, each scoring
    # prompt: a server prefills each whole, less what its prefix cache may reuse, which the
    # client cannot see) and the requests (greedy, scoring; retries not counted again).
    # None: in process (its prefill is the plan's, results' "prefill"), or a run from before
    tokens_sent: int | None = None
    requests: int | None = None
    error: str | None = None      # this sample failed; the run went on
    error_cause: str | None = None  # why: timeout, connect, http_5xx, http_4xx, bad_response,
                                  # cancelled (a served request), or other
    flag: str | None = None       # e.g. "over_length": not evaluated, never cut

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SampleResult":
        return cls(**d)
