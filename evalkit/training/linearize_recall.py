"""The recall stage of `evalkit linearize`: a trained twin trained further so that its state
keeps what the window drops.

After attention transfer and the end-to-end stage on prose, a window + state twin's state
returns nothing of a token 128+ tokens back (state_anatomy.py) and it answers no needle past its
window: prose gives it no reason to write one token strongly (copies.py says why). This stage
shows it the reason: the same KL to the parent as the end-to-end stage (linearize_e2e.kl_stage:
a sweep, a capped resumable run, LoRA r on q/k/v/o beside the twin's own parameters), on the
training prose with earlier snippets copied forward past the window, the copies' positions
carrying `copies.weight` of the loss:

    loss = w * mean_{copy positions} KL_i + (1 - w) * mean_{other positions} KL_i

Scored on held-out documents with copies made the same way (other indices): that weighted KL
(what a sweep compares), the KL at the copies and elsewhere, and how often the twin's top token
at a copy position is the copied one ("copy_top1"; the parent's beside it in the card, and the
twin's own with its state off, which is what the state adds).

The member (`from_twin` + `recall: true`) starts from its source's folder: its delta (the
end-to-end LoRA) and this stage's LoRA are stored together as one delta of rank r_source + r.

    info, delta = recall_stage(fam, member, twin, resume_file, state, write_progress)
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from evalkit.training.copies import copy_batch, loss_weights
from evalkit.training.linearize_e2e import KL_CHUNK, kl_stage, parent_hidden, twin_hidden

HELDOUT_INDEX = 1 << 30  # held-out copies' indices: apart from every training row's


class Held:
    """Held-out recall sequences: ids, copy mask and loss weights [n, T], and the parent's
    final hidden states [n, T, D] (computed once)."""

    def __init__(self, ids: torch.Tensor, mask: torch.Tensor, weight: float, parent,
                 batch: int) -> None:
        self.ids, self.mask, self.batch = ids, mask, batch
        self.weights = loss_weights(mask, weight)
        self.hidden = parent_hidden(parent, ids, batch)


@torch.no_grad()
def position_scores(h_twin: torch.Tensor, h_parent: torch.Tensor, head: torch.nn.Module,
                    ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position of [B, T]: KL(parent || twin) of the next token, and whether the twin's
    top token is the next token of `ids` (False at the last position)."""
    kl = torch.zeros(ids.shape, dtype=torch.float64)
    top = torch.zeros(ids.shape, dtype=torch.bool)
    for s in range(0, ids.shape[1], KL_CHUNK):
        lp = F.log_softmax(head(h_parent[:, s:s + KL_CHUNK]).float(), -1)
        lq = F.log_softmax(head(h_twin[:, s:s + KL_CHUNK]).float(), -1)
        kl[:, s:s + KL_CHUNK] = F.kl_div(lq, lp, reduction="none", log_target=True).sum(-1).double()
        nxt = ids[:, s + 1:s + KL_CHUNK + 1]
        top[:, s:s + nxt.shape[1]] = lq[:, :nxt.shape[1]].argmax(-1) == nxt
    return kl, top


@torch.no_grad()
def recall_score(twin, held: Held) -> dict[str, float]:
    """The held-out point: weighted KL ("kl"), KL at the copies and at the other positions,
    and the copies' top-1 agreement with the copied token."""
    kl_rows, top_rows = [], []
    for s in range(0, held.ids.shape[0], held.batch):
        ids = held.ids[s:s + held.batch]
        kl, top = position_scores(twin_hidden(twin, ids, grad=False),
                                  held.hidden[s:s + held.batch], twin.lm_head, ids)
        kl_rows.append(kl)
        top_rows.append(top)
    kl, top = torch.cat(kl_rows), torch.cat(top_rows)
    copy, prose = held.mask & (held.weights > 0), ~held.mask & (held.weights > 0)
    return {"kl": float((kl * held.weights).sum() / held.weights.sum()),
            "copy_kl": float(kl[copy].mean()), "prose_kl": float(kl[prose].mean()),
            "copy_top1": float(top[copy].double().mean())}


@torch.no_grad()
def parent_copy_top1(parent, held: Held) -> float:
    """The parent's own top-1 agreement at the held-out copies: the ceiling of copy_top1."""
    hits = []
    for s in range(0, held.ids.shape[0], held.batch):
        ids = held.ids[s:s + held.batch]
        logits = parent.lm_head(held.hidden[s:s + held.batch, :-1])
        hits.append((logits.argmax(-1) == ids[:, 1:])[held.mask[s:s + held.batch, :-1]])
    return float(torch.cat(hits).double().mean())


def recall_stage(fam, m, twin, resume_file, state: dict[str, Any],
                 write_progress: Callable[[], None]
                 ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The recall stage for member `m` of family `fam` (linearize_family.Family), from `twin`
    (its source, loaded). Returns (the card's record, this stage's LoRA deltas)."""
    r, seed = fam.recipe.recall, fam.recipe.seed
    sinks = twin.config.sinks
    stream = fam.recall_stream
    held = fam.recall_heldout(sinks)

    def batches(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = copy_batch(stream.batch(i, r.batch, seed), r.copies, sinks=sinks, seed=seed,
                               first=i * r.batch)
        return ids, loss_weights(mask, r.copies.weight)

    info, delta = kl_stage(fam, m, twin, r, "recall", resume_file, state, write_progress,
                           batches, lambda: recall_score(twin, held),
                           {"heldout_sequences": int(held.ids.shape[0]),
                            "heldout_copy_positions": int(held.mask.sum()),
                            "parent_copy_top1": parent_copy_top1(fam.parent, held)})
    info["state_off"] = state_off_score(twin, held)
    return info, delta


def state_off_score(twin, held: Held) -> dict[str, float]:
    """recall_score of `twin` with its state switched off: what the window and sinks alone
    recall of the copies."""
    layers = [b.attn for mixer, b in zip(twin.config.mixers, twin.model.layers)
              if mixer == "window_linear"]
    for a in layers:
        a.state_off = True
    try:
        return recall_score(twin, held)
    finally:
        for a in layers:
            a.state_off = False


def combined_delta(first: dict, second: dict) -> dict:
    """One delta per tensor from two stages' (each `(b [out, r], a [r, in])` factors or a full
    tensor): factors side by side (rank r1 + r2, b1 a1 + b2 a2 exactly), else the sum."""
    from evalkit.model_adapters.gla.twin import full_delta

    out = dict(first)
    for n, d in second.items():
        if n not in out:
            out[n] = d
        elif isinstance(out[n], tuple) and isinstance(d, tuple):
            out[n] = (torch.cat([out[n][0], d[0]], 1), torch.cat([out[n][1], d[1]], 0))
        else:
            out[n] = full_delta(out[n]) + full_delta(d)
    return out
