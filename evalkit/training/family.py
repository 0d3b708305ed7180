"""Train a capacity family: GLAs of several recurrent state sizes and a softmax twin, on the same
batches for the same steps, each with its own learning-rate sweep.

Recurrent models learn recall only inside a narrow learning-rate window (arXiv 2508.19029), so
one shared rate would make the comparison a training artifact. Every member is trained at each
rate of the sweep on a shortened schedule (every stage's steps times `sweep.scale`); the rate
with the best held-out recall is then trained on the full schedule and kept. With scale 1 the
sweep runs are full runs: the best is kept as it is (Zoology reports its best sweep run), so a
family costs one run per rate, not one more.

Held-out recall: exact match of the answer tokens under teacher forcing (argmax at every answer
token; for a greedy decoder that is the same as generating the answer), on `heldout.n` probes
of `heldout.task` whose seeds follow every training seed (training range, never an evaluation
seed, never trained on). Ties go to the lower answer-token loss. The answer-token loss alone
rewards a model that is confidently half right; exact match is what the leaderboard scores.

Runs are independent processes (`jobs` at once, `threads` each): two 1-thread trainings on 2
cores finish sooner than one 2-thread training after another (measured: the small matmuls of
a 128-wide model scale poorly across threads).
"""
from __future__ import annotations

import math
import random
import shutil
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal, Sequence

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalkit.training.data import TRAIN_SEED_BASE, Sequence_, batch, make_pool
from evalkit.training.train import (Recipe, batch_schedule, build_gla, build_llama, logits_of,
                                    lr_at, stage_pools, train_step)

MAX_MEMBERS = 16


class Member(BaseModel):
    """One model of the family. GLA state per layer: num_heads x (d_k / num_heads) x
    (d_v / num_heads) with d_k = hidden * expand_k, d_v = hidden * expand_v."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    kind: Literal["gla", "softmax"]
    num_heads: int = Field(ge=1, le=64)
    expand_k: float = Field(default=0.5, gt=0, le=4)
    expand_v: float = Field(default=1.0, gt=0, le=4)
    # Depth and MLP width of this member; unset: the recipe's. A deeper, narrower softmax twin
    # keeps the parameter count (two attention layers must learn a two-token key match from
    # scratch, which the GLA's short convolution hands its keys for free).
    num_layers: int | None = Field(default=None, ge=1, le=64)
    intermediate_size: int | None = Field(default=None, ge=8, le=16384)

    def shape(self, recipe: "Recipe") -> "Recipe":
        """The recipe with this member's depth and MLP width."""
        return recipe.model_copy(update={
            "num_layers": self.num_layers or recipe.num_layers,
            "intermediate_size": self.intermediate_size or recipe.intermediate_size})


