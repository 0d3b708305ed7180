"""What a twin's state holds, measured: each linearized layer's memory replayed from the inputs
it was given on real text (the layer's `record`, model_adapters/gla/window_linear.py).

Per layer, over the heads and the tokens that entered the state:
- the forget gate's half-life in tokens, ln(1/2) / mean(log a), per head (median, min, max):
  how long anything written stays;
- the look-back weight (delta rule: mean lam, the share of the output the memory gives) or the
  state's weight at the mix (GLA: 1 - the window weight, before normalising);
- for a token that left the window, what the memory returns for its own key at each distance
  D from the reading token (D = W + the steps since it entered): `strength`, the fraction of
  its value returned (<r, v> / |v|^2: 1 held whole, 0 gone) and `error`, |r - v| / |v|; and
  `held`, the strength less the same read one step before the token entered. Keys and values
  of neighbouring tokens are alike, so a memory holding only the last few tokens still returns
  part of any value; `held` is what the memory keeps of this token itself.

The replay steps the ops' own token-by-token references (gated_delta/naive.py: S_t = a_t (I -
b k k^T) S_{t-1} + b k v^T, read k^T S; gla/naive.py's GLA over [v, 1]: S_t = a_t S_{t-1} + phi(k)
[v, 1]^T, read the normalised phi(k)^T S), so a measured loss is the state's own, not the
window's.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from evalkit.model_adapters.gla.ops.gated_delta.naive import naive_recurrent_gated_delta
from evalkit.model_adapters.gla.ops.gla.naive import naive_recurrent_gla

# distances from the reading token (tokens) at which a fact's read-out is measured
DISTANCES = (64, 128, 256, 512, 1024, 2048)


def replay(key: torch.Tensor, value: torch.Tensor, log_a: torch.Tensor, has: torch.Tensor,
           steps: tuple[int, ...] = (), beta: torch.Tensor | None = None
           ) -> tuple[dict[int, tuple[float, float, int]], torch.Tensor]:
    """Replay one layer's memory over T steps from empty, reading each entered token back by its
    own key `s` steps after it entered, for each s in `steps` (s = -1: the step before it
    entered, the baseline of `held`).

    key [B, H, T, K], value [B, H, T, V], log_a [B, H, T], has [T] (a token entered at that
    step); beta [B, H, T] for the delta rule (S [K, V], read k^T S), None for GLA's additive
    state (S [K, V + 1], the last column the normaliser; read (k^T S)[:V] / (k^T S)[V]).
    Returns ({s: (mean strength, mean error, reads)} for the s with any token to read, the
    memory after the T steps: the state the layer itself ends with)."""
    B, H, T, K = key.shape
    V = value.shape[-1]
    delta = beta is not None
    S = key.new_zeros(B, H, K, V if delta else V + 1)
    ones = key.new_ones(B, H, 1)
    entered = has.tolist()
    total = key.new_zeros(2, len(steps))                   # summed strength, error per s
    reads = [0] * len(steps)
    lay = lambda x, t: x[:, :, t:t + 1].transpose(1, 2)                   # fla's [B, 1, H, .]
    for t in range(T):
        # one step of the ops' own references (gla/ops: gla/naive.py, gated_delta/naive.py)
        k = lay(key, t)
        if delta:
            _, S = naive_recurrent_gated_delta(k, k, lay(value, t), lay(log_a[..., None], t)[..., 0],
                                               lay(beta[..., None], t)[..., 0], scale=1.0,
                                               initial_state=S, output_final_state=True)
        else:
            v1 = torch.cat([lay(value, t), ones[:, None]], -1)                   # [v, 1]
            g = lay(log_a[..., None], t).expand_as(k)                            # one gate a head
            _, S = naive_recurrent_gla(k, k, v1, g, initial_state=S, output_final_state=True)
        which = [i for i, s in enumerate(steps) if 0 <= t - s < T and entered[t - s]]
        if not which:
            continue
        js = [t - steps[i] for i in which]
        r = key[:, :, js] @ S                                                # [B, H, n, V(+1)]
        if not delta:
            r = r[..., :V] / r[..., V:].clamp_min(1e-12)
        v = value[:, :, js]
        vv = (v * v).sum(-1).clamp_min(1e-12)
        got = torch.stack([((r * v).sum(-1) / vv).sum((0, 1)),
                           ((r - v).norm(dim=-1) / vv.sqrt()).sum((0, 1))])   # [2, n]
        total.index_add_(1, torch.tensor(which), got)
        for i in which:
            reads[i] += B * H
    out = {s: (total[0, i].item() / reads[i], total[1, i].item() / reads[i], reads[i])
           for i, s in enumerate(steps) if reads[i]}
    return out, S


def half_lives(log_a: torch.Tensor, has: torch.Tensor) -> list[float]:
    """Per head: ln(1/2) / mean log a over the steps a token entered (inf: no forgetting)."""
    mean = log_a[:, :, has].mean(dim=(0, 2))                                   # [H]
    return [math.inf if m >= 0 else math.log(0.5) / m for m in mean.tolist()]


def layer_anatomy(rec: dict[str, torch.Tensor], window: int,
                  distances: tuple[int, ...] = DISTANCES) -> dict[str, Any]:
    """One layer's figures from its record (see the module docstring); JSON-ready, finite."""
    has = rec["has"].bool()
    life = half_lives(rec["log_a"], has)
    finite = [x for x in life if math.isfinite(x)]
    steps = (-1,) + tuple(D - window for D in distances if D >= window)
    read, _ = replay(rec["key"], rec["value"], rec["log_a"], has, steps, rec.get("beta"))
    before = read.pop(-1, (0.0, 0.0, 0))[0]
    out: dict[str, Any] = {
        "half_life": {"median": sorted(finite)[len(finite) // 2] if finite else None,
                      "min": min(finite) if finite else None,
                      "max": max(finite) if finite else None,
                      "heads_without_forgetting": len(life) - len(finite)},
        "readout_before": before,
        "readout": {str(s + window): {"strength": a, "held": a - before, "error": e, "reads": n}
                    for s, (a, e, n) in read.items()}}
    if "lookback" in rec:
        out["lookback"] = rec["lookback"][:, :, has].mean().item()
    else:
        out["state_weight"] = rec["state_weight"].mean().item()
    return out


@torch.no_grad()
def state_anatomy(twin: torch.nn.Module, seqs: torch.Tensor,
                  distances: tuple[int, ...] = DISTANCES) -> dict[str, Any] | None:
    """Run `twin` (a GLAForCausalLM) over seqs [N, T] and measure every linearized layer's
    state; None for a twin without one. {"tokens": T, "sequences": N, "layers": {i: ...}}."""
    cfg = twin.config
    layers = {i: b.attn for i, (mixer, b) in enumerate(zip(cfg.mixers, twin.model.layers))
              if mixer == "window_linear"}
    if not layers or any(a.state_off for a in layers.values()):
        return None
    window = cfg.window_linear_spec["window"]
    for a in layers.values():
        a.record = []
    try:
        twin(seqs)
        recs = {i: a.record[0] for i, a in layers.items()}
    finally:
        for a in layers.values():
            a.record = None
    usable = tuple(D for D in distances if D < seqs.shape[1])
    # The replay is a loop of products of 64 x 64 matrices: one thread runs it fastest, and on
    # a busy machine several threads wait on each other at every step (minutes, not seconds).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        layers = {str(i): layer_anatomy(r, window, usable) for i, r in recs.items()}
    finally:
        torch.set_num_threads(threads)
    return {"tokens": int(seqs.shape[1]), "sequences": int(seqs.shape[0]),
            "window": window, "distances": list(usable), "layers": layers}
