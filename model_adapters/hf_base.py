"""What every transformers-backed adapter shares (softmax and recurrent): token-id and length
checks, end-of-sequence ids, the parameter count and the identity fields."""
from __future__ import annotations

from typing import Any, Sequence

from evalkit.model_adapters.dtypes import dtype_name
from evalkit.model_adapters.weights import weights_hash


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """The generation config's and the tokenizer's end-of-sequence ids."""
    ids: set[int] = set()
    gc = getattr(model, "generation_config", None)
    for src in (getattr(gc, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(i) for i in src)
    return ids


class HFBase:
    """Subclasses set name, model, tokenizer, dtype, device, max_length, trained_length, _vocab,
    _weight_files and _extra_identity."""

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self._vocab]
        if bad:
            raise ValueError(f"{self.name}: token id {bad[0]} is outside the vocabulary "
                             f"[0, {self._vocab})")
        return ids

    def _check_room(self, length: int, what: str) -> None:
        if self.max_length is not None and length > self.max_length:
            raise ValueError(f"{self.name}: {what} needs {length} tokens, more than max_length "
                             f"{self.max_length}; evalkit never truncates -- shorten the probe or "
                             f"pass max_length explicitly")

    def num_parameters(self) -> int:
        return self.model.num_parameters()

    def _identity(self, kind: str, **fields: Any) -> dict:
        """The shared identity fields, `fields` beside them, then the caller's extra identity.
        No path: a fingerprint must not depend on where the files live."""
        import transformers

        from evalkit.tokenization import tokenizer_hash

        ident = {"name": self.name, "kind": kind, **fields,
                 "weights_hash": weights_hash(self._weight_files),
                 "weights_files": sorted(f.name for f in self._weight_files),
                 "tokenizer_hash": tokenizer_hash(self.tokenizer),
                 "dtype": dtype_name(self.dtype), "device": str(self.device),
                 "max_length": self.max_length, "transformers": transformers.__version__}
        ident.update(self._extra_identity)
        return ident
