"""`evalkit train-tiny`: train the matched tiny GLA/softmax pair and write checkpoints + cards.

    evalkit train-tiny --config configs/train_tiny.yaml --out model_adapters/tiny

writes `recall-gla-tiny/` (fla checkpoint format) and `recall-softmax-tiny/` (transformers
Llama), each with the shared tokenizer, a README.md model card, loss.png and train_log.json.
"""
from __future__ import annotations

import json
import platform
import shutil
import time
from pathlib import Path

from pydantic import ValidationError

from evalkit import __version__
from evalkit.yamlfile import read_yaml

NAMES = {"gla": "recall-gla-tiny", "softmax": "recall-softmax-tiny"}


def add_parser(sub) -> None:
    p = sub.add_parser("train-tiny", help="train the matched tiny GLA/softmax pair (CPU)")
    p.add_argument("--config", default="configs/train_tiny.yaml")
    p.add_argument("--out", default="model_adapters/tiny", help="folder for both checkpoints")
    p.add_argument("--tokenizer", default=None, help="default: the shipped tiny tokenizer")
    p.set_defaults(func=run)


def load_config(path: str):
    from evalkit.training.train import TrainConfig

    p = Path(path)
    raw = read_yaml(p, ValueError, "training config") or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{p}: expected a mapping of keys (tasks, steps, ...), got "
                         f"{type(raw).__name__}")
    if isinstance(raw, dict) and "include" in raw:  # task folders are relative to the config
        raw["include"] = [str((p.parent / d).resolve()) for d in raw["include"]]
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as e:
        lines = [f"{p}: key {'.'.join(map(str, err['loc']))!r}: {err['msg']}" for err in e.errors()]
        raise ValueError("\n".join(lines)) from None


