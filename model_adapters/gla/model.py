"""Gated Linear Attention language model in plain PyTorch, with fla's GLAForCausalLM semantics.

Module and parameter names match flash-linear-attention's, so `state_dict()` keys are fla's
checkpoint names (model.embeddings.weight, model.layers.{i}.attn.q_proj.weight, ...).

    x = embeddings(ids)                                        [B, T, D]
    per layer:  x = x + GLA(attn_norm(x));  x = x + SwiGLU(mlp_norm(x))
    logits = lm_head(norm(x))                                  [B, T, vocab]

GLA (one layer), H heads of key width K and value width V:
    q, k, v = conv?(x W_q), conv?(x W_k), conv?(x W_v)         (short causal conv + SiLU)
    log a  = logsigmoid(x W_1 W_2 + b) / 16                    (low-rank gate, clamp_min)
    S_t = diag(a_t) S_{t-1} + k_t^T v_t ;  o_t = q_t S_t / sqrt(K)
    out = W_o (RMSNorm_head(o) * swish(x W_g))

A layer's mixer may instead be softmax attention (fla's hybrid `attn` config key) or a gated
short convolution (our `gated_conv` key), and `use_mlp: false` drops the MLPs: Zoology's
two-layer MQAR models (mixers.py). The state a sequence carries is in state.py.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.mixers import Attention, GatedConv, ShortConvolution
from evalkit.model_adapters.gla.ops.gla import chunk_gla, fused_recurrent_gla, naive_recurrent_gla
from evalkit.model_adapters.gla.state import STATE_DTYPE, GLAState, LayerState
from evalkit.model_adapters.gla.window_linear import WindowLinearAttention

# ---------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """fla's RMSNorm: statistics in fp32, result in the input's dtype; optional gate swish(g)."""

    def __init__(self, dim: int, eps: float, affine: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        # F.rms_norm is one fused pass with fp32 statistics: the same numbers as fla's
        # x.float() * rsqrt(mean(x^2) + eps) * w (tested), without five fp32 temporaries
        w = self.weight
        if gate is None:
            return F.rms_norm(x, x.shape[-1:], w, self.eps)
        y = F.rms_norm(x.float(), x.shape[-1:], None if w is None else w.float(), self.eps)
        g = gate.float()
        g = F.silu(g, inplace=g is not gate and not torch.is_grad_enabled())
        return y.mul_(g).to(x.dtype) if not torch.is_grad_enabled() else (y * g).to(x.dtype)


class GatedLinearAttention(nn.Module):
    def __init__(self, cfg: GLAConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.cfg = cfg
        self.H, self.K, self.V = cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim
        self.groups = cfg.kv_groups
        self.q_proj = nn.Linear(h, cfg.key_dim, bias=False)
        self.k_proj = nn.Linear(h, cfg.key_dim_per_group, bias=False)
        self.v_proj = nn.Linear(h, cfg.value_dim_per_group, bias=False)
        if cfg.use_output_gate:
            self.g_proj = nn.Linear(h, cfg.value_dim, bias=False)
        if cfg.use_short_conv:
            self.q_conv1d = ShortConvolution(cfg.key_dim, cfg.conv_size)
            self.k_conv1d = ShortConvolution(cfg.key_dim_per_group, cfg.conv_size)
            self.v_conv1d = ShortConvolution(cfg.value_dim_per_group, cfg.conv_size)
        self.gk_proj = nn.Sequential(nn.Linear(h, cfg.gate_low_rank_dim, bias=False),
                                     nn.Linear(cfg.gate_low_rank_dim, cfg.key_dim_per_group, bias=True))
        self.o_proj = nn.Linear(cfg.value_dim, h, bias=False)
        norm = RMSNorm(self.V, cfg.norm_eps, affine=bool(cfg.elementwise_affine))
        # fla names the norm after whether it is fused with the swish gate.
        if cfg.fused_gate_norm:
            self.g_norm_swish_gate = norm
        else:
            self.g_norm = norm
        # Which operator runs a multi-token input: "chunk" (default) or "naive".
        self.mode, self.chunk_size = "chunk", 128

    def forward(self, x: torch.Tensor, state: LayerState | None = None,
                valid: torch.Tensor | None = None, want_state: bool = False
                ) -> tuple[torch.Tensor, LayerState | None]:
        """x [B, T, D]; valid [B] = number of real (left-aligned) tokens per row, the rest are
        right padding that must leave the state unchanged."""
        B, T, _ = x.shape
        H, K, V, G = self.H, self.K, self.V, self.groups
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)      # [B, T, H*K | H*K/G | H*V/G]
        tails: tuple[torch.Tensor, ...] = ()
        if self.cfg.use_short_conv:
            prev = state.conv if state is not None and state.conv else (None, None, None)
            q, tq = self.q_conv1d(q, prev[0], valid, want_state)
            k, tk = self.k_conv1d(k, prev[1], valid, want_state)
            v, tv = self.v_conv1d(v, prev[2], valid, want_state)
            tails = (tq, tk, tv) if want_state else ()
        gk = self.gk_proj(x)                                          # [B, T, H*K/G]

        q = q.view(B, T, H, K)
        k, gk = k.view(B, T, H // G, K), gk.view(B, T, H // G, K)
        v = v.view(B, T, H // G, V)
        if G > 1:  # kv head i serves query heads i*G .. i*G+G-1 (fla's repeat '(h g)')
            k, gk, v = (t.repeat_interleave(G, dim=2) for t in (k, gk, v))
        gk = F.logsigmoid(gk.float()) / self.cfg.gate_logit_normalizer  # log forget gate <= 0
        if self.cfg.clamp_min is not None:
            gk = gk.clamp_min(self.cfg.clamp_min)
        if valid is not None:  # padding: k = 0 writes nothing, g = 0 decays nothing
            real = (torch.arange(T, device=x.device).view(1, T) < valid.view(B, 1)).view(B, T, 1, 1)
            k = torch.where(real, k, torch.zeros_like(k))
            gk = torch.where(real, gk, torch.zeros_like(gk))

        S0 = state.recurrent if state is not None else None
        if T == 1:
            o, S = fused_recurrent_gla(q, k, v, gk, S0, want_state)
        elif self.mode == "naive":
            o, S = naive_recurrent_gla(q, k, v, gk, S0, want_state)
        else:
            o, S = chunk_gla(q, k, v, gk, S0, want_state, chunk_size=self.chunk_size)
        # o: [B, T, H, V]
        norm = self.g_norm_swish_gate if self.cfg.fused_gate_norm else self.g_norm
        if self.cfg.use_output_gate:
            o = norm(o, self.g_proj(x).view(B, T, H, V))
        else:
            o = norm(o)
        o = self.o_proj(o.reshape(B, T, H * V))
        return o, (LayerState(S, tails) if want_state else None)


class GatedMLP(nn.Module):
    def __init__(self, cfg: GLAConfig) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.mlp_intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        # inference: in place, no [T, intermediate] temporaries beyond the two projections
        h = F.silu(self.gate_proj(x), inplace=True)
        return self.down_proj(h.mul_(self.up_proj(x)))


MIXERS = {"gla": GatedLinearAttention, "attn": Attention, "gated_conv": GatedConv,
          "window_linear": WindowLinearAttention}


class GLABlock(nn.Module):
    """Pre-norm block: x + mixer(norm(x)), then x + MLP(norm(x)) unless use_mlp is false. The
    mixer is `attn` whatever it is (fla's name for GLA and for hybrid attention layers)."""

    def __init__(self, cfg: GLAConfig, layer: int = 0) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.attn = MIXERS[cfg.mixer(layer)](cfg)
        if cfg.use_mlp:
            self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
            self.mlp = GatedMLP(cfg)

    def forward(self, x, state=None, valid=None, want_state=False):
        a, new_state = self.attn(self.attn_norm(x), state, valid, want_state)
        x = x + a
        if hasattr(self, "mlp"):
            x = x + self.mlp(self.mlp_norm(x))
        return x, new_state


class GLAModel(nn.Module):
    def __init__(self, cfg: GLAConfig) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, cfg.pad_token_id)
        self.layers = nn.ModuleList(GLABlock(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)


class GLAForCausalLM(nn.Module):
    def __init__(self, cfg: GLAConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = GLAModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embeddings.weight
        self.prefill_segment = 2048  # tokens per streamed prefill step (16 chunks of 128)

    # -- configuration ------------------------------------------------------------------
    def set_ops(self, mode: str | None = None, chunk_size: int | None = None) -> None:
        """Operator for multi-token inputs ("chunk" or "naive") and the chunk length."""
        if mode is not None and mode not in ("chunk", "naive"):
            raise ValueError(f"mode must be 'chunk' or 'naive', got {mode!r}")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        for layer in self.model.layers:
            if isinstance(layer.attn, GatedLinearAttention):
                layer.attn.mode = mode or layer.attn.mode
                layer.attn.chunk_size = chunk_size or layer.attn.chunk_size

    def init_weights(self, seed: int | None = None) -> "GLAForCausalLM":
        """fla's initialisation: normal(0, initializer_range) for linears, convs, embeddings;
        zero biases, unit norms."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        std = self.config.initializer_range
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight") or name.endswith("norm_swish_gate.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
        return self

    def empty_state(self, batch_size: int, device=None) -> GLAState:
        cfg, dev = self.config, device or self.lm_head.weight.device

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(batch_size, *shape, dtype=STATE_DTYPE, device=dev)

        layers = []
        for mixer, block in zip(cfg.mixers, self.model.layers):
            if mixer == "gla":
                shapes = cfg.state_shapes()
                layers.append(LayerState(zeros(*shapes["recurrent"]), tuple(
                    zeros(*shapes[n]) for n in ("q_conv", "k_conv", "v_conv") if n in shapes)))
            elif mixer == "gated_conv":
                layers.append(LayerState(conv=(zeros(cfg.hidden_size, cfg.gated_conv_kernel),)))
            else:
                a = block.attn  # window and, with sinks, the sinks' K, V (sinks.py)
                n = 4 if a.sinks else 2
                layers.append(LayerState(kv=tuple(zeros(a.Hkv, 0, a.d) for _ in range(n)),
                                         window=a.window))
        return GLAState(layers)

    # -- forward passes -----------------------------------------------------------------
    def hidden(self, input_ids: torch.Tensor, state: GLAState | None = None,
               valid: torch.Tensor | None = None, want_state: bool = False,
               consume: bool = False) -> tuple[torch.Tensor, GLAState | None]:
        """Final-norm hidden states [B, T, D] and (optionally) the state after the input.
        consume: `state` is handed over; each layer's entry is released once used, so the pass
        holds one state, not the old one beside the new (at 3B: 56 MiB fp32 a sequence)."""
        x = self.model.embeddings(input_ids)                            # [B, T, D]
        new_layers = []
        for i, layer in enumerate(self.model.layers):
            x, s = layer(x, state.layers[i] if state is not None else None, valid, want_state)
            if consume and state is not None:
                state.layers[i] = None
            new_layers.append(s)
        return self.model.norm(x), (GLAState(new_layers) if want_state else None)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab] from zero state; differentiable (for training)."""
        h, _ = self.hidden(input_ids)
        return self.lm_head(h)

    def forward_state(self, input_ids: torch.Tensor, state: GLAState | None = None
                      ) -> tuple[torch.Tensor, GLAState]:
        """Logits [B, T, vocab] for every position and the state after the input."""
        h, new_state = self.hidden(input_ids, state, want_state=True)
        return self.lm_head(h), new_state

    def segment_step(self, input_ids: torch.Tensor, valid: torch.Tensor, state: GLAState,
                     last_logits: torch.Tensor, consume: bool = False
                     ) -> tuple[torch.Tensor, GLAState]:
        """One streamed step over a [B, T] segment whose rows hold `valid` real tokens each
        (right padding after them). Returns the fp32 logits [B, vocab] at each row's last
        real token (rows with valid == 0 keep `last_logits`) and the state after the real
        tokens only. Only the last positions go through lm_head. consume: as in hidden."""
        h, new_state = self.hidden(input_ids, state, valid, want_state=True, consume=consume)
        B = input_ids.shape[0]
        idx = (valid - 1).clamp(min=0)
        h_last = h[torch.arange(B, device=h.device), idx]               # [B, D]
        logits = self.lm_head(h_last).float()
        logits = torch.where((valid > 0).view(B, 1), logits, last_logits)
        return logits, new_state

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, state: GLAState | None = None,
                lengths: torch.Tensor | None = None, segment: int | None = None,
                consume: bool = False) -> tuple[torch.Tensor, GLAState]:
        """Streaming prefill: consume [B, T] in segments of `segment` tokens, carrying the state,
        so activation memory is bounded by the segment, not T. Returns the logits [B, vocab]
        at each row's last real token and the state after it. The given state is left as it
        was unless `consume` hands it over (then its layers are released as they are used);
        the states between segments are this pass's own and are always released so."""
        B, T = input_ids.shape
        seg = segment or self.prefill_segment
        dev = input_ids.device
        own = consume or state is None
        state = state if state is not None else self.empty_state(B, dev)
        lengths = lengths if lengths is not None else torch.full((B,), T, device=dev)
        last = torch.zeros(B, self.config.vocab_size, device=dev)
        for start in range(0, T, seg):
            ids = input_ids[:, start:start + seg]
            valid = (lengths - start).clamp(0, ids.shape[1])
            last, state = self.segment_step(ids, valid, state, last, consume=own)
            own = True
        return last, state

    @torch.no_grad()
    def decode_step(self, token: torch.Tensor, state: GLAState) -> tuple[torch.Tensor, GLAState]:
        """One token per row: token [B] -> logits [B, vocab] (fp32) and the next state."""
        h, new_state = self.hidden(token.view(-1, 1), state, want_state=True)
        return self.lm_head(h[:, -1]).float(), new_state

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # shared (tied) parameters count once
