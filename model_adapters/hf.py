"""The `hf:PATH` loader: a local Hugging Face causal LM folder or .gguf file, routed by what its
cache will hold (recurrent/family.py). A config whose layers keep recurrent states or conv tails
(any such transformers family: Mamba, RWKV, xLSTM, the hybrids) gets the RecurrentAdapter;
everything else the SoftmaxAdapter. The kind of state is
measured by the adapter, hence `state_kind="measured"` in the registry."""
from __future__ import annotations

import inspect
from typing import Any

from evalkit.model_adapters.recurrent.adapter import RecurrentAdapter
from evalkit.model_adapters.recurrent.family import state_family
from evalkit.model_adapters.softmax.adapter import SoftmaxAdapter
from evalkit.model_adapters.softmax.describe import split_path
from evalkit.model_adapters.models import register_model


@register_model("hf", kind="softmax", state_kind="measured", options=SoftmaxAdapter,
                description="any local Hugging Face causal LM folder or .gguf (hf:PATH); "
                            "recurrent and hybrid families too (state measured from the cache)")
def load_hf(path: str | None, **options: Any) -> Any:
    """`hf:PATH`: a local Hugging Face causal LM folder or .gguf file. A folder whose cache holds
    recurrent states or conv tails (Mamba, RWKV, hybrids) gets the RecurrentAdapter."""
    if not path:
        raise ValueError("the 'hf' loader needs a path: hf:/path/to/model-folder or hf:/path/to/file.gguf")
    folder, gguf = split_path(path)
    if gguf is None:
        from transformers import AutoConfig  # heavy: only when an hf model is loaded

        try:
            config = AutoConfig.from_pretrained(
                str(folder), local_files_only=True,
                trust_remote_code=bool(options.get("trust_remote_code", False)))
        except (OSError, ValueError, KeyError):  # unreadable: the softmax load names the file
            config = None
        if config is not None and state_family(config) == "recurrent":
            allowed = set(inspect.signature(RecurrentAdapter).parameters) - {"path"}
            bad = sorted(set(options) - allowed)
            if bad:
                raise ValueError(f"{folder}: option(s) {', '.join(bad)} apply to attention models "
                                 f"only; this is a {config.model_type} model (recurrent state)")
            return RecurrentAdapter(path, **options)
    return SoftmaxAdapter(path, **options)
