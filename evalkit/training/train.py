"""Train the matched tiny pair: our GLA and a transformers Llama on the same data, same steps.

Both models share the tiny tokenizer, the width and depth; their parameter counts
must lie within 5 % of each other (checked before training). Each step feeds both models the
identical batch, with the identical optimizer and schedule, so the only difference is the
mixer: a fixed recurrent state against a growing KV cache.
"""
from __future__ import annotations

import math
import random
import time
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from evalkit.training.data import TRAIN_SEED_BASE, batch, make_pool


class Stage(BaseModel):
    """One curriculum stage: its tasks, probe lengths, steps and number of distinct sequences."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    tasks: tuple[str, ...]
    lengths: tuple[int, ...]              # probe lengths; the gold answers follow them
    steps: int = Field(ge=1, le=1_000_000)
    pool: int = Field(default=1000, ge=1, le=200_000)  # distinct training sequences (cycled)
    # per task, for this stage only (short stages cannot hold the long stages' loads);
    # a task not named here takes the recipe's `loads`
    loads: dict[str, tuple[int, ...]] = Field(default_factory=dict)


class Recipe(BaseModel):
    """What every recipe shares: data curriculum, loss weights, optimizer, width and depth."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    # Short contexts first: a tiny model learns to find and copy a value in a 100-token text
    # long before it can in 1,000 tokens, and what it learns there carries over.
    stages: tuple[Stage, ...] = Field(min_length=1)
    include: tuple[str, ...] = ()         # extra task folders (training-only variants)
    loads: dict[str, tuple[int, ...]] = Field(default_factory=dict)  # per task; default (1,)
    seq_len: int = Field(default=1024, ge=16, le=65536)  # trained length: no sequence is longer
    batch_tokens: int = Field(default=8192, ge=16, le=1 << 20)  # per step: // length rows
    warmup: int = Field(default=50, ge=1)
    weight_decay: float = 0.1
    answer_weight: float = 5.0            # loss weight of answer tokens
    context_weight: float = 1.0           # loss weight of every other token
    seed: int = 0
    hidden_size: int = Field(default=128, ge=8, le=4096)
    num_layers: int = Field(default=4, ge=1, le=64)
    intermediate_size: int = Field(default=352, ge=8, le=16384)
    threads: int = Field(default=2, ge=1, le=64)

    @property
    def steps(self) -> int:
        return sum(s.steps for s in self.stages)


class TrainConfig(Recipe):
    """The matched pair (configs/train_tiny.yaml): one GLA, one Llama, one learning rate."""
    lr: float = 3e-3
    num_heads: int = 4                    # softmax heads
    # GLA heads: its recall lives in per-head d_k x d_v states, so fewer, larger heads (Laplace
    # 3B: 2 of d_k 192) recall where four 16 x 32 states measured at chance; parameters are
    # the same for any head count.
    gla_heads: int = 1


def build_gla(cfg: Recipe, vocab_size: int, ids: tuple[int, int, int], *, num_heads: int,
              expand_k: float = 0.5, expand_v: float = 1.0, tie: bool = False):
    """A seeded random GLA of the recipe's width and depth. ids: (pad, bos, eos)."""
    from evalkit.model_adapters.gla.checkpoint import build_model
    from evalkit.model_adapters.gla.config import GLAConfig

    pad_id, bos_id, eos_id = ids
    gla_cfg = GLAConfig(vocab_size=vocab_size, hidden_size=cfg.hidden_size,
                        num_hidden_layers=cfg.num_layers, num_heads=num_heads,
                        expand_k=expand_k, expand_v=expand_v,
                        intermediate_size=cfg.intermediate_size,
                        use_short_conv=True, conv_size=4, max_position_embeddings=cfg.seq_len,
                        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id,
                        tie_word_embeddings=tie)
    gla_cfg.validate("training config")
    torch.manual_seed(cfg.seed)
    return build_model(gla_cfg), gla_cfg


def build_llama(cfg: Recipe, vocab_size: int, ids: tuple[int, int, int], *, num_heads: int,
                tie: bool = False):
    """A seeded random transformers Llama (softmax attention, RoPE) of the same width/depth."""
    from transformers import LlamaConfig, LlamaForCausalLM

    pad_id, bos_id, eos_id = ids
    llama_cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=cfg.hidden_size,
                            intermediate_size=cfg.intermediate_size,
                            num_hidden_layers=cfg.num_layers, num_attention_heads=num_heads,
                            num_key_value_heads=num_heads,
                            max_position_embeddings=cfg.seq_len, rope_theta=10000.0,
                            bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id,
                            tie_word_embeddings=tie, attn_implementation="sdpa")
    torch.manual_seed(cfg.seed)
    return LlamaForCausalLM(llama_cfg)


def build_pair(cfg: TrainConfig, vocab_size: int, pad_id: int, bos_id: int, eos_id: int):
    ids = (pad_id, bos_id, eos_id)
    gla, gla_cfg = build_gla(cfg, vocab_size, ids, num_heads=cfg.gla_heads)
    llama = build_llama(cfg, vocab_size, ids, num_heads=cfg.num_heads)
    n_gla, n_llama = (sum(p.numel() for p in m.parameters()) for m in (gla, llama))
    if abs(n_gla - n_llama) / n_llama > 0.05:
        raise ValueError(f"tiny pair parameters differ by more than 5 %: GLA {n_gla:,} vs "
                         f"Llama {n_llama:,}; adjust intermediate_size or widths")
    return gla, gla_cfg, llama


