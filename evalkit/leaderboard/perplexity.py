"""Held-out perplexity of the board's language models, as their twins' cards measured it.

A board row's model is looked up by its identity (spec and options): a linearized twin gets its
card's twin perplexity, or its state-off one when it runs with `state_off`; a model that is a
twin's parent gets the parent perplexity its twins' cards measured on the same documents. Not a
run of this board: the cards' numbers, written by `make train-twins` with the twins' weights
(evalkit.model_adapters.linearized.heldout_perplexity). Rows whose model has no card, or runs
with load options other than `state_off` (another dtype: not the model the card measured), are
absent.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from evalkit.model_adapters.linearized import heldout_perplexity

COLUMNS = ["model_label", "length", "ppl", "x_parent", "tokens", "documents", "source"]


def _row(label: str, spec: str, length: int, ppl: float, parent_ppl: float, m: dict) -> dict:
    return {"model_label": label, "length": length, "ppl": ppl, "x_parent": ppl / parent_ppl,
            "tokens": m["tokens"], "documents": len(m["documents"]), "source": spec}


def perplexity_table(identities: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per board model x length the cards measured (COLUMNS); empty when no board model
    is a twin. Parents' rows come from the twins on the board; twins of one parent must have
    measured it on the same documents, the same perplexity (else a ValueError naming both)."""
    cards = {}
    for label, ident in identities.items():
        spec = ident.get("spec") or label
        card = heldout_perplexity(spec)
        if card is not None:
            cards[label] = (spec, card)
    parents: dict[str, tuple[str, dict]] = {}  # parent spec -> (twin spec, its lengths)
    for spec, card in cards.values():
        seen = parents.setdefault(card["parent"], (spec, card["lengths"]))
        for length, m in card["lengths"].items():
            other = seen[1].get(length)
            if other is not None and (other["documents"] != m["documents"]
                                      or abs(other["parent"] - m["parent"]) > 1e-6 * m["parent"]):
                raise ValueError(f"the cards of {seen[0]} and {spec} measured their parent "
                                 f"{card['parent']} differently at {length} tokens "
                                 f"({other['parent']:.4f} vs. {m['parent']:.4f}): retrain both "
                                 f"on one recipe (make train-twins)")
    rows = []
    for label, ident in sorted(identities.items()):
        spec = ident.get("spec") or label
        options = dict(ident.get("options") or {})
        off = bool(options.pop("state_off", False))
        if options:  # another dtype, chunking, ...: not the model the card measured
            continue
        if label in cards:
            for length, m in cards[label][1]["lengths"].items():
                ppl = m["state_off"] if off else m["twin"]
                if ppl is not None:  # a twin without a state has no state-off perplexity
                    rows.append(_row(label, spec, length, ppl, m["parent"], m))
        elif spec in parents and not off:
            twin, lengths = parents[spec]
            for length, m in lengths.items():
                rows.append(_row(label, twin, length, m["parent"], m["parent"], m))
    return pd.DataFrame(rows, columns=COLUMNS)
