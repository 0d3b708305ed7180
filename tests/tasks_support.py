"""Helpers shared by the built-in task tests (test_tasks_*.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evalkit.render import prompt_ids, prompt_length, render

SMOLLM2_CACHE = Path.home() / ".cache" / "evalkit"


def gen(module: Any, tokenizer: Any, *, task: str = "t", length: int = 1024, depth: float = 0.5,
        load: int = 1, seed: int = 0, **params: Any):
    """One probe from a generator module with the given params."""
    return module.generate(module.Params(**params), task=task, version="1", tokenizer=tokenizer,
                           length=length, depth=depth, load=load, seed=seed)


def smollm2_tokenizer() -> Any:
    """The SmolLM2 tokenizer that evalkit converts from the packaged GGUF into ~/.cache/evalkit
    (a second real tokenizer, with a real chat template). The test is skipped when that
    tokenizer is not there, so nothing depends on it."""
    hits = sorted(SMOLLM2_CACHE.glob("smollm2*/*/tokenizer.json"))
    if not hits:
        pytest.skip("no converted SmolLM2 tokenizer in ~/.cache/evalkit")
    from evalkit.tokenization import load_tokenizer

    return load_tokenizer(hits[0].parent)


def check_measured(probe: Any, tokenizer: Any) -> None:
    """Every measured field matches the real rendered token ids."""
    assert probe.meta.actual_length == prompt_length(probe, tokenizer)
    assert abs(probe.meta.actual_length - probe.meta.target_length) <= probe.meta.tolerance
    assert probe.meta.tolerance == max(2, probe.meta.target_length // 200)
    r = render(probe, tokenizer)
    for qi, q in enumerate(probe.questions):
        ctx_tokens = r.prefix_length(q.after_segment)
        assert q.distance == ctx_tokens - q.fact_token
        assert 0 <= q.fact_token < ctx_tokens
        assert len(prompt_ids(probe, tokenizer, qi)) == ctx_tokens + len(r.questions[qi])
        assert q.candidates[0] == q.gold[0] and len(set(q.candidates)) == len(q.candidates)
        for v in q.gold:
            assert not set(v) & set(".,\n"), v  # the stop convention of evalkit.probes
