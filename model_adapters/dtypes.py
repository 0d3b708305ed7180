"""The one table of element types adapters accept, and their short names in identities."""
from __future__ import annotations

import torch

DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
}
_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """"bf16", "torch.bfloat16", torch.bfloat16, ... -> torch.bfloat16; anything else raises."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _NAMES:
            raise ValueError(f"dtype {dtype}: expected one of {sorted(set(_NAMES.values()))}")
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[key]


def dtype_name(dtype: str | torch.dtype) -> str:
    """The short name ("fp32", "bf16", "fp16") recorded in identities and reports."""
    return _NAMES[parse_dtype(dtype)]
