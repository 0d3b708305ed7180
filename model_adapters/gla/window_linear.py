"""WindowLinearAttention: a softmax attention layer linearized beyond a window (LoLCATs,
arXiv 2410.10254; Liger's key gate, arXiv 2503.01496). The config's `window_linear` key picks
the layers; heads, kv heads, bias and rotary are the `attn` spec's, and the q/k/v/o
projections carry attention's parameter names, so a parent's attention weights load as they
are. Same call as every mixer: (x [B, T, D], LayerState | None, valid, want_state) ->
(out [B, T, D], LayerState | None).

Each query sees the last `window` tokens (itself included) and the first `sinks` tokens
exactly, and the others through a state: a gated linear state (`state: gla`,
ops/window_linear/ has the combination) or a gated delta-rule memory (`state: gated_delta`,
ops/window_delta/). Settings (window_linear_config.py):
    window        W, tokens of exact softmax attention (counting the current one)
    sinks         S, the first S tokens kept exact beside the window, at their true positions
    feature_map   "hedgehog": LoLCATs' learned per-head map phi(x) = [softmax(xW), softmax(-xW)],
                  W [H, d, feature_dim], separate maps for q and k (identity at init when
                  feature_dim = d); "softmax": the same with W = I, no parameters
    feature_dim   hedgehog's features per half (64: 128 features per head)
    gate          "key": Liger's forget gate from the key projection, no parameters,
                  log a = mean_c logsigmoid(k_c) / gate_logit_normalizer (one scalar per head,
                  Liger's pooling for scalar-gated states); "learned": logsigmoid(x W_g + b) /
                  gate_logit_normalizer, W_g [D, H]; "none": no forgetting (LoLCATs)
    mix           the window weight per head at init, w = sigmoid(mix_logit), (1 - w) for the
                  linear part; only the ratio w / (1 - w) matters after normalising. For a
                  delta-rule state, 1 - mix is the look-back weight at init.

The gated delta-rule state (Gated DeltaNet, arXiv 2412.06464; initialised from the parent as
fla-org/hybrid-distillation does: the heads' own q and k, k and v repeated over the KV groups)
reads the parent's queries and the leaving token's key before rotary (a memory must not depend
on how far back a fact is), each through a learned per-head map [H, d, d] (identity at init)
and L2-normalised. Write strength b = sigmoid(k W_b + b_b) from that key, decay from `gate`,
look-back weight lam = sigmoid(x W_l + b_l) (b_l = logit(1 - mix) at init).

`state_off` (set on the module, never saved: `--model-args state_off=true`) switches the state
off: the layer is then softmax over the sinks and the window alone, the twin's own reference
(arXiv 2510.05901: hybrids learn to ignore their linear branch).

`sparse` (set on the module, never saved: `--model-args sparse=16`; sparse_cache.py, the op in
ops/window_sparse/) adds LoLA's bounded sparse cache (arXiv 2505.23666): each query head also
keeps up to N older tokens exactly, the N its state recalls worst. A token leaving the window
is scored against the state as it stands then: the delta rule's || vd - S^T kd ||, GLA's
normalised read-out || v - phi_k(k) S[:, :d] / phi_k(k) S[:, d] || (what the linear branch
alone answers for that key; the raw sum would measure how much the state holds, not how well
it recalls). The cache keeps the N largest errors; the smallest among the cache and the newcomer
enters the state at that step, as every leaving token does without a cache, so sparse=0 is this
layer unchanged. Cache tokens join the sinks and the window in the one softmax normalisation.

State: the window's K, V [B, H_kv, min(seen, W), d] and the sinks' [B, H_kv, min(seen, S), d]
(rotated keys, fp32; sinks.py) as `kv`, the state as `recurrent` (GLA [B, H, F, d + 1], the
last column the normaliser; delta rule [B, H, d, d]), tokens seen as `seen`, with sparse=N
the cache as `sparse` (K, V [B, H, n, d], errors, positions [B, H, n], n <= N). A state without
`recurrent` (the model's empty_state) reads as zeros.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.mixers import rotate
from evalkit.model_adapters.gla.sinks import gather, repeat_heads
from evalkit.model_adapters.gla.sparse_cache import sparse_forward
from evalkit.model_adapters.gla.state import STATE_DTYPE, LayerState
from evalkit.model_adapters.gla.ops.window_delta import chunk_window_delta, naive_window_delta
from evalkit.model_adapters.gla.ops.window_linear import (chunk_window_linear, naive_window_linear,
                                                         window_softmax)

# A learned gate starts input-independent, each head with its own half-life, log-spaced from
# the shortest to the longest below (Gated DeltaNet and Mamba-2 draw each head's time step
# log-uniformly for the same reason: a spread of memories, some short and some as long as the
# context). Liger's key gate has no parameters and, on SmolLM2's keys, forgets a fact within
# about 10 tokens of its leaving the window in every head (measured: half-lives 7-15 tokens),
# which no training can lengthen.
LEARNED_HALF_LIVES = (64.0, 8192.0)


def learned_gate_bias(heads: int, normalizer: float) -> torch.Tensor:
    """[H] biases b with logsigmoid(b) / normalizer = log(1/2) / half-life, the half-lives
    log-spaced over LEARNED_HALF_LIVES."""
    lo, hi = LEARNED_HALF_LIVES
    life = torch.logspace(math.log10(lo), math.log10(hi), heads, dtype=torch.float64) \
        if heads > 1 else torch.tensor([math.sqrt(lo * hi)], dtype=torch.float64)
    # logsigmoid(b) = -softplus(-b) = normalizer * log(1/2) / life
    return -torch.log(torch.expm1(normalizer * math.log(2) / life)).float()


class WindowLinearAttention(nn.Module):
    def __init__(self, cfg: GLAConfig) -> None:
        super().__init__()
        a, w, h = cfg.attn_spec, cfg.window_linear_spec, cfg.hidden_size
        self.H, self.Hkv = a["num_heads"], a["num_kv_heads"]
        self.d = h // self.H
        self.window, self.sinks, self.kind = w["window"], w["sinks"], w["state"]
        self.theta = None if a["rope_theta"] is None else float(a["rope_theta"])
        self.feature_map, self.gate = w["feature_map"], w["gate"]
        self.gate_normalizer = float(cfg.gate_logit_normalizer)
        self.F = cfg.window_linear_features
        self.q_proj = nn.Linear(h, self.H * self.d, bias=a["qkv_bias"])
        self.k_proj = nn.Linear(h, self.Hkv * self.d, bias=a["qkv_bias"])
        self.v_proj = nn.Linear(h, self.Hkv * self.d, bias=a["qkv_bias"])
        self.o_proj = nn.Linear(self.H * self.d, h, bias=False)
        if self.kind == "gated_delta":
            self.q_map = nn.Parameter(torch.eye(self.d).repeat(self.H, 1, 1))     # [H, d, d]
            self.k_map = nn.Parameter(torch.eye(self.d).repeat(self.H, 1, 1))
            self.b_key = nn.Parameter(torch.zeros(self.H, self.d))                # b = 0.5 at init
            self.b_bias = nn.Parameter(torch.zeros(self.H))
            self.l_proj = nn.Linear(h, self.H, bias=True)
            nn.init.zeros_(self.l_proj.weight)
            nn.init.constant_(self.l_proj.bias, math.log((1 - w["mix"]) / w["mix"]))
        else:
            if self.feature_map == "hedgehog":
                f = w["feature_dim"]
                self.q_map = nn.Parameter(self._map_init(f))
                self.k_map = nn.Parameter(self._map_init(f))
            self.mix_logit = nn.Parameter(torch.full((self.H,), math.log(w["mix"] / (1 - w["mix"]))))
        if self.gate == "learned":
            self.g_proj = nn.Linear(h, self.H, bias=True)
            nn.init.zeros_(self.g_proj.weight)
            with torch.no_grad():
                self.g_proj.bias.copy_(learned_gate_bias(self.H, self.gate_normalizer))
        # Which implementation runs: "chunk" (default) or "naive" (the reference).
        self.mode, self.chunk_size = "chunk", 64
        self.state_off = False
        # sparse=N (sparse_cache.py): N tokens the state recalls worst, kept exact; never saved
        self.sparse = 0
        # A list to keep what each forward writes into the state (evalkit.training.state_anatomy
        # replays the memory from it), or None: never saved, off unless a measurement sets it.
        self.record: list[dict[str, torch.Tensor]] | None = None

    def _map_init(self, f: int) -> torch.Tensor:
        if f == self.d:
            return torch.eye(self.d).repeat(self.H, 1, 1)                     # [H, d, f]
        return torch.randn(self.H, self.d, f) * self.d ** -0.5

    def features(self, x: torch.Tensor, which: str) -> torch.Tensor:
        """[B, H, T, d] -> [B, H, T, F]."""
        x = x.float()
        if self.feature_map == "hedgehog":
            x = torch.einsum("bhtd,hdf->bhtf", x, getattr(self, which).float())
        return torch.cat([x.softmax(-1), (-x).softmax(-1)], -1)

    def log_gate(self, x: torch.Tensor, k_raw: torch.Tensor) -> torch.Tensor:
        """Log forget gate [B, H, T] from the layer input x [B, T, D] or the unrotated keys
        k_raw [B, T, H_kv, d]."""
        B, T, _ = x.shape
        if self.gate == "none":
            return x.new_zeros(B, self.H, T, dtype=torch.float32)
        if self.gate == "key":
            g = F.logsigmoid(k_raw.float()).mean(-1).transpose(1, 2)           # [B, Hkv, T]
            g = g.repeat_interleave(self.H // self.Hkv, 1)
        else:
            g = F.logsigmoid(self.g_proj(x).float()).transpose(1, 2)           # [B, H, T]
        return g / self.gate_normalizer

    def empty_memory(self, B: int, x: torch.Tensor) -> torch.Tensor:
        cols = self.d if self.kind == "gated_delta" else self.d + 1
        return x.new_zeros(B, self.H, self.F, cols, dtype=STATE_DTYPE)

    def forward(self, x: torch.Tensor, state: LayerState | None = None,
                valid: torch.Tensor | None = None, want_state: bool = False
                ) -> tuple[torch.Tensor, LayerState | None]:
        B, T, _ = x.shape
        H, Hkv, d, W = self.H, self.Hkv, self.d, self.window
        if want_state and valid is not None and bool((valid != T).any()):
            raise ValueError("window_linear layers keep a state only for unpadded rows "
                             "(prefill such models one sequence at a time)")
        q_raw = self.q_proj(x).view(B, T, H, d).transpose(1, 2)             # [B, H, T, d]
        k_raw = self.k_proj(x).view(B, T, Hkv, d)
        q, k = q_raw, k_raw.transpose(1, 2)                                  # [B, Hkv, T, d]
        v = self.v_proj(x).view(B, T, Hkv, d).transpose(1, 2)
        start = state.seen if state is not None else 0
        pos = torch.arange(start, start + T, device=x.device)
        if self.theta is not None:
            q, k = rotate(q, pos, self.theta), rotate(k, pos, self.theta)
        keys = gather(state, k, v, self.sinks)
        groups = H // Hkv
        kr, vr = repeat_heads(keys.k, groups), repeat_heads(keys.v, groups)  # [B, H, L+T, d]
        sinks = {"n_sink": keys.n_sink, "sink_k": repeat_heads(keys.sink_k, groups),
                 "sink_v": repeat_heads(keys.sink_v, groups)}
        # the token leaving the window at step t is key index t + L - W; it enters the state
        # unless it is a sink (index < n_sink) or there is none (index < 0)
        idx = torch.arange(T, device=x.device) + keys.L - W
        has = (idx >= keys.n_sink).view(1, 1, T, 1)
        S0 = (state.recurrent if state is not None and state.recurrent is not None
              else self.empty_memory(B, x))
        kw = {} if self.mode == "naive" else {"chunk_size": self.chunk_size}
        cache = ()
        if self.state_off:
            o, S = window_softmax(q, kr, vr, W, chunk_size=self.chunk_size, **sinks)[0], S0
        elif self.sparse:
            o, S, cache = sparse_forward(self, x, q_raw, k_raw, q, kr, vr, keys, sinks, state,
                                         start, S0)
        elif self.kind == "gated_delta":
            o, S = self._delta(x, q_raw, k_raw, q, kr, vr, idx, has, pos - W, S0, sinks, kw)
        else:
            ke, ve = kr[:, :, idx.clamp(min=0)], vr[:, :, idx.clamp(min=0)]  # [B, H, T, d]
            fk = torch.where(has, self.features(ke, "k_map"), 0.0)
            u = torch.where(has, ve.float(), 0.0)
            log_a = self.log_gate(x, k_raw)
            self._keep(key=fk, value=u, log_a=log_a, has=has[0, 0, :, 0],
                       state_weight=1 - torch.sigmoid(self.mix_logit.detach()))
            op = naive_window_linear if self.mode == "naive" else chunk_window_linear
            o, S = op(q, kr, vr, self.features(q, "q_map"), fk, u, log_a,
                      torch.sigmoid(self.mix_logit), W, S0, **sinks, **kw)
        o = self.o_proj(o.to(x.dtype).transpose(1, 2).reshape(B, T, H * d))
        if not want_state:
            return o, None
        return o, LayerState(S.to(STATE_DTYPE), kv=keys.next_kv(W, self.sinks),
                             seen=start + T, window=W, sparse=cache)

    def _delta(self, x, q_raw, k_raw, q, kr, vr, idx, has, leaving_pos, S0, sinks, kw):
        """The gated delta-rule state's read-out mixed into the window (ops/window_delta)."""
        ke, ve = kr[:, :, idx.clamp(min=0)], vr[:, :, idx.clamp(min=0)]      # rotated keys
        if self.theta is not None:  # back to the key before rotary, at its own position
            ke = rotate(ke, -leaving_pos, self.theta)
        ke = ke.float()
        kd = F.normalize(torch.einsum("bhtd,hde->bhte", ke, self.k_map.float()), dim=-1)
        qd = F.normalize(torch.einsum("bhtd,hde->bhte", q_raw.float(), self.q_map.float()), dim=-1)
        beta = torch.sigmoid(torch.einsum("bhtd,hd->bht", ke, self.b_key.float())
                             + self.b_bias.float()[:, None])
        h = has[..., 0].float()                                               # [1, 1, T]
        lam = torch.sigmoid(self.l_proj(x).float()).transpose(1, 2) * h      # [B, H, T]
        kd, vd, log_a = torch.where(has, kd, 0.0), torch.where(has, ve.float(), 0.0), \
            self.log_gate(x, k_raw)
        beta = beta * h
        self._keep(key=kd, value=vd, log_a=log_a, has=has[0, 0, :, 0], beta=beta, lookback=lam)
        op = naive_window_delta if self.mode == "naive" else chunk_window_delta
        return op(q, kr, vr, qd, kd, vd, log_a, beta, lam, self.window, S0, **sinks, **kw)

    def _keep(self, **inputs: torch.Tensor) -> None:
        """What this forward writes into the state, for a measurement that set `record`:
        key / value [B, H, T, .] of the token entering at each step, log_a [B, H, T], has [T]
        (a token enters at that step), and the delta rule's beta / lookback [B, H, T] or
        GLA's state_weight [H] (1 - the window weight at the mix)."""
        if self.record is not None:
            self.record.append({k: v.detach().float() for k, v in inputs.items()})
