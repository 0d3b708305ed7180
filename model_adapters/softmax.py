"""Softmax-attention adapter: any local Hugging Face causal LM folder or .gguf file, KV cache as state.

Registered as the path loader "hf" (`load_model("hf:/path/to/folder")`, or a bare path whose
config is not GLA). Local files only; `trust_remote_code` stays off unless the caller passes it;
folders load from safetensors only. GGUF files go through transformers' GGUF loader (dequantised
on every load: slow; see `evalkit.model_adapters.embedded` for convert-once caching).

State: a transformers `DynamicCache` (the KV cache), the absolute length, and the next-token
logits. `state_bytes` is the measured size of the cache tensors; the logits are not counted
(the memory of the past is the cache).

Memory-matched baseline ("KV budget" semantics)
-----------------------------------------------
`window=W` (or `kv_budget_bytes=B`, giving W = floor(B / KV bytes per token), or
`match_state_of=NAME`, giving B = that model's state bytes) limits the state to
the KV of at most W tokens: after every forward chunk the oldest entries are evicted, so the
cache never holds more than W tokens between calls. A new token at absolute position t attends
to the retained tokens and itself: keys at positions max(0, t - W) .. t (W + 1 keys), plus the
first `sink` positions if `sink > 0`, in which case those sinks count against the budget and
the recent part shrinks to W - sink (StreamingLLM; default sink=0, i.e. a plain sliding
window). The same mask is applied inside each prefill chunk, so the attention pattern does not
depend on how a sequence is split into prefill/extend calls, and a long context with a small W
really forgets: per layer, tokens older than the window are invisible (information can still
travel up to n_layers * W tokens through the layers, as in any sliding-window model). Position
ids keep growing, so RoPE positions stay absolute. Window mode needs a model whose layers are
all full attention, with the sdpa or eager attention implementation (a custom 4-D mask is used).

Length limit: the model never processes a token at a position >= max_length (default: the
config's max_position_embeddings); a prompt, extension, scored continuation or generation that
would need one raises instead of being cut.
"""
from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from evalkit.adapter import cut_at_stop
from evalkit.models import MODEL_INFO, MODELS

DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def evalkit_cache_dir() -> Path:
    """`$EVALKIT_CACHE`, else ~/.cache/evalkit (converted weights, file hashes)."""
    return Path(os.environ.get("EVALKIT_CACHE") or "~/.cache/evalkit").expanduser()


def resolve_dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"dtype {dtype}: expected one of {sorted(set(_DTYPE_NAMES.values()))}")
        return dtype
    key = str(dtype).lower()
    if key not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
    return DTYPES[key]


# ---------------------------------------------------------------- file hashing (cached on disk)

