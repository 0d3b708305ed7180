"""Build the MQAR word-level tokenizer: model_adapters/mqar/tokenizer/.

Zoology's MQAR works on token ids (vocabulary 8,192); evalkit's probes are text. This tokenizer
makes the two the same thing: one whitespace-separated symbol per id, id i <-> tasks.mqar.symbol(i)

    id 0            "_"                 the filler
    ids 1..4095     "k1" .. "k4095"     keys   (k + the token id)
    ids 4096..8191  "v4096" .. "v8191"  values (v + the token id)

so a rendered probe encodes to exactly the generator's ids, one token per symbol, and a model
trained on the generator's id arrays reads the probes unchanged. Built with the `tokenizers`
library: a WordLevel model over those 8,192 words and a whitespace-split pre-tokenizer. No
special tokens, no BOS/EOS added, and the unknown-word token is deliberately absent from the
vocabulary, so encoding a word that is not a symbol raises (tokenizers: "Missing [UNK] token")
instead of silently mapping it to some id.

    python -m evalkit.model_adapters.build_mqar_tokenizer          # writes it
    python -m evalkit.model_adapters.build_mqar_tokenizer --check  # compares a rebuild with it

The vocabulary is a fixed list, nothing is trained: rebuilding gives identical bytes.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "mqar" / "tokenizer"
UNK = "<not-an-mqar-symbol>"  # named as the unk token but never in the vocabulary: unknown words raise


def build() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from evalkit.tasks.mqar import VOCAB_SIZE, symbols

    vocab = {s: i for i, s in enumerate(symbols(VOCAB_SIZE))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=1 << 20)
    return fast


def main(argv: list[str] | None = None) -> int:
    from evalkit.model_adapters.tokenizer_build import main as build_main

    return build_main(build, OUT, __doc__.splitlines()[0], argv)  # it saves what build returns


if __name__ == "__main__":
    sys.exit(main())
