"""SoftmaxAdapter: a transformers causal LM behind the evalkit protocol, the KV cache as state;
registered as the path loader "hf"."""
from __future__ import annotations

import inspect
import os
import struct
from pathlib import Path
from typing import Any, Sequence

import torch

from evalkit.model_adapters.cache_state import cache_state
from evalkit.model_adapters.hf_base import HFBase, HFState, eos_ids
from evalkit import heads_file
from evalkit.model_adapters.softmax import kv_cache, policy as mem
from evalkit.model_adapters.facts import hf_facts
from evalkit.model_adapters.softmax.describe import split_path
from evalkit.model_adapters.softmax.kv_cache import KVProfile, kv_profile, matched_window
from evalkit.model_adapters.weights import (WeightFileError, check_floating, file_sha256, index_shards,
                                            safetensors_dtypes)
from evalkit.model_adapters.state_match import matched_state_bytes
from evalkit.model_adapters.state_kind import StateBytes

INDEX = "model.safetensors.index.json"


def _check_folder_weights(folder: Path) -> list[Path]:
    """The folder's safetensors files, each checked to be complete before transformers reads it
    (its own errors name no file); a corrupt index is named too."""
    if (folder / INDEX).is_file():
        index_shards(folder / INDEX)
    files = sorted(folder.glob("*.safetensors"))
    for f in files:
        safetensors_dtypes(f)
    return files


