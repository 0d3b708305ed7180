"""Train mixer twins on Zoology's MQAR with the Based protocol (arXiv 2312.04927, 2402.18668).

Every member is the same two-layer model (layer 0 a gated short convolution, layer 1 the mixer
under test, no MLP, tied embeddings, vocabulary 8,192) and sees the same batches: step s draws
one setting of the training mix (weighted by its count) and `mqar_batch(..., seed=2^31 + s)`.
The loss is cross-entropy at the query positions only: the logits of no other position are
computed (the 8,192-wide head is most of a small model's cost).

Per member: short sweep runs at each learning rate, scored on held-out examples of the test
mix (seeds disjoint from training and evaluation); the best rate (ties: the lower held-out
loss, which separates runs still at chance) is trained for the full steps, stopping early
once the held-out accuracy reaches `early_stop`, or at the member's time cap.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalkit.tasks.mqar import IGNORE, VOCAB_SIZE, accuracy, check_shape, mqar_batch
from evalkit.training.data import TRAIN_SEED_BASE
from evalkit.training.train import lr_at
from evalkit.yamlfile import repeated

HELDOUT_SEED_BASE = TRAIN_SEED_BASE + (1 << 30)  # training seeds stay below this
MAX_STEPS = 200_000


class Setting(BaseModel):
    """One (length, load) of a mix; `count` weighs how often it is drawn (training)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    length: int = Field(ge=8, le=8192)
    load: int = Field(ge=1, le=2048)
    count: int = Field(default=1, ge=1, le=10_000_000)
    batch: int = Field(default=256, ge=1, le=4096)

    @model_validator(mode="after")
    def _fits(self) -> "Setting":
        check_shape(self.length, self.load, VOCAB_SIZE)
        return self


class Member(BaseModel):
    """One twin. mixer: gla (2 heads, expand_k 0.5, expand_v 1 as Based), attn (softmax with
    a KV cache), swa (sliding-window attention of `window` tokens)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    mixer: Literal["gla", "attn", "swa"]
    d: int = Field(ge=8, le=1024)
    num_heads: int | None = Field(default=None, ge=1, le=64)  # default: gla 2, attention 1
    expand_k: float = Field(default=0.5, gt=0, le=4)
    expand_v: float = Field(default=1.0, gt=0, le=4)
    window: int | None = Field(default=None, ge=1, le=65536)
    lrs: tuple[float, ...] | None = Field(default=None, min_length=1, max_length=8)
    steps: int | None = Field(default=None, ge=1, le=MAX_STEPS)
    minutes: float = Field(default=30.0, gt=0, le=600)   # cap of the final run

    @model_validator(mode="after")
    def _window(self) -> "Member":
        if (self.mixer == "swa") != (self.window is not None):
            raise ValueError(f"{self.name}: window is set for mixer swa and only for it")
        return self


class Sweep(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    lrs: tuple[float, ...] = Field(min_length=1, max_length=8)
    steps: int = Field(ge=1, le=MAX_STEPS)


class MQARFamily(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    train_mix: tuple[Setting, ...] = Field(min_length=1, max_length=32)
    test_mix: tuple[Setting, ...] = Field(min_length=1, max_length=32)
    heldout: int = Field(default=100, ge=1, le=10_000)   # examples per test setting
    steps: int = Field(ge=1, le=MAX_STEPS)               # the final run's, unless a member's
    sweep: Sweep
    warmup: int = Field(default=100, ge=0, le=MAX_STEPS)
    weight_decay: float = Field(default=0.1, ge=0, le=1)
    early_stop: float = Field(default=0.99, gt=0, le=1)
    eval_every: int = Field(default=200, ge=1, le=MAX_STEPS)
    conv_kernel: int = Field(default=3, ge=1, le=64)
    seed: int = Field(default=0, ge=0, le=1 << 20)
    threads: int = Field(default=1, ge=1, le=64)
    jobs: int = Field(default=2, ge=1, le=16)
    models: tuple[Member, ...] = Field(min_length=1, max_length=32)

    @model_validator(mode="after")
    def _unique(self) -> "MQARFamily":
        dup = repeated([m.name for m in self.models])
        if dup:
            raise ValueError(f"models: duplicate name(s) {dup}")
        return self

    @property
    def trained_length(self) -> int:
        return max(s.length for s in self.train_mix)

    def member(self, name: str) -> Member:
        for m in self.models:
            if m.name == name:
                return m
        raise ValueError(f"no member {name!r}; the family has {', '.join(m.name for m in self.models)}")

    def recipe_hash(self, m: Member) -> str:
        """What makes a member's checkpoint: the shared recipe, the member's own row and the
        model it builds (not the other members, not jobs). A checkpoint carrying this hash need
        not be retrained."""
        d = self.model_dump(mode="json", exclude={"models", "jobs"})
        return hashlib.sha256(json.dumps({"recipe": d, "member": m.model_dump(mode="json"),
                                          "model": member_config(self, m).config_hash()},
                                         sort_keys=True).encode()).hexdigest()


def member_config(fam: MQARFamily, m: Member):
    """The member's GLAConfig: Zoology's two-layer twin around its mixer."""
    from evalkit.model_adapters.gla.config import GLAConfig

    attn = None
    if m.mixer in ("attn", "swa"):
        # Zoology's attention has no positional encoding (max_position_embeddings=0): the
        # convolution before it places each token, and recall holds past the trained length.
        attn = {"layers": [1], "num_heads": m.num_heads or 1, "window_size": m.window,
                "rope_theta": None}
    cfg = GLAConfig(attn=attn, vocab_size=VOCAB_SIZE, hidden_size=m.d, num_hidden_layers=2,
                    num_heads=m.num_heads or 2, expand_k=m.expand_k, expand_v=m.expand_v,
                    use_short_conv=False, gated_conv={"layers": [0], "kernel_size": fam.conv_kernel},
                    use_mlp=False, tie_word_embeddings=True, pad_token_id=0, bos_token_id=None,
                    eos_token_id=None, max_position_embeddings=fam.trained_length,
                    extra={"trained_length": fam.trained_length})
    cfg.validate(f"member {m.name}")
    return cfg


def query_logits(model, ids: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [N, V] at the N scored positions of ids [B, T] and their targets [N]; the head
    runs only at those positions."""
    h, _ = model.hidden(ids)                                         # [B, T, D]
    scored = targets != IGNORE
    return model.lm_head(h[scored]).float(), targets[scored]


