"""Attention transfer (LoLCATs stage 1, arXiv 2410.10254): a transformer's linearized twin
learns to reproduce each attention layer's output, every parent weight frozen.

The twin's layers are `window_linear` mixers (gla/window_linear.py) on the parent's own q/k/v/o
projections; only their feature maps, gates and mixes are trained. Each layer is trained on
the parent's own input to that layer (teacher forcing), so the layers are independent: one
parent forward pass gives every layer's input x_i and softmax output y_i, and layer i's loss is

    mse_i = mean (twin_layer_i(x_i) - y_i)^2        (its gradient reaches only layer i)

reported also as relative error mse_i / mean(y_i^2). A recipe (configs/linearize.yaml) names
the corpus, the schedule, a small learning-rate sweep scored on held-out documents, and the
family: trained twins (a window, sinks, a state), derived twins (a trained twin with its worst
layers, by held-out relative error, restored to full attention: after attention transfer alone
the other layers' tensors are the same because training is per layer), and window-only
references (the parent with a sliding window, nothing trained). A recipe's `end_to_end`
settings add LoLCATs' stage 2 after this one (linearize_e2e.py).

    recipe = read_typed("configs/linearize.yaml", Recipe, "linearize recipe")
    run = train_transfer(recipe, parent, twin, layers, stream, heldout, lr, steps)
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalkit.training.copies import CopySpec
from evalkit.training.mqar import Sweep  # the same small sweep as the MQAR twins'
from evalkit.training.prose import CorpusConfig
from evalkit.training.train import lr_at
from evalkit.yamlfile import repeated

MAX_STEPS = 100_000


class Member(BaseModel):
    """One model of the family. Exactly one kind:
    - trained: `window` (every layer but `keep_attention` linearized, then trained; `state`
      picks the recurrent state of older tokens, and the recipe's end-to-end stage follows
      attention transfer unless `end_to_end: false`);
    - derived: `from_twin` + `keep_worst` (that trained twin, its keep_worst layers of highest
      held-out relative error restored to full attention, nothing trained);
    - recall: `from_twin` + `recall: true` (that trained twin, trained further by the recipe's
      recall stage: prose with earlier snippets copied forward past the window, copies.py);
    - window-only: `window` + `window_only: true` (the parent with a sliding window).
    `sinks`: the first S tokens stay exact softmax keys beside the window (StreamingLLM)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    window: int | None = Field(default=None, ge=1, le=8192)
    sinks: int = Field(default=0, ge=0, le=64)
    state: Literal["gla", "gated_delta"] = "gla"
    gate: Literal["key", "learned", "none"] | None = None   # the recipe's unless set
    end_to_end: bool = True
    keep_attention: tuple[int, ...] = Field(default=(), max_length=256)
    window_only: bool = False
    from_twin: str | None = None
    keep_worst: int | None = Field(default=None, ge=1, le=256)
    recall: bool = False
    minutes: float | None = Field(default=None, gt=0, le=600)   # this member's time cap

    @model_validator(mode="after")
    def _kind(self) -> "Member":
        if self.from_twin is not None:
            if (self.keep_worst is None) == (not self.recall) or self.window is not None \
                    or self.window_only or self.keep_attention or self.sinks \
                    or self.state != "gla" or self.gate:
                raise ValueError(f"{self.name}: a twin made from another (from_twin) sets either "
                                 f"keep_worst or recall: true, and nothing else (its window, "
                                 f"sinks and state are its source's)")
        elif self.window is None:
            raise ValueError(f"{self.name}: set window (a trained twin or, with window_only, a "
                             f"sliding-window reference) or from_twin + keep_worst / recall")
        elif self.keep_worst is not None or self.recall:
            raise ValueError(f"{self.name}: {'keep_worst' if self.recall is False else 'recall'} "
                             f"needs from_twin")
        elif self.window_only and (self.keep_attention or self.state != "gla" or self.gate):
            raise ValueError(f"{self.name}: a window-only reference keeps no attention layer "
                             f"and has no state (set window and sinks only)")
        return self

    @property
    def kind(self) -> Literal["trained", "derived", "recall", "window_only"]:
        return ("recall" if self.recall else "derived" if self.from_twin
                else "window_only" if self.window_only else "trained")


