"""The end-to-end stage of `evalkit linearize` (LoLCATs' stage 2, arXiv 2410.10254; Liger
2503.01496 and RADLADS 2505.03005 do the same): after attention transfer has fitted each layer
alone, the whole twin is trained to the parent's next-token distribution,

    loss = mean over tokens of KL(p_parent || p_twin)

(the parent runs beside it, frozen, on the same sequences), on sequences well past the window
so that what the state carries is what is trained. Trained: the twin's own parameters (what
the parent lacks: feature maps, gates, mixes, a delta-rule layer's write strengths:
`trained_names`) and a LoRA of rank r on q/k/v/o of every linearized layer, W + alpha/r B A,
A small random, B zero, so the stage starts exactly at stage 1's twin. At the end the LoRA is
merged: delta = alpha/r B A is added to the weights and stored as the twin's `delta`
(gla/twin.py), so the parent's weights still come from the parent.

Memory: the parent's pass needs no graph; the twin's blocks are checkpointed (one block's
activations at a time, recomputed in the backward pass), and the KL is taken over chunks of
positions so no [T, vocab] logits are held for the whole sequence.

    info, delta = end_to_end_stage(fam, member, twin, stage, state, write_progress)
"""
from __future__ import annotations

import math
import resource
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from evalkit.model_adapters.gla.twin import full_delta, trained_names
from evalkit.training.linearize import (EndToEnd, Progress, load_optimizer_state,
                                        optimizer_state, run_schedule, trainable, write_tensors)

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
KL_CHUNK = 256  # positions whose [chunk, vocab] log-probabilities are held at once


