"""The GLA / Laplace adapter: an fla-format checkpoint folder behind the ModelAdapter protocol.

Registered as `gla` and `laplace` (`gla:/path/to/ckpt`). Options: device (cpu | cuda |
neuron), dtype (fp32 | bf16; the recurrent state is always fp32), chunk_size (128),
max_length (none unless given: a recurrent model has no context window), trained_length
(the longest sequence it was trained on, recorded so results beyond it can be marked;
default: the config's `trained_length`), prefill_segment (tokens per streamed prefill
step), compile (static-shape buckets through torch.compile; forced on for neuron),
batch_buckets, length_buckets, compile_backend.

A state is a `GLASequence`: the model state for one sequence plus the fp32 logits after its
last token, which `score` and `generate` need for the first new token. `state_bytes` counts
the model state only (per layer [H, d_k, d_v] and the conv tails), what a server must keep.
"""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from evalkit.adapter import cut_at_stop
from evalkit.model_adapters.gla.buckets import BucketedRunner, BucketSpec
from evalkit.model_adapters.gla.checkpoint import load_checkpoint, weights_sha256
from evalkit.model_adapters.gla.config import dtype_name, parse_dtype
from evalkit.model_adapters.gla.model import GLAState
from evalkit.models import MODEL_INFO, MODELS
from evalkit.tokenization import load_tokenizer, tokenizer_hash

LAPLACE_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "models" / "laplace-3b.json"
_MAX_LENGTH_KEYS = ("evalkit_max_length",)


@dataclass
class GLASequence:
    state: GLAState             # batch of one
    last_logits: torch.Tensor   # [vocab] fp32, the prediction for the next token
    length: int                 # tokens consumed


def _resolve_device(device: str) -> torch.device:
    if device == "neuron":
        try:
            import torch_neuronx  # noqa: F401  (registers the "neuron" device)
        except ImportError as e:
            raise RuntimeError("device 'neuron' needs torch-neuronx (the AWS Neuron SDK), which is "
                               "not installed here") from e
        return torch.device("neuron")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} requested but CUDA is not available")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"device must be cpu, cuda or neuron, got {device!r}")
    return torch.device(device)