class Evaluation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    transfer_sequences: int = Field(default=8, ge=1, le=256)   # held-out, at seq_len
    every: int = Field(default=50, ge=1, le=MAX_STEPS)          # held-out transfer every N steps
    perplexity_lengths: tuple[int, ...] = Field(default=(1024, 2048), min_length=1, max_length=8)
    perplexity_documents: int = Field(default=8, ge=1, le=256)


class Rates(BaseModel):
    """A stage's learning rate: one `lr`, or a small `sweep` scored on held-out documents."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    sweep: Sweep | None = None
    lr: float | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="after")
    def _one_rate(self) -> "Rates":
        if (self.sweep is None) == (self.lr is None):
            raise ValueError("give either lr or a sweep (lrs, steps), not both")
        return self

    @property
    def lrs(self) -> tuple[float, ...]:
        return self.sweep.lrs if self.sweep else (self.lr,)


class EndToEnd(Rates):
    """LoLCATs' stage 2 (arXiv 2410.10254; Liger, RADLADS): after attention transfer, the whole
    twin trained to the parent's next-token distribution (KL), LoRA on the linearized layers'
    q/k/v/o beside the twin's own parameters, on sequences well past the window."""
    seq_len: int = Field(default=2048, ge=16, le=8192)
    batch: int = Field(default=1, ge=1, le=64)
    steps: int = Field(ge=1, le=MAX_STEPS)
    minutes: float = Field(gt=0, le=600)                        # cap of the final run
    warmup: int = Field(default=0, ge=0, le=MAX_STEPS)
    lora_rank: int = Field(default=8, ge=1, le=64)
    lora_alpha: float = Field(default=16.0, gt=0, le=1024)     # the update is alpha/rank B A
    heldout_sequences: int = Field(default=4, ge=1, le=64)     # held-out KL, at seq_len
    every: int = Field(default=25, ge=1, le=MAX_STEPS)          # held-out KL every N steps
    save_every_minutes: float = Field(default=5.0, gt=0, le=600)


class Recall(EndToEnd):
    """The recall stage: a trained twin (`from_twin`) trained further to the parent's
    next-token distribution on prose whose earlier snippets come back past the window
    (copies.py), the copies' positions `copies.weight` of the loss; scored by the held-out
    weighted KL, with the copies' top-1 agreement beside it."""
    seq_len: int = Field(default=1024, ge=16, le=8192)
    copies: CopySpec