class LoRA:
    """Low-rank updates of q/k/v/o of `layers`, applied by forward hooks so the twin's own
    parameter names (the parent's) stay as they are until `merge`. A ~ U(-1/sqrt(in),
    1/sqrt(in)) from `seed` (kaiming-uniform, as peft), B = 0."""

    def __init__(self, twin: torch.nn.Module, layers: list[int], rank: int, alpha: float,
                 seed: int) -> None:
        self.scale = alpha / rank
        gen = torch.Generator().manual_seed(seed)
        self.targets: dict[str, torch.nn.Linear] = {
            f"model.layers.{i}.attn.{p}.weight": getattr(twin.model.layers[i].attn, p)
            for i in layers for p in PROJECTIONS}
        self.A: dict[str, torch.nn.Parameter] = {}
        self.B: dict[str, torch.nn.Parameter] = {}
        self._hooks = []
        for name, lin in self.targets.items():
            out_f, in_f = lin.weight.shape
            a = (torch.rand(rank, in_f, generator=gen) * 2 - 1) / math.sqrt(in_f)
            self.A[name] = torch.nn.Parameter(a)
            self.B[name] = torch.nn.Parameter(torch.zeros(out_f, rank))
            self._hooks.append(lin.register_forward_hook(self._hook(name)))

    def _hook(self, name: str) -> Callable:
        def add(mod, args, out):
            return out + self.scale * F.linear(F.linear(args[0], self.A[name]), self.B[name])
        return add

    @property
    def names(self) -> list[str]:
        return [f"lora_{ab}.{n}" for n in self.targets for ab in "AB"]

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for n in self.targets for p in (self.A[n], self.B[n])]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: p.detach().clone() for k, p in zip(self.names, self.params)}

    def load(self, tensors: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for k, p in zip(self.names, self.params):
                p.copy_(tensors[k])

    def delta(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{weight name: (alpha/r B, A)} (fp32): the delta as the twin folder stores it,
        factored (gla/twin.py); merge() adds (alpha/r B) A, the very product the loader adds."""
        with torch.no_grad():
            return {n: (self.scale * self.B[n].float(), self.A[n].float().clone())
                    for n in self.targets}

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def merge(self) -> dict[str, torch.Tensor]:
        """Remove the hooks and add each delta to its weight in place (W + delta, the sum a
        twin folder's loader computes); returns the deltas."""
        self.remove()
        delta = self.delta()
        with torch.no_grad():
            for n, lin in self.targets.items():
                lin.weight.copy_(lin.weight.float() + full_delta(delta[n]))
        return delta


def _block(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return block(x)[0]


def twin_hidden(twin: torch.nn.Module, ids: torch.Tensor, grad: bool) -> torch.Tensor:
    """The twin's final-norm hidden states [B, T, D]; with `grad`, each block checkpointed."""
    x = twin.model.embeddings(ids)
    for block in twin.model.layers:
        x = checkpoint(_block, block, x, use_reentrant=False) if grad else _block(block, x)
    return twin.model.norm(x)


def kl_sum(h_twin: torch.Tensor, h_parent: torch.Tensor, head: torch.nn.Module,
           scale: float = 1.0, weights: torch.Tensor | None = None) -> float:
    """sum over positions of KL(parent || twin) from final hidden states [B, T, D], chunk by
    chunk of positions, each position's KL times `weights` [B, T] when given; when h_twin
    requires grad, scale * that sum's gradient is accumulated into h_twin.grad (each chunk's
    graph freed before the next)."""
    total = 0.0
    for s in range(0, h_twin.shape[1], KL_CHUNK):
        with torch.no_grad():
            lp = F.log_softmax(head(h_parent[:, s:s + KL_CHUNK]).float(), -1)
        lq = F.log_softmax(head(h_twin[:, s:s + KL_CHUNK]).float(), -1)
        if weights is None:
            kl = F.kl_div(lq, lp, reduction="sum", log_target=True)
        else:
            per = F.kl_div(lq, lp, reduction="none", log_target=True).sum(-1)   # [B, chunk]
            kl = (per * weights[:, s:s + KL_CHUNK]).sum()
        if h_twin.requires_grad:
            (kl * scale).backward()
        total += kl.item()
    return total


def kl_step(parent, twin, ids: torch.Tensor, weights: torch.Tensor | None = None) -> float:
    """One training step's loss, its gradients accumulated in the twin: the mean KL per token,
    or with `weights` [B, T] (summing to 1) the weighted sum of the positions' KL."""
    with torch.no_grad():
        hp, _ = parent.hidden(ids)
    h = twin_hidden(twin, ids, grad=True)
    leaf = h.detach().requires_grad_(True)
    scale = 1.0 if weights is not None else 1.0 / ids.numel()
    kl = kl_sum(leaf, hp, twin.lm_head, scale, weights)
    h.backward(leaf.grad)
    return kl * scale


@torch.no_grad()
def heldout_kl(twin, held: tuple[torch.Tensor, torch.Tensor], batch: int) -> float:
    """Mean KL per token over held-out sequences ids [n, T] against the parent's final hidden
    states [n, T, D] (computed once: the parent does not change)."""
    ids, hp = held
    total = 0.0
    for s in range(0, ids.shape[0], batch):
        total += kl_sum(twin_hidden(twin, ids[s:s + batch], grad=False), hp[s:s + batch],
                        twin.lm_head)
    return total / ids.numel()


@torch.no_grad()
def parent_hidden(parent, ids: torch.Tensor, batch: int) -> torch.Tensor:
    return torch.cat([parent.hidden(ids[s:s + batch])[0] for s in range(0, ids.shape[0], batch)])


Batches = Callable[[int], tuple[torch.Tensor, "torch.Tensor | None"]]
Score = Callable[[], dict[str, float]]


def train_kl(e: EndToEnd, parent, twin, names: list[str], lora: LoRA, batches: Batches,
             score: Score, progress: Progress, *, minutes: float | None = None,
             resume: dict[str, torch.Tensor] | None = None,
             save: Callable[[Progress, dict[str, torch.Tensor]], None] | None = None,
             log: Callable[[str], None] = print) -> Progress:
    """Train `names` of `twin` and `lora` on the KL to the parent, from progress.step to
    progress.planned_steps (or the time cap): step i reads `batches(i)` = (ids [B, T], the
    positions' loss weights [B, T] or None for the mean); `score()` (held-out, its "kl" the
    number a sweep compares) at the start, every e.every steps and at the end. `resume`: a
    snapshot's tensors (Adam's moments; the parameters are loaded by the caller)."""
    every = names + lora.names
    opt = torch.optim.AdamW(trainable(twin, names) + lora.params, lr=progress.lr,
                            betas=(0.9, 0.95), weight_decay=0.0)
    if resume:
        load_optimizer_state(opt, every, resume)

    def snapshot() -> dict[str, torch.Tensor]:
        p = dict(twin.named_parameters())
        return {**{n: p[n].detach().clone() for n in names}, **lora.tensors(),
                **optimizer_state(opt, every)}

    def evaluate() -> None:
        point = score()
        progress.heldout.append({"step": progress.step, **point})
        log(f"  step {progress.step}: held-out " + ", ".join(f"{k} {v:.4f}"
                                                             for k, v in point.items()))

    def step(i: int) -> tuple[float, int]:
        ids, weights = batches(i)
        return kl_step(parent, twin, ids, weights), ids.numel()

    if not progress.heldout:
        evaluate()  # where the stage starts
    return run_schedule(progress, opt, warmup=e.warmup, every=e.every,
                        save_every_minutes=e.save_every_minutes, minutes=minutes, step=step,
                        evaluate=evaluate, snapshot=snapshot, save=save, what="KL to the parent")


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def end_to_end_stage(fam, m, twin, resume_file, state: dict[str, Any],
                     write_progress: Callable[[], None]
                     ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """LoLCATs' stage 2 for member `m` of family `fam` (linearize_family.Family), from `twin`
    as attention transfer left it: kl_stage on the training prose, scored by held-out KL."""
    e, seed = fam.recipe.end_to_end, fam.recipe.seed
    held = fam.e2e_heldout()
    stream = fam.e2e_stream
    return kl_stage(fam, m, twin, e, "end_to_end", resume_file, state, write_progress,
                    lambda i: (stream.batch(i, e.batch, seed), None),
                    lambda: {"kl": heldout_kl(twin, held, e.batch)},
                    {"heldout_sequences": int(held[0].shape[0])})


def kl_stage(fam, m, twin, e: EndToEnd, key: str, resume_file, state: dict[str, Any],
             write_progress: Callable[[], None], batches: Batches, score: Score,
             extra: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A KL stage (`key`: its name in the progress and the resume file) for member `m`, from
    `twin` as it stands: a sweep of rates (each from that twin, scored by score()["kl"]; the
    lowest wins, ties to the lower rate), then the final run at the best rate, capped in time
    and resumable: its saves go to `resume_file` (the starting tensors beside them, under
    `key.`), its progress to state[key]. The LoRA is merged into `twin`. Returns (the card's
    record, the LoRA's deltas)."""
    from safetensors.torch import load_file

    log, saved_as = fam.log, key + "."
    names = trained_names(twin, fam.parent)
    layers = list(twin.config.window_linear["layers"])
    params = dict(twin.named_parameters())
    start = {n: params[n].detach().clone() for n in names}
    st = state.setdefault(key, {"sweep": [], "final": None})
    what = key.replace("_", "-")

    def fresh() -> LoRA:
        with torch.no_grad():
            for n in names:
                params[n].copy_(start[n])
        return LoRA(twin, layers, e.lora_rank, e.lora_alpha, fam.recipe.seed)

    if e.sweep and len(e.lrs) > 1:
        done = {s["lr"] for s in st["sweep"]}
        for lr in e.lrs:
            if lr in done:
                continue
            log(f"{m.name}: {what} sweep lr {lr:g}, {e.sweep.steps} steps of "
                f"{e.batch} x {e.seq_len:,} tokens")
            lora = fresh()
            p = train_kl(e, fam.parent, twin, names, lora, batches, score,
                         Progress(lr=lr, planned_steps=e.sweep.steps), log=log)
            lora.remove()
            st["sweep"].append({"lr": lr, "steps": p.step, "seconds": p.seconds,
                                "heldout_kl": p.heldout[-1]["kl"], "loss": p.loss})
            write_progress()
        best = min(st["sweep"], key=lambda s: (s["heldout_kl"], s["lr"]))["lr"]
    else:
        best = e.lrs[0]

    lora, resume = fresh(), None
    if st["final"] is not None and resume_file.is_file():
        progress = Progress(**st["final"])
        resume = {k.removeprefix(saved_as): v for k, v in load_file(str(resume_file)).items()
                  if k.startswith(saved_as)}
        with torch.no_grad():
            for n in names:
                params[n].copy_(resume[n])
        lora.load(resume)
        log(f"{m.name}: resuming the {what} run at step {progress.step} of "
            f"{progress.planned_steps}")
    else:
        progress = Progress(lr=best, planned_steps=e.steps)
        log(f"{m.name}: {what} run, lr {best:g}, {e.steps} steps of {e.batch} x "
            f"{e.seq_len:,} tokens, cap {e.minutes:g} min")

    def save_run(p: Progress, tensors: dict[str, torch.Tensor]) -> None:
        # the stage's starting tensors stay in the file: a resumed sweep starts from them
        write_tensors(resume_file, {**start, **{saved_as + k: v for k, v in tensors.items()}})
        st["final"] = p.to_json()
        write_progress()  # written last: a progress.json always names a complete resume file

    progress = train_kl(e, fam.parent, twin, names, lora, batches, score, progress,
                        minutes=e.minutes, resume=resume, save=save_run, log=log)
    delta = lora.merge()
    return {"lr": best, "sweep": st["sweep"], "final": progress.to_json(),
            "lora_rank": e.lora_rank, "lora_alpha": e.lora_alpha,
            "lora_parameters": sum(p.numel() for p in lora.params), **extra,
            "peak_rss_mib": peak_rss_mib()}, delta