def lr_at(step: int, lr: float, warmup: int, steps: int) -> float:
    """Linear warm-up then cosine to 0 over `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * 0.5 * (1 + math.cos(math.pi * t))


def batch_schedule(stages, pools, scale: float = 1.0) -> list[tuple[dict, int]]:
    """Per step: (that stage's sequences by probe length, this step's probe length). Batches
    hold one probe length, padded only to their own longest row, so a step costs about
    batch_tokens whatever the length. scale shortens every stage alike (sweeps)."""
    schedule = []
    for st, (_, pool) in zip(stages, pools):
        by_len: dict[int, list] = {}
        for s in pool:
            by_len.setdefault(s.length, []).append(s)
        buckets = sorted(by_len)
        n = max(1, round(st.steps * scale))
        schedule += [(by_len, buckets[i % len(buckets)]) for i in range(n)]
    return schedule


def _loss(logits: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                          reduction="none")
    return (nll * w.reshape(-1)).sum() / w.sum()


def logits_of(model, x: torch.Tensor) -> torch.Tensor:
    """Our GLA returns logits; a transformers model returns an output object."""
    out = model(input_ids=x)
    return out if isinstance(out, torch.Tensor) else out.logits


def train_step(model, opt, x, y, w, lr: float, answer_weight: float) -> tuple[float, float]:
    """One AdamW step (grad clip 1.0). Returns (weighted loss, loss on answer tokens alone)."""
    for g in opt.param_groups:
        g["lr"] = lr
    model.train()
    logits = logits_of(model, x)
    loss = _loss(logits, y, w)
    with torch.no_grad():  # recall is the point: log the loss on answer tokens alone
        ans = _loss(logits.detach(), y, (w == answer_weight).float())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item(), ans.item()


def train_pair(cfg: TrainConfig, tokenizer: Any, log=print) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train_pair(cfg, tokenizer, log)
    finally:
        torch.set_num_threads(threads)


def _train_pair(cfg: TrainConfig, tokenizer: Any, log) -> dict:
    from evalkit.taskspec import discover

    reg = discover(cfg.include)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    gla, gla_cfg, llama = build_pair(cfg, len(tokenizer), pad, tokenizer.bos_token_id,
                                     tokenizer.eos_token_id)
    t0 = time.time()
    pools = stage_pools(cfg, reg, tokenizer)
    for i, (st, (first, pool)) in enumerate(zip(cfg.stages, pools)):
        log(f"stage {i + 1}: {len(pool)} sequences from {', '.join(st.tasks)} at probe lengths "
            f"{list(st.lengths)}, seeds {first}..{first + len(pool) - 1}")
    log(f"data in {time.time() - t0:.0f}s")
    models = {"gla": gla, "softmax": llama}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                                 weight_decay=cfg.weight_decay) for k, m in models.items()}
    history: dict[str, list[float]] = {k: [] for k in models}
    answer_history: dict[str, list[float]] = {k: [] for k in models}
    seconds = {k: 0.0 for k in models}
    rng = random.Random(cfg.seed)
    schedule = batch_schedule(cfg.stages, pools)
    for step, (by_len, L) in enumerate(schedule):
        seqs = rng.sample(by_len[L], min(len(by_len[L]), max(1, cfg.batch_tokens // L)))
        x, y, w = batch(seqs, max(len(s.ids) - 1 for s in seqs), pad, cfg.answer_weight,
                        cfg.context_weight)
        for k, m in models.items():
            t = time.time()
            loss, ans = train_step(m, opts[k], x, y, w, lr_at(step, cfg.lr, cfg.warmup, cfg.steps),
                                   cfg.answer_weight)
            seconds[k] += time.time() - t
            history[k].append(loss)
            answer_history[k].append(ans)
        if step % 10 == 0 or step == cfg.steps - 1:
            log(f"step {step:4d} len {L:4d}  loss gla {history['gla'][-1]:.3f} softmax "
                f"{history['softmax'][-1]:.3f}  answer-loss gla {answer_history['gla'][-1]:.3f} "
                f"softmax {answer_history['softmax'][-1]:.3f}  "
                f"({seconds['gla']:.0f}s / {seconds['softmax']:.0f}s)", flush=True)
    return {"gla": (gla, gla_cfg), "softmax": llama, "history": history,
            "answer_history": answer_history, "seconds": seconds,
            "params": {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}}


def stage_pools(cfg: Recipe, reg, tokenizer: Any) -> list[tuple[int, list]]:
    """Each stage's sequences with its first seed; the stages' seed ranges never overlap."""
    pools, offset = [], 0
    for i, st in enumerate(cfg.stages):
        pool = make_pool([reg.get(t) for t in st.tasks], tokenizer, lengths=st.lengths,
                         loads={**cfg.loads, **st.loads}, n=st.pool, seed_offset=offset)
        longest = max(len(s.ids) for s in pool)
        if longest > cfg.seq_len + 1:
            raise ValueError(f"training config: stages[{i}]: a sequence (probe and answers) has "
                             f"{longest} tokens, more than seq_len={cfg.seq_len}: lower its "
                             f"lengths or raise seq_len")
        pools.append((TRAIN_SEED_BASE + offset, pool))
        offset += st.pool
    return pools


def final_loss(history: list[float], window: int = 25) -> float:
    tail = history[-window:]
    return sum(tail) / len(tail)
