"""The gated delta rule, one token at a time: the reference the chunked form is tested against.

Gated DeltaNet (Yang, Kautz, Hatamizadeh, arXiv 2412.06464). Per head, in the paper's
column-vector convention with the state S as a [V, K] matrix:
    S_t = a_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T ,   o_t = scale * S_t q_t
    a_t = exp(g_t)  (g_t <= 0: a per-head scalar log decay),  b_t in (0, 1): write strength.
With b = 1, a = 1 this overwrites the value stored under k_t (a delta rule, not a sum).

Shapes (fla's [B, T, H, D] layout, fla's names): q, k: [B, T, H, K]; v: [B, T, H, V];
g, beta: [B, T, H]. The state is stored like fla's, as S^T: [B, H, K, V] in fp32, so row i
of a head's state is what key direction e_i reads out (o_t = scale * q_t^T S in this layout).
q and k must be L2-normalised over K by the caller: the op uses them as given (with
unnormalised keys (I - b k k^T) is no longer a contraction and the state can blow up).
scale defaults to K ** -0.5 as in fla. Compute is fp32; o comes back in q's dtype.
"""
from __future__ import annotations

import torch


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, initial_state: torch.Tensor | None) -> tuple[int, ...]:
    """Validate the shapes shared by every form of the op; return (B, T, H, K, V)."""
    if q.dim() != 4:
        raise ValueError(f"q must have shape [B, T, H, K], got {tuple(q.shape)}")
    B, T, H, K = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k must have shape [B, T, H, K] = {(B, T, H, K)}, got {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != (B, T, H):
        raise ValueError(f"v must have shape [B, T, H, V] = {(B, T, H)} + (V,), got {tuple(v.shape)}")
    V = v.shape[-1]
    for name, x in (("g", g), ("beta", beta)):
        if x.shape != (B, T, H):
            raise ValueError(f"{name} must have shape [B, T, H] = {(B, T, H)}, got {tuple(x.shape)}")
    if initial_state is not None and initial_state.shape != (B, H, K, V):
        raise ValueError(f"initial_state must have shape [B, H, K, V] = {(B, H, K, V)}, "
                         f"got {tuple(initial_state.shape)}")
    return B, T, H, K, V


def naive_recurrent_gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                g: torch.Tensor, beta: torch.Tensor, *,
                                scale: float | None = None,
                                initial_state: torch.Tensor | None = None,
                                output_final_state: bool = False
                                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    B, T, H, K, V = check_inputs(q, k, v, g, beta, initial_state)
    scale = K ** -0.5 if scale is None else scale
    dtype = q.dtype
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    S = q.new_zeros(B, H, K, V)
    if initial_state is not None:
        S = S + initial_state.float()
    outs = []
    for t in range(T):
        a, b = g[:, t].exp()[..., None, None], beta[:, t][..., None, None]   # [B, H, 1, 1]
        kt = k[:, t, :, :, None]                                             # [B, H, K, 1]
        # Transposed formula: S <- a (I - b k k^T) S + b k v^T, with k^T S = S's read at k.
        read = (kt * S).sum(-2, keepdim=True)                                 # [B, H, 1, V]
        S = a * (S - b * kt * read) + b * kt * v[:, t, :, None, :]
        outs.append((q[:, t, :, :, None] * S).sum(-2) * scale)               # [B, H, V]
    o = torch.stack(outs, 1) if outs else v.new_zeros(B, 0, H, V)
    return o.to(dtype), (S if output_final_state else None)
