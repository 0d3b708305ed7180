"""Build a recipe's twin family from one parent, resumably: `evalkit linearize`.

    evalkit linearize smollm2-135m --recipe configs/linearize.yaml --out model_adapters/twins

For each member, in recipe order (a derived twin after its source):
  current?  its folder's twin.json has this recipe's member hash and this parent's hash: skip;
  trained   sweep (each rate from the twin's initial values, held-out relative error after
            sweep.steps; the lowest wins, ties to the lower rate), then the final run from the
            initial values at the best rate, capped in time; progress.json + resume.safetensors
            in the member's stage (`.<name>.tmp`) let a killed run resume at its last save;
            then, when the recipe has `end_to_end`, the end-to-end stage the same way
            (linearize_e2e.py: its own sweep and final run, whose saves join stage 1's result
            in resume.safetensors), its LoRA merged into the twin's stored delta;
  derived   its source's tensors, its source's keep_worst layers of highest held-out relative
            error back to the parent's full attention (their deltas dropped);
  recall    its source trained further by the recall stage (linearize_recall.py: prose with
            earlier snippets copied past the window), resumable the same way, the two
            stages' LoRAs stored as one delta;
  window    the parent with every layer's attention limited to the first `sinks` and the last
            `window` tokens.
Every member is then scored: held-out relative error per layer (what the twin's layers lose
against the parent's), held-out perplexity beside the parent's and, for a twin with a state,
beside its own with the state switched off, and what its state holds (state_anatomy.py: gate
half-lives, the memory's read-out by distance); its folder (gla/twin.py) gets a model card,
train_log.json and a plot, and is swapped in whole. A current member built before one of those
measures existed gets it added to its log and card (its weights untouched).
"""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Sequence

import torch

from evalkit import __version__, atomic
from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.from_llama import linearize
from evalkit.model_adapters.gla.model import GLAForCausalLM
from evalkit.model_adapters.gla.twin import (TWIN_FILE, TWIN_WEIGHTS, load_parent,
                                             load_twin, parent_folder, parent_hash, read_delta,
                                             read_meta, save_twin, trained_names)
from evalkit.owned_folder import stage_for
from evalkit.training.linearize import (Member, Progress, Recipe, heldout_transfer,
                                        mean_relative, perplexity, train_transfer, write_tensors)
from evalkit.training.copies import copy_batch
from evalkit.training.linearize_e2e import end_to_end_stage, parent_hidden
from evalkit.training.linearize_recall import Held, combined_delta, recall_stage
from evalkit.training.output import check_out, install
from evalkit.training.prose import TokenStream, heldout_sequences, read_corpus
from evalkit.training.state_anatomy import state_anatomy

COMMAND = "linearize"
ANATOMY_DOCUMENTS = 2   # held-out documents the state's anatomy replays (a Python loop a token)
PROGRESS, RESUME = "progress.json", "resume.safetensors"


def is_current(folder: Path, member_hash: str, parent_sha: str) -> bool:
    if not (folder / TWIN_FILE).is_file():
        return False
    try:
        meta = read_meta(folder)
    except ValueError:
        return False  # unreadable: rebuild it
    return meta["recipe_hash"] == member_hash and meta["parent"]["hash"] == parent_sha


