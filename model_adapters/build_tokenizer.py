"""Build the project's shared tiny tokenizer: model_adapters/tiny/tokenizer/.

A byte-level BPE with a 2048-token vocabulary, trained with the `tokenizers` library on the
shipped haystack text (Alice's Adventures in Wonderland) and on every template, key and value
list that the built-in tasks use. Each digit is its own token, so a model sees numbers digit
by digit. The tiny GLA/softmax pair is trained with this tokenizer, and the tests use it.

    python -m evalkit.model_adapters.build_tokenizer          # writes it
    python -m evalkit.model_adapters.build_tokenizer --check  # compares a rebuild with it

Special tokens: <|endoftext|> (bos = eos = unk = pad; document separator, GPT-2 style; no BOS
is added to encodings), and the chat markers <|system|>, <|user|>, <|assistant|>, <|end|>.
Chat template (each turn streams: adding a turn never re-renders earlier ones):

    <|user|>
    Please remember this. The code for locker 12 is 5512.<|end|>
    <|assistant|>
    Noted.<|end|>
    <|assistant|>                <- generation prompt

The build is deterministic: the training text is built in a fixed order and the trainer runs
single-threaded. Re-running it reproduces the same files byte for byte (checked by --check).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

# Single-threaded training: byte-identical merges on every machine.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

OUT = Path(__file__).resolve().parent / "tiny" / "tokenizer"
VOCAB_SIZE = 2048
SPECIALS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>\n"
                 "{{ message['content'] }}<|end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def training_text() -> list[str]:
    """The training text, in a fixed order: the book, then the task vocabulary in templates."""
    from evalkit.probes import words as c
    from evalkit.probes.haystack import DATA

    book = (DATA / "alice.txt").read_text(encoding="utf-8")
    lines = [p.strip() for p in book.split("\n\n") if p.strip()]
    lines += [c.FILLER] * 20
    for city in c.CITIES:
        for kind in ("number", "word", "UUID"):
            lines.append(f"The special magic {kind} for {city} is 4821.")
            lines.append(f"What is the special magic {kind} for {city}?")
    for w in c.VALUE_WORDS:
        lines.append(f"The special magic word is {w}. {w.capitalize()}, {w}.")
    for attr, plural, noun in c.DOMAINS:
        for num in ("7", "12", "21", "112", "305", "1024"):
            lines.append(f"The {attr} for {noun} {num} is 5512.")
            lines.append(f"What is the {attr} for {noun} {num}?")
            lines.append(f"The {plural} for {noun} {num} are 5512, 7730, 1190.")
            lines.append(f"What are the {plural} for {noun} {num}?")
    for phrase in (c.FACT_INTROS + c.UPDATE_INTROS + c.FACT_ACKS + c.UPDATE_ACKS
                   + c.STORY_REQUESTS):
        lines.extend([phrase] * 5)
    syll = [a + b for a in c.CONSONANTS for b in c.VOWELS]
    lines.append(" ".join(f"{x}{y}: 42." for x in syll for y in syll[::7]))
    lines.append("What is the value of zuvo? zuvo: 8812.")
    lines.append(" ".join("0123456789abcdef-"[i % 17] for i in range(500)))
    lines.append("3f2a9c1e-7b4d-4e8a-9c2f-1a2b3c4d5e6f 0123456789 abcdef")
    return lines


def build() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2,
                                  special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
        unk_token="<|endoftext|>", pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:], model_max_length=1 << 20)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main(argv: list[str] | None = None) -> int:
    from evalkit.model_adapters.tokenizer_build import main as build_main

    return build_main(build, OUT, __doc__.splitlines()[0], argv)  # it saves what build returns


if __name__ == "__main__":
    sys.exit(main())