class Recipe(Rates):
    corpus: CorpusConfig
    seq_len: int = Field(ge=16, le=8192)
    batch: int = Field(ge=1, le=64)
    steps: int = Field(ge=1, le=MAX_STEPS)
    minutes: float = Field(gt=0, le=600)                        # cap of each final run
    warmup: int = Field(default=0, ge=0, le=MAX_STEPS)
    weight_decay: float = Field(default=0.0, ge=0, le=1)
    feature_map: Literal["hedgehog", "softmax"] = "hedgehog"
    feature_dim: int = Field(default=64, ge=1, le=1024)
    gate: Literal["key", "learned", "none"] = "key"
    mix: float = Field(default=0.5, gt=0, lt=1)
    seed: int = Field(default=0, ge=0, le=2 ** 31 - 1)
    threads: int = Field(default=2, ge=1, le=256)
    save_every_minutes: float = Field(default=10.0, gt=0, le=600)
    eval: Evaluation = Evaluation()
    end_to_end: EndToEnd | None = None                          # stage 2 of trained twins
    recall: Recall | None = None                                # recall members' stage
    twins: tuple[Member, ...] = Field(min_length=1, max_length=16)

    @model_validator(mode="after")
    def _check(self) -> "Recipe":
        if dup := repeated([m.name for m in self.twins]):
            raise ValueError(f"twin names repeated: {dup}")
        for i, m in enumerate(self.twins):
            if m.from_twin is not None:
                src = next((s for s in self.twins[:i] if s.name == m.from_twin), None)
                if src is None or src.kind != "trained":
                    raise ValueError(f"{m.name}: from_twin {m.from_twin!r} must name a trained "
                                     f"twin listed before it")
                if m.recall:
                    self._check_recall(m, src)
            if self.has_end_to_end(m) and self.end_to_end.seq_len <= m.window + m.sinks:
                raise ValueError(f"{m.name}: end_to_end.seq_len {self.end_to_end.seq_len} must "
                                 f"be past its window + sinks ({m.window + m.sinks}): the stage "
                                 f"trains what the state adds")
        return self

    def _check_recall(self, m: Member, src: Member) -> None:
        r = self.recall
        if r is None:
            raise ValueError(f"{m.name}: recall: true needs the recipe's `recall` stage")
        if r.copies.min_distance < src.window:
            raise ValueError(f"{m.name}: recall.copies.min_distance {r.copies.min_distance} must "
                             f"be at least its window ({src.window}): a copy's source inside the "
                             f"window trains the window, not the state")
        r.copies.check_fits(r.seq_len, src.sinks, f"{m.name}: recall")

    def has_end_to_end(self, m: Member) -> bool:
        return self.end_to_end is not None and m.kind == "trained" and m.end_to_end

    def gate_of(self, m: Member) -> str:
        """The forget gate of `m`'s state: its own, else the recipe's."""
        return m.gate or self.gate

    def member(self, name: str) -> Member:
        for m in self.twins:
            if m.name == name:
                return m
        raise KeyError(f"no twin {name!r} in the recipe; it has {', '.join(m.name for m in self.twins)}")

    def member_hash(self, m: Member) -> str:
        """What a twin folder is current for: every setting that changes its tensors (not the
        thread count or the save interval), and a derived twin's source's."""
        shared = self.model_dump(mode="json", exclude={
            "twins": True, "threads": True, "save_every_minutes": True, "recall": True,
            "end_to_end": {"save_every_minutes": True}})
        # a member's own gate and recall are hashed only when set, the recall stage only for
        # the members it trains: folders built before they existed stay current
        unset = {k for k, v in (("gate", m.gate is None), ("recall", not m.recall)) if v}
        body = {"recipe": shared, "member": m.model_dump(mode="json", exclude=unset or None)}
        if m.from_twin:
            body["from"] = self.member_hash(self.member(m.from_twin))
        if m.recall:
            body["recall"] = self.recall.model_dump(mode="json",
                                                    exclude={"save_every_minutes"})
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------
@torch.no_grad()
def layer_io(parent: torch.nn.Module, ids: torch.Tensor, layers: list[int]
             ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """{layer: (its mixer's input x [B, T, D], the parent's mixer output y [B, T, D])} from
    one forward pass of the parent (no head)."""
    io: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = []
    for i in layers:
        def hook(mod, args, out, i=i):
            io[i] = (args[0].detach(), out[0].detach())
        hooks.append(parent.model.layers[i].attn.register_forward_hook(hook))
    try:
        x = parent.model.embeddings(ids)
        last = max(layers)
        for i, block in enumerate(parent.model.layers[:last + 1]):  # nothing past the last
            x, _ = block(x)
    finally:
        for h in hooks:
            h.remove()
    return io


def transfer_losses(twin: torch.nn.Module, io: dict[int, tuple[torch.Tensor, torch.Tensor]],
                    backward: bool) -> dict[int, tuple[float, float]]:
    """{layer: (mse, relative error)} of the twin's layers on the parent's inputs; with
    `backward`, each layer's gradient is accumulated right after its forward (its graph freed
    before the next layer's)."""
    out = {}
    for i, (x, y) in io.items():
        with torch.set_grad_enabled(backward):
            pred, _ = twin.model.layers[i].attn(x)
            mse = F.mse_loss(pred.float(), y.float())
        if backward:
            mse.backward()
        out[i] = (mse.item(), mse.item() / max(y.float().pow(2).mean().item(), 1e-30))
    return out


def heldout_transfer(twin, parent, seqs: torch.Tensor, layers: list[int], batch: int
                     ) -> dict[int, tuple[float, float]]:
    """Mean (mse, relative error) per layer over held-out sequences [n, T]."""
    sums = {i: [0.0, 0.0] for i in layers}
    n = 0
    for s in range(0, seqs.shape[0], batch):
        ids = seqs[s:s + batch]
        for i, (a, b) in transfer_losses(twin, layer_io(parent, ids, layers), False).items():
            sums[i][0] += a * ids.shape[0]
            sums[i][1] += b * ids.shape[0]
        n += ids.shape[0]
    return {i: (a / n, b / n) for i, (a, b) in sums.items()}


def mean_relative(per_layer: dict[int, tuple[float, float]]) -> float:
    return sum(r for _, r in per_layer.values()) / max(1, len(per_layer))


# ---------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------
@dataclass
class Progress:
    """Where a run stands; saved with the trained tensors and Adam's moments so an interrupted
    run resumes at its step (the batches are a function of (seed, step))."""
    lr: float
    planned_steps: int
    step: int = 0
    tokens: int = 0
    seconds: float = 0.0
    loss: list[float] = field(default_factory=list)          # mean relative error per step
    heldout: list[dict[str, Any]] = field(default_factory=list)  # {step, layers: {i: [mse, rel]}}
    stop: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def write_tensors(path, tensors: dict[str, torch.Tensor]) -> None:
    """A safetensors file written atomically: a run killed while saving keeps the last save."""
    from safetensors.torch import save

    from evalkit import atomic

    with atomic.atomic_open(path, "wb") as f:
        f.write(save({k: v.contiguous() for k, v in tensors.items()}))


def trainable(twin: torch.nn.Module, names: list[str]) -> list[torch.nn.Parameter]:
    """Freeze every parameter but `names`; returns those, in order."""
    params = dict(twin.named_parameters())
    for p in params.values():
        p.requires_grad_(False)
    for n in names:
        params[n].requires_grad_(True)
    return [params[n] for n in names]


def optimizer_state(opt: torch.optim.Optimizer, names: list[str]) -> dict[str, torch.Tensor]:
    """Adam's moments and step counts as named tensors (saved with safetensors)."""
    out = {}
    for n, p in zip(names, opt.param_groups[0]["params"]):
        st = opt.state.get(p)
        if st:
            out[f"adam.exp_avg.{n}"] = st["exp_avg"]
            out[f"adam.exp_avg_sq.{n}"] = st["exp_avg_sq"]
            out[f"adam.step.{n}"] = torch.as_tensor(st["step"], dtype=torch.float32).reshape(1)
    return out


def load_optimizer_state(opt: torch.optim.Optimizer, names: list[str],
                         tensors: dict[str, torch.Tensor]) -> None:
    for n, p in zip(names, opt.param_groups[0]["params"]):
        if f"adam.exp_avg.{n}" in tensors:
            opt.state[p] = {"step": tensors[f"adam.step.{n}"].reshape(()).clone(),
                            "exp_avg": tensors[f"adam.exp_avg.{n}"].clone(),
                            "exp_avg_sq": tensors[f"adam.exp_avg_sq.{n}"].clone()}


def run_schedule(progress: Progress, opt: torch.optim.Optimizer, *, warmup: int, every: int,
                 save_every_minutes: float, minutes: float | None,
                 step: Callable[[int], tuple[float, int]], evaluate: Callable[[], None],
                 snapshot: Callable[[], dict[str, torch.Tensor]],
                 save: Callable[[Progress, dict[str, torch.Tensor]], None] | None,
                 what: str) -> Progress:
    """The loop both stages share: from progress.step to progress.planned_steps or the time cap
    (counted over resumes: progress.seconds), warm-up then cosine; `step(i)` computes step i's
    gradients and returns (loss, tokens); `evaluate()` appends a held-out point every `every`
    steps and at the end; `save(progress, snapshot())` every save_every_minutes and at the end."""
    cap = 60.0 * minutes if minutes is not None else math.inf
    start, last_save = time.time() - progress.seconds, time.time()
    while progress.step < progress.planned_steps:
        if time.time() - start >= cap:
            progress.stop = f"time cap ({minutes:g} min)"
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(progress.step, progress.lr, warmup, progress.planned_steps)
        loss, tokens = step(progress.step)
        if not math.isfinite(loss):
            raise FloatingPointError(f"step {progress.step}: the {what} is {loss} "
                                     f"(lr {progress.lr:g}); lower the learning rate")
        opt.step()
        opt.zero_grad(set_to_none=True)
        progress.step += 1
        progress.tokens += tokens
        progress.loss.append(loss)
        progress.seconds = time.time() - start
        if progress.step % every == 0 and progress.step < progress.planned_steps:
            evaluate()
        if save and time.time() - last_save >= 60.0 * save_every_minutes:
            save(progress, snapshot())
            last_save = time.time()
    progress.stop = progress.stop or "planned steps"
    if not progress.heldout or progress.heldout[-1]["step"] != progress.step:
        evaluate()
    progress.seconds = time.time() - start
    if save:
        save(progress, snapshot())
    return progress


def train_transfer(recipe: Recipe, parent, twin, names: list[str], layers: list[int], stream,
                   heldout: torch.Tensor, progress: Progress, *, minutes: float | None = None,
                   resume: dict[str, torch.Tensor] | None = None,
                   save: Callable[[Progress, dict[str, torch.Tensor]], None] | None = None,
                   log: Callable[[str], None] = print) -> Progress:
    """Train `names` of `twin` from progress.step to progress.planned_steps (or the time cap),
    AdamW with warm-up then cosine; held-out transfer every eval.every steps and at the end.
    `save(progress, tensors)` is called every save_every_minutes and at the end."""
    params = trainable(twin, names)
    opt = torch.optim.AdamW(params, lr=progress.lr, betas=(0.9, 0.95),
                            weight_decay=recipe.weight_decay)
    if resume:
        load_optimizer_state(opt, names, resume)

    def snapshot() -> dict[str, torch.Tensor]:
        p = dict(twin.named_parameters())
        return {**{n: p[n].detach().clone() for n in names}, **optimizer_state(opt, names)}

    def evaluate() -> None:
        per = heldout_transfer(twin, parent, heldout, layers, recipe.batch)
        progress.heldout.append({"step": progress.step,
                                 "layers": {str(i): [a, b] for i, (a, b) in per.items()}})
        log(f"  step {progress.step}: held-out relative error {mean_relative(per):.4f}")

    def step(i: int) -> tuple[float, int]:
        ids = stream.batch(i, recipe.batch, recipe.seed)
        per = transfer_losses(twin, layer_io(parent, ids, layers), backward=True)
        return mean_relative(per), ids.numel()

    return run_schedule(progress, opt, warmup=recipe.warmup, every=recipe.eval.every,
                        save_every_minutes=recipe.save_every_minutes, minutes=minutes, step=step,
                        evaluate=evaluate, snapshot=snapshot, save=save, what="transfer loss")


# ---------------------------------------------------------------------------------------
# Perplexity
# ---------------------------------------------------------------------------------------
@torch.no_grad()
def perplexity(model: torch.nn.Module, seqs: torch.Tensor, window: int | None) -> dict[str, Any]:
    """Held-out perplexity of `model` on sequences [n, T] (each predicted from its own start):
    over all predicted tokens, and split at `window` (tokens whose context fits in the
    window, sinks included, vs those past it), plus the mean NLL per position (for the card's
    curve)."""
    n, T = seqs.shape
    nll = torch.zeros(T - 1, dtype=torch.float64)
    for row in seqs:
        logits = model(row[None])[0, :-1].float()                    # [T-1, V]
        nll += F.cross_entropy(logits, row[1:], reduction="none").double()
    nll /= n
    out = {"tokens": n * (T - 1), "ppl": math.exp(nll.mean().item()),
           "nll_by_position": [round(v, 4) for v in nll.tolist()]}
    if window is not None and window < T - 1:
        out["ppl_inside_window"] = math.exp(nll[:window].mean().item())
        out["ppl_past_window"] = math.exp(nll[window:].mean().item())
    return out