class Family:
    """What every member shares in one command run: the parent, its tokenizer, the corpus and
    the held-out sets (read once)."""

    def __init__(self, recipe: Recipe, parent_spec: str, log=print) -> None:
        from evalkit.tokenization import load_tokenizer

        self.recipe, self.parent_spec, self.log = recipe, parent_spec, log
        t0 = time.time()
        self.corpus = read_corpus(recipe.corpus, "recipe corpus")  # a missing corpus first
        self.parent = load_parent(parent_spec)
        for p in self.parent.parameters():
            p.requires_grad_(False)
        self.parent_sha = parent_hash(self.parent)
        self.tokenizer = load_tokenizer(parent_folder(parent_spec))
        self.layers = self.parent.config.num_hidden_layers
        ev = recipe.eval
        self.transfer_seqs, _ = heldout_sequences(self.corpus.heldout, self.tokenizer,
                                                  recipe.seq_len, ev.transfer_sequences)
        self.ppl_seqs = {L: heldout_sequences(self.corpus.heldout, self.tokenizer, L,
                                              ev.perplexity_documents)
                         for L in ev.perplexity_lengths}
        self._streams: dict[int, TokenStream] = {}
        self._e2e_heldout: tuple[torch.Tensor, torch.Tensor] | None = None
        self._recall_heldout: dict[int, Held] = {}
        self._parent_ppl: dict[int, dict] | None = None
        log(f"parent {parent_spec} (hash {self.parent_sha[:12]}), corpus "
            f"{len(self.corpus.train):,} training / {len(self.corpus.heldout):,} held-out "
            f"documents ({len(self.corpus.skipped)} skipped), ready in {time.time() - t0:.0f} s")

    def _stream_of(self, seq_len: int) -> TokenStream:
        if seq_len not in self._streams:
            t0 = time.time()
            s = self._streams[seq_len] = TokenStream(self.corpus.train, self.tokenizer, seq_len)
            self.log(f"training stream: {s.tokens:,} tokens, {len(s):,} sequences of "
                     f"{seq_len:,} ({time.time() - t0:.0f} s)")
        return self._streams[seq_len]

    @property
    def stream(self) -> TokenStream:
        return self._stream_of(self.recipe.seq_len)

    @property
    def e2e_stream(self) -> TokenStream:
        return self._stream_of(self.recipe.end_to_end.seq_len)

    def e2e_heldout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The end-to-end stage's held-out sequences and the parent's hidden states on them."""
        if self._e2e_heldout is None:
            e = self.recipe.end_to_end
            ids, _ = heldout_sequences(self.corpus.heldout, self.tokenizer, e.seq_len,
                                       e.heldout_sequences)
            self._e2e_heldout = ids, parent_hidden(self.parent, ids, e.batch)
        return self._e2e_heldout

    @property
    def recall_stream(self) -> TokenStream:
        return self._stream_of(self.recipe.recall.seq_len)

    def recall_heldout(self, sinks: int) -> Held:
        """The recall stage's held-out sequences for twins with `sinks` sinks: the first
        held-out documents with copies made as in training (other indices)."""
        if sinks not in self._recall_heldout:
            from evalkit.training.linearize_recall import HELDOUT_INDEX

            r = self.recipe.recall
            rows, _ = heldout_sequences(self.corpus.heldout, self.tokenizer, r.seq_len,
                                        r.heldout_sequences)
            ids, mask = copy_batch(rows, r.copies, sinks=sinks, seed=self.recipe.seed,
                                   first=HELDOUT_INDEX)
            self._recall_heldout[sinks] = Held(ids, mask, r.copies.weight, self.parent, r.batch)
        return self._recall_heldout[sinks]

    def parent_ppl(self) -> dict[int, dict]:
        if self._parent_ppl is None:
            self._parent_ppl = {L: perplexity(self.parent, s, None)
                                for L, (s, _) in self.ppl_seqs.items()}
        return self._parent_ppl

    def twin(self, m: Member) -> GLAForCausalLM:
        """A trained member's twin at its initial values (the same for every rate)."""
        r = self.recipe
        layers = [i for i in range(self.layers) if i not in m.keep_attention]
        # a delta-rule state keys on the heads themselves: the feature map is GLA's alone
        maps = {"feature_map": r.feature_map, "feature_dim": r.feature_dim} \
            if m.state == "gla" else {}
        torch.manual_seed(r.seed)  # hedgehog maps wider than a head start random
        return linearize(self.parent, window=m.window, layers=layers, sinks=m.sinks,
                         state=m.state, gate=r.gate_of(m), mix=r.mix, **maps)


