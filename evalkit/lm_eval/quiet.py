"""What lm-eval prints that an evalkit command does not want: progress bars under
--no-progress, and git's error when lm-eval asks for a commit outside a checkout.

- `no_bars(on)`: every tqdm bar made meanwhile is disabled (lm-eval's request building, the
  bridge's, RULER's document generators, the datasets library's). They all are tqdm.std.tqdm
  or its subclasses, bound by name at their import, so the class's __init__ is wrapped for
  the duration and restored after.
- `quiet_git()`: lm-eval 0.4.13 records `git describe --always` of the working directory in
  its results (evaluator.simple_evaluate -> loggers.utils.get_git_commit_hash) without
  silencing git, so outside a git checkout git printed "fatal: not a git repository".
  Meanwhile that function runs git with its error output dropped; the result is what lm-eval
  would have recorded (the hash, or its own fallback when git fails).
- `metadata_given()`: lm-eval 0.4.13 warns "Custom kwargs can be passed to `--metadata`" each
  time a task with a generated dataset (RULER's) loads, whatever metadata it was given.
  evalkit always gives it (the tokenizer, and the suite's lengths as max_seq_lengths), so
  meanwhile that one warning is dropped from lm_eval.api.task's logger; every other stays.
"""
from __future__ import annotations

import contextlib
import logging
import subprocess
from typing import Any, Iterator


@contextlib.contextmanager
def no_bars(on: bool = True) -> Iterator[None]:
    if not on:
        yield
        return
    from tqdm import std

    init = std.tqdm.__init__

    def disabled(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = True
        init(self, *args, **kwargs)

    std.tqdm.__init__ = disabled
    try:
        yield
    finally:
        std.tqdm.__init__ = init


def git_commit_hash() -> str | None:
    """lm-eval's get_git_commit_hash, with git's error output dropped."""
    from lm_eval.loggers.utils import get_commit_from_path
    import os

    try:
        out = subprocess.check_output(["git", "describe", "--always"],  # noqa: S607
                                      stderr=subprocess.DEVNULL)
        return out.strip().decode()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return get_commit_from_path(os.getcwd())


@contextlib.contextmanager
def quiet_git() -> Iterator[None]:
    import lm_eval.evaluator as evaluator

    original = evaluator.get_git_commit_hash
    evaluator.get_git_commit_hash = git_commit_hash
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = original


class _DropMetadataAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Custom kwargs can be passed to `--metadata`" not in record.getMessage()


@contextlib.contextmanager
def metadata_given() -> Iterator[None]:
    logger, drop = logging.getLogger("lm_eval.api.task"), _DropMetadataAdvice()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)
