"""ServedAdapter: a model behind an OpenAI-compatible completions server, as an evalkit adapter.

    prefill / extend / fork   token ids kept on the client (a tuple: fork is free); reuse of a
                              shared prefix is the server's prefix cache, so the runner sends
                              the questions of one context together
    generate                  one streamed greedy completion of the token ids (temperature 0,
                              the stop strings); `generate_timed` also returns TTFT and latency
    score                     the summed log-probabilities of each continuation, all of them in
                              one request: vLLM's `prompt_logprobs`, else OpenAI's echo+logprobs
                              (which one is in the identity, as `score_method`)

Prompts go as token ids, so the server sees exactly the tokens the probe fitted; a server that
does not take token ids is an error, never a fall-back to text. The server's context limit
(`max_model_len` of /v1/models) is `max_length`, so the runner flags longer probes before
anything is sent. The identity holds the served model's name, the local folder's weights and
tokenizer hashes, the engine's version and fingerprint, never a URL or a key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from evalkit.adapter import cut_at_stop
from evalkit.model_adapters.served.client import Client, ServerError, Timing
from evalkit.model_adapters.served.state import state_from_config
from evalkit.models import register_model
from evalkit.state_kind import StateBytes

MAX_CONCURRENCY = 1024
_STATE_DTYPES = {"float32": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16",
                 "float16": "fp16", "fp16": "fp16", "half": "fp16"}


@dataclass(frozen=True)
class ServedState:
    """The token ids of the sequence so far (the server holds no state between requests)."""
    ids: tuple[int, ...]


class ServedAdapter:
    def __init__(self, base_url: str | list[str], *, model: str | None = None,
                 tokenizer: str | None = None, config: str | None = None,
                 api_key_env: str | None = None, concurrency: int = 8,
                 timeout_s: float = 300.0, retries: int = 3, backoff_s: float = 0.5,
                 dtype: str = "fp32", name: str | None = None,
                 max_length: int | None = None) -> None:
        from evalkit.model_adapters.dtypes import parse_dtype
        from evalkit.tokenization import load_tokenizer

        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        urls = [u for part in urls for u in str(part).split("|") if u]
        if not tokenizer:
            raise ValueError("served: give tokenizer=DIR, the local folder of the served model's "
                             "tokenizer (prompts are sent as its token ids)")
        if not 1 <= int(concurrency) <= MAX_CONCURRENCY:
            raise ValueError(f"served: concurrency={concurrency}: expected 1..{MAX_CONCURRENCY} "
                             f"requests in flight")
        self.concurrency = int(concurrency)
        self.client = Client(urls, api_key_env=api_key_env, timeout_s=timeout_s, retries=retries,
                             backoff_s=backoff_s)
        tok_dir = Path(tokenizer).expanduser()
        if not tok_dir.is_dir():
            raise FileNotFoundError(f"served: tokenizer={tokenizer}: no such folder")
        self.tokenizer = load_tokenizer(tok_dir)
        self.config_dir = Path(config).expanduser() if config else tok_dir
        if config and not (self.config_dir / "config.json").is_file():
            raise FileNotFoundError(f"served: config={config}: no config.json there")
        self.dtype = parse_dtype(dtype)
        self._vocab = len(self.tokenizer)
        self.served_model, self.max_length = self._find_model(model)
        if max_length is not None:  # a lower limit than the server's: flag longer probes
            if not 1 <= int(max_length) <= (self.max_length or int(max_length)):
                raise ValueError(f"served: max_length={max_length}: expected 1..{self.max_length} "
                                 f"(the server's max_model_len)")
            self.max_length = int(max_length)
        self.trained_length = self._trained_length()
        self.server = self._server_version()
        self._fingerprint = None
        self.score_method = self._probe_scoring()
        self.name = name or f"served:{self.served_model}"
        probe = state_from_config(self.config_dir, 1, self.dtype)
        self.state_kind = "unknown" if probe is None else state_from_config(
            self.config_dir, 8192, self.dtype).kind

    # -- discovery --------------------------------------------------------------------------
    def _find_model(self, model: str | None) -> tuple[str, int | None]:
        listing = self.client.get_json("/models")
        try:
            entries = {m["id"]: m for m in listing["data"]}
        except (KeyError, TypeError):
            raise ServerError(f"{self.client.base_urls[0]}/models: expected an OpenAI model list "
                              f"({{data: [{{id: ...}}]}}), got {str(listing)[:200]}") from None
        if model is None:
            if len(entries) != 1:
                raise ValueError(f"served: the server lists {len(entries)} models "
                                 f"({', '.join(entries)}); choose one with model=NAME")
            model = next(iter(entries))
        if model not in entries:
            raise ValueError(f"served: model={model!r} is not served at "
                             f"{self.client.base_urls[0]} (it serves: {', '.join(entries)})")
        for i in range(1, len(self.client.base_urls)):  # every server must serve the same model
            others = [m.get("id") for m in self.client.get_json("/models", index=i).get("data", [])]
            if model not in others:
                raise ValueError(f"served: {self.client.base_urls[i]} does not serve {model!r} "
                                 f"(it serves: {', '.join(map(str, others))})")
        limit = entries[model].get("max_model_len")
        return model, int(limit) if limit else None

    def _trained_length(self) -> int | None:
        import json

        cfg = self.config_dir / "config.json"
        if not cfg.is_file():
            return None
        data = json.loads(cfg.read_text())
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            if isinstance(data.get(key), int):
                return data[key]
        return None

    def _server_version(self) -> dict:
        """The engine and its version (vLLM's /version); {} where a server has none."""
        root = self.client.base_urls[0].rsplit("/v1", 1)[0]
        try:
            import requests

            # with the key: a server that guards every route (not vLLM's default) still answers
            r = requests.get(root + "/version", headers=self.client.headers, timeout=10)
            if r.status_code == 200 and isinstance(r.json(), dict) and "version" in r.json():
                return {"engine": "vllm", "version": str(r.json()["version"])}
        except (requests.RequestException, ValueError):
            pass
        return {}

    def _probe_scoring(self) -> str:
        """prompt_logprobs where the server offers them (vLLM, SGLang), else echo+logprobs; a
        server that takes neither, or no token-id prompts, is refused here, before any probe."""
        ids = self._canary_ids()
        try:
            out = self.client.post_json("/completions", self._body(
                [ids], max_tokens=1, prompt_logprobs=0))
            self._fingerprint = out.get("system_fingerprint")
            if out["choices"][0].get("prompt_logprobs"):
                return "prompt_logprobs"
        except ServerError as e:
            if e.status != 400:  # 400: the server does not know prompt_logprobs
                raise
        out = self.client.post_json("/completions", self._body([ids], max_tokens=0, echo=True,
                                                               logprobs=0))
        self._fingerprint = out.get("system_fingerprint")
        lp = (out["choices"][0].get("logprobs") or {}).get("token_logprobs")
        if not lp or len(lp) < len(ids):
            raise ServerError(f"served: {self.client.base_urls[0]} returns neither prompt_logprobs "
                              f"nor echoed token log-probabilities for a token-id prompt; evalkit "
                              f"needs one of them to score")
        return "echo"

    def _canary_ids(self) -> list[int]:
        from evalkit.tokenization import encode

        return encode(self.tokenizer, "The quick brown fox jumps over the lazy dog.")

    # -- the protocol -----------------------------------------------------------------------
    def _check_ids(self, ids: Sequence[int]) -> tuple[int, ...]:
        out = tuple(int(i) for i in ids)
        bad = [i for i in out if not 0 <= i < self._vocab]
        if bad:
            raise ValueError(f"{self.name}: token id {bad[0]} is outside the tokenizer's "
                             f"vocabulary [0, {self._vocab})")
        return out

    def prefill(self, token_ids: Sequence[int]) -> ServedState:
        ids = self._check_ids(token_ids)
        if not ids:
            raise ValueError(f"{self.name}: prefill needs at least one token")
        return ServedState(ids)

    def extend(self, state: ServedState, token_ids: Sequence[int]) -> ServedState:
        return ServedState(state.ids + self._check_ids(token_ids))

    def fork(self, state: ServedState) -> ServedState:
        return state  # immutable

    def _body(self, prompt: list, **kw: Any) -> dict:
        return {"model": self.served_model, "prompt": prompt if len(prompt) > 1 else prompt[0],
                "temperature": 0, **kw}

    def _room(self, state: ServedState, extra: int, what: str) -> None:
        if self.max_length is not None and len(state.ids) + extra > self.max_length:
            raise ValueError(f"{self.name}: {what} needs {len(state.ids) + extra} tokens, more "
                             f"than the server's max_model_len {self.max_length}; evalkit never "
                             f"truncates")

    def generate_timed(self, state: ServedState, max_new_tokens: int,
                       stop: Sequence[str] | None = None) -> tuple[str, Timing]:
        budget = int(max_new_tokens)
        if self.max_length is not None:  # the prompt is never cut; the answer ends at the limit
            budget = min(budget, self.max_length - len(state.ids))
        if budget < 1:
            raise ValueError(f"{self.name}: a {len(state.ids)}-token prompt leaves no room to "
                             f"answer within max_model_len {self.max_length}")
        body = self._body([list(state.ids)], max_tokens=budget, **({"stop": list(stop)} if stop else {}))
        text, _, timing = self.client.stream_completion(body)
        return cut_at_stop(text, stop)[0], timing

    def generate(self, state: ServedState, max_new_tokens: int,
                 stop: Sequence[str] | None = None) -> str:
        return self.generate_timed(state, max_new_tokens, stop)[0]

    def score(self, state: ServedState, continuations: Sequence[Sequence[int]]) -> list[float]:
        conts = [self._check_ids(c) for c in continuations]
        if any(not c for c in conts):
            raise ValueError(f"{self.name}: cannot score an empty continuation")
        self._room(state, max(map(len, conts)) + 1, "scoring")
        prompts = [list(state.ids + c) for c in conts]
        if self.score_method == "prompt_logprobs":
            out = self.client.post_json("/completions", self._body(prompts, max_tokens=1,
                                                                   prompt_logprobs=0))
        else:
            out = self.client.post_json("/completions", self._body(prompts, max_tokens=0,
                                                                   echo=True, logprobs=0))
        choices = sorted(out["choices"], key=lambda ch: ch.get("index", 0))
        if len(choices) != len(prompts):
            raise ServerError(f"{self.name}: {len(prompts)} prompts scored, {len(choices)} "
                              f"choices returned")
        return [self._summed(ch, p, len(c)) for ch, p, c in zip(choices, prompts, conts)]

    def _summed(self, choice: dict, prompt: list[int], n: int) -> float:
        if self.score_method == "prompt_logprobs":
            rows = choice.get("prompt_logprobs")
            if not rows or len(rows) != len(prompt):
                raise ServerError(f"{self.name}: prompt_logprobs has {len(rows or [])} rows for "
                                  f"a {len(prompt)}-token prompt")
            vals = [_logprob_of(rows[i], prompt[i]) for i in range(len(prompt) - n, len(prompt))]
        else:
            lp = (choice.get("logprobs") or {}).get("token_logprobs") or []
            vals = lp[-n:] if len(lp) >= len(prompt) else []
            if len(vals) != n or any(v is None for v in vals):
                raise ServerError(f"{self.name}: the echoed log-probabilities do not cover the "
                                  f"continuation ({len(lp)} for a {len(prompt)}-token prompt)")
        total = math.fsum(float(v) for v in vals)
        if not math.isfinite(total):
            raise FloatingPointError(f"{self.name}: the server returned non-finite "
                                     f"log-probabilities {vals}")
        return total

    def state_parts(self, state: ServedState) -> StateBytes | None:
        return state_from_config(self.config_dir, len(state.ids), self.dtype)

    def state_bytes(self, state: ServedState) -> int | None:
        parts = self.state_parts(state)
        return None if parts is None else parts.total

    def identity(self) -> dict:
        from evalkit.model_adapters.weights import weights_hash
        from evalkit.tokenization import tokenizer_hash
        from evalkit.model_adapters.dtypes import dtype_name

        files = sorted(self.config_dir.glob("*.safetensors"))
        return {"name": self.name, "kind": "served", "served_model": self.served_model,
                "weights_hash": weights_hash(files) if files else "unknown (no local weights)",
                "weights_files": [f.name for f in files],
                "tokenizer_hash": tokenizer_hash(self.tokenizer), "server": {**self.server, "system_fingerprint": self._fingerprint},
                "score_method": self.score_method, "max_length": self.max_length,
                "state_source": "from config" if self.state_kind != "unknown" else "unknown",
                "state_dtype": dtype_name(self.dtype)}


def _logprob_of(row: Any, token: int) -> float:
    """vLLM's prompt_logprobs row: {"<token id>": {"logprob": x, ...}, ...}."""
    if not isinstance(row, dict):
        raise ServerError(f"prompt_logprobs row {str(row)[:80]} is not an object")
    entry = row.get(str(token), row.get(token))
    if entry is None:
        raise ServerError(f"prompt_logprobs row lacks the prompt's own token {token}")
    return float(entry["logprob"] if isinstance(entry, dict) else entry)


@register_model("served", kind="served", state_kind="measured",
                description="a model behind an OpenAI-compatible server (vLLM, SGLang, "
                            "llama.cpp): served:http://HOST:PORT/v1 with model=, tokenizer=DIR")
def load_served(path: str | None, *, base_url: str | list[str] | None = None,
                model: str | None = None, tokenizer: str | None = None,
                config: str | None = None, api_key_env: str | None = None,
                concurrency: int = 8, timeout_s: float = 300.0, retries: int = 3,
                backoff_s: float = 0.5, dtype: str = "fp32", name: str | None = None,
                max_length: int | None = None) -> ServedAdapter:
    """`served:URL` (several: URL|URL) or `served` with base_url= (a URL or a list)."""
    if path and base_url:
        raise ValueError("served: give the URL once, as served:URL or as base_url=")
    if not (path or base_url):
        raise ValueError("served: needs a server: served:http://HOST:PORT/v1 or base_url=")
    return ServedAdapter(path or base_url, model=model, tokenizer=tokenizer, config=config,
                         api_key_env=api_key_env, concurrency=concurrency, timeout_s=timeout_s,
                         retries=retries, backoff_s=backoff_s, dtype=dtype, name=name,
                         max_length=max_length)
