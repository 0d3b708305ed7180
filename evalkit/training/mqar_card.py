"""The model card (README.md) of an MQAR family member, from its train_log."""
from __future__ import annotations

from evalkit.formatting import fmt_bytes
from evalkit.training.mqar import MQARFamily, Member, member_config

MIXERS = {"gla": "GLA (Gated Linear Attention)", "attn": "softmax attention (KV cache)",
          "swa": "sliding-window softmax attention"}


def _kb(n: int) -> str:
    return f"{n:,} B ({fmt_bytes(n)})"


def _sweep(log: dict) -> str:
    if not log["sweep"]:
        return f"No sweep: the recipe gives this member one rate ({log['lr']:g})."
    rows = "\n".join(f"| {s['lr']:g} | {s['steps']:,} | {s['heldout_accuracy']:.3f} | "
                     f"{s['heldout_loss']:.3f} | {s['seconds'] / 60:.1f} |" for s in log["sweep"])
    return (f"Sweep ({log['sweep'][0]['planned_steps']:,}-step runs, scored on held-out examples;"
            " ties to the lower loss):\n\n| lr | steps | held-out accuracy | held-out loss |"
            f" minutes |\n| ---: | ---: | ---: | ---: | ---: |\n{rows}")


def member_card(fam: MQARFamily, m: Member, log: dict) -> str:
    cfg = member_config(fam, m)
    longest = max(s.length for s in fam.test_mix)
    parts = cfg.state_parts(longest)
    what = MIXERS[m.mixer] + (f" of {m.window} tokens" if m.window else "")
    by = log["evals"][-1]["by_setting"] if log["evals"] else {}
    settings = " / ".join(f"{k} {v:.2f}" for k, v in by.items())
    mix = ", ".join(f"({s.length}, {s.load}) x{s.count:,}" for s in fam.train_mix)
    return f"""# {m.name}

A two-layer MQAR twin trained here on CPU with the Based protocol: layer 0 a gated short
convolution (kernel {fam.conv_kernel}), layer 1 **{what}**, width {m.d}, no MLP, tied
embeddings, vocabulary 8,192 (model_adapters/mqar/tokenizer). Twins differ only in layer 1.

| figure | value |
| --- | --- |
| parameters | {log['params']:,} |
| state at {longest:,} tokens (fp32) | {_kb(parts.total)}: fixed {parts.fixed:,}, window {parts.window:,}, KV {parts.growing:,} |
| state kind | {parts.kind} |
| learning rate | {log['lr']:g} |
| final run | {log['steps']:,} of {log['planned_steps']:,} steps, {log['stop']}, {log['seconds'] / 60:.1f} min on {fam.threads} thread(s) |
| held-out accuracy (test mix, {fam.heldout} examples a setting) | {log['heldout_accuracy']:.3f} |
| per setting (length x pairs) | {settings} |
| recipe hash | `{log['recipe_hash'][:16]}` |

Training mix (length, pairs) x count, one setting drawn per step by count: {mix}.
Loss at the query positions only; AdamW (weight decay {fam.weight_decay}), warm-up
{fam.warmup} steps then cosine; early stop at held-out {fam.early_stop}.

{_sweep(log)}

Reproduce: `evalkit train-mqar --config {log.get('config_path') or 'configs/train_mqar.yaml'} --only {m.name}`
(evalkit {log['evalkit_version']}).
"""
