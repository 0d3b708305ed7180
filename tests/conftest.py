"""Test-wide settings: never touch the network, and keep CPU thread use predictable."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The project's shared tiny tokenizer (a real BPE saved as tokenizer.json)."""
    from evalkit.tokenization import load_tokenizer

    from helpers import TINY_TOKENIZER

    return load_tokenizer(TINY_TOKENIZER)
