"""RecurrentAdapter: a transformers recurrent or hybrid causal LM (any family whose cache holds
recurrent states or conv tails, maybe beside KV: recurrent/family.py) behind the evalkit
protocol, its state as the cache.

Prefill once, fork per question by copying the state, decode and score through it. The state's
bytes and kind are counted by role from the tensors it holds after each step
(model_adapters.cache_state), never assumed from the family. Models that drop their state on a
multi-token forward after a prefill are found by a probe at load (recurrent/stepwise.py) and fed
token by token after their prefill.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from evalkit.model_adapters.cache_state import cache_state, cache_tensors, fork_cache
from evalkit.model_adapters.hf_base import HFBase, HFState, eos_ids
from evalkit.model_adapters.recurrent.forward import Stepper
from evalkit.model_adapters.recurrent.stepwise import drops_state_on_chunks
from evalkit.model_adapters.softmax.adapter import load_causal_lm
from evalkit.model_adapters.facts import hf_facts
from evalkit.model_adapters.softmax.describe import split_path
from evalkit.model_adapters.state_kind import StateBytes


class RecurrentAdapter(HFBase):
    """A transformers model whose cache holds recurrent states or conv tails (maybe beside KV)."""

    def __init__(self, path: str | os.PathLike, *, name: str | None = None, device: str = "cpu",
                 dtype: Any = "fp32", trust_remote_code: bool = False,
                 max_length: int | None = None, trained_length: int | None = None,
                 prefill_chunk: int = 2048,
                 extra_identity: dict | None = None) -> None:
        folder, gguf = split_path(path)
        if gguf:
            raise ValueError(f"{path}: GGUF files are read for softmax models only; convert the "
                             f"recurrent model to a safetensors folder")
        self._set_options(dtype, device, trust_remote_code, prefill_chunk, extra_identity)
        self._set_model(*load_causal_lm(folder, None, self.dtype,
                                        trust_remote_code=self.trust_remote_code))
        self.model_type = self.model.config.get_text_config(decoder=True).model_type
        self._stepper = Stepper(self.model)
        # Some families' multi-token forward starts its scan from zero (or rebuilds a conv tail
        # from the chunk alone) once a state exists: found by a probe on this model, not a list.
        self.stepwise = drops_state_on_chunks(self._stepper, self._vocab)
        facts = hf_facts(self.model.config, source=folder)
        self.max_length = int(max_length) if max_length is not None else facts.max_length
        # a recurrent config has no positional range; evalkit's own training writes the trained
        # length as `trained_length` (transformers keeps unknown config keys): facts.py
        trained_length = trained_length if trained_length is not None else facts.trained_length
        self.trained_length = None if trained_length is None else int(trained_length)
        self.name = name or folder.name
        self._eos = eos_ids(self.model, self.tokenizer)
        # The kind is what one token's state holds (measured, not assumed from the family).
        self.state_kind = self.state_parts(self.prefill([0])).kind

    # -- core forward

    def _new_cache(self) -> Any:
        return None  # the model makes its own on the first forward (its returned cache is counted)

    def _pieces(self, start: int, n: int) -> list[tuple[int, int]]:
        """(offset, length) of the forwards that feed n tokens after `start` earlier ones."""
        if self.stepwise:
            if start == 0:
                return [(0, n)] if n else []  # a prefill: one forward, from the zero state
            return [(i, 1) for i in range(n)]
        return [(i, min(self.prefill_chunk, n - i)) for i in range(0, n, self.prefill_chunk)]

    @torch.inference_mode()
    def _feed(self, cache: Any, start: int, ids: Sequence[int], all_logits: bool
                 ) -> tuple[Any, torch.Tensor]:
        """Feed `ids` at positions start.. into `cache` (updated in place or replaced).
        Returns (cache, fp32 logits): [n, V] if all_logits else [V] for the last position."""
        x_all = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        outs: list[torch.Tensor] = []
        for off, q in self._pieces(start, len(ids)):
            cache, logits = self._stepper.forward(cache, x_all[:, off: off + q], start + off,
                                                  all_logits)
            outs.append(logits)
        logits = torch.cat(outs, dim=0)
        return cache, (logits if all_logits else logits[-1])

    def _copy_cache(self, cache: Any) -> Any:
        return fork_cache(cache)

    # -- protocol (prefill, extend, fork and generate: HFBase)

    def score(self, state: HFState, continuations: Sequence[Sequence[int]]) -> list[float]:
        conts, scores = self._first_token_scores(state, continuations)
        # one forked cache per continuation: recurrent layers update in place, and a padded batch
        # would need per-row masking inside their scans
        for i, c in enumerate(conts):
            if len(c) < 2:
                continue
            self._check_room(state.length + len(c) - 1, "score")
            _, logits = self._feed(fork_cache(state.cache), state.length, c[:-1], all_logits=True)
            lp = torch.log_softmax(logits, dim=-1)
            tgt = torch.tensor(c[1:], device=lp.device)
            scores[i] += lp.gather(1, tgt[:, None]).sum().item()
        return scores

    def state_parts(self, state: HFState) -> StateBytes:
        """The state's bytes by part, counted from the cache's tensors (not the logits)."""
        return cache_state(state.cache)

    def state_tensors(self, state: HFState) -> list[torch.Tensor]:
        return cache_tensors(state.cache)

    def state_bytes(self, state: HFState) -> int:
        return self.state_parts(state).total

    # -- description

    def state_bytes_at(self, n_tokens: int) -> int:
        """State bytes after `n_tokens` tokens from the config's formula (equals the measured)."""
        from evalkit.model_adapters.recurrent.formula import state_at

        return state_at(self.model.config, int(n_tokens), self.dtype).total

    def identity(self) -> dict:
        return self._identity("recurrent-hf", model_type=self.model_type)

    def describe_state(self) -> dict:
        """How this model's state is held and fed (for `evalkit state` and the family table)."""
        return {"stepwise_after_prefill": self.stepwise}
