"""The state rules both sparse-cache paths share: read, write and a token's recall error."""
from __future__ import annotations

import torch


def read(S: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """What the state returns for features f [..., F]: [..., d + 1] (GLA) or [..., d]."""
    return (f[..., None, :] @ S)[..., 0, :]


def recall_error(kind: str, S: torch.Tensor, f: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """|| u - what S returns for the key features f ||, [...]: the delta rule's plain read-out,
    GLA's normalised one (num / den; a state that holds nothing returns 0)."""
    r = read(S, f)
    if kind == "gla":
        num, den = r[..., :-1], r[..., -1:]
        r = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 0.0)
    return (u - r).norm(dim=-1)


def write(kind: str, S: torch.Tensor, log_a: torch.Tensor, f: torch.Tensor, u: torch.Tensor,
          b: torch.Tensor | None) -> torch.Tensor:
    """One step: decay by exp(log_a) [...], then write key features f [..., F] and value u
    (zero f: nothing enters). GLA: S + f [u, 1]; delta rule: a (I - b f f^T) S + b f u^T."""
    a = log_a.exp()[..., None, None]
    if kind == "gla":
        U = torch.cat([u, torch.ones_like(u[..., :1])], -1)
        return a * S + f[..., :, None] * U[..., None, :]
    kt, bt = f[..., :, None], b[..., None, None]
    S = a * (S - bt * kt @ (kt.transpose(-1, -2) @ S))
    return S + bt * kt @ u[..., None, :]


def combine(kind: str, o_x: torch.Tensor, Z: torch.Tensor, r: torch.Tensor, mix: torch.Tensor,
            on: torch.Tensor) -> torch.Tensor:
    """The exact part (softmax output o_x [B, H, T, d], Z = sum_j exp(s_tj - m_t)) with the
    state's read-out r at the queries: GLA o_x + (1 - w)(num - den o_x) / (w Z + (1 - w) den),
    the same o as w sum p v + (1 - w) num over w sum p + (1 - w) den; delta rule
    o_x + lam (r - o_x) where a token entered (`on` [T])."""
    if kind == "gla":
        w = mix.float().view(1, -1, 1, 1)
        num, den = r[..., :-1], r[..., -1:]
        return o_x + (1 - w) * (num - den * o_x) / (w * Z + (1 - w) * den)
    lam = mix.float() * on.to(mix.device).float()
    return o_x + lam[..., None] * (r - o_x)
