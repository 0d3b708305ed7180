"""The sparse-cache op the model runs (tested against naive.py; see __init__). The selection
is sequential by nature: which token enters the state at step t depends on the state, which
depends on what entered before. So one loop over the T steps, vectorised over batch and heads
(a handful of [B, H, F, d] operations a step: the candidate's error, the cache's argmin, the
state's write and its read at query t); the exact part then runs in blocks of queries over the
keys each block can see (stored sinks, the window, and the tokens that were in the cache at some
step of the block), each cache token masked to the steps it was in the cache."""
from __future__ import annotations

import torch

from evalkit.model_adapters.gla.ops.window_linear.common import sink_kv, visible
from evalkit.model_adapters.gla.ops.window_sparse.common import combine, read, recall_error, write


def _select(kind, fq, pf, pu, pb, log_a, window, S0, N, cache, L, n_sink):
    """The loop over steps: returns the state's read-out at every query [B, H, T, .], the state
    after the T steps, the pool index of each cache slot [B, H, n], their errors [B, H, n],
    each pool token's first and last-plus-one step in the cache [B, H, P], and the pool index
    that entered at each step [B, H, T] (-1: none)."""
    B, H, T, _ = fq.shape
    P, n0, dev = pf.shape[2], cache[0].shape[2], fq.device
    slots = torch.arange(n0, device=dev).expand(B, H, n0).clone()
    errs = cache[2].float().clone()
    t_in = torch.full((B, H, P), T, dtype=torch.long, device=dev)     # never in the cache
    t_in[:, :, :n0] = 0
    t_out = torch.full((B, H, P), T, dtype=torch.long, device=dev)
    entered = torch.full((B, H, T), -1, dtype=torch.long, device=dev)
    S, reads = S0.float().clone(), []
    zero_f, zero_u = pf.new_zeros(B, H, pf.shape[3]), pu.new_zeros(B, H, pu.shape[3])
    zero_b = None if pb is None else pf.new_zeros(B, H)
    rows = (torch.arange(B, device=dev)[:, None], torch.arange(H, device=dev)[None, :])
    for t in range(T):
        j = t + L - window
        f, u, b = zero_f, zero_u, zero_b
        if j >= 0 and j >= n_sink:
            c = n0 + j
            e = recall_error(kind, S, pf[:, :, c], pu[:, :, c])              # [B, H]
            if slots.shape[2] < N:                                           # admitted
                slots = torch.cat([slots, slots.new_full((B, H, 1), c)], 2)
                errs = torch.cat([errs, e[..., None]], 2)
                t_in[:, :, c] = t
            else:
                i = torch.cat([errs, e[..., None]], 2).argmin(-1)           # [B, H], first min
                kept = i < slots.shape[2]
                slot = i.clamp(max=max(slots.shape[2] - 1, 0))
                goes = torch.where(kept, slots.gather(2, slot[..., None])[..., 0], c) \
                    if slots.shape[2] else torch.full_like(i, c)
                if slots.shape[2]:
                    put = torch.where(kept, c, slots[(*rows, slot)])
                    slots[(*rows, slot)] = put
                    errs[(*rows, slot)] = torch.where(kept, e, errs[(*rows, slot)])
                    t_in[(*rows, torch.full_like(i, c))] = torch.where(kept, t, T)
                    t_out[(*rows, goes)] = torch.where(kept, t, t_out[(*rows, goes)])
                entered[:, :, t] = goes
                f, u = pf[(*rows, goes)], pu[(*rows, goes)]
                b = None if pb is None else pb[(*rows, goes)]
        S = write(kind, S, log_a[:, :, t], f, u, b)
        reads.append(read(S, fq[:, :, t]))
    r = torch.stack(reads, 2) if T else fq.new_zeros(B, H, 0, S.shape[-1])
    return r, S, slots, errs, t_in, t_out, entered


def chunk_window_sparse(kind, q, k, v, fq, pf, pu, pb, log_a, mix, window: int, S0, N: int,
                        cache, first: int, *, n_sink: int = 0, sink_k=None, sink_v=None,
                        chunk_size: int = 64):
    B, H, T, d = q.shape
    L, n0 = k.shape[2] - T, cache[0].shape[2]
    q, k, v, fq, pf, pu, log_a = (t.float() for t in (q, k, v, fq, pf, pu, log_a))
    pb = None if pb is None else pb.float()
    r, S, slots, errs, t_in, t_out, entered = _select(kind, fq, pf, pu, pb, log_a, window, S0, N,
                                                      cache, L, n_sink)
    # the exact part: stored sinks, then the pool (cache tokens, then k), each pool token seen
    # by query t when it is in the window / a sink (k only) or in the cache at step t
    sk, sv = sink_kv(B, H, d, q, sink_k, sink_v)
    pk = torch.cat([cache[0].float(), k], 2)
    pv = torch.cat([cache[1].float(), v], 2)
    outs, zs = [], []
    for t0 in range(0, T, chunk_size):
        t1 = min(T, t0 + chunk_size)
        steps = torch.arange(t0, t1, device=q.device)
        member = (t_in[:, :, None, :] <= steps[:, None]) & (steps[:, None] < t_out[:, :, None, :])
        qi = torch.arange(L + t0, L + t1, device=q.device)[:, None]
        kj = torch.arange(L + T, device=q.device)[None, :]
        win = torch.cat([torch.zeros(t1 - t0, n0, dtype=torch.bool, device=q.device),
                         visible(qi, kj, window, n_sink)], 1)                  # [c, P]
        seen = member | win                                                    # [B, H, c, P]
        cols = seen.flatten(0, 2).any(0).nonzero()[:, 0]                       # keys this block uses
        seen = torch.cat([seen.new_ones(B, H, t1 - t0, sk.shape[2]), seen[..., cols]], -1)
        kc, vc = torch.cat([sk, pk[:, :, cols]], 2), torch.cat([sv, pv[:, :, cols]], 2)
        s = (q[:, :, t0:t1] @ kc.transpose(-1, -2) * d ** -0.5).masked_fill(~seen, float("-inf"))
        p = (s - s.amax(-1, keepdim=True)).exp()
        Z = p.sum(-1, keepdim=True)
        outs.append(p @ vc / Z)
        zs.append(Z)
    o_x = torch.cat(outs, 2) if T else q
    Z = torch.cat(zs, 2) if T else q[..., :1]
    o = combine(kind, o_x, Z, r, mix, entered[0, 0] >= 0 if B * H else entered.new_zeros(T))
    pos = torch.cat([cache[3].float(), (first + torch.arange(L + T, device=q.device)).float()
                     .expand(B, H, L + T)], 2)
    gather = lambda t: t.gather(2, slots[..., None].expand(-1, -1, -1, d))
    new = (gather(pk), gather(pv), errs, pos.gather(2, slots))
    ent = torch.where(entered >= 0, pos.gather(2, entered.clamp(min=0)).long(), -1)
    return o, S, new, ent
