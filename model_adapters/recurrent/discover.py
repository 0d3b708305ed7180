"""The recurrent, convolutional and hybrid causal LMs the installed transformers ships, found by
walking its own registry (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), never from a list kept here.

A causal-LM class is picked when its modeling source uses a state API: transformers' cache-layer
calls for a linear mixer (update_conv_state / update_recurrent_state: every family whose cache
has linear_attention, conv or hybrid layers writes them through these), a family's own state
attributes (conv1d_state, linear_cache, rnn_state, ssm_state), or a `state` parameter (RWKV).
The source is read as text first (importing two hundred modeling modules takes a minute); only
the classes it marks are imported, and kept when their own module uses the API. The default
configs are not asked: some say nothing (LFM2's is all attention until a checkpoint lists its
conv layers).
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path

STATE_API = re.compile(r"update_conv_state|update_recurrent_state|conv1d_state|linear_cache|"
                       r"rnn_state|ssm_state|^\s+state: ", re.M)


def _source(model_type: str) -> str:
    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    folder = Path(transformers.__file__).parent / "models" / model_type_to_module_name(model_type)
    return "".join(p.read_text() for p in sorted(folder.glob("modeling_*.py")))


def recurrent_families() -> list[tuple[str, str]]:
    """(model_type, causal-LM class name), sorted, one per class (its config's model_type)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    marked = sorted({cls for mt, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()
                     if STATE_API.search(_source(mt))})
    found: dict[str, str] = {}
    for cls_name in marked:
        cls = getattr(transformers, cls_name, None)
        if cls is None:
            continue
        source = inspect.getsource(inspect.getmodule(cls))
        if "state" in inspect.signature(cls.forward).parameters or STATE_API.search(source):
            found[cls.config_class.model_type] = cls_name
    return sorted(found.items())
