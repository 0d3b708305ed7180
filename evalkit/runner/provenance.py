"""Provenance: everything needed to tell whether two runs are comparable and to redo one.

Recorded: evalkit version and `evalkit_code`, the hash of its source (code_hash: what the
sample cache and lm-eval's stored pairs are keyed on, so results of other code are never
reused); `user_code`, the content hashes of the user's modules the run ran (plugins, task
generators, what they imported: evalkit.user_modules, also in the sample cache's key); git commit and dirty flag of the evalkit checkout (when it is one);
the config hash; each model's identity (weights hash, dtype, backend ... as the adapter reports
it) with its hash and tokenizer hash; each task's version, config hash and source file; package
versions; seeds; python and platform; the CPU (its model, the instruction set torch's kernels
dispatch to, the core count: two machines with the same code and packages can differ in the last
bits of a log-probability, and the kernel string alone does not say which CPU ran); start and
finish timestamps. Nothing here varies between an interrupted-and-resumed run and an
uninterrupted one on the same machine except the timestamps.
"""
from __future__ import annotations

import hashlib
import math
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from evalkit import __version__
from evalkit.code_version import code_hash
from evalkit.user_modules import code_of
from evalkit.probe import canonical_json

PACKAGES = ("torch", "transformers", "tokenizers", "lm_eval", "datasets", "safetensors",
            "numpy", "pydantic", "flash-linear-attention", "fla-core", "gguf", "accelerate")


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_facts() -> dict[str, Any]:
    """The CPU that computed: model name, torch's dispatch level (e.g. AVX512, AVX2), cores."""
    import torch  # every run that records provenance has loaded it already

    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"model": model or platform.processor() or platform.machine(),
            "torch_capability": torch.backends.cpu.get_cpu_capability(),
            "cores": os.cpu_count()}


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_state(path: Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the checkout holding evalkit's source (None outside one)."""
    path = path or Path(__file__).resolve().parents[2]
    commit = _git(["rev-parse", "HEAD"], path)
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git(["status", "--porcelain"], path)
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def code_key(owners: list[str]) -> dict[str, Any]:
    """Every code a sample's score depends on, for the sample cache's key: evalkit's source,
    the user's modules the run's `owners` (its plugins, task generators and model factory)
    are or imported, by content (evalkit.user_modules), and the versions of the packages that
    compute (torch, transformers, ...). Asked after the model loads: a plugin may import more
    as it builds its model."""
    return {"evalkit": code_hash(), "user": code_of(owners), "packages": package_versions()}


def identity_hash(identity: dict, options: dict | None = None,
                  files: dict | None = None) -> str:
    """Hash of what makes a model's results distinct: its identity plus the load options, an
    option that names a file or folder keyed by what it holds (option_content), never by
    where it lies: the same tokenizer folder in two clones (or two users' caches) is one model,
    and a folder edited in place is another. `files`: the content of the files the model was
    built from beyond its weights (path_content of its checkpoint folder and config.json: an
    edited config.json changes the scores with the same weights)."""
    doc = {"identity": identity, "options": option_content(jsonable(options or {})),
           **({"files": files} if files else {})}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


def path_content(value: Any) -> dict | None:
    """The content of the file or folder `value` names (option_content's form), or None when
    it names none (a URL, a registered name): a location never enters a hash."""
    if value is None:
        return None
    content = option_content(str(value) if os.sep in str(value) else f".{os.sep}{value}")
    return content if isinstance(content, dict) else None


def option_content(value: Any) -> Any:
    """`value` with every string that names an existing file or folder (it holds a path
    separator, or starts with ~) replaced by its content: a file by its sha256, a folder by
    {file name: sha256} of the regular files in it (not below it: a model folder keeps its
    files at its top). Hashes are evalkit.model_adapters.weights.file_sha256's, remembered
    on disk, so a large file is read once."""
    if isinstance(value, dict):
        return {k: option_content(v) for k, v in value.items()}
    if isinstance(value, list):
        return [option_content(v) for v in value]
    if not isinstance(value, str) or not ("/" in value or os.sep in value or
                                          value.startswith("~")):
        return value
    from evalkit.model_adapters.weights import file_sha256

    path = Path(value).expanduser()
    if path.is_file():
        return {"file_sha256": file_sha256(path)}
    if path.is_dir():
        return {"folder": {f.name: file_sha256(f) for f in sorted(path.iterdir()) if f.is_file()}}
    return value  # not there: the adapter's own error names it


def jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)  # "nan", "inf": recorded, but never as a bare non-JSON number
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def collect(*, config_hash: str, seed: int, models: dict, tasks: dict, started: str,
            finished: str | None = None, resumed: list[str] | None = None,
            user_code: list[str] | None = None) -> dict[str, Any]:
    return {
        "evalkit_version": __version__,
        "evalkit_code": code_hash(),
        "user_code": user_code or [],
        "git": git_state(),
        "config_hash": config_hash,
        "models": models,
        "tokenizers": {name: m.get("tokenizer_hash") for name, m in models.items()},
        "tasks": tasks,
        "packages": package_versions(),
        "seeds": {"seed": seed, "torch_manual_seed": seed,
                  "probe_seed": "sha256(task, version, seed, length, depth, load, index)"},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_facts(),
        "started": started,
        "finished": finished,
        "resumed": resumed or [],
    }