def query_loss(model, ids: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy at the scored positions and the predictions there (evaluation)."""
    logits, y = query_logits(model, ids, targets)
    return F.cross_entropy(logits, y), logits.argmax(-1)


@torch.no_grad()
def heldout_accuracy(model, fam: MQARFamily) -> tuple[dict[str, float], float]:
    """Zoology's accuracy on `heldout` examples per test setting and the mean query loss."""
    model.eval()
    acc, losses = {}, []
    for i, s in enumerate(fam.test_mix):
        ids, t = mqar_batch(fam.heldout, s.length, s.load, seed=HELDOUT_SEED_BASE + i)
        pred = np.full(t.shape, IGNORE, dtype=np.int64)
        for b in range(0, fam.heldout, 64):
            x, y = torch.from_numpy(ids[b:b + 64]), torch.from_numpy(t[b:b + 64])
            loss, guess = query_loss(model, x, y)
            losses.append(loss.item())
            pred[b:b + 64][t[b:b + 64] != IGNORE] = guess.numpy()
        acc[f"{s.length}x{s.load}"] = accuracy(pred, t)
    model.train()
    return acc, float(np.mean(losses))


def plan(fam: MQARFamily, steps: int) -> list[Setting]:
    """The setting of every step: drawn by count from the training mix, seeded by fam.seed;
    every member's step s is the same."""
    rng = np.random.Generator(np.random.PCG64(fam.seed))
    w = np.array([s.count for s in fam.train_mix], dtype=np.float64)
    return [fam.train_mix[i] for i in rng.choice(len(w), size=steps, p=w / w.sum())]


def train_run(fam: MQARFamily, m: Member, lr: float, steps: int, *, minutes: float | None = None,
              early_stop: bool = False, progress=None) -> dict:
    """One run from a seeded init. Returns the model, its config, histories and timings."""
    from evalkit.model_adapters.gla.checkpoint import build_model

    cfg = member_config(fam, m)
    torch.manual_seed(fam.seed)
    model = build_model(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95),
                            weight_decay=fam.weight_decay)
    t0, losses, evals, stop = time.time(), [], [], "every planned step"
    for step, s in enumerate(plan(fam, steps)):
        ids, t = mqar_batch(s.batch, s.length, s.load, seed=TRAIN_SEED_BASE + step)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, lr, fam.warmup, steps)
        loss = F.cross_entropy(*query_logits(model, torch.from_numpy(ids), torch.from_numpy(t)))
        if not math.isfinite(loss.item()):
            stop = f"diverged at step {step}"
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(round(loss.item(), 5))
        last = step == steps - 1
        if (step + 1) % fam.eval_every == 0 or last:
            acc, held_loss = heldout_accuracy(model, fam)
            mean = float(np.mean(list(acc.values())))
            evals.append({"step": step + 1, "accuracy": round(mean, 4), "loss": round(held_loss, 4),
                          "seconds": round(time.time() - t0, 1), "by_setting": acc})
            if progress:
                progress(f"{m.name} lr {lr:g} step {step + 1}/{steps} loss "
                         f"{np.mean(losses[-50:]):.3f} held-out {mean:.3f} "
                         f"({(time.time() - t0) / 60:.1f} min)")
            if early_stop and mean >= fam.early_stop:
                stop = f"early stop at step {step + 1} (held-out {mean:.3f})"
                break
        if minutes is not None and time.time() - t0 > 60 * minutes:
            stop = f"time cap {minutes:g} min at step {step + 1}"
            if not evals or evals[-1]["step"] != step + 1:
                acc, held_loss = heldout_accuracy(model, fam)
                evals.append({"step": step + 1, "accuracy": round(float(np.mean(list(acc.values()))), 4),
                              "loss": round(held_loss, 4), "seconds": round(time.time() - t0, 1),
                              "by_setting": acc})
            break
    final = evals[-1] if evals and not stop.startswith("diverged") else None
    return {"model": model, "config": cfg, "lr": lr, "planned_steps": steps,
            "steps": len(losses), "stop": stop, "seconds": round(time.time() - t0, 1),
            "loss_history": losses, "evals": evals,
            "heldout_accuracy": final["accuracy"] if final else 0.0,
            "heldout_loss": final["loss"] if final else math.inf,
            "params": model.num_parameters(),
            "state_bytes": cfg.state_bytes(context=fam.trained_length)}


def best_rate(runs: list[dict]) -> dict:
    """Highest held-out accuracy; ties (e.g. every run still at chance) to the lower loss."""
    return max(runs, key=lambda r: (r["heldout_accuracy"], -r["heldout_loss"]))
