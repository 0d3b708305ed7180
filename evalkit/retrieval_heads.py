"""Retrieval score of every attention head (Wu et al., "Retrieval Head Mechanistically Explains
Long-Context Factuality", arXiv 2404.15574), measured on evalkit's own needle probes.

A copy step is an answer token that also occurs in the needle's value inside the context. With
the prompt and the gold answer in one teacher-forced forward, a head hits a copy step when its
top attention (the argmax over keys of the query that predicts the token) lands on a position
of the needle's value holding that very token. A head's retrieval score is its hits over all
copy steps of all selection probes. A grouped-query model's KV head scores the max over the
query heads that read it (what `keep_heads` ranks).

Selection probes are never evaluation probes: their seeds are 3 * 2^30 + a 30-bit hash of
(task, version, seed, length, depth, index), above every evaluation seed (< 2^31,
evalkit.taskspec.EVAL_SEED_MASK) and clear of training seeds (2^31 + i).

    doc = measure(load_model("smollm2-135m"), lengths=(1024,), samples=2)
    doc["kv_ranking"][:3]       # [[layer, kv_head, score], ...] best first
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from evalkit import heads_file
from evalkit.probe import Probe, canonical_json
from evalkit.render import continuation_ids, render
from evalkit.taskspec import EVAL_SEED_MASK, GridPoint, TaskSpec, discover, generate_probes

HEADS_SEED_BASE = 3 << 30
RECORD_ATTN = "evalkit_retrieval_record"
RECORD_KWARG = "evalkit_retrieval_rows"
DEFAULT_DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
DEFAULTS = {"task": "needle", "lengths": (1024,), "depths": DEFAULT_DEPTHS, "samples": 2, "seed": 0}


def selection_seed(spec: TaskSpec, seed: int, length: int, depth: float, index: int) -> int:
    key = canonical_json(["retrieval-heads", spec.name, spec.version, seed, length, float(depth),
                          index])
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") & ((1 << 30) - 1)
    out = HEADS_SEED_BASE + h
    assert out > EVAL_SEED_MASK  # never an evaluation seed
    return out


def selection_points(spec: TaskSpec, lengths: Sequence[int], depths: Sequence[float],
                     samples: int, seed: int) -> list[GridPoint]:
    if samples < 1:
        raise ValueError(f"samples must be >= 1 probe per (length, depth), got {samples}")
    if not lengths or not depths:
        raise ValueError("at least one length and one depth are needed")
    return [GridPoint(L, float(d), 1, i, selection_seed(spec, seed, L, d, i))
            for L in lengths for d in depths for i in range(samples)]


@dataclass(frozen=True)
class CopyProbe:
    """One selection probe, tokenized: the teacher-forced ids, where the needle's value sits,
    and the copy steps (query position, token copied)."""

    probe: Probe
    ids: list[int]
    needle: range
    steps: list[tuple[int, int]]
    answer: list[tuple[int, int]]  # every answer step (query position, gold token)


def _find(seq: list[int], sub: list[int]) -> list[int]:
    n = len(sub)
    return [i for i in range(len(seq) - n + 1) if seq[i: i + n] == sub]


def copy_probe(probe: Probe, tokenizer: Any) -> CopyProbe:
    """The asked needle's value located in the context (exactly once, by its tokens as the
    answer continues them, else as they sit after a space-free boundary)."""
    q = probe.questions[-1]
    r = render(probe, tokenizer)
    context = [t for piece in r.context[: q.after_segment] for t in piece]
    prompt = context + list(r.questions[-1])
    answer = continuation_ids(tokenizer, q.gold[0])
    value = answer
    hits = _find(context, value)
    if len(hits) != 1:  # a tokenizer that merges the leading space differently in the prose
        from evalkit.tokenization import encode
        value = encode(tokenizer, q.gold[0])
        hits = _find(context, value)
    if len(hits) != 1:
        raise ValueError(f"probe {probe.id} (seed {probe.meta.seed}): the value {q.gold[0]!r} "
                         f"occurs {len(hits)} times in the context as tokens {value}; a retrieval "
                         f"score needs exactly one needle")
    needle = range(hits[0], hits[0] + len(value))
    in_needle = {context[i] for i in needle}
    ids = prompt + answer
    steps_all = [(len(prompt) - 1 + j, tok) for j, tok in enumerate(answer)]
    return CopyProbe(probe, ids, needle, [s for s in steps_all if s[1] in in_needle], steps_all)


def _record_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal sdpa (one forward from position 0, no cache) that also records, for the query
    rows in kwargs[RECORD_KWARG], each head's argmax key."""
    rec = kwargs[RECORD_KWARG]
    groups = query.shape[1] // key.shape[1]
    out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                         enable_gqa=groups > 1)
    rows = rec["rows"]
    k = key.repeat_interleave(groups, 1) if groups > 1 else key
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    s = (query[:, :, rows] @ k.transpose(-1, -2)) * scale           # [B, Hq, m, n]
    later = torch.arange(k.shape[-2], device=s.device)[None, :] > rows[:, None]
    rec["argmax"][module.layer_idx] = s.masked_fill(later, float("-inf")).argmax(-1)[0]
    return out.transpose(1, 2).contiguous(), None


def _model_shape(model: Any) -> tuple[int, int, int]:
    cfg = model.config
    heads = int(cfg.num_attention_heads)
    return int(cfg.num_hidden_layers), heads, int(getattr(cfg, "num_key_value_heads", None) or heads)


