"""Which adapter a transformers config needs: read from what its cache would hold."""
from __future__ import annotations

from typing import Any

from evalkit.model_adapters.recurrent.formula import FAMILIES, UnsupportedFamily

# Families whose recurrent state lives inside the model's modules, not in a cache object, so it
# can be neither counted nor forked per question (transformers 5.x).
MODULE_STATE = {
    "recurrent_gemma": "RecurrentGemma keeps its RG-LRU and conv states on the model's modules "
                       "(_setup_cache), outside the cache",
    "xlstm": "xLSTM passes its own xLSTMCache, which evalkit does not walk yet",
}


def state_family(config: Any) -> str:
    """"recurrent" for a config the RecurrentAdapter runs, "kv" for a plain attention model;
    UnsupportedFamily for a recurrent one whose state cannot be counted or forked."""
    from transformers import DynamicCache

    model_type = config.get_text_config(decoder=True).model_type
    if model_type in FAMILIES:
        return "recurrent"
    if model_type in MODULE_STATE:
        raise UnsupportedFamily(f"model_type {model_type!r} is not supported: "
                                f"{MODULE_STATE[model_type]}")
    layers = DynamicCache(config=config).layers
    odd = sorted({type(l).__name__ for l in layers}
                 - {"DynamicLayer", "DynamicSlidingWindowLayer", "DummyLayer"})
    if odd:
        raise UnsupportedFamily(f"model_type {model_type!r} holds {', '.join(odd)} cache layers "
                                f"but evalkit has no state formula for it (supported recurrent "
                                f"families: {', '.join(FAMILIES)})")
    return "kv"