class GLAAdapter:
    state_kind = "recurrent"

    def __init__(self, path: str, *, name: str | None = None, device: str = "cpu", dtype: str = "fp32",
                 chunk_size: int = 128, max_length: int | None = None, prefill_segment: int = 2048,
                 compile: bool | None = None, batch_buckets: Sequence[int] = (1, 2, 4, 8),
                 length_buckets: Sequence[int] | None = None, compile_backend: Any = None,
                 tokenizer: str | None = None, trained_length: int | None = None) -> None:
        self.path = Path(path).expanduser()
        self.device_name = device
        self.dtype = parse_dtype(dtype)
        if self.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"{name or path}: dtype must be fp32 or bf16, got {dtype!r}")
        dev = _resolve_device(device)
        self.model, self.config = load_checkpoint(self.path, device=dev, dtype=self.dtype)
        self.model.set_ops(mode="chunk", chunk_size=chunk_size)
        self.model.prefill_segment = prefill_segment
        self.chunk_size = chunk_size
        self.name = name or f"gla:{self.path.name}"
        self.tokenizer = load_tokenizer(tokenizer or self.path)
        if len(self.tokenizer) > self.config.vocab_size:
            raise ValueError(f"{self.name}: the tokenizer has {len(self.tokenizer)} tokens but the "
                             f"model's vocab_size is {self.config.vocab_size} ({self.path / 'config.json'})")
        self.max_length = (max_length if max_length is not None
                           else self._config_int(_MAX_LENGTH_KEYS))
        self.trained_length = (trained_length if trained_length is not None
                               else self._config_int(("trained_length",)))
        self.compiled = (device == "neuron") if compile is None else bool(compile)
        if device == "neuron" and not self.compiled:
            raise ValueError(f"{self.name}: the neuron backend runs compiled, static shapes only")
        lengths = tuple(length_buckets) if length_buckets else (chunk_size, 4 * chunk_size,
                                                                 16 * chunk_size)
        self.buckets = BucketSpec(tuple(batch_buckets), lengths)
        backend = compile_backend or ("neuron" if device == "neuron" else "inductor")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.runner = BucketedRunner(self.model, self.buckets, compile=self.compiled, backend=backend,
                                     pad_id=pad, device=device)
        self._weights_hash: str | None = None

    def _config_int(self, keys: Sequence[str]) -> int | None:
        raw = json.loads((self.path / "config.json").read_text())
        for key in keys:
            if raw.get(key) is not None:
                return int(raw[key])
        return None  # max_position_embeddings is a default in every fla config, not a trained length

    @property
    def _dev(self) -> torch.device:
        return self.model.lm_head.weight.device

    # -- protocol -------------------------------------------------------------------------
    def prefill(self, token_ids: Sequence[int]) -> GLASequence:
        if len(token_ids) == 0:
            raise ValueError(f"{self.name}: prefill needs at least one token (got an empty prompt)")
        return self._advance(None, token_ids)

    def extend(self, state: GLASequence, token_ids: Sequence[int]) -> GLASequence:
        if len(token_ids) == 0:
            return state
        return self._advance(state, token_ids)

    def _advance(self, seq: GLASequence | None, ids: Sequence[int]) -> GLASequence:
        """Stream `ids` through the model after `seq` (never mutating it)."""
        if self.compiled:
            prev = (seq.state, seq.last_logits) if seq is not None else (None, None)
            [(logits, state)] = self.runner.run([(prev[0], prev[1], list(ids))])
        else:
            x = torch.as_tensor([list(ids)], dtype=torch.long, device=self._dev)
            last, state = self.model.prefill(x, seq.state if seq is not None else None)
            logits = last[0]
        return GLASequence(state, logits, (seq.length if seq is not None else 0) + len(ids))

    def prefill_batch(self, batch: Sequence[Sequence[int]]) -> list[GLASequence]:
        """Prefill several prompts together at bucketed shapes; each row's result equals its
        own prefill (padding never reaches real rows, see buckets.py)."""
        for i, ids in enumerate(batch):
            if len(ids) == 0:
                raise ValueError(f"{self.name}: prompt {i} of the batch is empty")
        res = self.runner.run([(None, None, list(ids)) for ids in batch])
        return [GLASequence(s, lg, len(ids)) for (lg, s), ids in zip(res, batch)]

    def fork(self, state: GLASequence) -> GLASequence:
        return GLASequence(state.state.clone(), state.last_logits.clone(), state.length)

    @torch.no_grad()
    def _step(self, token: int, state: GLAState) -> tuple[torch.Tensor, GLAState]:
        if self.compiled:
            [(logits, new)] = self.runner.decode([token], [state])
            return logits, new
        logits, new = self.model.decode_step(torch.tensor([token], device=self._dev), state)
        return logits[0], new

    def generate(self, state: GLASequence, max_new_tokens: int,
                 stop: Sequence[str] | None = None) -> str:
        eos = self.tokenizer.eos_token_id
        logits, st, out = state.last_logits, state.state, []  # decode_step never mutates st
        for i in range(max_new_tokens):
            tok = int(logits.argmax())
            if tok == eos:
                break
            out.append(tok)
            if stop:
                text, stopped = cut_at_stop(self.tokenizer.decode(out), stop)
                if stopped:
                    return text
            if i + 1 < max_new_tokens:
                logits, st = self._step(tok, st)
        return cut_at_stop(self.tokenizer.decode(out), stop)[0]

    @torch.no_grad()
    def score(self, state: GLASequence, continuations: Sequence[Sequence[int]]) -> list[float]:
        """Summed log-probabilities; one continuation at a time so a score never depends on
        which other continuations share the call."""
        first = torch.log_softmax(state.last_logits.float(), -1)
        scores = []
        for cont in continuations:
            cont = [int(t) for t in cont]
            if not cont:
                scores.append(0.0)
                continue
            total = first[cont[0]].item()
            if len(cont) > 1:
                x = torch.tensor([cont[:-1]], device=self._dev)
                logits, _ = self.model.forward_state(x, state.state)    # [1, n-1, vocab]
                lp = torch.log_softmax(logits[0].float(), -1)
                total += lp.gather(-1, torch.tensor(cont[1:], device=self._dev)[:, None]).sum().item()
            scores.append(total)
        return scores

    def state_bytes(self, state: GLASequence) -> int:
        return state.state.nbytes()

    def state_tensors(self, state: GLASequence) -> list[torch.Tensor]:
        """The tensors `state_bytes` counts: per layer S [1, H, d_k, d_v] and the conv tails."""
        return state.state.tensors()

    def state_bytes_at(self, n_tokens: int) -> int:
        """Analytic state size after n_tokens (the same for every length; fp32 state)."""
        return self.config.state_bytes(torch.float32)

    def identity(self) -> dict:
        if self._weights_hash is None:
            self._weights_hash = weights_sha256(self.path)
        return {"name": self.name, "kind": "gla", "state_kind": self.state_kind,
                "weights_hash": self._weights_hash, "config_hash": self.config.config_hash(),
                "tokenizer_hash": tokenizer_hash(self.tokenizer), "dtype": dtype_name(self.dtype),
                "state_dtype": "fp32", "device": self.device_name, "backend":
                f"{self.device_name}-compiled" if self.compiled else f"{self.device_name}-eager",
                "chunk_size": self.chunk_size}

    def num_parameters(self) -> int:
        return self.model.num_parameters()


def _factory(name: str, config_path: Path | None = None):
    def make(path: str | None, **options: Any) -> GLAAdapter:
        if not path:
            raise ValueError(f"{name}: needs a checkpoint folder, e.g. '{name}:/ckpt/gla-340m' "
                             f"(config.json + model.safetensors + tokenizer files)")
        known = set(inspect.signature(GLAAdapter.__init__).parameters) - {"self", "path"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"{name}: unknown options {unknown} (expected {', '.join(sorted(known))})")
        options.setdefault("name", f"{name}:{Path(path).expanduser().name}")
        return GLAAdapter(path, **options)
    make.config_path = config_path  # what `evalkit state NAME` reads without weights
    return make


MODELS.add("gla", _factory("gla"), origin=__name__)
MODELS.add("laplace", _factory("laplace", LAPLACE_CONFIG), origin=__name__)
MODEL_INFO["gla"] = {"kind": "gla", "state_kind": "recurrent",
                     "description": "fla-format GLA checkpoint (gla:PATH)"}
MODEL_INFO["laplace"] = {"kind": "gla", "state_kind": "recurrent", "path": str(LAPLACE_CONFIG),
                         "description": "Laplace 3B GLA reconstruction (laplace:PATH for weights)"}