_hash_lock = threading.Lock()
_hash_memo: dict[str, str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file, computed once per (path, size, mtime) and remembered in the cache dir."""
    p = Path(path).resolve()
    st = p.stat()
    key = f"{p}|{st.st_size}|{st.st_mtime_ns}"
    with _hash_lock:
        if key in _hash_memo:
            return _hash_memo[key]
    store = evalkit_cache_dir() / "sha256-cache.json"
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    digest = known.get(key)
    if digest is None:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        digest = h.hexdigest()
        known[key] = digest
        try:  # best effort: a read-only cache dir only costs a re-hash next time
            store.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=store.parent, prefix=".sha256-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(known, f, indent=0, sort_keys=True)
            os.replace(tmp, store)
        except OSError:
            pass
    with _hash_lock:
        _hash_memo[key] = digest
    return digest


# ---------------------------------------------------------------- cache helpers

def _cache_classes():
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
    return DynamicLayer, DynamicSlidingWindowLayer


def _layer_tensors(layer: Any) -> list[torch.Tensor]:
    """The state tensors of one cache layer (public tensor attributes; `_x` are bookkeeping)."""
    out: list[torch.Tensor] = []
    for name, val in vars(layer).items():
        if name.startswith("_"):
            continue
        if isinstance(val, torch.Tensor):
            out.append(val)
        elif isinstance(val, (list, tuple)):
            out.extend(v for v in val if isinstance(v, torch.Tensor))
    return out


def _copy_cache(cache: Any, clone: bool) -> Any:
    """Copy a cache. clone=False shares tensors: safe only for layers whose update builds new
    tensors (torch.cat) instead of writing in place -- the dynamic layers checked by the caller."""
    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        l2 = copy.copy(layer)
        for name, val in vars(layer).items():
            if isinstance(val, torch.Tensor) and clone and not name.startswith("_"):
                setattr(l2, name, val.clone())
            elif isinstance(val, list):
                setattr(l2, name, [v.clone() if clone and isinstance(v, torch.Tensor) else v
                                   for v in val])
        new.layers.append(l2)
    return new


@dataclass
class KVState:
    """A softmax model's state: the KV cache, tokens seen so far, next-token logits (fp32)."""

    cache: Any
    length: int
    logits: torch.Tensor


@dataclass(frozen=True)
class KVProfile:
    """Per-layer KV growth: bytes(n) = sum(const + per_token * min(n, cap or n))."""

    per_token: tuple[int, ...]
    const: tuple[int, ...]
    cap: tuple[int | None, ...]

    @property
    def bytes_per_token(self) -> int:
        return sum(self.per_token)

    def bytes_at(self, n_tokens: int) -> int:
        return sum(c + p * (n_tokens if cap is None else min(n_tokens, cap))
                   for p, c, cap in zip(self.per_token, self.const, self.cap))


def kv_profile(model: Any, *, window: int | None = None) -> KVProfile:
    """Measure KV bytes per layer after 1 and 2 tokens (works on meta-device models too)."""
    from transformers import DynamicCache

    _, sliding_cls = _cache_classes()
    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    sizes = []
    with torch.inference_mode():
        for pos in range(2):
            model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device),
                  position_ids=torch.tensor([[pos]], device=device),
                  **{_cache_kwarg(model): cache}, use_cache=True)
            sizes.append([sum(t.nbytes for t in _layer_tensors(layer)) for layer in cache.layers])
    per_token = tuple(b - a for a, b in zip(*sizes))
    const = tuple(a - p for a, p in zip(sizes[0], per_token))
    caps = []
    for layer in cache.layers:
        if isinstance(layer, sliding_cls):
            caps.append(layer.sliding_window - 1)  # what DynamicSlidingWindowLayer retains
        else:
            caps.append(window)
    return KVProfile(per_token, const, tuple(caps))


def _cache_kwarg(model: Any) -> str:
    # transformers 5.x renamed `past_key_values` to `cache`; remote-code models may still use the old name
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def matched_window(state_bytes: int, bytes_per_token: int) -> int:
    """Largest window W whose KV bytes (W * bytes_per_token) do not exceed `state_bytes`."""
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token must be positive, got {bytes_per_token}")
    w = int(state_bytes) // int(bytes_per_token)
    if w < 1:
        raise ValueError(f"kv_budget_bytes={state_bytes} is less than one token's KV "
                         f"({bytes_per_token} bytes); no window fits")
    return w


def _max_length_from_config(config: Any) -> int | None:
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    for field in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(cfg, field, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _split_path(path: str | os.PathLike) -> tuple[Path, str | None]:
    """(folder, gguf file name or None); raises when neither a .gguf file nor a model folder."""
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return p.parent, p.name
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"model folder {p}: no config.json (expected a Hugging Face "
                                    f"model folder or a .gguf file)")
        return p, None
    if p.exists():
        raise ValueError(f"model path {p}: expected a folder with config.json or a .gguf file")
    raise FileNotFoundError(f"model path {p} does not exist")


