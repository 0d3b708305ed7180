"""The leaderboard: `evalkit publish RUN_DIR... --to leaderboard/`.

load (run folders) -> merge (newest run per cell) -> tables / derived metrics -> plots,
README, CSV/JSON -> atomic swap into the target folder (publish).
"""
from __future__ import annotations

from evalkit.leaderboard.board import Options
from evalkit.leaderboard.publish import publish

__all__ = ["Options", "publish"]
