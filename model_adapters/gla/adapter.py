"""The GLA / Laplace adapter: an fla-format checkpoint folder behind the ModelAdapter protocol.

Registered as `gla` (`gla:/path/to/ckpt`; `laplace` is in embedded.py). Options: device (cpu | cuda |
xla | neuron), dtype (fp32 | bf16; the recurrent state is always fp32), chunk_size (128),
max_length (none unless given: a recurrent model has no context window), trained_length
(the longest sequence it was trained on, recorded so results beyond it can be marked;
default: the config's `trained_length`), prefill_segment (tokens per streamed prefill
step), compile (static-shape buckets through torch.compile on cpu / cuda; xla and neuron
always run the buckets as XLA graphs, see gla/xla.py), batch_buckets, length_buckets,
compile_backend, random_seed (random weights from this seed and the folder's config.json instead
of its checkpoint: the identity says random_weights, and publish refuses such a model),
state_off (a model with window_linear layers, a linearized twin, with its state switched off:
softmax over its sinks and window alone; the identity says so, so it is its own board row),
sparse (N: each twin layer also keeps the N tokens its state recalls worst exactly, LoLA's
bounded sparse cache, gla/sparse_cache.py; 0 is the twin as trained; the name gets
`-sparseN` and the identity `sparse`, so it is its own row).
A twin folder (gla/twin.py: a parent plus the tensors `evalkit linearize` trained) is
assembled from its parent, whose tokenizer it uses; its identity names the parent's hash.

A state is a `GLASequence`: the model state for one sequence plus the fp32 logits after its
last token, which `score` and `generate` need for the first new token. `state_bytes` counts
the model state only (per layer [H, d_k, d_v] and the conv tails), what a server must keep.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from evalkit.model_adapters.protocol import AdapterBase, greedy_generate, greedy_token
from evalkit.model_adapters.dtypes import dtype_name, parse_dtype
from evalkit.model_adapters.gla import xla
from evalkit.model_adapters.gla.buckets import BucketedRunner, BucketSpec
from evalkit.model_adapters.gla.checkpoint import load_checkpoint, random_model, weight_files
from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.device import resolve_device
from evalkit.model_adapters.facts import config_facts
from evalkit.model_adapters.gla.model import GLAState
from evalkit.model_adapters.gla.sparse_cache import set_sparse, sparse_bytes, sparse_error
from evalkit.model_adapters.gla.twin import is_twin, load_twin, parent_folder, twin_files
from evalkit.model_adapters.random_weights import init_std, weights_id
from evalkit.model_adapters.weights import weights_hash
from evalkit.model_adapters.models import register_model
from evalkit.model_adapters.state_kind import StateBytes
from evalkit.tokenization import load_tokenizer, tokenizer_hash


@dataclass
class GLASequence:
    state: GLAState             # batch of one
    last_logits: torch.Tensor   # [vocab] fp32, the prediction for the next token
    length: int                 # tokens consumed


class GLAAdapter(AdapterBase):

    def __init__(self, path: str, *, name: str | None = None, device: str = "cpu", dtype: str = "fp32",
                 chunk_size: int = 128, max_length: int | None = None, prefill_segment: int = 2048,
                 compile: bool | None = None, batch_buckets: Sequence[int] = (1, 2, 4, 8),
                 length_buckets: Sequence[int] | None = None, compile_backend: Any = None,
                 tokenizer: str | os.PathLike | None = None,
                 trained_length: int | None = None, random_seed: int | None = None,
                 state_off: bool = False, sparse: int = 0) -> None:
        self.path = Path(path).expanduser()
        self.device_name = device
        self.dtype = parse_dtype(dtype)
        if self.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"{name or path}: dtype must be fp32 or bf16, got {dtype!r}")
        dev = resolve_device(device, self.dtype, xla_ok=True)
        # random_seed: random weights from the folder's config.json (or a config file) instead
        # of its checkpoint: for measuring a model at size whose weights one does not have
        self.random_seed = random_seed
        self.twin: dict | None = None  # twin.json of a twin folder (gla/twin.py)
        if random_seed is not None:
            if isinstance(random_seed, bool) or not isinstance(random_seed, int) or random_seed < 0:
                raise ValueError(f"{name or path}: random_seed must be an integer >= 0, got "
                                 f"{random_seed!r}")
            config_json = self.path if self.path.is_file() else self.path / "config.json"
            if not config_json.is_file():
                raise FileNotFoundError(f"{name or path}: random_seed needs a config.json; "
                                        f"{config_json} does not exist")
            self.model, self.config = random_model(config_json, random_seed, device=dev,
                                                   dtype=self.dtype)
            if self.path.is_file():
                self.path = self.path.parent
        elif is_twin(self.path):  # assembled from its parent + the tensors trained for it
            config_json = self.path / "config.json"
            model, self.config, self.twin = load_twin(self.path)
            self.model = model.to(device=dev, dtype=self.dtype)
            tokenizer = tokenizer or parent_folder(self.twin["parent"]["model"])
        else:
            config_json = self.path / "config.json"
            self.model, self.config = load_checkpoint(self.path, device=dev, dtype=self.dtype)
        self.model.set_ops(mode="chunk", chunk_size=chunk_size)
        if not isinstance(state_off, bool):
            raise ValueError(f"{name or path}: state_off must be true or false, got {state_off!r}")
        self.state_off = state_off
        if state_off:  # the twin without its state: what the state adds is the gap to this
            if "window_linear" not in self.config.mixers:
                raise ValueError(f"{name or path}: state_off=true needs window_linear layers (a "
                                 f"linearized twin); this model has "
                                 f"{', '.join(sorted(set(self.config.mixers)))} layers")
            for mixer, block in zip(self.config.mixers, self.model.model.layers):
                if mixer == "window_linear":
                    block.attn.state_off = True
        err = sparse_error(sparse, self.config.mixers)
        if not err and sparse and state_off:
            err = (f"sparse={sparse} needs the state (its cache holds what the state recalls "
                   f"worst); state_off=true has none")
        if err:
            raise ValueError(f"{name or path}: {err}")
        self.sparse = sparse
        set_sparse(self.model, sparse)
        self.model.prefill_segment = prefill_segment
        self.chunk_size = chunk_size
        self.name = (name or f"gla:{self.path.name}") + (f"-sparse{sparse}" if sparse else "")
        self.tokenizer = load_tokenizer(tokenizer or self.path)
        if len(self.tokenizer) > self.config.vocab_size:
            raise ValueError(f"{self.name}: the tokenizer has {len(self.tokenizer)} tokens but the "
                             f"model's vocab_size is {self.config.vocab_size} ({config_json})")
        facts = config_facts(config_json)  # the lengths as describe reads them (facts.py)
        self.max_length = max_length if max_length is not None else facts.max_length
        self.trained_length = trained_length if trained_length is not None else facts.trained_length
        lazy = device in xla.KINDS  # XLA compiles every graph: always the bucketed shapes
        self.compiled = lazy if compile is None else bool(compile)
        if lazy and not self.compiled:
            raise ValueError(f"{self.name}: compile=false: device {device!r} runs compiled "
                             f"static shapes only")
        if lazy and compile_backend is not None:
            raise ValueError(f"{self.name}: compile_backend applies to cpu and cuda; device "
                             f"{device!r} compiles through XLA")
        lengths = tuple(length_buckets) if length_buckets else (chunk_size, 4 * chunk_size,
                                                                 16 * chunk_size)
        self.buckets = BucketSpec(tuple(batch_buckets), lengths)
        # What the state holds (recurrent, kv, hybrid, ...), from the config's layers.
        self.state_kind = self.config.state_kind
        # The bucketed runner batches padded rows; a KV cache cannot take padding, so models
        # with attention layers run eagerly, one sequence at a time.
        self.runner = None
        if set(self.config.mixers) == {"gla"}:
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            self.runner = BucketedRunner(self.model, self.buckets,
                                         compile=self.compiled and not lazy,
                                         backend=compile_backend or "inductor", pad_id=pad,
                                         device=device, sync=xla.sync if lazy else None)
        elif self.compiled:
            raise ValueError(f"{self.name}: compile / device {device!r} runs models of GLA layers "
                             f"only; this one has {', '.join(sorted(set(self.config.mixers)))} "
                             f"layers (use device cpu or cuda, compile false)")

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
        if self.runner is None:
            return [self._advance(None, ids) for ids in batch]
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
        current = [state.state]  # _step never mutates a state, so `state` stays as it was

        def step(tok: int) -> int:
            logits, current[0] = self._step(tok, current[0])
            return greedy_token(logits)

        eos = self.tokenizer.eos_token_id
        return greedy_generate(greedy_token(state.last_logits), step, decode=self.tokenizer.decode,
                               eos=() if eos is None else (eos,), max_new_tokens=max_new_tokens,
                               stop=stop)

    @torch.no_grad()
    def score(self, state: GLASequence, continuations: Sequence[Sequence[int]]) -> list[float]:
        """Summed log-probabilities; one continuation at a time so a score never depends on
        which other continuations share the call."""
        # on the host: indexing a device tensor by token id would trace a graph per id
        first = torch.log_softmax(state.last_logits.cpu().float(), -1)
        scores = []
        for cont in continuations:
            cont = [int(t) for t in cont]
            if not cont:
                scores.append(0.0)
                continue
            total = first[cont[0]].item()
            if len(cont) > 1 and self.device_name in xla.KINDS:
                # token by token through the cached decode graph, not a graph per length
                st = state.state
                for prev, nxt in zip(cont[:-1], cont[1:]):
                    logits, st = self._step(prev, st)
                    total += torch.log_softmax(logits.cpu().float(), -1)[nxt].item()
            elif len(cont) > 1:
                x = torch.tensor([cont[:-1]], device=self._dev)
                logits, _ = self.model.forward_state(x, state.state)    # [1, n-1, vocab]
                lp = torch.log_softmax(logits[0].float(), -1)
                total += lp.gather(-1, torch.tensor(cont[1:], device=self._dev)[:, None]).sum().item()
            scores.append(total)
        return scores

    def state_bytes(self, state: GLASequence) -> int:
        return state.state.nbytes()

    def state_parts(self, state: GLASequence) -> StateBytes:
        """`state_bytes` split into fixed / window / growing parts (evalkit.model_adapters.state_kind)."""
        return state.state.parts()

    def state_tensors(self, state: GLASequence) -> list[torch.Tensor]:
        """The tensors `state_bytes` counts: per layer S [1, H, d_k, d_v] and the conv tails."""
        return state.state.tensors()

    def state_bytes_at(self, n_tokens: int) -> int:
        """Analytic state size after n_tokens (fp32 state; a recurrent one never grows)."""
        return self.config.state_bytes(torch.float32, context=n_tokens) + \
            sparse_bytes(self.config, self.sparse, n_tokens)

    def identity(self) -> dict:
        return {"name": self.name, "kind": "gla", "state_kind": self.state_kind,
                **self._weights_identity(), "config_hash": self.config.config_hash(),
                "tokenizer_hash": tokenizer_hash(self.tokenizer), "dtype": dtype_name(self.dtype),
                "state_dtype": "fp32", "device": self.device_name, "backend":
                f"{self.device_name}-compiled" if self.compiled else f"{self.device_name}-eager",
                "chunk_size": self.chunk_size,
                # the exact window and sinks, where there are (what the distance plot marks)
                **({"window": self.config.window} if self.config.window is not None else {}),
                **({"sinks": self.config.sinks} if self.config.sinks else {}),
                **({"state_off": True} if self.state_off else {}),
                **({"sparse": self.sparse} if self.sparse else {}),
                **({"pjrt_device": xla.hardware()} if self.device_name in xla.KINDS else {})}

    def _weights_identity(self) -> dict:
        if self.twin is not None:
            return {"weights_hash": weights_hash(twin_files(self.path)),
                    "parent": self.twin["parent"]["model"],
                    "parent_hash": self.twin["parent"]["hash"]}
        if self.random_seed is None:
            return {"weights_hash": weights_hash(weight_files(self.path))}
        return {"weights_hash": weights_id(init_std(self.config), self.random_seed),
                "random_weights": True}

    def num_parameters(self) -> int:
        return self.model.num_parameters()


def describe_config(config: Path, state_dtype: str, n_tokens: int = 1) -> dict:
    """`evalkit models` figures of a GLA config, without weights: the lengths as a loaded
    adapter reads them from the same file."""
    facts = config_facts(config)
    return {"parameters": facts.parameters(),
            "state_bytes": facts.state_at(n_tokens, state_dtype).total,
            "dtype": dtype_name(state_dtype), "max_length": facts.max_length,
            "trained_length": facts.trained_length}


def shipped_gla(name: str, folder: Path, marker: str, build: str, module: str):
    """(factory, describe) for a GLA folder that ships in the repository once built here (the
    MQAR twins, SmolLM2's linearized twins): `marker` is the file whose presence means built.
    Until then loading fails naming the `build` command, and `evalkit models` notes it."""
    def make(path: str | None = None, **options: Any) -> GLAAdapter:
        if path:
            raise ValueError(f"{name} is an embedded model and takes no path")
        if not (folder / marker).is_file():
            raise FileNotFoundError(f"{name}: {folder} is not built yet; build it with `{build}`")
        options.setdefault("name", name)
        return GLAAdapter(str(folder), **options)
    make.__module__ = module  # the registry records the declaring module

    def describe(n_tokens: int) -> dict:
        if not (folder / marker).is_file():
            return {"note": f"not built yet: {build}"}
        return describe_config(folder / "config.json", "fp32", n_tokens=n_tokens)
    return make, describe


def _load(name: str, path: str | None, options: dict) -> GLAAdapter:
    if not path:
        raise ValueError(f"{name}: needs a checkpoint folder, e.g. '{name}:/ckpt/gla-340m' "
                         f"(config.json + model.safetensors + tokenizer files)")
    options.setdefault("name", f"{name}:{Path(path).expanduser().name}")
    return GLAAdapter(path, **options)


@register_model("gla", kind="gla", state_kind="measured", options=GLAAdapter,
                description="fla-format GLA checkpoint (gla:PATH)")
def load_gla(path: str | None, **options: Any) -> GLAAdapter:
    return _load("gla", path, options)