class Sweep(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    lrs: tuple[float, ...] = Field(min_length=1, max_length=8)
    scale: float = Field(default=0.25, gt=0, le=1)  # fraction of every stage's steps per sweep run


class Heldout(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    task: str = "multikey_mqar"
    length: int = Field(ge=16, le=65536)
    load: int = Field(default=1, ge=1, le=4096)
    n: int = Field(default=32, ge=1, le=1000)


class FamilyConfig(Recipe):
    models: tuple[Member, ...] = Field(min_length=1, max_length=MAX_MEMBERS)
    sweep: Sweep
    heldout: Heldout
    tie_word_embeddings: bool = True   # halves the checkpoints of a small-vocabulary model
    jobs: int = Field(default=1, ge=1, le=16)

    @model_validator(mode="after")
    def _unique_names(self) -> "FamilyConfig":
        names = [m.name for m in self.models]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"models: duplicate name(s) {dup}")
        return self


# -- the data, shared with worker processes through one tensor file ---------------------------

def _pack(seqs: Sequence[Sequence_]) -> dict[str, torch.Tensor]:
    return {"ids": torch.tensor([t for s in seqs for t in s.ids], dtype=torch.int32),
            "mask": torch.tensor([m for s in seqs for m in s.answer_mask], dtype=torch.bool),
            "sizes": torch.tensor([len(s.ids) for s in seqs], dtype=torch.int64),
            "lengths": torch.tensor([s.length for s in seqs], dtype=torch.int64)}


def _unpack(d: dict[str, torch.Tensor]) -> list[Sequence_]:
    out, at = [], 0
    ids, mask = d["ids"].tolist(), d["mask"].tolist()
    for n, L in zip(d["sizes"].tolist(), d["lengths"].tolist()):
        out.append(Sequence_(tuple(ids[at:at + n]), tuple(mask[at:at + n]), L))
        at += n
    return out


def build_data(cfg: FamilyConfig, tokenizer: Any, path: Path, log=print) -> None:
    """Every stage's pool and the held-out probes, written once for all runs."""
    from evalkit.taskspec import discover

    reg = discover(cfg.include)
    t0 = time.time()
    pools = stage_pools(cfg, reg, tokenizer)
    first = TRAIN_SEED_BASE + sum(st.pool for st in cfg.stages)
    h = cfg.heldout
    held = make_pool([reg.get(h.task)], tokenizer, lengths=[h.length], loads={h.task: [h.load]},
                     n=h.n, seed_offset=first - TRAIN_SEED_BASE)
    tensors = {f"heldout.{k}": v for k, v in _pack(held).items()}
    for i, (_, pool) in enumerate(pools):
        tensors.update({f"stage{i}.{k}": v for k, v in _pack(pool).items()})
    torch.save(tensors, path)
    log(f"data: {sum(len(p) for _, p in pools)} training sequences, {len(held)} held-out "
        f"{h.task} probes (length {h.length}, load {h.load}, seeds {first}..{first + h.n - 1}) "
        f"in {time.time() - t0:.0f}s")


def _load_data(path: Path, n_stages: int) -> tuple[list[tuple[int, list]], list[Sequence_]]:
    t = torch.load(path, weights_only=True)
    part = lambda p: _unpack({k: t[f"{p}.{k}"] for k in ("ids", "mask", "sizes", "lengths")})
    return [(0, part(f"stage{i}")) for i in range(n_stages)], part("heldout")


# -- one training run -------------------------------------------------------------------------

@torch.no_grad()
def heldout_recall(model, seqs: Sequence[Sequence_]) -> tuple[float, float]:
    """(exact match, mean answer-token loss) under teacher forcing; the newline that ends each
    answer is not part of the answer."""
    model.eval()
    hits, losses = 0, []
    for s in seqs:
        logits = logits_of(model, torch.tensor([s.ids[:-1]]))[0].float()
        y = torch.tensor(s.ids[1:])
        mask = torch.tensor(s.answer_mask[1:])
        ends = mask & ~torch.cat([mask[1:], torch.tensor([False])])  # last token of each answer
        idx = (mask & ~ends).nonzero()[:, 0]
        hits += bool((logits[idx].argmax(-1) == y[idx]).all())
        losses.append(F.cross_entropy(logits[idx], y[idx]).item())
    return hits / len(seqs), sum(losses) / len(losses)


def build_member(cfg: FamilyConfig, m: Member, vocab: int, ids: tuple[int, int, int]):
    """(model, GLA config or None)."""
    cfg = m.shape(cfg)
    if m.kind == "gla":
        return build_gla(cfg, vocab, ids, num_heads=m.num_heads, expand_k=m.expand_k,
                         expand_v=m.expand_v, tie=cfg.tie_word_embeddings)
    if cfg.hidden_size % m.num_heads:
        raise ValueError(f"models: {m.name}: hidden_size {cfg.hidden_size} is not divisible by "
                         f"num_heads {m.num_heads}")
    return build_llama(cfg, vocab, ids, num_heads=m.num_heads, tie=cfg.tie_word_embeddings), None


def run_job(job: dict) -> dict:
    """Train one member at one learning rate (a worker process, or inline when jobs=1)."""
    cfg = FamilyConfig.model_validate(job["cfg"])
    member = Member.model_validate(job["member"])
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        pools, held = _load_data(Path(job["data"]), len(cfg.stages))
        model, gla_cfg = build_member(cfg, member, job["vocab"], tuple(job["ids"]))
        schedule = batch_schedule(cfg.stages, pools, job["scale"])
        opt = torch.optim.AdamW(model.parameters(), lr=job["lr"], betas=(0.9, 0.95),
                                weight_decay=cfg.weight_decay)
        rng = random.Random(cfg.seed)  # same seed: every member sees the same batches
        pad = job["ids"][0]
        hist, ans_hist, t0 = [], [], time.time()
        for step, (by_len, L) in enumerate(schedule):
            seqs = rng.sample(by_len[L], min(len(by_len[L]), max(1, cfg.batch_tokens // L)))
            x, y, w = batch(seqs, max(len(s.ids) - 1 for s in seqs), pad, cfg.answer_weight,
                            cfg.context_weight)
            loss, ans = train_step(model, opt, x, y, w,
                                   lr_at(step, job["lr"], cfg.warmup, len(schedule)),
                                   cfg.answer_weight)
            if not (math.isfinite(loss) and math.isfinite(ans)):  # this rate diverged
                if job.get("final"):
                    raise RuntimeError(f"{member.name}: training at lr {job['lr']:g} diverged "
                                       f"(non-finite loss) at step {step}")
                break
            hist.append(loss)
            ans_hist.append(ans)
            if job.get("progress") and (step % 100 == 99 or step == len(schedule) - 1):
                with open(job["progress"], "a", encoding="utf-8") as f:  # tail -f to watch
                    f.write(f"{member.name} lr {job['lr']:g} step {step + 1}/{len(schedule)} "
                            f"answer loss (mean of 100) "
                            f"{sum(ans_hist[-100:]) / len(ans_hist[-100:]):.3f} "
                            f"{time.time() - t0:.0f}s\n")
        seconds = time.time() - t0
        diverged = len(hist) < len(schedule)
        em, held_loss = (0.0, None) if diverged else heldout_recall(model, held)
        out = {}
        if job.get("save") and not diverged:
            _save(model, gla_cfg, Path(job["save"]))
            out["save"] = job["save"]
        return {**out, "final": bool(job.get("final")), "name": member.name, "lr": job["lr"],
                "steps": len(schedule),
                "diverged_at": len(hist) if diverged else None, "seconds": seconds,
                "heldout_em": em, "heldout_answer_loss": held_loss, "history": hist,
                "answer_history": ans_hist, "params": sum(p.numel() for p in model.parameters()),
                "state_bytes": gla_cfg.state_bytes("float32") if gla_cfg is not None else None}
    finally:
        torch.set_num_threads(threads)


def _save(model, gla_cfg, folder: Path) -> None:
    from evalkit.model_adapters.gla.checkpoint import save_checkpoint

    folder.mkdir(parents=True, exist_ok=True)
    if gla_cfg is not None:
        save_checkpoint(model.float(), gla_cfg, folder)
    else:
        model.save_pretrained(folder, safe_serialization=True)


class _Inline:
    """The executor interface, running each job at submit (jobs: 1; and tests)."""
    def submit(self, fn, job):
        from concurrent.futures import Future

        f = Future()
        f.set_result(fn(job))
        return f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def best_of(sweep: Sequence[dict]) -> dict:
    """Highest held-out exact match; ties to the lower held-out answer loss; a rate whose
    training diverged is never kept (unless every rate diverged)."""
    finite = [r for r in sweep if r.get("diverged_at") is None] or sweep
    return max(finite, key=lambda r: (r["heldout_em"], -(r["heldout_answer_loss"] or 0.0)))


def _keep(run: dict, folder: Path) -> dict:
    """A full-length sweep run kept as the member's final: its checkpoint moved into place."""
    if "save" not in run:
        raise RuntimeError(f"{run['name']}: every learning rate of the sweep diverged")
    shutil.move(run["save"], folder)
    return {**run, "save": str(folder)}


def train_family(cfg: FamilyConfig, tokenizer: Any, work: Path, log=print) -> dict[str, dict]:
    """Sweep, select, train the finals into work/<name>/. Returns per member: the final run
    (with "sweep": every sweep run, with its answer-loss history)."""
    data = work / "data.pt"
    build_data(cfg, tokenizer, data, log)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    base = {"cfg": cfg.model_dump(mode="json"), "data": str(data), "vocab": len(tokenizer),
            "progress": str(work / "progress.log"),
            "ids": [pad, tokenizer.bos_token_id, tokenizer.eos_token_id]}
    log(f"progress of every run: {work / 'progress.log'}")
    t0 = time.time()
    by_name: dict[str, list[dict]] = {m.name: [] for m in cfg.models}
    finals: list[dict] = []
    full = cfg.sweep.scale == 1.0  # the sweep runs are the finals: save each, keep the best
    sweep_dir = work / "sweep"
    # A member's final starts as soon as its own sweep is done, so both workers stay busy.
    # spawn: a fresh interpreter per worker; fork after tokenizers/OpenMP threads can deadlock.
    pool = (ProcessPoolExecutor(cfg.jobs, mp_context=get_context("spawn")) if cfg.jobs > 1
            else _Inline())
    with pool as ex:
        pending = {ex.submit(run_job, {**base, "member": m.model_dump(), "lr": lr,
                                       "scale": cfg.sweep.scale,
                                       **({"save": str(sweep_dir / f"{m.name}-lr{lr:g}")}
                                          if full else {})})
                   for m in cfg.models for lr in cfg.sweep.lrs}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                r = f.result()
                if r.pop("final", False):
                    finals.append(r)
                    log(f"final {r['name']} lr {r['lr']:g}: held-out exact match "
                        f"{r['heldout_em']:.3f} ({r['seconds'] / 60:.1f} min, "
                        f"{(time.time() - t0) / 60:.0f} min in)")
                    continue
                runs = by_name[r["name"]]
                runs.append(r)
                log(f"sweep {r['name']} lr {r['lr']:g}: " + (
                    f"diverged at step {r['diverged_at']}" if r["diverged_at"] is not None else
                    f"held-out exact match {r['heldout_em']:.3f}, answer loss "
                    f"{r['heldout_answer_loss']:.3f}") +
                    f" ({r['steps']} steps, {r['seconds'] / 60:.1f} min)")
                if len(runs) < len(cfg.sweep.lrs):
                    continue
                m = next(m for m in cfg.models if m.name == r["name"])
                if full:
                    finals.append(_keep(best_of(runs), work / m.name))
                    continue
                pending.add(ex.submit(run_job, {**base, "member": m.model_dump(),
                                                "lr": best_of(runs)["lr"], "scale": 1.0,
                                                "save": str(work / m.name), "final": True}))
    if full:
        shutil.rmtree(sweep_dir, ignore_errors=True)  # the runs not kept
    out = {}
    for r in finals:
        r["sweep"] = [{k: v for k, v in s.items() if k not in ("history", "save")}
                      for s in sorted(by_name[r["name"]], key=lambda s: s["lr"])]
        out[r["name"]] = r
    log(f"family trained in {(time.time() - t0) / 60:.1f} min")
    return out
