"""Copied by `evalkit lm-eval-export` into every include path: scores lm-eval results with
evalkit.scoring, computing exactly the metrics the export listed in evalkit_export.json (so
the task YAMLs' metric_list and these scores cannot disagree)."""
import json
from pathlib import Path

from lm_eval.api.task import ConfigurableTask

from evalkit import scoring

_EXPORTED = json.loads((Path(__file__).parent / "evalkit_export.json").read_text())["metrics"]
# A metric this interpreter has not registered is an error here, at task load.
GENERATION = [scoring.get(name) for name in _EXPORTED[scoring.GENERATION]]
FORCED_CHOICE = [scoring.get(name) for name in _EXPORTED[scoring.FORCED_CHOICE]]


class EvalkitGenerateTask(ConfigurableTask):
    """generate_until with each question's own token budget and the probe's stop strings, as
    evalkit's runner answers it (a plain YAML task has one generation_kwargs for every doc)."""

    def __init__(self, config=None, **kwargs):
        # lm-eval hands the whole YAML over, including the `class` key TaskConfig rejects
        super().__init__(config={k: v for k, v in (config or {}).items() if k != "class"},
                         **kwargs)

    def construct_requests(self, doc, ctx, **kwargs):
        req = super().construct_requests(doc, ctx, **kwargs)
        for r in req if isinstance(req, list) else [req]:
            r.arguments[1]["max_gen_toks"] = int(doc["max_new_tokens"])
            r.arguments[1]["until"] = list(doc["stop"])
        return req


def process_results(doc, results):
    # only the metrics that apply to the question's kind (mqar_accuracy: MQAR's queries), as
    # the task's metric_list lists them
    return {m.name: m.fn(results[0], doc["gold"]) for m in GENERATION
            if m.applies_to(doc["kind"])}


def process_results_choice(doc, results):
    # multiple_choice results: one (loglikelihood, is_greedy) per candidate, gold first
    lls = [r[0] if isinstance(r, (list, tuple)) else r for r in results]
    return {m.name: m.fn(lls) for m in FORCED_CHOICE if m.applies_to(doc["kind"])}
