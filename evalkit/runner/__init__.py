"""The evaluation runner: suite configs -> plans -> adapters -> a fingerprinted run directory.

One module per concept: `suite` (typed configs), `plan` (prefill once, fork per question),
`execute` (one plan on one adapter), `concurrent` (a served model's requests in flight, closed
or open loop), `arrivals` (the open loop's schedule: Poisson or a trace), `cache`
(content-addressed results), `aggregate` (results.json), `provenance`, `rundir` (layout, atomic
writes, DONE marker), `distributed` (torchrun ranks), `shard` (`--shard I/N`: one part of a
suite per machine) and `run` (the loop tying them together).
"""
from __future__ import annotations

from evalkit.runner.run import RunOutcome, run_suite
from evalkit.runner.suite import SuiteConfig, SuiteError, load_suite, resolve

__all__ = ["RunOutcome", "SuiteConfig", "SuiteError", "load_suite", "resolve", "run_suite"]
