"""WindowLinearAttention: a softmax attention layer linearized beyond a window (LoLCATs,
arXiv 2410.10254; Liger's key gate, arXiv 2503.01496). The config's `window_linear` key picks
the layers; heads, kv heads, bias and rotary are the `attn` spec's, and the q/k/v/o
projections carry attention's parameter names, so a parent's attention weights load as they
are. Same call as every mixer: (x [B, T, D], LayerState | None, valid, want_state) ->
(out [B, T, D], LayerState | None).

Each query sees the last `window` tokens (itself included) exactly, and the older ones through
a gated linear state; window_linear_ops.py has the combination. Settings:
    window        W, tokens of exact softmax attention (counting the current one)
    feature_map   "hedgehog": LoLCATs' learned per-head map phi(x) = [softmax(xW), softmax(-xW)],
                  W [H, d, feature_dim], separate maps for q and k (identity at init when
                  feature_dim = d); "softmax": the same with W = I, no parameters
    feature_dim   hedgehog's features per half (64: 128 features per head)
    gate          "key": Liger's forget gate from the key projection, no parameters,
                  log a = mean_c logsigmoid(k_c) / gate_logit_normalizer (one scalar per head,
                  Liger's pooling for scalar-gated states); "learned": logsigmoid(x W_g + b) /
                  gate_logit_normalizer, W_g [D, H]; "none": no forgetting (LoLCATs)
    mix           the window weight per head at init, w = sigmoid(mix_logit), (1 - w) for the
                  linear part; only the ratio w / (1 - w) matters after normalising

State: the window's K, V [B, H_kv, min(seen, W), d] (rotated keys, fp32) as `kv`, the linear
state [B, H, F, d + 1] (last column: the normaliser) as `recurrent`, tokens seen as `seen`.
A state without `recurrent` (the model's empty_state) reads as zeros.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.mixers import rotate
from evalkit.model_adapters.gla.state import STATE_DTYPE, LayerState
from evalkit.model_adapters.gla.window_linear_ops import chunk_window_linear, naive_window_linear

# A learned gate starts input-independent at log a = logsigmoid(3) / 16 ~ -0.003 a token
# (half-life ~230 tokens): slow enough not to erase what just left the window.
LEARNED_GATE_BIAS = 3.0


class WindowLinearAttention(nn.Module):
    def __init__(self, cfg: GLAConfig) -> None:
        super().__init__()
        a, w, h = cfg.attn_spec, cfg.window_linear_spec, cfg.hidden_size
        self.H, self.Hkv = a["num_heads"], a["num_kv_heads"]
        self.d = h // self.H
        self.window = w["window"]
        self.theta = None if a["rope_theta"] is None else float(a["rope_theta"])
        self.feature_map, self.gate = w["feature_map"], w["gate"]
        self.gate_normalizer = float(cfg.gate_logit_normalizer)
        self.F = cfg.window_linear_features
        self.q_proj = nn.Linear(h, self.H * self.d, bias=a["qkv_bias"])
        self.k_proj = nn.Linear(h, self.Hkv * self.d, bias=a["qkv_bias"])
        self.v_proj = nn.Linear(h, self.Hkv * self.d, bias=a["qkv_bias"])
        self.o_proj = nn.Linear(self.H * self.d, h, bias=False)
        if self.feature_map == "hedgehog":
            f = w["feature_dim"]
            self.q_map = nn.Parameter(self._map_init(f))
            self.k_map = nn.Parameter(self._map_init(f))
        self.mix_logit = nn.Parameter(torch.full((self.H,), math.log(w["mix"] / (1 - w["mix"]))))
        if self.gate == "learned":
            self.g_proj = nn.Linear(h, self.H, bias=True)
            nn.init.zeros_(self.g_proj.weight)
            nn.init.constant_(self.g_proj.bias, LEARNED_GATE_BIAS)
        # Which implementation runs: "chunk" (default) or "naive" (the reference).
        self.mode, self.chunk_size = "chunk", 64

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

    def forward(self, x: torch.Tensor, state: LayerState | None = None,
                valid: torch.Tensor | None = None, want_state: bool = False
                ) -> tuple[torch.Tensor, LayerState | None]:
        B, T, _ = x.shape
        H, Hkv, d, W = self.H, self.Hkv, self.d, self.window
        if want_state and valid is not None and bool((valid != T).any()):
            raise ValueError("window_linear layers keep a state only for unpadded rows "
                             "(prefill such models one sequence at a time)")
        q = self.q_proj(x).view(B, T, H, d).transpose(1, 2)                 # [B, H, T, d]
        k_raw = self.k_proj(x).view(B, T, Hkv, d)
        k = k_raw.transpose(1, 2)                                            # [B, Hkv, T, d]
        v = self.v_proj(x).view(B, T, Hkv, d).transpose(1, 2)
        start = state.seen if state is not None else 0
        if self.theta is not None:
            pos = torch.arange(start, start + T, device=x.device)
            q, k = rotate(q, pos, self.theta), rotate(k, pos, self.theta)
        if state is not None and state.kv:
            k = torch.cat([state.kv[0].to(k.dtype), k], 2)                   # [B, Hkv, L+T, d]
            v = torch.cat([state.kv[1].to(v.dtype), v], 2)
        L = k.shape[2] - T
        # the token leaving the window at step t is key index t + L - W (none while < 0)
        idx = torch.arange(T, device=x.device) + L - W
        has = (idx >= 0).view(1, 1, T, 1)
        groups = H // Hkv
        kr, vr = (k, v) if groups == 1 else (k.repeat_interleave(groups, 1),
                                             v.repeat_interleave(groups, 1))
        ke, ve = kr[:, :, idx.clamp(min=0)], vr[:, :, idx.clamp(min=0)]      # [B, H, T, d]
        fk = torch.where(has, self.features(ke, "k_map"), 0.0)
        u = torch.where(has, ve.float(), 0.0)
        fq = self.features(q, "q_map")
        S0 = (state.recurrent if state is not None and state.recurrent is not None
              else x.new_zeros(B, H, self.F, d + 1, dtype=STATE_DTYPE))
        op = naive_window_linear if self.mode == "naive" else chunk_window_linear
        kw = {} if self.mode == "naive" else {"chunk_size": self.chunk_size}
        o, S = op(q, kr, vr, fq, fk, u, self.log_gate(x, k_raw), torch.sigmoid(self.mix_logit),
                  W, S0, **kw)
        o = self.o_proj(o.to(x.dtype).transpose(1, 2).reshape(B, T, H * d))
        if not want_state:
            return o, None
        return o, LayerState(S.to(STATE_DTYPE), kv=(k[:, :, -W:].to(STATE_DTYPE),
                                                    v[:, :, -W:].to(STATE_DTYPE)),
                             seen=start + T, window=W)
