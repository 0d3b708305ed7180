"""What every transformers-backed adapter shares (softmax and recurrent): the state record,
prefill / extend / fork / generate over a transformers cache, token-id and length checks,
end-of-sequence ids, the parameter count and the identity fields."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from evalkit.model_adapters.protocol import AdapterBase, greedy_generate, greedy_token
from evalkit.model_adapters.device import resolve_device
from evalkit.model_adapters.dtypes import dtype_name, parse_dtype
from evalkit.model_adapters.weights import weights_hash


@dataclass
class HFState:
    """A transformers model's state: its cache (KV, recurrent or both), the tokens seen so
    far, and the next-token logits (fp32, [V])."""

    cache: Any
    length: int
    logits: torch.Tensor


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


class HFBase(AdapterBase):
    """Subclasses set name, model, tokenizer, dtype, device, max_length, trained_length, _vocab,
    _eos, _weight_files and _extra_identity, and give the cache its three operations:
    `_new_cache()`, `_copy_cache(cache)` (an independent copy, for fork) and
    `_feed(cache, start, ids, all_logits) -> (cache, fp32 logits)` ([n, V] if all_logits else
    [V] for the last position). `_scratch_cache(cache)` (a copy to run ahead on) defaults to
    `_copy_cache`."""

    # -- the stateful protocol

    def prefill(self, token_ids: Sequence[int]) -> HFState:
        ids = self._check_ids(token_ids)
        if not ids:
            raise ValueError(f"{self.name}: prefill needs at least one token")
        self._check_room(len(ids), "prefill")
        cache, logits = self._feed(self._new_cache(), 0, ids, all_logits=False)
        return HFState(cache, len(ids), logits)

    def extend(self, state: HFState, token_ids: Sequence[int]) -> HFState:
        ids = self._check_ids(token_ids)
        if not ids:
            return state
        self._check_room(state.length + len(ids), "extend")
        state.cache, state.logits = self._feed(state.cache, state.length, ids, all_logits=False)
        state.length += len(ids)
        return state

    def fork(self, state: HFState) -> HFState:
        return HFState(self._copy_cache(state.cache), state.length, state.logits.clone())

    def generate(self, state: HFState, max_new_tokens: int,
                 stop: Sequence[str] | None = None) -> str:
        scratch = {"cache": None, "length": state.length}  # `state` itself is never advanced

        def step(tok: int) -> int:
            self._check_room(scratch["length"] + 1, "generation")
            if scratch["cache"] is None:
                scratch["cache"] = self._scratch_cache(state.cache)
            scratch["cache"], logits = self._feed(scratch["cache"], scratch["length"], [tok],
                                                  all_logits=False)
            scratch["length"] += 1
            return greedy_token(logits)

        return greedy_generate(greedy_token(state.logits), step,
                               decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
                               eos=self._eos, max_new_tokens=max_new_tokens, stop=stop)

    def _scratch_cache(self, cache: Any) -> Any:
        return self._copy_cache(cache)

    def _first_token_scores(self, state: HFState, continuations: Sequence[Sequence[int]]
                            ) -> tuple[list[list[int]], list[float]]:
        """score's shared start: the checked continuations and each one's first-token
        log-probability, read from the state's logits (the rest needs a forward)."""
        conts = [self._check_ids(c) for c in continuations]
        if any(not c for c in conts):
            raise ValueError(f"{self.name}: cannot score an empty continuation")
        first = torch.log_softmax(state.logits, dim=-1)
        return conts, [first[c[0]].item() for c in conts]

    # -- setup, checks and identity

    def _set_options(self, dtype: Any, device: str, trust_remote_code: bool, prefill_chunk: int,
                     extra_identity: dict | None) -> None:
        """The options every transformers-backed adapter takes, checked before any loading."""
        self.dtype = parse_dtype(dtype)
        self.device = resolve_device(device, self.dtype)
        self.trust_remote_code = bool(trust_remote_code)
        if int(prefill_chunk) < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.prefill_chunk = int(prefill_chunk)
        self._extra_identity = dict(extra_identity or {})

    def _set_model(self, tokenizer: Any, model: Any, weight_files: list) -> None:
        """The loaded model on its device, for inference only."""
        self.tokenizer, self.model, self._weight_files = tokenizer, model, weight_files
        self.model.to(self.device).eval()
        self.model.requires_grad_(False)
        self._vocab = self.model.get_input_embeddings().num_embeddings

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
