"""One forward of a transformers recurrent or hybrid causal LM through its state, whatever holds
it: the cache object the model returns (DynamicCache with linear-attention layers, MiniMaxCache,
xLSTMCache), the tensors it returns as `state` (RWKV), or attributes it sets on its own modules
(RecurrentGemma). How a family passes its state is read from the model (its forward's
parameters and what one forward returns), never from its name.

`Stepper(model)` learns this once; `stepper.forward(holder, ids, start, all_logits)` feeds ids at
positions start.. and returns the new holder and the fp32 logits. Holders are the classes of
model_adapters.cache_state, which counts and forks them.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch

from evalkit.model_adapters.cache_state import ModuleState, TensorState

_OUT_STATE = ("cache", "past_key_values")


class Stepper:
    """How to feed tokens through `model`'s state (learned from one probe forward)."""

    def __init__(self, model: Any) -> None:
        from transformers import DynamicCache

        self.model = model
        params = inspect.signature(model.forward).parameters
        self.state_param = "state" in params and "cache" not in params  # RWKV's tensor list
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.keeps_logits = "logits_to_keep" in params
        self.module_paths: list[str] = []
        self._dynamic_cache = DynamicCache
        if self.state_param:
            return
        # Does the model return its cache? A model that keeps its state on its modules returns
        # none (and sets tensors on them): find those modules from a 1-token forward.
        before = {p: set(_plain_tensors(m)) for p, m in model.named_modules()}
        with torch.inference_mode():
            out = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=_device(model)),
                        use_cache=True, **self._logits_kw(False))
        if self._returned(out) is None:
            self.module_paths = sorted(p for p, m in model.named_modules()
                                       if set(_plain_tensors(m)) - before.get(p, set()))
            self._clear_modules()

    # -- holders

    def _returned(self, out: Any) -> Any:
        for name in _OUT_STATE:
            value = getattr(out, name, None)
            if value is not None:
                return value
        return None

    def _logits_kw(self, all_logits: bool) -> dict:
        return {"logits_to_keep": 0 if all_logits else 1} if self.keeps_logits else {}

    def _modules(self) -> dict[str, Any]:
        named = dict(self.model.named_modules())
        return {p: named[p] for p in self.module_paths}

    def _clear_modules(self) -> None:
        for m in self._modules().values():
            for attr in _plain_tensors(m):
                setattr(m, attr, None)

    def _load_modules(self, holder: ModuleState) -> None:
        for path, m in self._modules().items():
            for attr, t in holder.modules.get(path, {}).items():
                setattr(m, attr, t)

    def _save_modules(self) -> dict[str, dict[str, torch.Tensor]]:
        return {p: {a: getattr(m, a) for a in _plain_tensors(m)} for p, m in self._modules().items()}

    # -- forward

    def forward(self, holder: Any, ids: torch.Tensor, start: int, all_logits: bool
                ) -> tuple[Any, torch.Tensor]:
        """Feed ids ([1, q]) at positions start..; the holder (None before the first forward) is
        updated in place or replaced. Returns (holder, fp32 logits [q, V] or [1, V])."""
        kw: dict[str, Any] = {"use_cache": True, **self._logits_kw(all_logits)}
        q = ids.shape[1]
        if self.state_param:
            kw["state"] = holder.tensors if holder is not None else None
        else:
            kw["position_ids"] = torch.arange(start, start + q, device=ids.device)[None]
            if self.module_paths:
                if holder is None:  # a fresh sequence: the modules start from zero
                    self._clear_modules()
                    holder = ModuleState(self._dynamic_cache(config=self.model.config), {})
                else:
                    self._load_modules(holder)
                kw[self.cache_kw] = holder.cache
            else:
                kw[self.cache_kw] = holder
        out = self.model(input_ids=ids, **kw)
        if self.state_param:
            holder = TensorState(list(out.state))
        elif self.module_paths:
            holder = ModuleState(holder.cache, self._save_modules())
            self._clear_modules()  # no state left behind on the shared model
        else:
            holder = self._returned(out)
        logits = out.logits[0].float() if all_logits else out.logits[0, -1:].float()
        return holder, logits


def _plain_tensors(module: Any) -> list[str]:
    """A module's attributes holding plain tensors (not parameters or buffers): where a model
    keeps a state on its modules."""
    return [k for k, v in vars(module).items()
            if isinstance(v, torch.Tensor) and not k.startswith("_")]


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device
