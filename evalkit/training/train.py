"""Train the tiny family: our GLA and a transformers Llama (the matched pair), and a transformers
Mamba-2, on the same data, same steps.

All share the tiny tokenizer and the width; the pair also the depth, the Mamba-2 its own depth
(the recipe's `mamba2` block). Every parameter count must lie within 5 % of the GLA's (checked
before training). One loop trains any of them: each step draws one batch (`draw_batches`: one
seeded RNG, whatever trains) and feeds it to every model, with the identical optimizer and
schedule, so the only difference is the mixer: a fixed recurrent state (GLA, Mamba-2) against a
growing KV cache. Training one model alone sees exactly the batches it saw beside the others.
"""
from __future__ import annotations

import math
import random
import time
from typing import Any, Iterable, Iterator, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from evalkit.training.data import TRAIN_SEED_BASE, batch, make_pool

# the tiny family, in training order: kind -> model (and folder) name
NAMES = {"gla": "recall-gla-tiny", "softmax": "recall-softmax-tiny",
         "mamba2": "recall-mamba2-tiny"}


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


class Mamba2Block(BaseModel):
    """The Mamba-2 of the tiny family (transformers Mamba2ForCausalLM) at the recipe's width:
    its own depth and mixer shape, so that its parameters lie within 5 % of the GLA's. Limits
    keep it servable by vLLM's Mamba-2 kernels (head_dim a multiple of 16, state <= 128)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    num_layers: int = Field(ge=1, le=64)
    state_size: int = Field(default=64, ge=8, le=128)   # d_state of each head's SSM matrix
    head_dim: int = Field(default=64, ge=16, le=256, multiple_of=16)
    expand: int = Field(default=2, ge=1, le=8)          # inner width = expand * hidden_size
    n_groups: int = Field(default=1, ge=1, le=64)       # B/C groups shared by the heads
    conv_kernel: int = Field(default=4, ge=2, le=4)
    chunk_size: Literal[64, 128, 256] = 64  # SSD chunk length (the CPU reference scan: 64 fastest)


class TrainConfig(Recipe):
    """The tiny family (configs/train_tiny.yaml): one GLA, one Llama, and with a `mamba2`
    block one Mamba-2; one learning rate."""
    lr: float = 3e-3
    num_heads: int = 4                    # softmax heads
    # GLA heads: its recall lives in per-head d_k x d_v states, so fewer, larger heads (Laplace
    # 3B: 2 of d_k 192) recall where four 16 x 32 states measured at chance; parameters are
    # the same for any head count.
    gla_heads: int = 1
    mamba2: Mamba2Block | None = None     # without it, `evalkit train-tiny` trains the pair

    @field_validator("mamba2")
    @classmethod
    def _mamba2_heads(cls, m: Mamba2Block | None, info: ValidationInfo) -> Mamba2Block | None:
        if m is not None and "hidden_size" in info.data:
            inner = m.expand * info.data["hidden_size"]
            if inner % m.head_dim:
                raise ValueError(f"expand x hidden_size = {inner} is not a multiple of head_dim "
                                 f"{m.head_dim} (Mamba-2 needs num_heads x head_dim = expand x "
                                 f"hidden_size)")
            if (inner // m.head_dim) % m.n_groups:
                raise ValueError(f"n_groups {m.n_groups} does not divide its "
                                 f"{inner // m.head_dim} heads")
        return m


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


def build_mamba2(cfg: TrainConfig, vocab_size: int, ids: tuple[int, int, int]):
    """A seeded random transformers Mamba2ForCausalLM of the recipe's width and its `mamba2`
    block (untied embeddings, as the GLA's). config.json records `trained_length` (Mamba-2 has
    no positional range to hold it)."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    m = cfg.mamba2
    if m is None:
        raise ValueError("training config: no `mamba2` block, so recall-mamba2-tiny cannot be "
                         "built (add one: num_layers, state_size, head_dim, expand, ...)")
    pad_id, bos_id, eos_id = ids
    m_cfg = Mamba2Config(vocab_size=vocab_size, hidden_size=cfg.hidden_size,
                         num_hidden_layers=m.num_layers, state_size=m.state_size,
                         expand=m.expand, head_dim=m.head_dim,
                         num_heads=m.expand * cfg.hidden_size // m.head_dim,
                         n_groups=m.n_groups, conv_kernel=m.conv_kernel, chunk_size=m.chunk_size,
                         bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id,
                         tie_word_embeddings=False, trained_length=cfg.seq_len)
    torch.manual_seed(cfg.seed)
    return Mamba2ForCausalLM(m_cfg)


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def check_parameters(params: dict[str, int]) -> None:
    """Every model of the family within 5 % of the GLA's parameters (the pair: of each other)."""
    n_gla, n_llama = params["gla"], params["softmax"]
    if abs(n_gla - n_llama) / n_llama > 0.05:
        raise ValueError(f"tiny pair parameters differ by more than 5 %: GLA {n_gla:,} vs "
                         f"Llama {n_llama:,}; adjust intermediate_size or widths")
    if "mamba2" in params:
        n = params["mamba2"]
        if abs(n - n_gla) / n_gla > 0.05:
            raise ValueError(f"{NAMES['mamba2']} would have {n:,} parameters, "
                             f"{100 * (n - n_gla) / n_gla:+.1f} % from {NAMES['gla']}'s {n_gla:,} "
                             f"(more than 5 %); adjust mamba2.num_layers, expand or state_size")


