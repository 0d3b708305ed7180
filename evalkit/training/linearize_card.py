"""The model card (README.md) and plot (loss.png) of a twin built by `evalkit linearize`, both
from its train_log.json."""
from __future__ import annotations

from pathlib import Path

from evalkit.formatting import fmt_bytes

WHAT = {"trained": "linearized twin (attention transfer)",
        "derived": "linearized twin with its hardest layers kept as full attention",
        "window_only": "sliding-window reference (no state beyond the window, nothing trained)"}


def member_plot(log: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 3.6))
    ax1, ax2, ax3 = fig.subplots(1, 3)
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
        ax3.axvline(log["window"], color="grey", linestyle=":", linewidth=0.8, label="window")
    ax3.set_xscale("log")
    ax3.set_title(f"held-out NLL by position ({longest} tokens)", fontsize=9)
    ax3.set_xlabel("position")
    ax3.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _ppl_table(log: dict) -> str:
    rows = ["| tokens | documents | parent | twin | twin, tokens inside the window | twin, past it | twin / parent |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for L, v in sorted(log["perplexity"].items(), key=lambda kv: int(kv[0])):
        t, p = v["twin"], v["parent"]
        inside = f"{t['ppl_inside_window']:.2f}" if "ppl_inside_window" in t else "-"
        past = f"{t['ppl_past_window']:.2f}" if "ppl_past_window" in t else "-"
        rows.append(f"| {int(L):,} | {len(v['documents'])} | {p['ppl']:.2f} | {t['ppl']:.2f} | "
                    f"{inside} | {past} | {t['ppl'] / p['ppl']:.3f} |")
    return "\n".join(rows)


def _layers_table(log: dict) -> str:
    tr = log["heldout_transfer"]
    if not tr:
        return "No layer is linearized."
    rows = ["| layer | held-out MSE | relative error |", "| ---: | ---: | ---: |"]
    rows += [f"| {i} | {tr[i][0]:.3g} | {tr[i][1]:.4f} |" for i in sorted(tr, key=int)]
    return "\n".join(rows)


def _training(log: dict) -> str:
    if log["kind"] == "window_only":
        return "Nothing is trained: the parent's weights, every attention layer limited to the " \
               f"last {log['window']} tokens."
    if log["kind"] == "derived":
        kept = ", ".join(f"{i} ({log['source_heldout_relative'][str(i)]:.4f})"
                         for i in log["kept_attention"])
        return (f"Nothing more is trained: the tensors of `{log['from_twin']}`, with its layers of "
                f"highest held-out relative error kept as the parent's full attention: {kept}. "
                f"Attention transfer trains each layer on the parent's own inputs, so the other "
                f"layers are exactly what training them again would give.")
    r, f = log["recipe"], log["final"]
    sweep = ""
    if log["sweep"]:
        rows = "\n".join(f"| {s['lr']:g} | {s['steps']} | {s['heldout_relative']:.4f} | "
                         f"{s['seconds'] / 60:.1f} |" for s in sorted(log["sweep"], key=lambda s: s["lr"]))
        sweep = ("\n\nLearning-rate sweep (each from the same initial values, scored on held-out "
                 "documents; the lowest wins):\n\n| lr | steps | held-out relative error | minutes |\n"
                 f"| ---: | ---: | ---: | ---: |\n{rows}")
    return (f"Attention transfer: {f['step']:,} of {f['planned_steps']:,} steps ({f['stop']}), "
            f"{f['tokens']:,} tokens seen, batches of {r['batch']} x {r['seq_len']:,} tokens, "
            f"AdamW (betas 0.9 / 0.95, weight decay {r['weight_decay']}) at lr {log['lr']:g}, "
            f"{r['warmup']} warm-up steps then cosine, {f['seconds'] / 60:.1f} min on "
            f"{r['threads']} thread(s) ({log['machine']}). {log['parameters_trained']:,} "
            f"parameters trained (feature maps, gates, mixes); every parent weight frozen.{sweep}")


def member_card(log: dict) -> str:
    c = log["corpus"]
    spec = log["recipe"]
    lin = log["linearized_layers"]
    state = "; ".join(f"{int(T):,} tokens: {fmt_bytes(b)} (parent KV {fmt_bytes(log['parent_kv_bytes'][T])})"
                      for T, b in log["state_bytes"].items())
    mixer = (f"{spec['feature_map']} feature map ({spec['feature_dim']} per half), "
             f"{spec['gate']} gate, window weight {spec['mix']} at init"
             if log["kind"] != "window_only" else "sliding-window softmax attention")
    skipped = (f" {len(c['skipped'])} file(s) skipped: {'; '.join(c['skipped'][:5])}"
               f"{' ...' if len(c['skipped']) > 5 else ''}." if c["skipped"] else "")
    return f"""# {log['name']}

The {WHAT[log['kind']]} of `{log['parent']}` (weights hash `{log['parent_hash'][:16]}`),
built by `evalkit linearize` from `{log['recipe_path'] or 'its recipe'}`. Inside the last
{log['window']} tokens each linearized layer is the parent's own softmax attention; older
tokens reach it only through a fixed recurrent state. This folder stores only what was trained
(twin.safetensors) and the parent's hash: the model is assembled from the parent at load
time, and a parent whose weights differ is refused.

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
"inside the window" counts tokens whose whole context fits in the window, where the twin
equals its parent.

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

Reproduce: `evalkit linearize {log['parent']} --recipe {log['recipe_path'] or 'RECIPE'} --out DIR --only {log['name']}`.
"""
