"""Published results drawn beside ours, on the same axes and labelled as theirs.

A curve is a paper's figure for a model we do not run, attached to the task of ours that asks
the same thing, and drawn only where the board holds the models it speaks to (`applies`): the
linearized-twin curves beside linearized twins (an identity with a `parent`). The numbers are
copied from the paper's table as `checked` says; they are context lengths in their models'
tokens (not ours), with their training and scale, so a reader compares shapes, not points.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class PublishedCurve:
    source: str                  # who, where: "Haller et al. 2025 (arXiv 2504.14366)"
    model: str                   # their model, as they name it
    task: str                    # our task that asks the same thing
    lengths: tuple[int, ...]     # their context lengths (their tokens)
    recall: tuple[float, ...]    # their accuracy at each length, as a fraction
    checked: str                 # where the numbers were read, and whether re-checked
    applies: Callable[[Mapping[str, Any]], bool]  # a model identity on the board it speaks to

    def __post_init__(self) -> None:
        if len(self.lengths) != len(self.recall) or not self.lengths:
            raise ValueError(f"{self.source} {self.model}: one recall per length")
        if not all(0.0 <= r <= 1.0 for r in self.recall):
            raise ValueError(f"{self.source} {self.model}: recall is a fraction in [0, 1]")

    @property
    def label(self) -> str:
        return f"theirs: {self.model}, {self.source}"


def _linearized(identity: Mapping[str, Any]) -> bool:
    return bool(identity.get("parent"))


# Haller, Golde, Akbik, "What Matters in Linearizing Language Models?" (arXiv 2504.14366):
# single-needle accuracy of linearized models at 512 / 1K / 2K / 4K tokens. Only the gated
# delta rule keeps retrieval; the additive GLA state saturates.
_HALLER = "Haller et al. 2025 (arXiv 2504.14366)"
_HALLER_CHECKED = ("as quoted in issue 40 from the paper's single-needle table, not re-read "
                   "here: no network, and the stored copy of the paper gives its abstract only")
CURVES: tuple[PublishedCurve, ...] = (
    PublishedCurve(_HALLER, "Gated DeltaNet (linearized)", "needle", (512, 1024, 2048, 4096),
                   (0.994, 0.978, 0.818, 0.298), _HALLER_CHECKED, _linearized),
    PublishedCurve(_HALLER, "GLA (linearized)", "needle", (512, 1024, 2048, 4096),
                   (0.106, 0.010, 0.0, 0.0), _HALLER_CHECKED, _linearized),
)


def curves_for(task: str, identities: Mapping[str, Mapping[str, Any]],
               models: set[str] | None = None) -> list[PublishedCurve]:
    """The published curves of `task` that speak to a model on the board (all of `identities`,
    or only `models` among them)."""
    ids = [i for m, i in identities.items() if models is None or m in models]
    return [c for c in CURVES if c.task == task and any(c.applies(i) for i in ids)]
