"""The adapter's optional capabilities are declared and checked once, at load
(evalkit.model_adapters.protocol.check_capabilities via load_model): a missing or mistyped one is a clear
error naming the model, and a model registered as served must serve (and only it)."""
from __future__ import annotations

import pytest

from evalkit.model_adapters.protocol import AdapterBase, Serving, check_capabilities
from evalkit.model_adapters.reference import DEFAULT_TOKENIZER, InductionAdapter
from evalkit.model_adapters.models import MODELS, load_model, register_model
from evalkit.tokenization import load_tokenizer


class Bare:  # the protocol's methods would be here; no capability declared
    name = "bare"


def test_undeclared_and_mistyped_capabilities_named():
    with pytest.raises(TypeError, match=r"model 'x': Bare does not declare serving, "
                                        r"prefill_batch, state_parts, num_parameters"):
        check_capabilities(Bare(), "x")

    class WrongServing(AdapterBase):
        serving = 8  # a concurrency, not a Serving

    with pytest.raises(TypeError, match="serving must be an evalkit.model_adapters.protocol.Serving"):
        check_capabilities(WrongServing(), "x")

    class WrongParts(AdapterBase):
        state_parts = "fixed"

    with pytest.raises(TypeError, match="state_parts must be a method or None"):
        check_capabilities(WrongParts(), "x")


def test_registered_kind_and_serving_agree():
    tok = load_tokenizer(DEFAULT_TOKENIZER)

    class FakeServed(InductionAdapter):
        def __init__(self):
            super().__init__("fake", tok)
            self.serving = Serving(4, lambda *a, **k: ("", None), lambda: None, lambda: None)

    register_model("contract-claims-serving", kind="reference", state_kind="memory",
                   description="test")(
        lambda path: FakeServed())
    register_model("contract-served-in-process", kind="served", state_kind="memory",
                   description="test")(
        lambda path: InductionAdapter("plain", tok))
    try:
        with pytest.raises(TypeError, match="registered kind 'reference' but its adapter serves"):
            load_model("contract-claims-serving")
        with pytest.raises(TypeError, match="registered kind 'served' but its adapter does not"):
            load_model("contract-served-in-process")
    finally:
        MODELS.remove("contract-claims-serving")
        MODELS.remove("contract-served-in-process")
