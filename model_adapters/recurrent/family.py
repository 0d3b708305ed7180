"""Which adapter a transformers config needs, read from what its cache would hold, never from a
list of family names:

- "recurrent": its layer types (transformers' get_layer_types_and_kwargs) include a linear
  mixer's layer (linear_attention, conv, hybrid, hybrid_sliding), or its causal LM passes its
  state as tensors (a `state` parameter: RWKV) or in a cache class of its own that is not a
  transformers Cache (xLSTMCache);
- "kv": every layer is attention that transformers' DynamicCache holds as plain or
  sliding-window KV (the SoftmaxAdapter's models);
- UnsupportedFamily otherwise, naming the layer classes it cannot count.
"""
from __future__ import annotations

import inspect
from typing import Any

from evalkit.model_adapters.recurrent.formula import LINEAR_TYPES, UnsupportedFamily

KV_LAYERS = {"DynamicLayer", "DynamicSlidingWindowLayer", "DummyLayer"}


def causal_lm_class(config: Any) -> type | None:
    """The transformers causal-LM class a config loads as (None: none registered)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        return None


def own_state_holder(cls: type | None) -> str | None:
    """How a causal LM passes its state when it is not a transformers Cache: "state" (a tensor
    list parameter, RWKV) or the name of its own cache class (read from its forward's
    annotation), else None."""
    if cls is None:
        return None
    from transformers.cache_utils import Cache

    params = inspect.signature(cls.forward).parameters
    if "state" in params and "cache" not in params and "past_key_values" not in params:
        return "state"
    p = params.get("cache") or params.get("past_key_values")
    if p is None:
        return None
    names = str(p.annotation).replace("|", " ").replace("Optional[", " ").replace("]", " ").split()
    module = inspect.getmodule(cls)
    for name in names:
        obj = getattr(module, name.split(".")[-1].strip("'\""), None)
        if inspect.isclass(obj) and not issubclass(obj, Cache) and name.endswith("Cache"):
            return obj.__name__
    return None


def layer_types(config: Any) -> list[str]:
    from transformers.cache_utils import get_layer_types_and_kwargs

    return list(get_layer_types_and_kwargs(config.get_text_config(decoder=True))[0])


def state_family(config: Any) -> str:
    """"recurrent" for a config the RecurrentAdapter runs, "kv" for a plain attention model;
    UnsupportedFamily for one whose cache evalkit cannot count."""
    from transformers import DynamicCache

    model_type = config.get_text_config(decoder=True).model_type
    if own_state_holder(causal_lm_class(config)) is not None:
        return "recurrent"
    if any(t in LINEAR_TYPES for t in layer_types(config)):
        return "recurrent"
    try:
        layers = DynamicCache(config=config).layers
    except KeyError as e:
        raise UnsupportedFamily(f"model_type {model_type!r} has layer type {e} which no "
                                f"transformers DynamicCache layer holds") from None
    odd = sorted({type(l).__name__ for l in layers} - KV_LAYERS)
    if odd:
        raise UnsupportedFamily(f"model_type {model_type!r} holds {', '.join(odd)} cache layers "
                                f"and no recurrent or convolutional layer: evalkit counts "
                                f"{', '.join(sorted(KV_LAYERS))} for attention models")
    return "kv"
