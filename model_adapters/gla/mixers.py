"""The other sequence mixers a layer can hold beside GLA: softmax attention and a gated short
convolution. Same call as GatedLinearAttention: (x [B, T, D], LayerState | None, valid,
want_state) -> (out [B, T, D], LayerState | None).

Attention is fla's hybrid layer (fla/layers/attn.py: q/k/v/o projections, rotary embedding on
q and k unless rope_theta is null, an optional sliding window of `window_size` tokens counting
the current one). With a
window, `sinks` S keeps the first S tokens exact beside it (attention sinks, sinks.py). Its
state is the KV cache [B, H_kv, T', d] in fp32, T' = every token seen, or the last
`window_size` with a window (then the S sinks' K, V too), plus the number of tokens seen (the
next rotary position).

The gated convolution is Zoology's BaseConv (arXiv 2312.04927): y = conv(x) * (x W + b), a
depthwise causal convolution of `kernel_size` taps gating a linear projection. Its state is
the last `kernel_size` inputs per channel [B, D, kernel_size], like GLA's conv tails.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.sinks import gather, repeat_heads
from evalkit.model_adapters.gla.state import STATE_DTYPE, LayerState
from evalkit.model_adapters.gla.ops.window_linear import window_softmax


class ShortConvolution(nn.Module):
    """Depthwise causal conv (weight [D, 1, W], fla's parameter layout) followed by SiLU
    (fla's ShortConvolution; activation=False for Zoology's gated convolution).

    The tail is the last W inputs per channel ([B, D, W], newest last), fla's conv cache."""

    def __init__(self, dim: int, kernel_size: int, activation: bool = True) -> None:
        super().__init__()
        self.dim, self.kernel_size = dim, kernel_size
        self.act = F.silu if activation else (lambda t: t)
        self.weight = nn.Parameter(torch.empty(dim, 1, kernel_size))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor, tail: torch.Tensor | None = None,
                valid: torch.Tensor | None = None, want_tail: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T, D = x.shape
        W = self.kernel_size
        xt = x.transpose(1, 2)                                          # [B, D, T]
        prev = (tail.to(x.dtype) if tail is not None
                else x.new_zeros(B, D, W))                              # [B, D, W]
        full = torch.cat([prev, xt], -1)                                # [B, D, W + T]
        if T == 1:  # decoding: a dot product per channel (cheaper than a conv call)
            y = self.act((full[..., 1:] * self.weight.squeeze(1)).sum(-1, keepdim=True))
        else:
            y = self.act(F.conv1d(full[..., 1:], self.weight, groups=D))  # [B, D, T]
        new_tail = None
        if want_tail:
            if valid is None:
                new_tail = full[..., T:]
            else:  # per row, the W inputs ending at its last real token
                idx = valid.view(B, 1, 1) + torch.arange(W, device=x.device).view(1, 1, W)
                new_tail = full.gather(-1, idx.expand(B, D, W))
            new_tail = new_tail.to(STATE_DTYPE)
        return y.transpose(1, 2), new_tail


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (the non-interleaved, rotate-half form) of x [B, H, T, d] at absolute
    positions [T] (or one per entry, [B, H, T]: a twin's sparse cache), computed in fp32."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    freqs = positions.to(torch.float32)[..., None] * inv_freq          # [T or B, H, T, d/2]
    cos, sin = freqs.cos(), freqs.sin()
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: GLAConfig) -> None:
        super().__init__()
        a, h = cfg.attn_spec, cfg.hidden_size
        self.H, self.Hkv = a["num_heads"], a["num_kv_heads"]
        self.d = h // self.H
        self.window, self.sinks = a["window_size"], a["sinks"]
        self.theta = None if a["rope_theta"] is None else float(a["rope_theta"])
        self.q_proj = nn.Linear(h, self.H * self.d, bias=a["qkv_bias"])
        self.k_proj = nn.Linear(h, self.Hkv * self.d, bias=a["qkv_bias"])
        self.v_proj = nn.Linear(h, self.Hkv * self.d, bias=a["qkv_bias"])
        self.o_proj = nn.Linear(self.H * self.d, h, bias=False)

    def forward(self, x: torch.Tensor, state: LayerState | None = None,
                valid: torch.Tensor | None = None, want_state: bool = False
                ) -> tuple[torch.Tensor, LayerState | None]:
        B, T, _ = x.shape
        if want_state and valid is not None and bool((valid != T).any()):
            # right padding would enter the cache and shift the next rotary position
            raise ValueError("attention layers keep a state only for unpadded rows "
                             "(prefill such models one sequence at a time)")
        q = self.q_proj(x).view(B, T, self.H, self.d).transpose(1, 2)         # [B, H, T, d]
        k = self.k_proj(x).view(B, T, self.Hkv, self.d).transpose(1, 2)       # [B, Hkv, T, d]
        v = self.v_proj(x).view(B, T, self.Hkv, self.d).transpose(1, 2)
        start = state.seen if state is not None else 0
        pos = torch.arange(start, start + T, device=x.device)
        if self.theta is not None:
            q, k = rotate(q, pos, self.theta), rotate(k, pos, self.theta)
        keys = gather(state, k, v, self.sinks)
        k, v = keys.k, keys.v                                                 # [B, Hkv, S, d]
        S = k.shape[2]
        groups = self.H // self.Hkv
        kr, vr = repeat_heads(k, groups), repeat_heads(v, groups)
        if S == T and self.window is None:
            o = F.scaled_dot_product_attention(q, kr, vr, is_causal=True)
        elif self.sinks:  # the window and the first `sinks` tokens (sinks.py)
            o = window_softmax(q, kr, vr, self.window, n_sink=keys.n_sink,
                               sink_k=repeat_heads(keys.sink_k, groups),
                               sink_v=repeat_heads(keys.sink_v, groups))[0].to(q.dtype)
        else:
            kpos = torch.arange(start + T - S, start + T, device=x.device)    # keys' positions
            mask = kpos[None, :] <= pos[:, None]                              # [T, S]
            if self.window is not None:
                mask &= kpos[None, :] > pos[:, None] - self.window
            o = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask)
        o = self.o_proj(o.transpose(1, 2).reshape(B, T, self.H * self.d))
        if not want_state:
            return o, None
        return o, LayerState(kv=keys.next_kv(self.window, self.sinks), seen=start + T,
                             window=self.window)


class GatedConv(nn.Module):
    def __init__(self, cfg: GLAConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.proj = nn.Linear(h, h, bias=True)
        self.conv1d = ShortConvolution(h, cfg.gated_conv_kernel, activation=False)

    def forward(self, x: torch.Tensor, state: LayerState | None = None,
                valid: torch.Tensor | None = None, want_state: bool = False
                ) -> tuple[torch.Tensor, LayerState | None]:
        tail = state.conv[0] if state is not None and state.conv else None
        c, new_tail = self.conv1d(x, tail, valid, want_state)
        return c * self.proj(x), (LayerState(conv=(new_tail,)) if want_state else None)
