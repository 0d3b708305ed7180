"""Model cards of the capacity family (evalkit.training.family): the member, its state size,
its learning-rate sweep and the rate kept."""
from __future__ import annotations

import platform
from pathlib import Path

from evalkit import __version__
from evalkit.training.cards import TRAINED_NOTE, data_section


def sweep_table(r: dict) -> str:
    rows = ["| lr | steps | held-out exact match | held-out answer loss | minutes | kept |",
            "| ---: | ---: | ---: | ---: | ---: | --- |"]
    for s in sorted(r["sweep"], key=lambda s: s["lr"]):
        loss = ("diverged at step " + str(s["diverged_at"]) if s.get("diverged_at") is not None
                else f"{s['heldout_answer_loss']:.3f}")
        rows.append(f"| {s['lr']:g} | {s['steps']} | {s['heldout_em']:.3f} | {loss} | "
                    f"{s['seconds'] / 60:.1f} | {'yes' if s['lr'] == r['lr'] else ''} |")
    return "\n".join(rows)


def family_table(cfg, results: dict[str, dict]) -> str:
    """Every member: the family at a glance, in every card."""
    rows = ["| model | mixer | layers | MLP | heads | d_k x d_v per head | state (fp32) | "
            "parameters | lr kept |",
            "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for m in cfg.models:
        r = results[m.name]
        dk, dv = (int(cfg.hidden_size * e) // m.num_heads for e in (m.expand_k, m.expand_v))
        shape = (f"{dk} x {dv}" if m.kind == "gla"
                 else f"KV, head dim {cfg.hidden_size // m.num_heads}")
        state = f"{r['state_bytes']:,} B" if r["state_bytes"] is not None else "grows with length"
        sh = m.shape(cfg)
        rows.append(f"| `{m.name}` | {m.kind} | {sh.num_layers} | {sh.intermediate_size} | "
                    f"{m.num_heads} | {shape} | {state} | "
                    f"{r['params']:,} | {r['lr']:g} |")
    return "\n".join(rows)


def _sweep_text(cfg) -> tuple[str, str]:
    """How the sweep runs were trained, and how the kept model came from them."""
    if cfg.sweep.scale == 1.0:
        return ("Each rate trained on the full schedule (the same batches)",
                "The best run is the model: it was kept, not retrained.")
    return (f"Each rate trained on a shortened schedule (every stage at {cfg.sweep.scale:g} of "
            f"its steps, the same batches)", "The kept rate was retrained on the full schedule.")


def family_card(name: str, cfg, results: dict[str, dict], tok_path: str, config_path: str) -> str:
    m = next(m for m in cfg.models if m.name == name)
    r = results[name]
    h = cfg.heldout
    sh = m.shape(cfg)
    schedule, kept = _sweep_text(cfg)
    return f"""# {name}

A tiny {'recurrent (GLA)' if m.kind == 'gla' else 'softmax-attention (Llama)'} language model of
the capacity family trained by `evalkit train-tiny --config {config_path}`: GLAs that differ
only in the size of their recurrent state, and a softmax twin, trained on the same batches for
the same steps, each at the learning rate its own sweep selected.

| | |
| --- | --- |
| parameters | {r['params']:,} |
| width / layers / MLP / heads | {cfg.hidden_size} / {sh.num_layers} / {sh.intermediate_size} / {m.num_heads} |
| recurrent state (fp32) | {f"{r['state_bytes']:,} B" if r['state_bytes'] is not None else 'none (KV cache grows with the context)'} |
| tied embeddings | {cfg.tie_word_embeddings} |
| trained length | {cfg.seq_len} tokens{TRAINED_NOTE[m.kind]} |
| steps | {r['steps']} in {len(cfg.stages)} stage(s), each about {cfg.batch_tokens:,} tokens, one probe length per batch |
| optimizer | AdamW (betas 0.9/0.95, weight decay {cfg.weight_decay}), lr {r['lr']:g} (selected, below), {cfg.warmup} warm-up steps then cosine to 0, grad clip 1.0 |
| loss | next-token cross-entropy, answer tokens weighted {cfg.answer_weight}, all other tokens {cfg.context_weight} |
| held-out recall | exact match {r['heldout_em']:.3f}, answer loss {r['heldout_answer_loss']:.3f} ({h.n} `{h.task}` probes, length {h.length}, load {h.load}; seeds 2^31+{sum(st.pool for st in cfg.stages)} onwards: after every training seed, never trained on, never an evaluation seed) |
| training time | {r['seconds'] / 60:.1f} min (final run) on {cfg.threads} CPU thread(s) ({platform.processor() or platform.machine()}), {cfg.jobs} run(s) at once |
| seed | {cfg.seed} (initialisation and batch order) |
| evalkit | {__version__}; tokenizer `{tok_path}` |

## Learning-rate sweep

{schedule}, then scored on the held-out probes: exact match of the answer under
teacher forcing (what greedy decoding would produce), ties to the lower answer-token loss.
{kept}

{sweep_table(r)}

## The family

{family_table(cfg, results)}

## Data

{data_section(cfg)}

## Loss

![loss curve](loss.png)

Recall scores are in the project leaderboard (`leaderboard/README.md`), not here.
"""


def family_loss_plot(r: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    for s in sorted(r["sweep"], key=lambda s: s["lr"]):
        ax.plot(s["answer_history"], linewidth=0.6, alpha=0.6, label=f"sweep lr {s['lr']:g}")
    ax.plot(r["answer_history"], linewidth=0.9, color="black", label=f"final lr {r['lr']:g}")
    ax.set_xlabel("step")
    ax.set_yscale("log")
    ax.set_title(f"{r['name']}: loss on answer tokens")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
