"""The state a memory-matched baseline gets: `match_state_of=NAME` for any recurrent or hybrid
model. A registered model reports its state from its description (GLA, Laplace); a recurrent or
hybrid checkpoint (hf:DIR or a folder) gives the fixed part of its measured state: the recurrent
states and conv tails a prefill leaves in its cache, without the KV a hybrid's attention grows."""
from __future__ import annotations

from pathlib import Path

from evalkit.model_adapters.recurrent.family import state_family
from evalkit.model_adapters.recurrent.measure import measured_at
from evalkit.model_adapters.models import describe_model, resolve_spec

MATCH_TOKENS = 8  # a fixed state does not depend on the length; any short prefill measures it


def matched_state_bytes(spec: str) -> int:
    """Bytes of `spec`'s fixed state; a ValueError naming `spec` when it has none."""
    info, path = resolve_spec(spec)
    if path is None:
        nbytes = describe_model(spec)["state_bytes"]
    elif info.name == "hf":
        nbytes = _checkpoint_fixed_bytes(Path(path).expanduser())
    else:
        nbytes = describe_model(info.name)["state_bytes"] if info.describe else None
    if not nbytes:
        raise ValueError(f"match_state_of={spec!r}: that model reports no fixed state size to "
                         f"match (registered recurrent models and recurrent or hybrid hf "
                         f"checkpoints do)")
    return int(nbytes)


def _checkpoint_fixed_bytes(folder: Path) -> int:
    import torch
    from transformers import AutoConfig  # heavy: only when a checkpoint is matched

    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    if state_family(config) != "recurrent":
        return 0
    # fp32: the dtype `hf:` loads a checkpoint in unless told otherwise
    return measured_at(config, MATCH_TOKENS, torch.float32).fixed
