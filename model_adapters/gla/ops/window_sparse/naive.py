"""The token-by-token reference of the sparse-cache op (see __init__): one batch row and head
at a time, the cache a Python list of tokens, every query's keys gathered one by one."""
from __future__ import annotations

import torch

from evalkit.model_adapters.gla.ops.window_sparse.common import read, recall_error, write


def naive_window_sparse(kind, q, k, v, fq, pf, pu, pb, log_a, mix, window: int, S0, N: int,
                        cache, first: int, *, n_sink: int = 0, sink_k=None, sink_v=None):
    B, H, T, d = q.shape
    L, n0 = k.shape[2] - T, cache[0].shape[2]
    q, k, v, fq, pf, pu, log_a = (t.float() for t in (q, k, v, fq, pf, pu, log_a))
    out = torch.zeros(B, H, T, d)
    S_out = S0.float().clone()
    entered = torch.full((B, H, T), -1, dtype=torch.long)
    n_new = min(N, n0 + sum(1 for t in range(T) if t + L - window >= max(n_sink, 0)))
    new = [torch.zeros(B, H, n_new, d), torch.zeros(B, H, n_new, d),
           torch.zeros(B, H, n_new), torch.zeros(B, H, n_new)]
    for b in range(B):
        for h in range(H):
            def token(p: int) -> dict:              # pool entry p: a cached token, then k's
                rk, rv = (cache[0][b, h, p], cache[1][b, h, p]) if p < n0 else \
                    (k[b, h, p - n0], v[b, h, p - n0])
                pos = int(cache[3][b, h, p]) if p < n0 else first + p - n0
                return {"k": rk.float(), "v": rv.float(), "f": pf[b, h, p], "u": pu[b, h, p],
                        "b": None if pb is None else pb[b, h, p].float(), "pos": pos}
            slots = []
            for p in range(n0):
                slots.append({**token(p), "err": float(cache[2][b, h, p])})
            S = S0[b, h].float().clone()
            for t in range(T):
                j, goes = t + L - window, None
                if j >= 0 and j >= n_sink:          # the token leaving the window
                    cand = {**token(n0 + j), "err": float(recall_error(kind, S, pf[b, h, n0 + j],
                                                                        pu[b, h, n0 + j]))}
                    if len(slots) < N:
                        slots.append(cand)
                    else:
                        errs = [s["err"] for s in slots] + [cand["err"]]
                        i = errs.index(min(errs))
                        goes = (slots + [cand])[i]
                        if i < len(slots):
                            slots[i] = cand
                if goes is not None:
                    S = write(kind, S, log_a[b, h, t], goes["f"], goes["u"], goes["b"])
                    entered[b, h, t] = goes["pos"]
                else:
                    S = write(kind, S, log_a[b, h, t], torch.zeros_like(pf[b, h, 0]),
                              torch.zeros_like(pu[b, h, 0]),
                              None if pb is None else torch.zeros(()))
                # query t: the sinks, its window and the cache exactly, the rest through S
                keys, vals = [], []
                if sink_k is not None:
                    keys += list(sink_k[b, h].float())
                    vals += list(sink_v[b, h].float())
                for i in range(L + t + 1):
                    if i > L + t - window or i < n_sink:
                        keys.append(k[b, h, i])
                        vals.append(v[b, h, i])
                keys += [s["k"] for s in slots]
                vals += [s["v"] for s in slots]
                s = torch.stack(keys) @ q[b, h, t] * d ** -0.5
                p = (s - s.max()).exp()
                r = read(S, fq[b, h, t])
                if kind == "gla":
                    w = mix[h].float()
                    num = w * p @ torch.stack(vals) + (1 - w) * r[:d]
                    out[b, h, t] = num / (w * p.sum() + (1 - w) * r[d])
                else:
                    o_x = p @ torch.stack(vals) / p.sum()
                    lam = mix[b, h, t].float() if goes is not None else 0.0
                    out[b, h, t] = o_x + lam * (r - o_x)
            S_out[b, h] = S
            for i, s in enumerate(slots):
                new[0][b, h, i], new[1][b, h, i] = s["k"], s["v"]
                new[2][b, h, i], new[3][b, h, i] = s["err"], float(s["pos"])
    return out, S_out, tuple(new), entered