def linearized_layers(cfg: GLAConfig) -> list[int]:
    return sorted(i for i in range(cfg.num_hidden_layers) if cfg.mixer(i) != "attn"
                  or (cfg.attn_spec.get("window_size") is not None))


# ---------------------------------------------------------------------------------------
# One member
# ---------------------------------------------------------------------------------------
def _stage(out: Path, name: str, member_hash: str) -> tuple[Path, dict | None]:
    """The member's stage, kept with its progress when that belongs to this very recipe."""
    stage = out / f".{name}.tmp"
    try:
        saved = json.loads((stage / PROGRESS).read_text())
        if saved.get("member_hash") == member_hash:
            return stage, saved
    except (OSError, ValueError):
        pass
    return stage_for(out / name), None


def train_member(fam: Family, m: Member, stage: Path, saved: dict | None, member_hash: str
                 ) -> tuple[GLAForCausalLM, dict, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    r, log = fam.recipe, fam.log
    state = saved or {"member_hash": member_hash, "sweep": [], "final": None}
    probe = fam.twin(m)
    names, layers = trained_names(probe, fam.parent), linearized_layers(probe.config)
    del probe

    def write_progress() -> None:
        atomic.write_json(stage / PROGRESS, state)

    lrs = r.lrs
    if r.sweep and len(lrs) > 1:
        done = {s["lr"] for s in state["sweep"]}
        for lr in lrs:
            if lr in done:
                continue
            log(f"{m.name}: sweep lr {lr:g}, {r.sweep.steps} steps")
            twin = fam.twin(m)
            p = train_transfer(r, fam.parent, twin, names, layers, fam.stream, fam.transfer_seqs,
                               Progress(lr=lr, planned_steps=r.sweep.steps), log=log)
            last = p.heldout[-1]["layers"]
            state["sweep"].append({"lr": lr, "steps": p.step, "seconds": p.seconds,
                                   "heldout_relative": mean_relative(
                                       {int(i): tuple(v) for i, v in last.items()}),
                                   "loss": p.loss})
            write_progress()
        best = min(state["sweep"], key=lambda s: (s["heldout_relative"], s["lr"]))["lr"]
    else:
        best = lrs[0]

    twin = fam.twin(m)
    resume = None
    if state["final"] is not None and (stage / RESUME).is_file():
        progress = Progress(**state["final"])
        resume = load_file(str(stage / RESUME))
        with torch.no_grad():
            params = dict(twin.named_parameters())
            for n in names:
                params[n].copy_(resume[n])
        log(f"{m.name}: attention transfer done ({progress.stop})" if progress.stop else
            f"{m.name}: resuming the final run at step {progress.step} of {progress.planned_steps}")
    else:
        progress = Progress(lr=best, planned_steps=r.steps)
        log(f"{m.name}: final run, lr {best:g}, {r.steps} steps, cap {m.minutes or r.minutes:g} min")

    def save_run(p: Progress, tensors: dict[str, torch.Tensor]) -> None:
        write_tensors(stage / RESUME, tensors)
        state["final"] = p.to_json()
        write_progress()  # written last: a progress.json always names a complete resume file

    if not progress.stop:  # a finished stage 1 (the end-to-end stage under way) is not rerun
        progress = train_transfer(r, fam.parent, twin, names, layers, fam.stream,
                                  fam.transfer_seqs, progress, minutes=m.minutes or r.minutes,
                                  resume=resume, save=save_run, log=log)
    info = {"lr": best, "sweep": state["sweep"], "final": progress.to_json(), "trained": names,
            "kept_attention": list(m.keep_attention)}
    delta: dict[str, torch.Tensor] = {}
    if r.has_end_to_end(m):
        info["end_to_end"], delta = end_to_end_stage(fam, m, twin, stage / RESUME, state,
                                                     write_progress)
    return twin, info, delta


def source_folder(fam: Family, m: Member, out: Path) -> Path:
    """The folder of `m`'s source twin, current for this recipe (else an error)."""
    src_dir = out / m.from_twin
    src_hash = fam.recipe.member_hash(fam.recipe.member(m.from_twin))
    if not is_current(src_dir, src_hash, fam.parent_sha):
        raise ValueError(f"{m.name}: its source {src_dir} is not trained by this recipe yet "
                         f"(run without --only, or with --only {m.from_twin} first)")
    return src_dir


def source_delta(folder: Path, meta: dict) -> dict:
    """The delta a twin folder stores ({parent tensor: factors or tensor})."""
    from safetensors.torch import load_file

    if not meta["delta"]:
        return {}
    stored = load_file(str(folder / TWIN_WEIGHTS))
    return {n: read_delta(stored, n, folder / TWIN_WEIGHTS) for n in meta["delta"]}


def recall_member(fam: Family, m: Member, out: Path, stage: Path, saved: dict | None,
                  member_hash: str) -> tuple[GLAForCausalLM, dict, dict]:
    """The source twin trained further by the recall stage; resumable from `stage`."""
    src_dir = source_folder(fam, m, out)
    twin, _, meta = load_twin(src_dir, fam.parent)
    state = saved or {"member_hash": member_hash}

    def write_progress() -> None:
        atomic.write_json(stage / PROGRESS, state)

    fam.log(f"{m.name}: {m.from_twin} trained further on recall (copies past the window)")
    info, delta = recall_stage(fam, m, twin, stage / RESUME, state, write_progress)
    return twin, {"from_twin": m.from_twin, "trained": trained_names(twin, fam.parent),
                  "recall": info}, combined_delta(source_delta(src_dir, meta), delta)


def derive_member(fam: Family, m: Member, out: Path
                  ) -> tuple[GLAForCausalLM, dict, dict[str, torch.Tensor]]:
    """The source twin with its keep_worst layers of highest held-out relative error restored
    to the parent's full attention (their end-to-end deltas dropped, the others kept)."""
    src_dir = source_folder(fam, m, out)
    src, src_cfg, src_meta = load_twin(src_dir, fam.parent)
    log = json.loads((src_dir / "train_log.json").read_text())
    final = log["heldout_transfer"]
    worst = sorted(final, key=lambda i: (-final[i][1], int(i)))[:m.keep_worst]
    keep = sorted(int(i) for i in worst)
    d = src_cfg.to_dict()
    wl = dict(d["window_linear"])
    wl["layers"] = [i for i in wl["layers"] if i not in keep]
    attn = dict(d["attn"])
    attn["layers"] = sorted(set(attn.get("layers", [])) | set(keep))
    d.update(window_linear=wl, attn=attn)
    cfg = GLAConfig.from_dict(d, source=f"{m.name} config")
    twin = GLAForCausalLM(cfg)
    restored = {f"model.layers.{i}.attn.{p}.weight" for i in keep
                for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    parent_sd = fam.parent.state_dict()
    state = {n: parent_sd[n] if n in restored else t for n, t in src.state_dict().items()}
    missing, unexpected = twin.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    if set(missing) - tied:
        raise ValueError(f"{m.name}: the source's tensors do not fill the derived twin: {missing[:4]}")
    delta = {n: d for n, d in source_delta(src_dir, src_meta).items() if n not in restored}
    fam.log(f"{m.name}: {m.from_twin} with layers {keep} (highest held-out relative error) "
            f"back to full attention")
    return twin.eval(), {"from_twin": m.from_twin, "kept_attention": keep,
                         "source_heldout_relative": {str(i): final[str(i)][1] for i in keep},
                         "trained": trained_names(twin, fam.parent)}, delta


def window_member(fam: Family, m: Member) -> tuple[GLAForCausalLM, dict, dict]:
    d = fam.parent.config.to_dict()
    d["attn"] = {**d["attn"], "window_size": m.window, "sinks": m.sinks}
    twin = GLAForCausalLM(GLAConfig.from_dict(d, source=f"{m.name} config"))
    twin.load_state_dict(fam.parent.state_dict())
    return twin.eval(), {"trained": []}, {}


# ---------------------------------------------------------------------------------------
# The family
# ---------------------------------------------------------------------------------------
def linearize_family(recipe: Recipe, parent_spec: str, out: Path, only: Sequence[str] = (),
                     recipe_path: str = "", log=print) -> dict[str, str]:
    """Build every member of `recipe` (or those in `only`) not already current in out/.
    Returns {name: "built" | "current"}."""
    for name in only:
        recipe.member(name)  # a typo is an error before anything runs
    todo = [m for m in recipe.twins if not only or m.name in only]
    check_out(out, [m.name for m in todo], COMMAND)  # before the parent loads: never lose an hour
    torch.set_num_threads(recipe.threads)
    fam = Family(recipe, parent_spec, log)
    status: dict[str, str] = {}
    for m in todo:
        h = recipe.member_hash(m)
        if is_current(out / m.name, h, fam.parent_sha):
            added = add_missing_measures(fam, out / m.name)
            log(f"{m.name}: current (recipe {h[:12]}), skipped"
                + (f"; its {' and '.join(added)} added to its card" if added else ""))
            status[m.name] = "current"
            continue
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        stage, saved = _stage(out, m.name, h)
        if m.kind == "trained":
            twin, info, delta = train_member(fam, m, stage, saved, h)
        elif m.kind == "recall":
            twin, info, delta = recall_member(fam, m, out, stage, saved, h)
        elif m.kind == "derived":
            twin, info, delta = derive_member(fam, m, out)
        else:
            twin, info, delta = window_member(fam, m)
        _finish(fam, m, twin, info, delta, stage, out, h, recipe_path, time.time() - t0)
        status[m.name] = "built"
    return status


def state_off_perplexity(twin: GLAForCausalLM, fam: Family) -> dict[str, dict] | None:
    """Held-out perplexity of `twin` with its state switched off (its own weights, exact
    attention over the sinks and the window only), per length; None for a model without a
    state. Beside the twin's own, what the state adds to language: a window + state hybrid can
    learn to ignore its state (arXiv 2510.05901), and only this row shows it."""
    cfg = twin.config
    layers = [b.attn for mixer, b in zip(cfg.mixers, twin.model.layers)
              if mixer == "window_linear"]
    if not layers:
        return None
    window = cfg.window_linear_spec["window"] + cfg.sinks
    for a in layers:
        a.state_off = True
    try:
        with torch.no_grad():
            return {str(L): perplexity(twin, s, window) for L, (s, _) in fam.ppl_seqs.items()}
    finally:
        for a in layers:
            a.state_off = False


def anatomy(twin: GLAForCausalLM, fam: Family) -> dict | None:
    """What the twin's state holds (evalkit.training.state_anatomy) on the first two held-out
    documents of the longest perplexity length; None without a state."""
    seqs, _ = fam.ppl_seqs[max(fam.ppl_seqs)]
    return state_anatomy(twin, seqs[:ANATOMY_DOCUMENTS])


def add_missing_measures(fam: Family, folder: Path) -> list[str]:
    """Give a current twin's train_log.json and card the measures added since it was built
    (its state-off perplexity, what its state holds); returns what was added. The weights and
    twin.json stay as they are; each file is replaced atomically, the log last, so an
    interrupted call is redone by the next."""
    from evalkit.training.linearize_card import member_card

    path = folder / "train_log.json"
    log = json.loads(path.read_text())
    if not log.get("state"):
        return []  # no state to switch off or to measure (a window-only member)
    ppl = log.get("perplexity") or {}
    todo = [what for what, missing in (
        ("state-off perplexity", not all("state_off" in v for v in ppl.values())),
        ("state anatomy", "state_anatomy" not in log)) if missing]
    if not todo:
        return []
    if {str(L) for L in fam.ppl_seqs} != set(ppl):
        raise ValueError(f"{path}: perplexity at {sorted(ppl, key=int)} tokens, the recipe "
                         f"scores {sorted(fam.ppl_seqs)}: rebuild the twin to compare")
    twin, _, _ = load_twin(folder, fam.parent)
    fam.log(f"{folder.name}: measuring its {' and '.join(todo)} ...")
    if "state-off perplexity" in todo:
        for L, v in (state_off_perplexity(twin, fam) or {}).items():
            ppl[L]["state_off"] = v
    if "state anatomy" in todo:
        log["state_anatomy"] = anatomy(twin, fam)
    atomic.write_text(folder / "README.md", member_card(log))
    atomic.write_json(path, log)  # last: the log is what says it is done
    return todo


def _finish(fam: Family, m: Member, twin: GLAForCausalLM, info: dict,
            delta: dict[str, torch.Tensor], stage: Path, out: Path, member_hash: str,
            recipe_path: str, seconds: float) -> None:
    from evalkit.training.linearize_card import member_card, member_plot

    twin.eval()
    layers = linearized_layers(twin.config)
    t0 = time.time()
    transfer = heldout_transfer(twin, fam.parent, fam.transfer_seqs, layers, fam.recipe.batch)
    window, sinks = twin.config.window, twin.config.sinks
    ppl = {str(L): {"parent": fam.parent_ppl()[L], "twin": perplexity(twin, s, window + sinks),
                    "documents": names}
           for L, (s, names) in fam.ppl_seqs.items()}
    for L, v in (state_off_perplexity(twin, fam) or {}).items():
        ppl[L]["state_off"] = v
    held = anatomy(twin, fam)
    log = {"name": m.name, "kind": m.kind, "member": m.model_dump(mode="json"),
           "recipe": fam.recipe.model_dump(mode="json"), "recipe_path": recipe_path,
           "recipe_hash": member_hash, "parent": fam.parent_spec, "parent_hash": fam.parent_sha,
           "corpus": {k: v for k, v in fam.corpus.summary().items()},
           "linearized_layers": layers, "num_layers": fam.layers, "window": window,
           "sinks": sinks, "state": twin.config.window_linear_spec["state"] if twin.config.window_linear else None,
           "delta": sorted(delta),
           "heldout_transfer": {str(i): list(v) for i, v in transfer.items()},
           "heldout_relative_mean": mean_relative(transfer) if transfer else None,
           "perplexity": ppl, **({"state_anatomy": held} if held else {}),
           "eval_seconds": time.time() - t0, "build_seconds": seconds,
           "parameters_trained": sum(p.numel() for n, p in twin.named_parameters()
                                     if n in set(info["trained"])),
           "state_bytes": {str(T): twin.config.state_bytes("float32", T) for T in (2048, 8192)},
           "parent_kv_bytes": {str(T): fam.parent.config.state_bytes("float32", T)
                               for T in (2048, 8192)},
           "machine": platform.processor() or platform.machine(),
           "evalkit_version": __version__, "torch_version": torch.__version__, **info}
    for f in (PROGRESS, RESUME):  # the finished folder holds the twin, not how it got there
        (stage / f).unlink(missing_ok=True)
    save_twin(stage, m.name, twin, fam.parent_spec, fam.parent_sha, info["trained"], member_hash,
              delta)
    atomic.write_json(stage / "train_log.json", log)
    member_plot(log, stage / "loss.png")
    (stage / "README.md").write_text(member_card(log), encoding="utf-8")
    install(stage, out / m.name, COMMAND)
    fam.log(f"{m.name}: built in {seconds / 60:.1f} min; held-out relative error "
            f"{log['heldout_relative_mean'] or 0:.4f}; perplexity " + ", ".join(
                f"{L}: twin {v['twin']['ppl']:.2f} vs parent {v['parent']['ppl']:.2f}"
                for L, v in ppl.items()))