def measure(adapter: Any, *, task: str = DEFAULTS["task"],
            lengths: Sequence[int] = DEFAULTS["lengths"],
            depths: Sequence[float] = DEFAULTS["depths"], samples: int = DEFAULTS["samples"],
            seed: int = DEFAULTS["seed"], include: Sequence[str] = (),
            progress: Any = None) -> dict:
    """The retrieval-heads record (heads_file.FORMAT) of a SoftmaxAdapter's model."""
    from transformers import AttentionInterface

    # the model's own forward, never the adapter's window or policy: always the whole model
    model, tok = adapter.model, adapter.tokenizer
    n_layers, n_heads, n_kv = _model_shape(model)
    spec = discover(include).get(task)
    points = selection_points(spec, lengths, depths, samples, seed)
    probes = [copy_probe(p, tok) for p in generate_probes(spec, tok, points)]
    for cp in probes:
        adapter._check_room(len(cp.ids), "retrieval-heads probe")

    hits = torch.zeros(n_layers, n_heads, dtype=torch.long)
    n_steps, rows_out = 0, []
    AttentionInterface.register(RECORD_ATTN, _record_attention)
    before = model.config._attn_implementation
    model.set_attn_implementation(RECORD_ATTN)
    try:
        for i, cp in enumerate(probes):
            rows = torch.tensor([p for p, _ in cp.answer], device=adapter.device)
            rec = {"rows": rows, "argmax": {}}
            x = torch.tensor([cp.ids], device=adapter.device)
            with torch.inference_mode():
                logits = model(input_ids=x, use_cache=False, **{RECORD_KWARG: rec}).logits[0]
            correct = all(int(logits[p].argmax()) == t for p, t in cp.answer)
            if len(rec["argmax"]) != n_layers:
                raise RuntimeError(f"{adapter.name}: {len(rec['argmax'])} of {n_layers} layers "
                                   f"went through the recording attention")
            step_idx = [j for j, s in enumerate(cp.answer) if s in cp.steps]
            for layer, am in rec["argmax"].items():          # am [Hq, m]
                for j in step_idx:
                    tok_j = cp.answer[j][1]
                    for h in range(n_heads):
                        pos = int(am[h, j])
                        if pos in cp.needle and cp.ids[pos] == tok_j:
                            hits[layer, h] += 1
            n_steps += len(step_idx)
            rows_out.append({"id": cp.probe.id, "hash": cp.probe.hash, "seed": cp.probe.meta.seed,
                             "length": cp.probe.meta.target_length, "depth": cp.probe.meta.depth,
                             "tokens": len(cp.ids), "copy_steps": len(step_idx),
                             "parent_correct": correct})
            if progress is not None:
                progress(i + 1, len(probes))
    finally:
        model.set_attn_implementation(before)
    if n_steps == 0:
        raise ValueError(f"task {task}: no answer token of the selection probes occurs in its "
                         f"needle; no copy step to score")
    q_scores = (hits.double() / n_steps).tolist()
    groups = n_heads // n_kv
    kv_scores = [[max(row[h * groups: (h + 1) * groups]) for h in range(n_kv)] for row in q_scores]
    ident = adapter.identity()
    return {
        "format": heads_file.FORMAT,
        "model": ident["name"], "weights_hash": ident["weights_hash"],
        "tokenizer_hash": ident.get("tokenizer_hash"),
        "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": n_kv,
        "copy_steps": n_steps,
        "query_hits": hits.tolist(),
        "query_scores": q_scores, "kv_scores": kv_scores,
        "kv_ranking": heads_file.ranking(kv_scores),
        "scores_sha256": hashlib.sha256(json.dumps(kv_scores).encode()).hexdigest(),
        "selection": {"task": spec.name, "task_version": spec.version, "lengths": list(lengths),
                      "depths": [float(d) for d in depths], "samples": samples, "seed": seed,
                      "seed_base": HEADS_SEED_BASE,
                      "parent_correct": sum(r["parent_correct"] for r in rows_out),
                      "probes": len(rows_out)},
        "probes": rows_out,
        "definition": "Wu et al. 2404.15574: share of copy steps whose argmax attention lands "
                      "on the copied token inside the needle's value (teacher-forced gold "
                      "answer); KV heads: max over their query heads",
    }


def heat_map(doc: dict, path: Any) -> None:
    """A layer x query-head map of the retrieval scores (matplotlib's object API, Agg)."""
    from matplotlib.figure import Figure

    scores = doc["query_scores"]
    n_layers, n_heads = len(scores), len(scores[0])
    fig = Figure(figsize=(max(4.0, 0.45 * n_heads + 2), max(3.0, 0.22 * n_layers + 1.5)))
    ax = fig.add_subplot()
    im = ax.imshow(scores, aspect="auto", cmap="viridis", vmin=0.0,
                   vmax=max(0.05, max(max(r) for r in scores)), origin="upper")
    groups = n_heads // doc["n_kv_heads"]
    for b in range(groups, n_heads, groups):  # KV-group boundaries
        ax.axvline(b - 0.5, color="white", lw=0.6)
    ax.set_xlabel(f"query head ({doc['n_kv_heads']} KV groups of {groups})")
    ax.set_ylabel("layer")
    sel = doc["selection"]
    ax.set_title(f"{doc['model']}: retrieval score per head\n{sel['probes']} {sel['task']} "
                 f"probes at {', '.join(map(str, sel['lengths']))} tokens, "
                 f"{doc['copy_steps']} copy steps", fontsize=9)
    fig.colorbar(im, ax=ax, label="retrieval score")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