def build_models(cfg: TrainConfig, vocab_size: int, pad_id: int, bos_id: int, eos_id: int
                 ) -> dict[str, tuple[Any, Any]]:
    """{kind: (model, its config)} for the pair and, with a `mamba2` block, the Mamba-2; each
    seeded alike (so none changes another's initialisation), parameters checked."""
    gla, gla_cfg = build_gla(cfg, vocab_size, (pad_id, bos_id, eos_id), num_heads=cfg.gla_heads)
    llama = build_llama(cfg, vocab_size, (pad_id, bos_id, eos_id), num_heads=cfg.num_heads)
    built = {"gla": (gla, gla_cfg), "softmax": (llama, llama.config)}
    if cfg.mamba2 is not None:
        m = build_mamba2(cfg, vocab_size, (pad_id, bos_id, eos_id))
        built["mamba2"] = (m, m.config)
    check_parameters({k: n_params(m) for k, (m, _) in built.items()})
    return built


def select_kinds(cfg: TrainConfig, only: Iterable[str] = ()) -> list[str]:
    """The kinds to train, in the family's order, from model names (`--only`, repeatable); none:
    every model the recipe defines (the pair, and the Mamba-2 when it has a `mamba2` block)."""
    import difflib

    by_name = {v: k for k, v in NAMES.items()}
    only = list(only)
    for n in only:
        if n not in by_name:
            close = difflib.get_close_matches(n, by_name, n=1)
            raise ValueError(f"--only {n!r}: no such model"
                             + (f" (did you mean {close[0]!r}?)" if close else "")
                             + f"; train-tiny trains {', '.join(NAMES.values())}")
    if not only:
        return [k for k in NAMES if k != "mamba2" or cfg.mamba2 is not None]
    kinds = [k for k in NAMES if NAMES[k] in only]
    if "mamba2" in kinds and cfg.mamba2 is None:
        raise ValueError(f"--only {NAMES['mamba2']}: the training config has no `mamba2` block "
                         f"(configs/train_tiny.yaml has one)")
    return kinds


def lr_at(step: int, lr: float, warmup: int, steps: int) -> float:
    """Linear warm-up then cosine to 0 over `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * 0.5 * (1 + math.cos(math.pi * t))


def draw_batches(cfg: Recipe, pools) -> Iterator[tuple[int, list]]:
    """Each step's (probe length, sequences), in step order: one RNG seeded by the recipe draws
    every batch, whatever models train on it, so any subset of the family sees the same ones."""
    rng = random.Random(cfg.seed)
    for by_len, L in batch_schedule(cfg.stages, pools):
        yield L, rng.sample(by_len[L], min(len(by_len[L]), max(1, cfg.batch_tokens // L)))


def batch_seeds(pools) -> dict[int, int]:
    """id(sequence) -> its training seed, to name what each step drew."""
    return {id(s): first + i for first, pool in pools for i, s in enumerate(pool)}


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


def train_models(cfg: TrainConfig, tokenizer: Any, kinds: Iterable[str] | None = None,
                 log=print) -> dict:
    """Train the family's models named by kind ("gla", "softmax", "mamba2"; default: all the
    recipe defines) on the shared batches. Returns {"models": {kind: model} (the trained),
    "history", "answer_history", "seconds" (per trained kind), "configs" and "params" (every
    kind the recipe defines, trained or not: the cards compare them), "batches": [(probe
    length, [seeds])] per step}."""
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train_models(cfg, tokenizer, kinds, log)
    finally:
        torch.set_num_threads(threads)


def _train_models(cfg: TrainConfig, tokenizer: Any, kinds: Iterable[str] | None, log) -> dict:
    from evalkit.taskspec import discover

    kinds = select_kinds(cfg) if kinds is None else list(kinds)
    if set(kinds) - set(NAMES) or not kinds:
        raise ValueError(f"train_models: kinds {kinds} should be some of {list(NAMES)}")
    if "mamba2" in kinds and cfg.mamba2 is None:
        raise ValueError(f"training config: no `mamba2` block, so {NAMES['mamba2']} cannot be "
                         f"trained")
    kinds = [k for k in NAMES if k in kinds]  # the family's order, whatever the caller's
    reg = discover(cfg.include)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    built = build_models(cfg, len(tokenizer), pad, tokenizer.bos_token_id, tokenizer.eos_token_id)
    params = {k: n_params(m) for k, (m, _) in built.items()}
    models = {k: built[k][0] for k in kinds}
    log(f"training {', '.join(f'{NAMES[k]} ({params[k]:,} parameters)' for k in kinds)}")
    t0 = time.time()
    pools = stage_pools(cfg, reg, tokenizer)
    for i, (st, (first, pool)) in enumerate(zip(cfg.stages, pools)):
        log(f"stage {i + 1}: {len(pool)} sequences from {', '.join(st.tasks)} at probe lengths "
            f"{list(st.lengths)}, seeds {first}..{first + len(pool) - 1}")
    log(f"data in {time.time() - t0:.0f}s")
    opts = {k: torch.optim.AdamW(m.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                                 weight_decay=cfg.weight_decay) for k, m in models.items()}
    history: dict[str, list[float]] = {k: [] for k in models}
    answer_history: dict[str, list[float]] = {k: [] for k in models}
    seconds = {k: 0.0 for k in models}
    seeds, drawn = batch_seeds(pools), []
    for step, (L, seqs) in enumerate(draw_batches(cfg, pools)):
        drawn.append((L, [seeds[id(s)] for s in seqs]))
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
            log(f"step {step:4d} len {L:4d}  loss "
                + " ".join(f"{k} {history[k][-1]:.3f}" for k in models) + "  answer-loss "
                + " ".join(f"{k} {answer_history[k][-1]:.3f}" for k in models) + "  ("
                + " / ".join(f"{seconds[k]:.0f}s" for k in models) + ")", flush=True)
    return {"models": models, "configs": {k: c for k, (_, c) in built.items()},
            "history": history, "answer_history": answer_history, "seconds": seconds,
            "params": params, "batches": drawn}


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
