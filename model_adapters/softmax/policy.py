"""Memory policies: which past keys and values each KV head of a softmax model keeps.

A policy gives every KV head of every layer one of two memories:
- whole: every past token (the parent's cache, for that head);
- bounded: the first `sinks` tokens and a window of the last `window` tokens, the query itself
  counted -- the twins' attention exactly (gla/sinks.py, mixers.Attention): a query at
  position t sees keys at p < S and t - W < p <= t.

    window=64,sinks=4              every head bounded (smollm2-135m-swa-w64-s4's attention)
    keep_heads=27,window=64,sinks=4  the 27 best-scoring KV heads whole, the rest bounded
                                   (DuoAttention, arXiv 2410.10819; heads from `evalkit heads`)

State: per layer a PolicyLayer holding the whole heads' keys/values [B, F, n, d] and the bounded
heads' [B, H_kv - F, <= S + W - 1, d] (what the next query can still see: a bounded head never
stores a key no future query will read), so state bytes are what each head keeps, measured
from the tensors.

Attention runs through a transformers attention function of our own (registered as
"evalkit_memory_policy"): the whole heads take the parent's sdpa call (causal, no mask on a
fresh prefill) and the bounded heads one sdpa call over their short key list with a position
mask, so a policy's prefill does no more work than the parent's (never an eager T x T path).
The mask is a pure function of positions, so a sequence split into any prefill / extend calls,
or forked, sees the same keys as one fresh prefill.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

ATTN_NAME = "evalkit_memory_policy"
CACHE_KWARG = "evalkit_policy_cache"  # how the attention function reaches the layer's storage


@dataclass(frozen=True)
class MemoryPolicy:
    """`full[l]`: the KV heads of layer l that keep the whole context; every other head keeps
    `sinks` + `window` (the query counted)."""

    window: int
    sinks: int
    full: tuple[tuple[int, ...], ...]
    n_kv_heads: int

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1 token, got {self.window}")
        if self.sinks < 0:
            raise ValueError(f"sinks must be >= 0, got {self.sinks}")
        for layer, heads in enumerate(self.full):
            bad = [h for h in heads if not 0 <= h < self.n_kv_heads]
            if bad or len(set(heads)) != len(heads) or list(heads) != sorted(heads):
                raise ValueError(f"layer {layer}: whole heads {list(heads)} must be distinct, "
                                 f"sorted KV head indices in [0, {self.n_kv_heads})")

    @property
    def n_full(self) -> int:
        return sum(len(h) for h in self.full)

    def kept(self, n_seen: int) -> tuple[int, int]:
        """(a, b): after n_seen tokens a bounded head keeps positions [0, a) and [b, n_seen)."""
        a = min(self.sinks, n_seen)
        return a, max(a, n_seen - (self.window - 1))

    def kept_tokens(self, n_seen: int) -> int:
        a, b = self.kept(n_seen)
        return a + n_seen - b


def kv_head_bytes(profile: Any, n_kv_heads: int) -> tuple[int, ...]:
    """Bytes one token adds to one KV head of each layer (keys and values)."""
    out = []
    for per_token in profile.per_token:
        if per_token % n_kv_heads:
            raise ValueError(f"a layer's {per_token} KV bytes per token do not split over "
                             f"{n_kv_heads} KV heads")
        out.append(per_token // n_kv_heads)
    return tuple(out)


def bytes_at(policy: MemoryPolicy, per_head: tuple[int, ...], n_tokens: int) -> int:
    """Analytic state bytes after n_tokens (equals the measured tensors)."""
    bounded = policy.kept_tokens(n_tokens)
    return sum(b * (len(f) * n_tokens + (policy.n_kv_heads - len(f)) * bounded)
               for b, f in zip(per_head, policy.full))


def _empty(like: torch.Tensor, heads: int) -> torch.Tensor:
    return like.new_empty(like.shape[0], heads, 0, like.shape[-1])


def _layer_base():
    from transformers.cache_utils import DynamicLayer
    return DynamicLayer


class PolicyLayer(_layer_base()):
    """One layer's cache under a policy: `keys`/`values` hold the whole heads, `win_keys`/
    `win_values` the bounded heads. Updates concatenate (new tensors, never in place), so a
    shallow copy that shares tensors is safe."""

    def __init__(self, policy: MemoryPolicy, layer: int) -> None:
        super().__init__()
        self.policy = policy
        full = policy.full[layer]
        self._full = list(full)
        self._bounded = [h for h in range(policy.n_kv_heads) if h not in full]
        self._seen = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.keys, self.values = _empty(key_states, len(self._full)), _empty(value_states, len(self._full))
        self.win_keys = _empty(key_states, len(self._bounded))
        self.win_values = _empty(value_states, len(self._bounded))
        self.is_initialized = True

    def _split(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._bounded:
            return t, t[:, :0]
        if not self._full:
            return t[:, :0], t
        return t[:, self._full], t[:, self._bounded]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        kf, kb = self._split(key_states)
        vf, vb = self._split(value_states)
        self.keys, self.values = torch.cat([self.keys, kf], -2), torch.cat([self.values, vf], -2)
        self.win_keys = torch.cat([self.win_keys, kb], -2)
        self.win_values = torch.cat([self.win_values, vb], -2)
        self._seen += key_states.shape[-2]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._seen

    def evict(self) -> None:
        """Drop the bounded heads' keys no later query can see (after each forward)."""
        if not self.is_initialized:
            return
        a, b = self.policy.kept(self._seen)
        n = self.win_keys.shape[-2]
        keep = a + self._seen - b
        if n == keep:
            return
        first = self._seen - n  # position of the oldest stored entry past the sinks' block
        lo = b - first           # index of position b in the stored list (sinks come first)
        # torch.cat copies: the evicted rows' storage is freed (state bytes are real)
        self.win_keys = torch.cat([self.win_keys[..., :a, :], self.win_keys[..., lo:, :]], -2)
        self.win_values = torch.cat([self.win_values[..., :a, :], self.win_values[..., lo:, :]], -2)

    def bounded_positions(self, n_new: int, device: torch.device) -> torch.Tensor:
        """Absolute positions of the stored bounded entries (after this forward's update)."""
        start = self._seen - n_new
        a, b = self.policy.kept(start)
        pos = torch.cat([torch.arange(a, device=device), torch.arange(b, self._seen, device=device)])
        if pos.numel() != self.win_keys.shape[-2]:
            raise RuntimeError(f"policy cache out of step: {self.win_keys.shape[-2]} bounded "
                               f"entries stored, {pos.numel()} expected after {self._seen} tokens "
                               f"(a forward without eviction?)")
        return pos

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a memory-policy cache cannot be cropped")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("a memory-policy cache is expanded by evalkit's kv_cache")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("a memory-policy cache is expanded by evalkit's kv_cache")


