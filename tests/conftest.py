"""Test-wide settings: never touch the network, and keep CPU thread use predictable."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Under pytest-xdist (`make test` runs two workers), the cores are split between the workers:
# each one's torch (and every child interpreter it starts) gets its share, not all of them, so
# two workers on two cores do not fight over four threads.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    _share = max(1, (_cores or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))
    os.environ.setdefault("MKL_NUM_THREADS", str(_share))

import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The project's shared tiny tokenizer (a real BPE saved as tokenizer.json)."""
    from evalkit.tokenization import load_tokenizer

    from helpers import TINY_TOKENIZER

    return load_tokenizer(TINY_TOKENIZER)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for the board-page tests (tests/browser.py)."""
    from browser import start_browser

    yield from start_browser()
