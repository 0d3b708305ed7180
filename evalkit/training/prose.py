"""Offline English prose for attention transfer: text files under some folders (Debian's
python3.11-doc and linux-doc-6.1 reST sources by default), split into training and held-out
documents by a hash of their path, tokenized with the parent's tokenizer.

Everything is a pure function of (the files, the config, the tokenizer):
- a document is one file; its id is `<root's name>/<path under the root>`;
- it is held out when int(sha256(id)) % 100 < heldout_percent, so adding files never moves
  another document between the splits;
- training text is the training documents in id order, each followed by EOS, as one token
  stream cut into sequences of seq_len tokens (the tail shorter than seq_len is counted and
  left out); step s of epoch e reads rows permutation(seed, e)[i] for i in its slice.

    corpus = read_corpus(cfg)                       # documents, split, skipped files named
    stream = TokenStream(corpus.train, tokenizer, seq_len=1024)
    ids = stream.batch(step=0, batch=4, seed=0)     # [4, 1024] int64
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

MAX_FILES = 100_000
MAX_BYTES = 1 << 30           # 1 GiB of text in all
MAX_FILE_BYTES = 16 << 20     # one document


class CorpusConfig(BaseModel):
    """Where the text comes from (a recipe's `corpus` key)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    roots: dict[str, str] = Field(min_length=1, max_length=16)  # name: folder
    pattern: str = Field(default="**/*.rst.txt", min_length=1, max_length=200)
    heldout_percent: int = Field(default=5, ge=1, le=50)
    install: str = Field(default="", max_length=500)  # how to get the roots (error messages)


@dataclass
class Corpus:
    train: list[tuple[str, str]]                 # (id, text), sorted by id
    heldout: list[tuple[str, str]]
    skipped: list[str] = field(default_factory=list)   # "<id>: why"
    sha256: str = ""                             # over every (id, text) read

    def summary(self) -> dict[str, Any]:
        return {"train_documents": len(self.train), "heldout_documents": len(self.heldout),
                "train_bytes": sum(len(t.encode()) for _, t in self.train),
                "heldout_bytes": sum(len(t.encode()) for _, t in self.heldout),
                "skipped": list(self.skipped), "sha256": self.sha256}


def doc_id(name: str, root: Path, path: Path) -> str:
    return "/".join((name,) + path.relative_to(root).parts)


def is_heldout(doc: str, percent: int) -> bool:
    return int(hashlib.sha256(doc.encode()).hexdigest(), 16) % 100 < percent


def read_corpus(cfg: CorpusConfig, where: str = "corpus") -> Corpus:
    """Read every file matching cfg.pattern under cfg.roots. A missing root, no files, or a
    corpus past the size bounds is an error; a file that is not UTF-8 or is empty is skipped
    and named in `skipped` (the model card lists them)."""
    files: list[tuple[str, Path]] = []
    for name, r in sorted(cfg.roots.items()):
        root = Path(r).expanduser()
        if not root.is_dir():
            hint = f"; install it with: {cfg.install}" if cfg.install else ""
            raise FileNotFoundError(f"{where}.roots.{name}: {root} is not a folder{hint}")
        found = sorted(p for p in root.glob(cfg.pattern) if p.is_file())
        if not found:
            raise ValueError(f"{where}.roots.{name}: no file matches {cfg.pattern!r} under {root}")
        files += [(doc_id(name, root, p), p) for p in found]
        if len(files) > MAX_FILES:
            raise ValueError(f"{where}: over {MAX_FILES:,} files")
    corpus, total, h = Corpus([], []), 0, hashlib.sha256()
    for doc, path in sorted(files):
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            corpus.skipped.append(f"{doc}: {size:,} bytes, over {MAX_FILE_BYTES:,}")
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            corpus.skipped.append(f"{doc}: not UTF-8 ({e.reason} at byte {e.start})")
            continue
        if not text.strip():
            corpus.skipped.append(f"{doc}: empty")
            continue
        total += size
        if total > MAX_BYTES:
            raise ValueError(f"{where}: over {MAX_BYTES:,} bytes of text; use fewer roots")
        h.update(f"{doc}\n{len(text)}\n".encode() + text.encode())
        (corpus.heldout if is_heldout(doc, cfg.heldout_percent) else corpus.train).append((doc, text))
    if not corpus.train or not corpus.heldout:
        raise ValueError(f"{where}: {len(corpus.train)} training and {len(corpus.heldout)} held-out "
                         f"documents; both splits need at least one (more files, or another "
                         f"heldout_percent)")
    corpus.sha256 = h.hexdigest()
    return corpus


def tokenize(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, no special tokens (the fast tokenizer's batch call)."""
    out: list[list[int]] = []
    for i in range(0, len(texts), 256):
        out += tokenizer(list(texts[i:i + 256]), add_special_tokens=False)["input_ids"]
    return out


class TokenStream:
    """The training documents as one stream of tokens (EOS after each), in sequences."""

    def __init__(self, docs: Sequence[tuple[str, str]], tokenizer: Any, seq_len: int) -> None:
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the parent's tokenizer has no EOS token to separate documents")
        ids: list[int] = []
        for toks in tokenize(tokenizer, [t for _, t in docs]):
            ids += toks
            ids.append(eos)
        self.tokens = len(ids)
        self.seq_len = seq_len
        n = len(ids) // seq_len
        if n < 1:
            raise ValueError(f"the training documents hold {len(ids):,} tokens, fewer than one "
                             f"sequence of {seq_len:,}")
        self.rows = torch.tensor(np.asarray(ids[:n * seq_len], dtype=np.int64)).view(n, seq_len)
        self.dropped_tail = len(ids) - n * seq_len

    def __len__(self) -> int:
        return self.rows.shape[0]

    def batch(self, step: int, batch: int, seed: int) -> torch.Tensor:
        """[batch, seq_len]: rows step*batch .. of the epoch's seeded permutation (an epoch
        ends when a batch would wrap; the next one is a new permutation)."""
        n = len(self)
        per_epoch = max(1, n // batch)
        epoch, i = divmod(step, per_epoch)
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        idx = perm[(i * batch) % n:][:batch]
        if len(idx) < batch:  # fewer rows than one batch: wrap within the permutation
            idx = np.resize(perm, batch)
        return self.rows[torch.as_tensor(idx)]


def heldout_sequences(docs: Sequence[tuple[str, str]], tokenizer: Any, length: int,
                      count: int) -> tuple[torch.Tensor, list[str]]:
    """The first `length` tokens of each of the first `count` held-out documents (id order)
    that have at least `length` tokens: [n, length] and their ids. Fewer than `count` such
    documents is an error naming how many there are."""
    rows, names = [], []
    for (doc, _), toks in zip(docs, tokenize(tokenizer, [t for _, t in docs])):
        if len(toks) >= length:
            rows.append(toks[:length])
            names.append(doc)
            if len(rows) == count:
                break
    if len(rows) < count:
        raise ValueError(f"only {len(rows)} held-out document(s) have {length:,} tokens; "
                         f"{count} asked for (fewer documents or a shorter length)")
    return torch.tensor(rows, dtype=torch.int64), names
