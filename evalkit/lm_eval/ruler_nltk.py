"""lm-eval's RULER code imported without nltk's download attempt and its false report.

Every RULER task's YAML includes niah_single_1.yaml, whose custom_dataset lives in
tasks/ruler/niah_utils.py, so building any RULER task imports tasks/ruler/prepare_niah.py. At
import (lm-eval 0.4.13) that module calls nltk.download("punkt_tab") when NLTK's punkt_tab is
not installed, then prints "Downloaded punkt_tab on rank 0" whether or not anything came.
punkt_tab serves only sent_tokenize on the essay haystack (prepare_niah.generate_input_output
with type_haystack="essay"), and the essay tasks are refused when it is missing
(evalkit.lm_eval.offline). So the module is imported once with the download refused (no
network attempt) and that one line dropped; everything else it prints passes through.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import sys

MODULE = "lm_eval.tasks.ruler.prepare_niah"
FALSE_REPORT = "Downloaded punkt_tab on rank 0"


def import_prepare_niah() -> None:
    """Import RULER's prepare_niah (idempotent); the caller must be about to build RULER."""
    if MODULE in sys.modules:
        return
    import nltk

    asked: list = []
    real = nltk.download

    def refuse(*args, **kwargs) -> bool:  # evalkit downloads nothing at run time
        asked.append(args)
        return False

    out = io.StringIO()
    nltk.download = refuse
    try:
        with contextlib.redirect_stdout(out):
            importlib.import_module(MODULE)
    finally:
        nltk.download = real
        text = out.getvalue()
        if asked:  # the report follows our refused download: it is false
            text = text.replace(FALSE_REPORT + "\n", "", 1)
        sys.stdout.write(text)