def _load_gguf(folder: Path, gguf: str, dtype: torch.dtype, common: dict) -> tuple[Any, Any]:
    """(tokenizer, model) from a GGUF file; a file the GGUF reader cannot parse (truncated,
    not GGUF) raises WeightFileError naming it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf, **common)
        model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf, dtype=dtype,
                                                     **common)
    except (ValueError, OSError, KeyError, IndexError, EOFError, struct.error) as e:
        raise WeightFileError(f"{folder / gguf}: cannot read this GGUF file ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); it is truncated, "
                              f"corrupt or of an unsupported architecture") from None
    return tok, model


def load_causal_lm(folder: Path, gguf: str | None, dtype: torch.dtype, *,
                   trust_remote_code: bool = False) -> tuple[Any, Any, list[Path]]:
    """(tokenizer, model, weight files) of a local folder (safetensors only) or GGUF file."""
    from transformers import AutoModelForCausalLM

    from evalkit.tokenization import load_tokenizer

    common = dict(local_files_only=True, trust_remote_code=trust_remote_code)
    if gguf:
        tok, model = _load_gguf(folder, gguf, dtype, common)
        return tok, model, [folder / gguf]
    tok = load_tokenizer(folder, trust_remote_code=trust_remote_code)
    files = _check_folder_weights(folder)
    # use_safetensors=True: never unpickle .bin weights
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, use_safetensors=True,
                                                 **common)
    # transformers casts an int8 tensor to the model's dtype without a word
    floating = {k for k, v in model.state_dict().items() if v.is_floating_point()}
    for f in files:
        check_floating(f, floating)
    return tok, model, files


class SoftmaxAdapter(HFBase):
    """A transformers causal LM behind the evalkit protocol, with the KV cache as state."""

    def __init__(self, path: str | os.PathLike, *, name: str | None = None, device: str = "cpu",
                 dtype: Any = "fp32", trust_remote_code: bool = False, window: int | None = None,
                 kv_budget_bytes: int | None = None, match_state_of: str | None = None,
                 sink: int = 0, sinks: int | None = None, keep_heads: int | None = None,
                 heads: str | None = None,
                 max_length: int | None = None, trained_length: int | None = None,
                 prefill_chunk: int = 2048,
                 score_batch: int = 32, score_batch_bytes: int = 2 << 30,
                 extra_identity: dict | None = None) -> None:
        self.path = str(Path(path).expanduser())
        folder, gguf = split_path(path)
        self._set_options(dtype, device, trust_remote_code, prefill_chunk, extra_identity)
        self.score_batch = max(1, int(score_batch))  # continuations scored in one forward
        self.score_batch_bytes = int(score_batch_bytes)  # memory for their cache copies + logits

        self._set_model(*load_causal_lm(folder, gguf, self.dtype,
                                        trust_remote_code=self.trust_remote_code))
        self._cache_kw = kv_cache.cache_kwarg(self.model)
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters

        # the positional range (facts.py); the trained length only when given: past its range
        # a softmax model is flagged over-length already
        cfg_max = hf_facts(self.model.config, source=folder).max_length
        self.max_length = int(max_length) if max_length is not None else cfg_max
        self.trained_length = None if trained_length is None else int(trained_length)

        self._full_profile = kv_profile(self.model)
        self.sink = int(sink)
        self.match_state_of = match_state_of
        if match_state_of is not None:  # memory-matched: the KV budget of another model's state
            if kv_budget_bytes is not None:
                raise ValueError("pass either kv_budget_bytes or match_state_of, not both")
            kv_budget_bytes = matched_state_bytes(match_state_of)
        if kv_budget_bytes is not None:
            if window is not None:
                raise ValueError("pass either window or kv_budget_bytes, not both")
            window = matched_window(int(kv_budget_bytes), self._full_profile.bytes_per_token)
        self.kv_budget_bytes = None if kv_budget_bytes is None else int(kv_budget_bytes)
        self.window = None if window is None else int(window)
        base = name or (Path(gguf).stem if gguf else folder.name)
        self.name = base
        self.policy: mem.MemoryPolicy | None = None
        self.sinks, self.keep_heads, self.heads, self._heads_record = None, None, None, None
        if sinks is not None or keep_heads is not None:
            self._set_policy(sinks, keep_heads, heads)
        elif heads is not None:
            raise ValueError("heads (an `evalkit heads` file) is only meaningful with keep_heads")
        elif self.window is not None:
            self._check_window_support()
        elif self.sink:
            raise ValueError("sink is only meaningful with window or kv_budget_bytes")
        prof = self._full_profile
        # window mode has only full-attention layers, each capped at the window
        self._profile = (KVProfile(prof.per_token, prof.const, (self.window,) * len(prof.cap))
                         if self.window is not None and self.policy is None else prof)

        if self.policy is not None:
            self.name += "[" + (f"keep_heads={self.keep_heads}," if self.keep_heads is not None
                                else "") + f"window={self.window},sinks={self.sinks}]"
        elif self.window is not None:
            self.name += f"[window={self.window}" + (f",sink={self.sink}" if self.sink else "") + "]"
        self._eos = eos_ids(self.model, self.tokenizer)
        dyn, sliding = kv_cache.cache_classes()
        probe_cache = self._new_cache()
        # Shallow copies are safe only for layers that update by concatenation (new tensors).
        self._functional_cache = all(type(layer) in (dyn, sliding, mem.PolicyLayer)
                                     for layer in probe_cache.layers)
        # kv, or kv-window for a model of sliding layers only: measured from one token's cache
        self.state_kind = ("kv-window" if self.window is not None and self.policy is None
                           else self.state_parts(self.prefill([0])).kind)

    # -- setup helpers

    def _check_window_support(self) -> None:
        dyn, _ = kv_cache.cache_classes()
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if not 0 <= self.sink < self.window:
            raise ValueError(f"sink must satisfy 0 <= sink < window ({self.window}), got {self.sink}")
        layers = kv_cache.new_cache(self.model).layers
        if not layers or any(type(layer) is not dyn for layer in layers):
            raise ValueError(f"window/kv_budget_bytes needs a model whose layers are all full "
                             f"attention; {self.model.config.model_type} has sliding or linear "
                             f"cache layers")
        impl = getattr(self.model.config, "_attn_implementation", None)
        if impl not in ("sdpa", "eager"):
            raise ValueError(f"window/kv_budget_bytes needs attn_implementation sdpa or eager "
                             f"(a custom 4-D mask); this model uses {impl!r}")
        self._attn_impl = impl

    def _set_policy(self, sinks: int | None, keep_heads: int | None, heads: str | None) -> None:
        """A memory policy (policy.py): `window` is then the twins' window (the query counted)
        beside `sinks` first tokens, for every KV head but the `keep_heads` best."""
        if self.window is None:
            raise ValueError("sinks and keep_heads need window=W (the tokens a bounded head "
                             "sees, the query counted)")
        if self.sink or self.kv_budget_bytes is not None:
            raise ValueError("sinks/keep_heads set a memory policy; sink, kv_budget_bytes and "
                             "match_state_of set a KV budget: pass one or the other")
        self.sinks = 0 if sinks is None else int(sinks)
        dyn, _ = kv_cache.cache_classes()
        layers = kv_cache.new_cache(self.model).layers
        if not layers or any(type(layer) is not dyn for layer in layers):
            raise ValueError(f"a memory policy needs a model whose layers are all full "
                             f"attention; {self.model.config.model_type} has sliding or linear "
                             f"cache layers")
        cfg = self.model.config
        n_kv = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        full: tuple[tuple[int, ...], ...] = ((),) * len(layers)
        if keep_heads is not None:
            self.keep_heads = int(keep_heads)
            if heads is not None:
                self.heads = str(Path(heads).expanduser().resolve())
                doc = heads_file.read(self.heads, weights_hash=self._weights_hash(),
                                      n_layers=len(layers), n_kv_heads=n_kv)
                source = f"file sha256 {file_sha256(self.heads)}"
            else:  # measured here, with the selection defaults (recorded in the identity)
                from evalkit.retrieval_heads import measure  # core: the needle probes and the record

                doc = measure(self)
                source = "computed at load"
            full = heads_file.top_heads(doc["kv_ranking"], self.keep_heads, len(layers))
            self._heads_record = heads_file.summary(doc, source)
        self.policy = mem.MemoryPolicy(self.window, self.sinks, full, n_kv)
        self._head_bytes = mem.kv_head_bytes(self._full_profile, n_kv)
        mem.install(self.model)

    def _weights_hash(self) -> str:
        from evalkit.model_adapters.weights import weights_hash
        return weights_hash(self._weight_files)

    # -- core forward

    @torch.inference_mode()
    def _forward(self, cache: Any, start: int, rows: Sequence[Sequence[int]], all_logits: bool
                 ) -> torch.Tensor:
        """Run equal-length id rows at absolute positions start.. through the model, updating
        `cache` (batch = len(rows)) in place, chunk by chunk. Returns fp32 logits:
        [B, n, V] if all_logits else [B, V] for the last position."""
        n = len(rows[0])
        x_all = torch.tensor([list(r) for r in rows], dtype=torch.long, device=self.device)
        outs: list[torch.Tensor] = []
        last = None
        for i in range(0, n, self.prefill_chunk):
            x = x_all[:, i: i + self.prefill_chunk]
            pos0, q = start + i, x.shape[1]
            kw: dict[str, Any] = {
                self._cache_kw: cache,
                "use_cache": True,
                "position_ids": torch.arange(pos0, pos0 + q, device=self.device)[None].expand(len(rows), q),
            }
            if self.policy is not None:
                kw[mem.CACHE_KWARG] = cache
            elif self.window is not None:
                kw["attention_mask"] = kv_cache.window_mask(
                    pos0, q, kv_cache.cached_len(cache), window=self.window, sink=self.sink,
                    attn_impl=self._attn_impl, dtype=self.dtype, device=self.device)
            if self._keeps_logits:
                kw["logits_to_keep"] = 0 if all_logits else 1
            logits = self.model(input_ids=x, **kw).logits
            if self.policy is not None:
                mem.evict(cache)
            elif self.window is not None:
                kv_cache.evict(cache, window=self.window, sink=self.sink)
            if all_logits:
                outs.append(logits.float())
            else:
                last = logits[:, -1].float()
        return torch.cat(outs, dim=1) if all_logits else last

    def _feed(self, cache: Any, start: int, ids: Sequence[int], all_logits: bool
              ) -> tuple[Any, torch.Tensor]:
        """One row through `_forward` (the cache is updated in place)."""
        return cache, self._forward(cache, start, [ids], all_logits)[0]

    def _new_cache(self) -> Any:
        if self.policy is not None:
            return mem.new_cache(self.model, self.policy)
        return kv_cache.new_cache(self.model)

    def _copy_cache(self, cache: Any) -> Any:
        return kv_cache.copy_cache(cache, clone=True)

    def _scratch_cache(self, cache: Any) -> Any:
        """A cache to run ahead on without touching `cache` (shares tensors when that is safe)."""
        return kv_cache.copy_cache(cache, clone=not self._functional_cache)

    # -- protocol (prefill, extend, fork and generate: HFBase)

    def score(self, state: HFState, continuations: Sequence[Sequence[int]]) -> list[float]:
        conts, scores = self._first_token_scores(state, continuations)
        multi = sorted((i for i, c in enumerate(conts) if len(c) > 1), key=lambda i: len(conts[i]))
        if not multi:
            return scores
        self._check_room(state.length + len(conts[multi[-1]]) - 1, "score")
        # Continuations run as one batch on a shared copy of the cache (decoding is memory-bound,
        # so a batch costs about one pass), in groups whose cache copies + logits fit the budget.
        longest = len(conts[multi[-1]]) - 1
        per_item = self.state_bytes(state) + 3 * longest * self._vocab * 4
        group = max(1, min(self.score_batch, self.score_batch_bytes // per_item))
        if not self._functional_cache:
            group = 1  # caches updated in place cannot share a batch-expanded view
        for g in range(0, len(multi), group):
            idx = multi[g: g + group]
            width = len(conts[idx[-1]]) - 1
            # right padding: pads come after every real token, so causal attention never sees them
            rows = [conts[i][:-1] + [0] * (width - len(conts[i]) + 1) for i in idx]
            scratch = kv_cache.expand_batch(self._scratch_cache(state.cache), len(idx))
            logits = self._forward(scratch, state.length, rows, all_logits=True)
            lp = torch.log_softmax(logits, dim=-1)
            for b, i in enumerate(idx):
                tgt = torch.tensor(conts[i][1:], device=lp.device)
                scores[i] += lp[b, : len(tgt)].gather(1, tgt[:, None]).sum().item()
        return scores

    def state_tensors(self, state: HFState) -> list[torch.Tensor]:
        """The tensors `state_bytes` counts (the KV cache; not the logits)."""
        return [t for layer in state.cache.layers for t in kv_cache.layer_tensors(layer)]

    def state_bytes(self, state: HFState) -> int:
        return sum(t.nbytes for t in self.state_tensors(state))

    def state_parts(self, state: HFState) -> StateBytes:
        """The cache's bytes by part (an unknown cache layer class is an UnknownCacheError);
        with a window every KV row is bounded by it; under a policy, the bounded heads' rows
        are the window part and the whole heads' the growing part."""
        if self.policy is not None:
            layers = state.cache.layers
            return StateBytes(window=sum(l.win_keys.nbytes + l.win_values.nbytes for l in layers),
                              growing=sum(l.keys.nbytes + l.values.nbytes for l in layers))
        parts = cache_state(state.cache)
        if self.window is not None:
            return StateBytes(fixed=parts.fixed, window=parts.window + parts.growing,
                              recurrent=parts.recurrent)
        return parts

    # -- description

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one more token adds to a full (unwindowed) cache."""
        return self._full_profile.bytes_per_token

    def state_bytes_at(self, n_tokens: int) -> int:
        """Analytic state bytes after `n_tokens` tokens (equals the measured value)."""
        if self.policy is not None:
            return mem.bytes_at(self.policy, self._head_bytes, int(n_tokens))
        return self._profile.bytes_at(int(n_tokens))

    def identity(self) -> dict:
        policy = {}
        if self.policy is not None:  # the policy's own fields (absent for the parent and budgets)
            policy = {"sinks": self.sinks, "keep_heads": self.keep_heads,
                      "whole_heads": [[l, h] for l, hs in enumerate(self.policy.full) for h in hs],
                      "heads": self._heads_record}
        return self._identity("softmax", window=self.window,
                              sink=self.sink if self.window is not None and self.policy is None
                              else None,
                              kv_budget_bytes=self.kv_budget_bytes,
                              match_state_of=self.match_state_of, **policy)