def _loss_plot(result: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.5))
    for ax, key, title in zip(fig.subplots(1, 2), ("history", "answer_history"),
                              ("weighted loss, all tokens", "loss on answer tokens")):
        for k, v in result[key].items():
            ax.plot(v, label=NAMES[k], linewidth=0.8)
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.legend()
    fig.suptitle("training loss (same batches, same optimizer)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _bytes_table(gla_cfg, llama_cfg, lengths=(256, 512, 1024, 2048, 4096, 8192)) -> str:
    state = gla_cfg.state_bytes("float32")
    head_dim = llama_cfg.hidden_size // llama_cfg.num_attention_heads
    rows = ["| tokens | GLA state (fp32) | softmax KV cache (fp32) | KV / state |",
            "| ---: | ---: | ---: | ---: |"]
    for n in lengths:
        kv = 2 * llama_cfg.num_hidden_layers * llama_cfg.num_key_value_heads * head_dim * n * 4
        rows.append(f"| {n:,} | {state:,} B | {kv:,} B | {kv / state:.2f} |")
    return "\n".join(rows)


def _stages_table(cfg) -> str:
    rows = ["| stage | tasks | probe lengths | steps | sequences | seeds |",
            "| ---: | --- | --- | ---: | ---: | --- |"]
    first = 0
    for i, st in enumerate(cfg.stages, 1):
        rows.append(f"| {i} | {', '.join(f'`{t}`' for t in st.tasks)} | "
                    f"{', '.join(map(str, st.lengths))} | {st.steps} | {st.pool} | "
                    f"2^31+{first} .. 2^31+{first + st.pool - 1} |")
        first += st.pool
    return "\n".join(rows)


def _card(name: str, kind: str, cfg, result: dict, gla_cfg, llama_cfg, tok_path: str,
          config_path: str) -> str:
    from evalkit.training.train import final_loss

    hist = result["history"][kind]
    arch = ("our native-PyTorch Gated Linear Attention (fla GLAForCausalLM semantics, saved in "
            "fla's checkpoint format)" if kind == "gla" else
            "transformers LlamaForCausalLM (softmax attention, RoPE)")
    return f"""# {name}

A tiny {'recurrent' if kind == 'gla' else 'softmax-attention'} language model trained by
`evalkit train-tiny` so that a fixed recurrent state and a growing KV cache can be compared on
equal terms on 2 CPU cores. Its twin is `{NAMES['softmax' if kind == 'gla' else 'gla']}`.

| | |
| --- | --- |
| architecture | {arch} |
| parameters | {result['params'][kind]:,} (twin: {result['params']['softmax' if kind == 'gla' else 'gla']:,}) |
| width / layers / heads | {cfg.hidden_size} / {cfg.num_layers} / {cfg.gla_heads if kind == 'gla' else cfg.num_heads} (twin: {cfg.num_heads if kind == 'gla' else cfg.gla_heads}) |
| vocabulary | {llama_cfg.vocab_size} (shared tokenizer: `{tok_path}`) |
| trained length | {cfg.seq_len} tokens: evaluate only up to here |
| steps | {cfg.steps} in {len(cfg.stages)} stage(s) (below), each about {cfg.batch_tokens:,} tokens, one probe length per batch |
| optimizer | AdamW (betas 0.9/0.95, weight decay {cfg.weight_decay}), lr {cfg.lr}, {cfg.warmup} warm-up steps then cosine to 0, grad clip 1.0 |
| loss | next-token cross-entropy over the whole sequence, answer tokens weighted {cfg.answer_weight}, all other tokens {cfg.context_weight} |
| final loss (mean of last 25 steps) | {final_loss(hist):.4f} (answer tokens alone: {final_loss(result['answer_history'][kind]):.4f}) |
| training time | {result['seconds'][kind] / 60:.1f} min on {cfg.threads} CPU threads ({platform.processor() or platform.machine()}) |
| seed | {cfg.seed} (initialisation and batch order) |
| evalkit | {__version__}; recipe: `{config_path}` |

## Data

Training sequences generated by the evalkit task plugins, in a curriculum of
{len(cfg.stages)} stage(s) run in order (one learning-rate schedule over all of them):

{_stages_table(cfg)}

Each sequence is an evaluation-format prompt at the probe length for one of the probe's
questions (every question, for the multi-query training variants) followed by the gold answer
and a newline; no sequence exceeds the trained length. Loads: {json.dumps(cfg.loads) if cfg.loads else 'one fact'}.
**Seeds are disjoint from every evaluation seed**: training probes use seeds
2^31 .. 2^31 + {sum(st.pool for st in cfg.stages) - 1} (each stage its own range); evaluation probes always use seeds below 2^31
(`evalkit.taskspec.EVAL_SEED_MASK`). The haystack prose (Alice's Adventures in Wonderland,
public domain) is shared with evaluation, as in every needle benchmark; the facts, keys,
values and positions are not.

## Loss

![loss curve](loss.png)

## State bytes vs. KV-cache bytes by length

The GLA state does not grow with the context; the Llama KV cache grows linearly.

{_bytes_table(gla_cfg, llama_cfg)}

Recall scores are in the project leaderboard (`leaderboard/README.md`), measured by the
quick suite, not here.
"""


def run(args) -> int:
    from evalkit.model_adapters.gla.checkpoint import save_checkpoint
    from evalkit.tokenization import load_tokenizer
    from evalkit.training.train import train_pair

    from evalkit.model_adapters.reference import DEFAULT_TOKENIZER

    cfg = load_config(args.config)
    tok_path = args.tokenizer or str(DEFAULT_TOKENIZER.relative_to(Path.cwd())
                                     if DEFAULT_TOKENIZER.is_relative_to(Path.cwd())
                                     else DEFAULT_TOKENIZER)
    tokenizer = load_tokenizer(tok_path)
    out = Path(args.out)
    t0 = time.time()
    result = train_pair(cfg, tokenizer)
    gla, gla_cfg = result["gla"]
    llama = result["softmax"]
    for kind, name in NAMES.items():
        tmp = out / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if kind == "gla":
            save_checkpoint(gla.float(), gla_cfg, tmp)
        else:
            llama.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _loss_plot(result, tmp / "loss.png")
        (tmp / "train_log.json").write_text(json.dumps(
            {"config": cfg.model_dump(mode="json"), "history": result["history"][kind],
             "answer_history": result["answer_history"][kind],
             "seconds": result["seconds"][kind], "params": result["params"][kind],
             "evalkit_version": __version__}, indent=1) + "\n")
        (tmp / "README.md").write_text(_card(name, kind, cfg, result, gla_cfg, llama.config,
                                             tok_path, args.config))
        final = out / name
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        print(f"wrote {final}")
    print(f"trained the pair in {(time.time() - t0) / 60:.1f} min")
    return 0
