"""Which model a run holds: its hash (identity, options and the files it was built from, by
content), one model never listed twice, and a resumed run's model the one it started with."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from evalkit.probe import canonical_json
from evalkit.runner import provenance
from evalkit.runner.suite import ResolvedModel, ResolvedSuite, SuiteError
from evalkit.scoring import FORCED_CHOICE


def model_hash(spec: str, identity: dict, options: dict) -> str:
    """A model's hash: its identity, its options and the files it was built from by content
    (the identity holds the weights' hash, not the checkpoint's config.json, which changes the
    scores with the same weights): a NAME:PATH or path spec's folder, a registered model's
    config. Never a location: a served URL names no file, and a folder in two clones is one."""
    from evalkit.model_adapters.models import resolve_spec

    info, where = resolve_spec(spec)
    files = {k: c for k, c in (("checkpoint", provenance.path_content(where)),
                               ("config", provenance.path_content(info.config))) if c is not None}
    return provenance.identity_hash(identity, options, files)


def check_distinct_models(resolved: ResolvedSuite) -> None:
    """One model listed under two names would make two indistinguishable result sets."""
    seen: dict[str, str] = {}
    for m in resolved.models:
        key = canonical_json([m.spec, provenance.jsonable(m.options)])
        if seen.setdefault(key, m.name) != m.name:
            raise SuiteError(f"{resolved.source}: models {seen[key]!r} and {m.name!r} are the "
                             f"same model (spec {m.spec!r} with the same options); list it once")


def check_same_as_before(earlier_models: dict, path: Path, m: ResolvedModel, identity: dict,
                         mhash: str) -> None:
    """A resumed run's model must be the one it started with (`earlier_models`: the models as
    they loaded before): other weights or another served model would mix two models' samples."""
    before = earlier_models.get(m.name)
    if not isinstance(before, dict) or before.get("hash") in (None, mhash):
        return
    skip = {"hash", "spec", "options", "state_kind", "max_length", "trained_length",
            "published", FORCED_CHOICE}  # the entry's metric switch: scoring, not model
    fields = sorted(k for k in (set(identity) | set(before)) - skip
                    if identity.get(k) != before.get(k))
    shown = "; ".join(f"{k}: {_short(before.get(k))} -> {_short(identity.get(k))}"
                      for k in fields[:4]) or (
        "the content of a file or folder it was built from: its config.json, or a folder "
        "an option names, was edited, or the run was started by an evalkit that hashed "
        "models otherwise")
    raise SuiteError(f"cannot resume {path}: model {m.name!r} ({m.spec}) is not the "
                     f"model this run started with ({shown}); its finished samples would "
                     f"mix two models. Start a new run (another --output) for this one")


def _short(v: Any) -> str:
    text = canonical_json(v) if not isinstance(v, str) else v
    return text if len(text) <= 40 else text[:37] + "..."
