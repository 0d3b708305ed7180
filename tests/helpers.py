"""Shared test helpers (plain functions; fixtures live in conftest.py)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY_TOKENIZER = REPO / "model_adapters" / "tiny" / "tokenizer"
