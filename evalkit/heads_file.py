"""The retrieval-heads record `evalkit heads` writes, and the K best KV heads read from it.

    {"format": "evalkit-heads/1", "model": {...identity...}, "weights_hash": "...",
     "n_layers": 30, "n_heads": 9, "n_kv_heads": 3,
     "query_scores": [[...n_heads...] x n_layers],   # Wu et al.'s retrieval score per query head
     "kv_scores":    [[...n_kv_heads...] x n_layers], # max over each KV head's query heads
     "kv_ranking":   [[layer, kv_head, score], ...],  # best first; ties by (layer, head)
     "selection": {...how the probes were made...}, ...}

A record is tied to its model by the weights hash: keep_heads on another model's record is an
error, never a silently wrong head list.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FORMAT = "evalkit-heads/1"


def ranking(kv_scores: list[list[float]]) -> list[list]:
    """[[layer, kv_head, score], ...] best first; ties broken by (layer, head) so the order is
    a pure function of the scores."""
    rows = [[l, h, float(s)] for l, row in enumerate(kv_scores) for h, s in enumerate(row)]
    return sorted(rows, key=lambda r: (-r[2], r[0], r[1]))


def top_heads(kv_ranking: list[list], k: int, n_layers: int) -> tuple[tuple[int, ...], ...]:
    """Per layer, the sorted KV heads among the k best."""
    if not 0 <= k <= len(kv_ranking):
        raise ValueError(f"keep_heads={k}: expected 0..{len(kv_ranking)} (the model's KV heads)")
    per: list[list[int]] = [[] for _ in range(n_layers)]
    for layer, head, _ in kv_ranking[:k]:
        per[layer].append(head)
    return tuple(tuple(sorted(h)) for h in per)


def read(path: str | Path, *, weights_hash: str, n_layers: int, n_kv_heads: int) -> dict:
    """The record at `path`, checked to be an `evalkit heads` record of this model."""
    path = Path(path).expanduser()
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"heads file {path} does not exist (write one with "
                                f"`evalkit heads MODEL --output {path}`)") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"heads file {path}: not a readable JSON file ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"heads file {path}: field 'format' should be {FORMAT!r}, got "
                         f"{doc.get('format') if isinstance(doc, dict) else type(doc).__name__!r}")
    if doc.get("weights_hash") != weights_hash:
        raise ValueError(f"heads file {path}: field 'weights_hash' {str(doc.get('weights_hash'))[:16]}"
                         f"... is another model's (this model: {weights_hash[:16]}...)")
    if doc.get("n_layers") != n_layers or doc.get("n_kv_heads") != n_kv_heads:
        raise ValueError(f"heads file {path}: fields n_layers/n_kv_heads "
                         f"{doc.get('n_layers')}/{doc.get('n_kv_heads')} should be "
                         f"{n_layers}/{n_kv_heads}")
    scores = doc.get("kv_scores")
    if (not isinstance(scores, list) or len(scores) != n_layers
            or any(not isinstance(r, list) or len(r) != n_kv_heads for r in scores)
            or any(not isinstance(s, (int, float)) or isinstance(s, bool) or not math.isfinite(s)
                   for r in scores for s in r)):
        raise ValueError(f"heads file {path}: field 'kv_scores' should be {n_layers} lists of "
                         f"{n_kv_heads} finite numbers")
    if doc.get("kv_ranking") != ranking(scores):
        raise ValueError(f"heads file {path}: field 'kv_ranking' does not follow from "
                         f"'kv_scores' (edited?)")
    return doc


def summary(doc: dict, source: str) -> dict[str, Any]:
    """What a policy's identity records of the record it used."""
    return {"source": source, "selection": doc.get("selection"),
            "scores_sha256": doc.get("scores_sha256")}