def new_cache(model: Any, policy: MemoryPolicy) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    cache.layers = [PolicyLayer(policy, i) for i in range(len(cache.layers))]
    return cache


def evict(cache: Any) -> None:
    for layer in cache.layers:
        layer.evict()


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int,
          mask: torch.Tensor | None, causal: bool, scaling: float | None) -> torch.Tensor:
    if groups > 1:
        if mask is None:  # as transformers' sdpa path: GQA in the kernel when unmasked
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scaling,
                                                  enable_gqa=True)
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scaling)


BLOCK = 256  # bounded heads' queries per sdpa call in a long prefill


def _bounded_attention(layer: PolicyLayer, query: torch.Tensor, qpos: torch.Tensor, groups: int,
                       scaling: float | None) -> torch.Tensor:
    """The bounded heads over their stored sinks + window, query block by query block: a block
    of B queries reads the sinks and the B + W - 1 keys ending at its last query, so a prefill
    of T tokens costs T * (S + W + B) scores, not T * T."""
    p = layer.policy
    kpos = layer.bounded_positions(qpos.numel(), query.device)
    a = min(p.sinks, int(kpos.numel()))
    a = int((kpos[:a] < p.sinks).sum()) if a else 0   # stored sinks (then a contiguous tail)
    first_tail = int(kpos[a]) if kpos.numel() > a else 0
    outs = []
    for j in range(0, qpos.numel(), BLOCK):
        qp = qpos[j: j + BLOCK]
        lo = max(a, a + int(qp[0]) - (p.window - 1) - first_tail)   # first tail index needed
        hi = a + int(qp[-1]) + 1 - first_tail
        idx = slice(lo, hi)
        k = torch.cat([layer.win_keys[..., :a, :], layer.win_keys[..., idx, :]], -2)
        v = torch.cat([layer.win_values[..., :a, :], layer.win_values[..., idx, :]], -2)
        kp = torch.cat([kpos[:a], kpos[idx]])
        mask = (kp[None, :] <= qp[:, None]) & ((kp[None, :] < p.sinks)
                                              | (kp[None, :] > qp[:, None] - p.window))
        outs.append(_sdpa(query[:, :, j: j + BLOCK], k, v, groups, mask, False, scaling))
    return outs[0] if len(outs) == 1 else torch.cat(outs, 2)


def policy_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: whole heads as the parent, bounded heads over their
    sinks + window. query [B, Hq, q, d] -> ([B, q, Hq, d], None)."""
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise ValueError("memory policies support plain softmax attention only (no softcap or "
                         "learned sinks)")
    cache = kwargs.get(CACHE_KWARG)
    if cache is None:
        raise RuntimeError(f"the memory-policy attention needs the policy cache "
                           f"(keyword {CACHE_KWARG}); run the model through SoftmaxAdapter")
    layer: PolicyLayer = cache.layers[module.layer_idx]
    _, Hq, q, _ = query.shape
    n_kv = layer.policy.n_kv_heads
    groups = Hq // n_kv
    n = layer._seen
    dv = layer.values.shape[-1]
    qpos = torch.arange(n - q, n, device=query.device)

    def heads(kv_heads: list[int]) -> torch.Tensor | slice:
        if len(kv_heads) == n_kv:
            return slice(None)
        return torch.tensor([h * groups + j for h in kv_heads for j in range(groups)],
                            device=query.device)

    parts = []
    if layer._full:
        qi = heads(layer._full)
        qf = query[:, qi]
        if n == q or q == 1:  # a fresh prefill (causal) or one query (it sees every key)
            o = _sdpa(qf, layer.keys, layer.values, groups, None, q > 1, scaling)
        else:
            mask = torch.arange(n, device=query.device)[None, :] <= qpos[:, None]
            o = _sdpa(qf, layer.keys, layer.values, groups, mask, False, scaling)
        parts.append((qi, o))
    if layer._bounded:
        qi = heads(layer._bounded)
        parts.append((qi, _bounded_attention(layer, query[:, qi], qpos, groups, scaling)))
    if len(parts) == 1:
        out = parts[0][1]
    else:
        out = query.new_empty(parts[0][1].shape[0], Hq, q, dv)
        for qi, o in parts:
            out[:, qi] = o
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make "evalkit_memory_policy" a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, policy_attention)


def install(model: Any) -> None:
    """Route the model's attention through the policy function."""
    register()
    model.set_attn_implementation(ATTN_NAME)