def describe_checkpoint(path: str | os.PathLike, *, dtype: Any = "fp32", window: int | None = None,
                        n_tokens: int = 8192, trust_remote_code: bool = False) -> dict:
    """Parameters and KV bytes at `n_tokens` from the config alone (a meta-device model: no weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder, gguf = _split_path(path)
    kw = {"gguf_file": gguf} if gguf else {}
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True,
                                        trust_remote_code=trust_remote_code, **kw)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # GGUF configs carry it; the meta model is dequantised
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=resolve_dtype(dtype),
                                                 trust_remote_code=trust_remote_code)
    prof = kv_profile(model, window=window)
    return {
        "parameters": model.num_parameters(),
        "state_kind": "kv-window" if window else "kv",
        "state_bytes": prof.bytes_at(n_tokens),
        "n_tokens": n_tokens,
        "kv_bytes_per_token": prof.bytes_per_token,
        "dtype": _DTYPE_NAMES[resolve_dtype(dtype)],
        "max_length": _max_length_from_config(config),
    }


# ---------------------------------------------------------------- the adapter

class SoftmaxAdapter:
    """A transformers causal LM behind the evalkit protocol, with the KV cache as state."""

    def __init__(self, path: str | os.PathLike, *, name: str | None = None, device: str = "cpu",
                 dtype: Any = "fp32", trust_remote_code: bool = False, window: int | None = None,
                 kv_budget_bytes: int | None = None, match_state_of: str | None = None,
                 sink: int = 0, max_length: int | None = None, prefill_chunk: int = 2048, score_batch: int = 32, score_batch_bytes: int = 2 << 30,
                 extra_identity: dict | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from evalkit.tokenization import load_tokenizer

        self.path = str(Path(path).expanduser())
        folder, gguf = _split_path(path)
        self.dtype = resolve_dtype(dtype)
        self.device = torch.device(device)
        self.trust_remote_code = bool(trust_remote_code)
        if int(prefill_chunk) < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.prefill_chunk = int(prefill_chunk)
        self.score_batch = max(1, int(score_batch))  # continuations scored in one forward
        self.score_batch_bytes = int(score_batch_bytes)  # memory for their cache copies + logits
        self._extra_identity = dict(extra_identity or {})

        common = dict(local_files_only=True, trust_remote_code=self.trust_remote_code)
        if gguf:
            self.tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf, **common)
            self.model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf,
                                                              dtype=self.dtype, **common)
            self._weight_files = [folder / gguf]
        else:
            self.tokenizer = load_tokenizer(folder, trust_remote_code=self.trust_remote_code)
            # use_safetensors=True: never unpickle .bin weights
            self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=self.dtype,
                                                              use_safetensors=True, **common)
            self._weight_files = sorted(folder.glob("*.safetensors"))
        self.model.to(self.device).eval()
        self.model.requires_grad_(False)
        self._cache_kw = _cache_kwarg(self.model)
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._vocab = self.model.get_input_embeddings().num_embeddings

        cfg_max = _max_length_from_config(self.model.config)
        self.max_length = int(max_length) if max_length is not None else cfg_max

        self._full_profile = kv_profile(self.model)
        self.sink = int(sink)
        self.match_state_of = match_state_of
        if match_state_of is not None:  # memory-matched: the KV budget of another model's state
            if kv_budget_bytes is not None:
                raise ValueError("pass either kv_budget_bytes or match_state_of, not both")
            from evalkit.models_cmd import describe_model

            kv_budget_bytes = describe_model(match_state_of)["state_bytes"]
            if not kv_budget_bytes:
                raise ValueError(f"match_state_of={match_state_of!r}: that model reports no "
                                 f"fixed state size to match")
        if kv_budget_bytes is not None:
            if window is not None:
                raise ValueError("pass either window or kv_budget_bytes, not both")
            window = matched_window(int(kv_budget_bytes), self._full_profile.bytes_per_token)
        self.kv_budget_bytes = None if kv_budget_bytes is None else int(kv_budget_bytes)
        self.window = None if window is None else int(window)
        if self.window is not None:
            self._check_window_support()
        elif self.sink:
            raise ValueError("sink is only meaningful with window or kv_budget_bytes")
        self.state_kind = "kv-window" if self.window is not None else "kv"
        prof = self._full_profile
        # window mode has only full-attention layers, each capped at the window
        self._profile = (KVProfile(prof.per_token, prof.const, (self.window,) * len(prof.cap))
                         if self.window is not None else prof)

        base = name or (Path(gguf).stem if gguf else folder.name)
        if self.window is not None:
            base += f"[window={self.window}" + (f",sink={self.sink}" if self.sink else "") + "]"
        self.name = base
        self._eos = self._eos_ids()
        dyn, sliding = _cache_classes()
        probe_cache = self._new_cache()
        # Shallow copies are safe only for layers that update by concatenation (new tensors).
        self._functional_cache = all(type(layer) in (dyn, sliding) for layer in probe_cache.layers)

    # -- setup helpers

    def _check_window_support(self) -> None:
        dyn, _ = _cache_classes()
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if not 0 <= self.sink < self.window:
            raise ValueError(f"sink must satisfy 0 <= sink < window ({self.window}), got {self.sink}")
        layers = self._new_cache().layers
        if not layers or any(type(layer) is not dyn for layer in layers):
            raise ValueError(f"window/kv_budget_bytes needs a model whose layers are all full "
                             f"attention; {self.model.config.model_type} has sliding or linear "
                             f"cache layers")
        impl = getattr(self.model.config, "_attn_implementation", None)
        if impl not in ("sdpa", "eager"):
            raise ValueError(f"window/kv_budget_bytes needs attn_implementation sdpa or eager "
                             f"(a custom 4-D mask); this model uses {impl!r}")
        self._attn_impl = impl

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        gc = getattr(self.model, "generation_config", None)
        for src in (getattr(gc, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(src, int):
                ids.add(src)
            elif isinstance(src, (list, tuple)):
                ids.update(int(i) for i in src)
        return ids

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    # -- core forward

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self._vocab]
        if bad:
            raise ValueError(f"{self.name}: token id {bad[0]} is outside the vocabulary [0, {self._vocab})")
        return ids

    def _check_room(self, length: int, what: str) -> None:
        if self.max_length is not None and length > self.max_length:
            raise ValueError(f"{self.name}: {what} needs {length} tokens, more than max_length "
                             f"{self.max_length}; evalkit never truncates -- shorten the probe or "
                             f"pass max_length explicitly")

    def _window_mask(self, pos0: int, q_len: int, n_cached: int) -> torch.Tensor:
        """[1, 1, q, cached+q] mask for KV-budget attention at absolute positions pos0.."""
        dev = self.device
        n_sink = min(self.sink, pos0, n_cached)
        recent = n_cached - n_sink
        kpos = torch.cat([torch.arange(n_sink, device=dev),
                          torch.arange(pos0 - recent, pos0, device=dev),
                          torch.arange(pos0, pos0 + q_len, device=dev)])
        qpos = torch.arange(pos0, pos0 + q_len, device=dev)[:, None]
        k = kpos[None, :]
        allowed = (k <= qpos) & ((k < self.sink) | (k >= qpos - (self.window - self.sink)))
        if self._attn_impl == "sdpa":
            return allowed[None, None]
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=dev)
        return mask.masked_fill(~allowed, torch.finfo(self.dtype).min)[None, None]

    def _evict(self, cache: Any) -> None:
        """Keep the first `sink` and the last `window - sink` entries of every layer."""
        keep = self.window - self.sink
        for layer in cache.layers:
            n = layer.keys.shape[-2]
            if n <= self.window:
                continue
            # torch.cat copies, so the evicted entries' storage is freed (state bytes are real)
            layer.keys = torch.cat([layer.keys[..., : self.sink, :], layer.keys[..., n - keep:, :]], dim=-2)
            layer.values = torch.cat([layer.values[..., : self.sink, :], layer.values[..., n - keep:, :]],
                                     dim=-2)

    def _cached_len(self, cache: Any) -> int:
        if not cache.layers or getattr(cache.layers[0], "keys", None) is None:
            return 0
        return cache.layers[0].keys.shape[-2]

    @torch.inference_mode()
    def _forward(self, cache: Any, start: int, rows: Sequence[Sequence[int]], all_logits: bool
                 ) -> torch.Tensor:
        """Run equal-length id rows at absolute positions start.. through the model, updating
        `cache` (batch = len(rows)) in place, chunk by chunk. Returns fp32 logits:
        [B, n, V] if all_logits else [B, V] for the last position."""
        n = len(rows[0])
        x_all = torch.tensor([list(r) for r in rows], dtype=torch.long, device=self.device)
        outs: list[torch.Tensor] = []
        last = None
        for i in range(0, n, self.prefill_chunk):
            x = x_all[:, i: i + self.prefill_chunk]
            pos0, q = start + i, x.shape[1]
            kw: dict[str, Any] = {
                self._cache_kw: cache,
                "use_cache": True,
                "position_ids": torch.arange(pos0, pos0 + q, device=self.device)[None].expand(len(rows), q),
            }
            if self.window is not None:
                kw["attention_mask"] = self._window_mask(pos0, q, self._cached_len(cache))
            if self._keeps_logits:
                kw["logits_to_keep"] = 0 if all_logits else 1
            logits = self.model(input_ids=x, **kw).logits
            if self.window is not None:
                self._evict(cache)
            if all_logits:
                outs.append(logits.float())
            else:
                last = logits[:, -1].float()
        return torch.cat(outs, dim=1) if all_logits else last

    def _scratch(self, state: KVState) -> Any:
        """A cache to run ahead on without touching `state` (shares tensors when that is safe)."""
        return _copy_cache(state.cache, clone=not self._functional_cache)

    # -- protocol

    def prefill(self, token_ids: Sequence[int]) -> KVState:
        ids = self._check_ids(token_ids)
        if not ids:
            raise ValueError(f"{self.name}: prefill needs at least one token")
        self._check_room(len(ids), "prefill")
        cache = self._new_cache()
        logits = self._forward(cache, 0, [ids], all_logits=False)[0]
        return KVState(cache, len(ids), logits)

    def extend(self, state: KVState, token_ids: Sequence[int]) -> KVState:
        ids = self._check_ids(token_ids)
        if not ids:
            return state
        self._check_room(state.length + len(ids), "extend")
        logits = self._forward(state.cache, state.length, [ids], all_logits=False)[0]
        state.length += len(ids)
        state.logits = logits
        return state

    def fork(self, state: KVState) -> KVState:
        return KVState(_copy_cache(state.cache, clone=True), state.length, state.logits.clone())

    def generate(self, state: KVState, max_new_tokens: int, stop: Sequence[str] | None = None) -> str:
        cache = None
        length, logits = state.length, state.logits
        out: list[int] = []
        for step in range(int(max_new_tokens)):
            nxt = int(torch.argmax(logits))
            if nxt in self._eos:
                break
            out.append(nxt)
            if stop and cut_at_stop(self._decode(out), stop)[1]:
                break
            if step == max_new_tokens - 1:
                break  # the last token needs no forward
            self._check_room(length + 1, "generation")
            if cache is None:
                cache = self._scratch(state)
            logits = self._forward(cache, length, [[nxt]], all_logits=False)[0]
            length += 1
        return cut_at_stop(self._decode(out), stop)[0]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def score(self, state: KVState, continuations: Sequence[Sequence[int]]) -> list[float]:
        conts = [self._check_ids(c) for c in continuations]
        if any(not c for c in conts):
            raise ValueError(f"{self.name}: cannot score an empty continuation")
        first = torch.log_softmax(state.logits, dim=-1)
        scores = [first[c[0]].item() for c in conts]
        multi = sorted((i for i, c in enumerate(conts) if len(c) > 1), key=lambda i: len(conts[i]))
        if not multi:
            return scores
        self._check_room(state.length + len(conts[multi[-1]]) - 1, "score")
        # Continuations run as one batch on a shared copy of the cache (decoding is memory-bound,
        # so a batch costs about one pass), in groups whose cache copies + logits fit the budget.
        longest = len(conts[multi[-1]]) - 1
        per_item = self.state_bytes(state) + 3 * longest * self._vocab * 4
        group = max(1, min(self.score_batch, self.score_batch_bytes // per_item))
        if not self._functional_cache:
            group = 1  # caches updated in place cannot share a batch-expanded view
        for g in range(0, len(multi), group):
            idx = multi[g: g + group]
            width = len(conts[idx[-1]]) - 1
            # right padding: pads come after every real token, so causal attention never sees them
            rows = [conts[i][:-1] + [0] * (width - len(conts[i]) + 1) for i in idx]
            logits = self._forward(self._batched_scratch(state, len(idx)), state.length, rows,
                                   all_logits=True)
            lp = torch.log_softmax(logits, dim=-1)
            for b, i in enumerate(idx):
                tgt = torch.tensor(conts[i][1:], device=lp.device)
                scores[i] += lp[b, : len(tgt)].gather(1, tgt[:, None]).sum().item()
        return scores

    def _batched_scratch(self, state: KVState, batch: int) -> Any:
        cache = self._scratch(state)
        if batch > 1:
            for layer in cache.layers:
                for name, val in vars(layer).items():
                    if isinstance(val, torch.Tensor) and not name.startswith("_") and val.dim() == 4:
                        setattr(layer, name, val.expand(batch, *val.shape[1:]))  # a view; cat copies
        return cache

    def state_tensors(self, state: KVState) -> list[torch.Tensor]:
        """The tensors `state_bytes` counts (the KV cache; not the logits)."""
        return [t for layer in state.cache.layers for t in _layer_tensors(layer)]

    def state_bytes(self, state: KVState) -> int:
        return sum(t.nbytes for t in self.state_tensors(state))

    # -- description

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one more token adds to a full (unwindowed) cache."""
        return self._full_profile.bytes_per_token

    def state_bytes_at(self, n_tokens: int) -> int:
        """Analytic state bytes after `n_tokens` tokens (equals the measured value)."""
        return self._profile.bytes_at(int(n_tokens))

    def num_parameters(self) -> int:
        return self.model.num_parameters()

    def identity(self) -> dict:
        import transformers

        from evalkit.tokenization import tokenizer_hash

        hashes = {f.name: file_sha256(f) for f in self._weight_files}
        if len(hashes) == 1:
            combined = next(iter(hashes.values()))
        else:
            combined = hashlib.sha256("".join(f"{k}:{v}\n" for k, v in sorted(hashes.items()))
                                      .encode()).hexdigest()
        ident = {
            "name": self.name,
            "kind": "softmax",  # no path: a fingerprint must not depend on where files live
            "weights_sha256": combined,
            "weights_files": sorted(hashes),
            "tokenizer_sha256": tokenizer_hash(self.tokenizer),
            "dtype": _DTYPE_NAMES[self.dtype],
            "device": str(self.device),
            "window": self.window,
            "sink": self.sink if self.window is not None else None,
            "kv_budget_bytes": self.kv_budget_bytes,
            "match_state_of": self.match_state_of,
            "max_length": self.max_length,
            "transformers": transformers.__version__,
        }
        ident.update(self._extra_identity)
        return ident


@MODELS.register("hf")
def load_hf(path: str | None, **options: Any) -> SoftmaxAdapter:
    """`hf:PATH`: a local Hugging Face causal LM folder or .gguf file."""
    if not path:
        raise ValueError("the 'hf' loader needs a path: hf:/path/to/model-folder or hf:/path/to/file.gguf")
    return SoftmaxAdapter(path, **options)


MODEL_INFO["hf"] = {"kind": "loader",
                    "description": "any local Hugging Face causal LM folder or .gguf (hf:PATH)"}
