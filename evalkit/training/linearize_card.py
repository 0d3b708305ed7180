"""The model card (README.md) and plot (loss.png) of a twin built by `evalkit linearize`, both
from its train_log.json."""
from __future__ import annotations

from pathlib import Path

from evalkit.formatting import fmt_bytes

WHAT = {"trained": "linearized twin",
        "derived": "linearized twin with its hardest layers kept as full attention",
        "recall": "linearized twin trained further to recall past its window",
        "window_only": "sliding-window reference (no state beyond the window, nothing trained)"}


def member_plot(log: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    e2e = log.get("end_to_end") or log.get("recall")
    fig = Figure(figsize=(16 if e2e else 12, 3.6))
    ax1, ax2, ax3, *ax4 = fig.subplots(1, 4 if e2e else 3)
    final = (log.get("final") or {}).get("loss") or []
    for s in log.get("sweep") or []:
        ax1.plot(s["loss"], linewidth=0.7, label=f"sweep lr {s['lr']:g}")
    if final:
        ax1.plot(final, linewidth=0.9, color="black", label=f"final lr {log['lr']:g}")
        ax1.set_yscale("log")
        ax1.legend(fontsize=7)
    ax1.set_title("training: mean relative error", fontsize=9)
    ax1.set_xlabel("step")
    tr = log["heldout_transfer"]
    layers = sorted(tr, key=int)
    ax2.bar([int(i) for i in layers], [tr[i][1] for i in layers], color="tab:orange")
    for i in log.get("kept_attention") or []:
        ax2.axvline(i, color="grey", linestyle=":", linewidth=0.8)
    ax2.set_title("held-out relative error per layer", fontsize=9)
    ax2.set_xlabel("layer")
    longest = max(log["perplexity"], key=int)
    p = log["perplexity"][longest]
    for key, style in (("parent", "-"), ("twin", "-")):
        nll = p[key]["nll_by_position"]
        k = max(1, len(nll) // 128)  # mean over blocks of k positions
        xs = list(range(0, len(nll) - k + 1, k))
        ax3.plot([x + k / 2 for x in xs], [sum(nll[x:x + k]) / k for x in xs], style,
                 linewidth=0.9, label=log["parent"] if key == "parent" else log["name"])
    if log.get("window"):
        sinks = log.get("sinks", 0)  # the twin is its parent up to sinks + window tokens
        ax3.axvline(log["window"] + sinks, color="grey", linestyle=":", linewidth=0.8,
                    label="sinks + window" if sinks else "window")
    ax3.set_xscale("log")
    ax3.set_title(f"held-out NLL by position ({longest} tokens)", fontsize=9)
    ax3.set_xlabel("position")
    ax3.legend(fontsize=7)
    if e2e:
        _kl_panel(ax4[0], e2e, "recall" if "recall" in log else "end-to-end")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _kl_panel(ax, e2e: dict, what: str) -> None:
    """A KL stage's loss: training steps (sweep runs thin) and held-out."""
    for s in e2e["sweep"]:
        ax.plot(s["loss"], linewidth=0.6, alpha=0.7, label=f"sweep lr {s['lr']:g}")
    f = e2e["final"]
    ax.plot(f["loss"], linewidth=0.9, color="black", label=f"training, lr {e2e['lr']:g}")
    ax.plot([h["step"] for h in f["heldout"]], [h["kl"] for h in f["heldout"]], "o-",
            color="tab:red", markersize=3, linewidth=0.9, label="held-out")
    ax.set_yscale("log")
    ax.set_title(f"{what}: KL(parent || twin), nats a token", fontsize=9)
    ax.set_xlabel("step")
    ax.legend(fontsize=7)


def _ppl_table(log: dict) -> str:
    items = sorted(log["perplexity"].items(), key=lambda kv: int(kv[0]))
    off = all("state_off" in v for _, v in items)  # a twin with a state, measured without it
    rows = ["| tokens | documents | parent | twin | twin, tokens inside the window | twin, past it | twin / parent |"
            + (" twin, state off | state off / parent |" if off else ""),
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if off else "")]
    for L, v in items:
        t, p = v["twin"], v["parent"]
        inside = f"{t['ppl_inside_window']:.2f}" if "ppl_inside_window" in t else "-"
        past = f"{t['ppl_past_window']:.2f}" if "ppl_past_window" in t else "-"
        rows.append(f"| {int(L):,} | {len(v['documents'])} | {p['ppl']:.2f} | {t['ppl']:.2f} | "
                    f"{inside} | {past} | {t['ppl'] / p['ppl']:.3f} |"
                    + (f" {v['state_off']['ppl']:.2f} | {v['state_off']['ppl'] / p['ppl']:.3f} |"
                       if off else ""))
    return "\n".join(rows)


def _layers_table(log: dict) -> str:
    tr = log["heldout_transfer"]
    if not tr:
        return "No layer is linearized."
    rows = ["| layer | held-out MSE | relative error |", "| ---: | ---: | ---: |"]
    rows += [f"| {i} | {tr[i][0]:.3g} | {tr[i][1]:.4f} |" for i in sorted(tr, key=int)]
    return "\n".join(rows)


def _anatomy(log: dict) -> str:
    """The card's "What the state holds" section (evalkit.training.state_anatomy), or ""."""
    a = log.get("state_anatomy")
    if not a:
        return ""
    delta = log.get("state") == "gated_delta"
    Ds = [str(D) for D in a["distances"]]
    share = "look-back weight" if delta else "state weight at the mix"
    head = (f"| layer | gate half-life, tokens: median (min-max over heads) | {share} | "
            + " | ".join(f"held at {int(D):,}" for D in Ds) + " |")
    rows = [head, "| ---: | --- | ---: | " + " | ".join("---:" for _ in Ds) + " |"]

    def life(x):
        return "no forgetting" if x is None else f"{x:,.1f}"
    for i in sorted(a["layers"], key=int):
        L = a["layers"][i]
        h = L["half_life"]
        cells = [f"{L['readout'][D]['held']:+.3f}" if D in L["readout"] else "-" for D in Ds]
        rows.append(f"| {i} | {life(h['median'])} ({life(h['min'])}-{life(h['max'])}) | "
                    f"{L['lookback' if delta else 'state_weight']:.3f} | " + " | ".join(cells) + " |")
    rule = ("S_t = a_t (I - b k k^T) S_{t-1} + b k v^T, read k^T S" if delta else
            "S_t = a_t S_{t-1} + phi(k) [v, 1]^T, read phi(k)^T S normalised")
    return f"""
## What the state holds

Each linearized layer's memory replayed from what it was given on {a['sequences']} held-out
document(s) of {a['tokens']:,} tokens ({rule}). The gate's half-life is how long anything
written stays (ln(1/2) / mean log a per head). "Held at D" is, for a token D tokens before the
reading one (it left the {a['window']}-token window D - {a['window']} steps earlier), the
fraction of its value the memory returns for its own key, less the same read one step before
it entered (neighbouring tokens are alike, so a memory of the last few tokens already returns
part of any value): 1 held whole, 0 or below nothing of it left.

{chr(10).join(rows)}
"""


def _training(log: dict) -> str:
    if log["kind"] == "window_only":
        sinks = f"the first {log['sinks']} and " if log.get("sinks") else ""
        return "Nothing is trained: the parent's weights, every attention layer limited to " \
               f"{sinks}the last {log['window']} tokens."
    if log["kind"] == "recall":
        return _recall(log)
    if log["kind"] == "derived":
        kept = ", ".join(f"{i} ({log['source_heldout_relative'][str(i)]:.4f})"
                         for i in log["kept_attention"])
        return (f"Nothing more is trained: the tensors of `{log['from_twin']}`, with its layers of "
                f"highest held-out relative error kept as the parent's full attention: {kept}. "
                + ("The other layers were trained end to end with the source's, so they are "
                   "what the source learned, not what training them again would give."
                   if log.get("delta") else
                   "Attention transfer trains each layer on the parent's own inputs, so the "
                   "other layers are exactly what training them again would give."))
    r, f = log["recipe"], log["final"]
    sweep = _sweep_table(log["sweep"], "heldout_relative", "held-out relative error",
                         "Learning-rate sweep (each from the same initial values, scored on "
                         "held-out documents; the lowest wins)")
    return (f"Attention transfer: {f['step']:,} of {f['planned_steps']:,} steps ({f['stop']}), "
            f"{f['tokens']:,} tokens seen, batches of {r['batch']} x {r['seq_len']:,} tokens, "
            f"AdamW (betas 0.9 / 0.95, weight decay {r['weight_decay']}) at lr {log['lr']:g}, "
            f"{r['warmup']} warm-up steps then cosine, {f['seconds'] / 60:.1f} min on "
            f"{r['threads']} thread(s) ({log['machine']}). {log['parameters_trained']:,} "
            f"parameters trained (the ones the parent lacks: maps, gates, mixes); every "
            f"parent weight frozen.{sweep}"
            f"{_end_to_end(log)}")


def _sweep_table(sweep: list[dict], key: str, label: str, intro: str) -> str:
    if not sweep:
        return ""
    rows = "\n".join(f"| {s['lr']:g} | {s['steps']} | {s[key]:.4f} | {s['seconds'] / 60:.1f} |"
                     for s in sorted(sweep, key=lambda s: s["lr"]))
    return (f"\n\n{intro}:\n\n| lr | steps | {label} | minutes |\n| ---: | ---: | ---: | ---: |"
            f"\n{rows}")


def _end_to_end(log: dict) -> str:
    e2e = log.get("end_to_end")
    if not e2e:
        return ("\n\nNo end-to-end stage: the parent's weights are the twin's, unchanged."
                if log["kind"] == "trained" else "")
    r, f = log["recipe"]["end_to_end"], e2e["final"]
    kl = f["heldout"]
    sweep = _sweep_table(e2e["sweep"], "heldout_kl", "held-out KL",
                         "Its learning-rate sweep (each from attention transfer's twin, scored "
                         "by held-out KL; the lowest wins)")
    return (f"\n\nThen end to end (LoLCATs' stage 2): KL(parent || twin) on the next-token "
            f"distribution, the parent running beside it, {f['step']:,} of "
            f"{f['planned_steps']:,} steps ({f['stop']}), {f['tokens']:,} tokens in batches of "
            f"{r['batch']} x {r['seq_len']:,}, AdamW (betas 0.9 / 0.95, no weight decay) at lr "
            f"{e2e['lr']:g}, {r['warmup']} warm-up steps then cosine, {f['seconds'] / 60:.1f} "
            f"min. Trained: the parameters above and a LoRA of rank {e2e['lora_rank']} (alpha "
            f"{e2e['lora_alpha']:g}, {e2e['lora_parameters']:,} parameters) on q/k/v/o of every "
            f"linearized layer, merged at the end into the stored delta ({len(log['delta'])} "
            f"tensors, W = W_parent + delta). Held-out KL on {e2e['heldout_sequences']} sequences "
            f"of {r['seq_len']:,} tokens: {kl[0]['kl']:.4f} at step {kl[0]['step']}, "
            f"{kl[-1]['kl']:.4f} at step {kl[-1]['step']} (nats a token). Peak memory of the "
            f"build process: {e2e['peak_rss_mib'] / 1024:.1f} GiB.{sweep}")


def _recall(log: dict) -> str:
    rc = log["recall"]
    r, f = log["recipe"]["recall"], rc["final"]
    c = r["copies"]
    first, last, off = f["heldout"][0], f["heldout"][-1], rc["state_off"]
    sweep = _sweep_table(rc["sweep"], "heldout_kl", "held-out weighted KL",
                         "Its learning-rate sweep (each from the source, scored by held-out "
                         "weighted KL; the lowest wins)")
    rows = "\n".join(f"| {name} | {p['copy_top1']:.3f} | {p['copy_kl']:.4f} | {p['prose_kl']:.4f} |"
                     for name, p in ((f"`{log['from_twin']}` (step 0)", first),
                                     (f"this twin (step {last['step']})", last),
                                     ("this twin, state off", off)))
    return (f"`{log['from_twin']}` (attention transfer and the end-to-end stage; see its card) "
            f"trained further by the recall stage: KL(parent || twin) on training prose in which "
            f"{c['spans']} earlier snippets of {c['span_len']} tokens come back {c['min_distance']:,}"
            f" to {c['max_distance']:,} tokens after they end (log-uniform), the positions "
            f"inside a copy carrying {c['weight']:g} of the loss (no task template: the board's "
            f"probes never appear in training). {f['step']:,} of {f['planned_steps']:,} steps "
            f"({f['stop']}), {f['tokens']:,} tokens in batches of {r['batch']} x "
            f"{r['seq_len']:,}, AdamW (betas 0.9 / 0.95, no weight decay) at lr {rc['lr']:g}, "
            f"{r['warmup']} warm-up steps then cosine, {f['seconds'] / 60:.1f} min. Trained: the "
            f"twin's own parameters and a new LoRA of rank {rc['lora_rank']} (alpha "
            f"{rc['lora_alpha']:g}) on q/k/v/o, stored with the source's as one delta "
            f"({len(log['delta'])} tensors). Peak memory of the build process: "
            f"{rc['peak_rss_mib'] / 1024:.1f} GiB.\n\n"
            f"Held out: {rc['heldout_sequences']} documents of {r['seq_len']:,} tokens with copies "
            f"made the same way ({rc['heldout_copy_positions']:,} copy positions). Top-1 at a "
            f"copy: how often the model's most likely next token is the copied one (the parent: "
            f"{rc['parent_copy_top1']:.3f}).\n\n"
            f"| model | top-1 at a copy | KL at copies | KL elsewhere |\n| --- | ---: | ---: | ---: |"
            f"\n{rows}{sweep}")


def member_card(log: dict) -> str:
    c = log["corpus"]
    spec = log["recipe"]
    lin = log["linearized_layers"]
    state = "; ".join(f"{int(T):,} tokens: {fmt_bytes(b)} (parent KV {fmt_bytes(log['parent_kv_bytes'][T])})"
                      for T, b in log["state_bytes"].items())
    sinks = log.get("sinks", 0)
    kept = f"the first {sinks} tokens (sinks) and the last {log['window']}" if sinks else \
        f"the last {log['window']}"
    own = log["member"]  # a twin made from another has its source's gate
    if own.get("from_twin"):
        own = next(t for t in spec["twins"] if t["name"] == own["from_twin"])
    gate = own.get("gate") or spec["gate"]
    if log["kind"] == "window_only":
        mixer = f"softmax attention over {kept} tokens"
    elif log.get("state") == "gated_delta":
        mixer = (f"gated delta-rule state (keys and queries through learned per-head maps, "
                 f"L2-normalised), {gate} gate, look-back weight {1 - spec['mix']:g} at init")
    else:
        mixer = (f"GLA state, {spec['feature_map']} feature map ({spec['feature_dim']} per half), "
                 f"{gate} gate, window weight {spec['mix']} at init")
    skipped = (f" {len(c['skipped'])} file(s) skipped: {'; '.join(c['skipped'][:5])}"
               f"{' ...' if len(c['skipped']) > 5 else ''}." if c["skipped"] else "")
    return f"""# {log['name']}

The {WHAT[log['kind']]} of `{log['parent']}` (weights hash `{log['parent_hash'][:16]}`),
built by `evalkit linearize` from `{log['recipe_path'] or 'its recipe'}`. Over {kept}
tokens each linearized layer is the parent's own softmax attention; the other tokens reach it
only through a fixed recurrent state. This folder stores only what was trained
(twin.safetensors: the new parameters, and the deltas of the parent's weights the end-to-end
stage changed) and the parent's hash: the model is assembled from the parent at load time,
and a parent whose weights differ is refused.

| | |
| --- | --- |
| layers {'windowed' if log['kind'] == 'window_only' else 'linearized'} | {len(lin)} of {log['num_layers']}{f" (full attention: {log['kept_attention']})" if log.get('kept_attention') else ''} |
| mixer | {mixer} |
| state | {state} |
| held-out relative error, mean over layers | {'-' if log['heldout_relative_mean'] is None else f"{log['heldout_relative_mean']:.4f}"} |
| recipe hash | `{log['recipe_hash'][:16]}` |
| evalkit / torch | {log['evalkit_version']} / {log['torch_version']} |

## Held-out perplexity

Documents of the corpus's held-out split (never trained on), each scored from its start;
"inside the window" counts tokens whose whole context fits in the sinks and the window,
where the twin equals its parent before the end-to-end stage; "state off": the same twin
with its state switched off (`--model-args state_off=true`), what it predicts without it.

{_ppl_table(log)}

## Training

{_training(log)}

Corpus: {c['train_documents']:,} training and {c['heldout_documents']:,} held-out documents
({c['train_bytes']:,} and {c['heldout_bytes']:,} bytes; sha256 `{c['sha256'][:16]}`), split by a
hash of each document's path.{skipped}

![training and held-out figures](loss.png)

## Held-out relative error per layer

MSE between the layer's output and the parent's softmax attention output on the parent's own
inputs, divided by the mean square of the parent's output.

{_layers_table(log)}
{_anatomy(log)}
Reproduce: `evalkit linearize {log['parent']} --recipe {log['recipe_path'] or 'RECIPE'} --out DIR --only {log['name']}`.
"""
