"""Train an MQAR family member by member, resumable: `evalkit train-mqar`.

    evalkit train-mqar --config configs/train_mqar.yaml --out model_adapters/mqar [--only NAME ...]

A member whose folder already holds a checkpoint trained by this recipe (its train_log.json
carries the member's recipe hash) is skipped, so the family can be trained in parts and
committed member by member; an interrupted run loses only the members it had not finished.
Runs are processes, `jobs` at once with `threads` each (two 1-thread runs on 2 cores beat one
2-thread run: a 64-wide model's matmuls scale poorly across threads). A member's final run
starts as soon as its own sweep is done; a member with one rate (its own `lrs: [x]`, or a
one-rate sweep) skips the sweep.
"""
from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Sequence

from evalkit import __version__
from evalkit.training.mqar import MQARFamily, Member, best_rate, train_run
from evalkit.training.output import check_out, fresh_tmp, install

TOKENIZER = Path(__file__).resolve().parents[2] / "model_adapters" / "mqar" / "tokenizer"


def is_current(fam: MQARFamily, m: Member, folder: Path) -> bool:
    """True when folder holds m's checkpoint trained by this very recipe."""
    log = folder / "train_log.json"
    if not (log.is_file() and (folder / "model.safetensors").is_file()):
        return False
    try:
        return json.loads(log.read_text()).get("recipe_hash") == fam.recipe_hash(m)
    except ValueError:
        return False  # unreadable: retrain it


def _job(job: dict) -> dict:
    """One run in a worker process; a final run saves its checkpoint into job['save']."""
    import torch

    from evalkit.model_adapters.gla.checkpoint import save_checkpoint

    torch.set_num_threads(job["threads"])
    fam = MQARFamily.model_validate(job["family"])
    m = fam.member(job["member"])
    progress = job.get("progress")

    def note(line: str) -> None:
        if progress:
            with open(progress, "a", encoding="utf-8") as f:  # tail -f to watch
                f.write(line + "\n")

    r = train_run(fam, m, job["lr"], job["steps"], minutes=job.get("minutes"),
                  early_stop=job["final"], progress=note)
    model, cfg = r.pop("model"), r.pop("config")
    if job["final"]:
        save_checkpoint(model.float(), cfg, job["save"])
    return {**r, "member": m.name, "final": job["final"]}


class _Inline:
    """The executor interface, running each job at submit (jobs: 1, and tests)."""
    def submit(self, fn, job):
        f = Future()
        f.set_result(fn(job))
        return f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def train_mqar_family(fam: MQARFamily, out: Path, only: Sequence[str] = (),
                      config_path: str = "", log=print) -> dict[str, str]:
    """Train every member of `fam` (or those named in `only`) not already current in out/.
    Returns {name: "trained" | "current"}."""
    for name in only:
        fam.member(name)  # a typo is an error before anything runs
    if not (TOKENIZER / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{TOKENIZER}: the MQAR tokenizer is missing (python -m evalkit.model_adapters.build_mqar_tokenizer)")
    todo = [m for m in fam.models if not only or m.name in only]
    status = {m.name: "current" for m in todo if is_current(fam, m, out / m.name)}
    todo = [m for m in todo if m.name not in status]
    check_out(out, [m.name for m in todo], "train-mqar")
    for m in fam.models:
        if m.name in status:
            log(f"{m.name}: current (recipe {fam.recipe_hash(m)[:12]}), skipped")
    if not todo:
        return status
    out.mkdir(parents=True, exist_ok=True)
    progress = out / ".train-mqar-progress.log"
    log(f"training {', '.join(m.name for m in todo)}; progress: tail -f {progress}")
    base = {"family": fam.model_dump(mode="json"), "threads": fam.threads,
            "progress": str(progress)}
    sweeps: dict[str, list[dict]] = {m.name: [] for m in todo}
    t0 = time.time()
    pool = (ProcessPoolExecutor(fam.jobs, mp_context=get_context("spawn")) if fam.jobs > 1
            else _Inline())
    with pool as ex:
        def final(m: Member, lr: float) -> Future:
            return ex.submit(_job, {**base, "member": m.name, "lr": lr,
                                    "steps": m.steps or fam.steps, "final": True,
                                    "minutes": m.minutes, "save": str(fresh_tmp(out, m.name))})

        # A member given one rate has nothing to choose: its final run starts at once, queued
        # first since those are the longest (d 256).
        rates = {m.name: m.lrs or fam.sweep.lrs for m in todo}
        pending = {final(m, rates[m.name][0]) for m in todo if len(rates[m.name]) == 1}
        pending |= {ex.submit(_job, {**base, "member": m.name, "lr": lr,
                                     "steps": fam.sweep.steps, "final": False})
                    for m in todo if len(rates[m.name]) > 1 for lr in rates[m.name]}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                r = f.result()
                m = fam.member(r["member"])
                if r["final"]:
                    _write(fam, m, r, sweeps[m.name], out, config_path)
                    status[m.name] = "trained"
                    log(f"final {m.name} lr {r['lr']:g}: held-out {r['heldout_accuracy']:.3f}, "
                        f"{r['stop']}, {r['seconds'] / 60:.1f} min ({(time.time() - t0) / 60:.0f} "
                        f"min in)")
                    continue
                sweeps[m.name].append(r)
                log(f"sweep {m.name} lr {r['lr']:g}: held-out {r['heldout_accuracy']:.3f} loss "
                    f"{r['heldout_loss']:.3f} ({r['steps']} steps, {r['seconds'] / 60:.1f} min)")
                if len(sweeps[m.name]) == len(rates[m.name]):
                    pending.add(final(m, best_rate(sweeps[m.name])["lr"]))
    log(f"trained {len(todo)} member(s) in {(time.time() - t0) / 60:.1f} min")
    return status


def _write(fam: MQARFamily, m: Member, r: dict, sweep: list[dict], out: Path,
           config_path: str) -> None:
    """Finish the member's folder (tokenizer, log, card) and put it in place."""
    from evalkit.training.mqar_card import member_card

    tmp = out / f".{m.name}.tmp"
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER / f, tmp / f)
    sweep_rows = [{k: v for k, v in s.items() if k not in ("loss_history", "final")}
                  for s in sorted(sweep, key=lambda s: s["lr"])]
    log = {"recipe_hash": fam.recipe_hash(m), "family": fam.model_dump(mode="json"),
           "member": m.name, "config_path": config_path, "evalkit_version": __version__,
           "sweep": sweep_rows, **{k: v for k, v in r.items() if k != "final"}}
    (tmp / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    (tmp / "README.md").write_text(member_card(fam, m, log))
    install(tmp, out / m.name, "train-mqar")
