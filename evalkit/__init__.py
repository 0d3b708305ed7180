"""evalkit: measure what a fixed-state recurrent language model forgets."""
from __future__ import annotations

__version__ = "0.1.0"

from evalkit.model_adapters.protocol import ModelAdapter
from evalkit.model_adapters.models import load_model
from evalkit.probe import Probe, ProbeMeta, Question, Segment
from evalkit.result import SampleResult

__all__ = ["ModelAdapter", "Probe", "ProbeMeta", "Question", "SampleResult", "Segment",
           "__version__", "load_model"]
