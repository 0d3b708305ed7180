"""ServedAdapter: a model behind an OpenAI-compatible completions server, as an evalkit adapter.

    prefill / extend / fork   token ids kept on the client (a tuple: fork is free); reuse of a
                              shared prefix is the server's prefix cache, so the runner sends
                              the questions of one context together
    generate                  one streamed greedy completion of the token ids (the stop
                              strings); `generate_timed` also returns its client.Timing
    score                     the summed log-probabilities of each continuation, all of them in
                              one request: vLLM's `prompt_logprobs`, else OpenAI's echo+logprobs
                              sliced as lm-eval does and checked against the ids sent (which
                              one is in the identity, as `score_method`)
    abort                     from any thread: every request in flight and every later one
                              raises ServerError(cause="cancelled")
    metered                   a block that counts the prompt tokens and requests this thread
                              sends (the runner wraps each sample in one: its `tokens_sent`)

Every request pins its sampling parameters to neutral greedy (NEUTRAL): a server fills any
field left out from the model folder's generation_config.json (vLLM does, by default), and a
repetition penalty or top-k there would make served greedy differ from in-process greedy.

Prompts go as token ids, so the server sees exactly the tokens the probe fitted; a server that
does not take token ids is an error, never a fall-back to text. The server's context limit
(`max_model_len` of /v1/models) is `max_length`, so the runner flags longer probes before
anything is sent. Every server of a list is probed (engine, version, model, context limit,
scoring method, model card) and servers that disagree are refused. The identity holds the
served model's name and its card as the server reports it (`served_card`: /v1/models' entry,
so a model redeployed from other weights under the same name changes the cache key and a
resume refuses it), the local folder's weights and tokenizer hashes, the engine's version and
fingerprint, never a URL or a key.

What a sample costs is counted in prompt tokens sent: the state is token ids on the client, so
every request carries its whole prompt and the server prefills all of it (the greedy prompt,
then each scoring prompt: the context once per candidate). A server's prefix cache may reuse
some of it, which the client cannot see; vLLM reads none for a request with prompt_logprobs
(vllm/sampling_params.py: skip_reading_prefix_cache), so a scoring request's prompts are
prefilled whole on vLLM whatever its cache.
"""
from __future__ import annotations

import contextlib
import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from evalkit.model_adapters.facts import ModelFacts, config_facts
from evalkit.model_adapters.protocol import AdapterBase, Serving, cut_at_stop
from evalkit.model_adapters.served.client import Client, ServerError, Timing
from evalkit.model_adapters.served.urls import clean_url, on_this_machine, public_url
from evalkit.model_adapters.models import register_model
from evalkit.model_adapters.state_kind import StateBytes

MAX_CONCURRENCY = 1024
# The echo path asks for one generated token (the least every server accepts: some refuse 0)
# and slices it off, as lm-eval does.
ECHO = {"max_tokens": 1, "echo": True, "logprobs": 0}
# Greedy with nothing else: top_k -1 is "off" on vLLM (0.32 also takes 0), SGLang and llama.cpp;
# penalties at their identity values; a fixed seed for engines that sample anyway.
# /v1/models fields that are no part of the model: vLLM, SGLang and llama.cpp fill `created`
# with the time of the listing (every call differs) and vLLM's `permission` with a random id
VOLATILE = ("created", "permission")
NEUTRAL = {"temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0, "repetition_penalty": 1,
           "frequency_penalty": 0, "presence_penalty": 0, "seed": 0}


@dataclass(frozen=True)
class ServedState:
    """The token ids of the sequence so far (the server holds no state between requests)."""
    ids: tuple[int, ...]


@dataclass
class Sent:
    """What one thread's requests sent inside `metered()`: their prompts' tokens (a request
    of several prompts counts each) and the requests, each counted once as it is handed to
    the client (a retry re-sends the same prompt and is not counted again)."""
    tokens: int = 0
    requests: int = 0


class ServedAdapter(AdapterBase):
    def __init__(self, base_url: str | list[str], *, model: str | None = None,
                 tokenizer: str | None = None, config: str | None = None,
                 api_key_env: str | None = None, concurrency: int = 8,
                 timeout_s: float = 300.0, retries: int = 3, backoff_s: float = 0.5,
                 dtype: str = "fp32", name: str | None = None,
                 max_length: int | None = None, trust_env: bool | None = None) -> None:
        from evalkit.model_adapters.dtypes import parse_dtype
        from evalkit.tokenization import load_tokenizer

        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        # a URL holding a secret is refused first, before anything could repeat or use it
        urls = [clean_url(u) for part in urls for u in str(part).split("|") if u]
        if not tokenizer:
            raise ValueError("served: give tokenizer=DIR, the local folder of the served model's "
                             "tokenizer (prompts are sent as its token ids)")
        if not 1 <= int(concurrency) <= MAX_CONCURRENCY:
            raise ValueError(f"served: concurrency={concurrency}: expected 1..{MAX_CONCURRENCY} "
                             f"requests in flight")
        # a served model, declared: the runner asks `serving`, never the adapter's methods
        self.serving = Serving(int(concurrency), self.generate_timed, self.metered,
                               self.abort)
        self.client = Client(urls, api_key_env=api_key_env, timeout_s=timeout_s, retries=retries,
                             backoff_s=backoff_s, trust_env=trust_env)
        tok_dir = Path(tokenizer).expanduser()
        if not tok_dir.is_dir():
            raise FileNotFoundError(f"served: tokenizer={tokenizer}: no such folder")
        self.tokenizer = load_tokenizer(tok_dir)
        self.config_dir = Path(config).expanduser() if config else tok_dir
        if config and not (self.config_dir / "config.json").is_file():
            raise FileNotFoundError(f"served: config={config}: no config.json there")
        self.dtype = parse_dtype(dtype)
        self._vocab = len(self.tokenizer)
        self._fingerprint = None
        self._token_forms: dict[int, tuple[str, ...]] = {}
        self._local = threading.local()  # this thread's Sent inside metered()
        self.name = name or "served"  # until the served model's name is known
        (self.served_model, self.max_length, self.server, self.score_method,
         self.served_card) = self._probe_all(model)
        if max_length is not None:  # a lower limit than the server's: flag longer probes
            if not 1 <= int(max_length) <= (self.max_length or int(max_length)):
                raise ValueError(f"served: max_length={max_length}: expected 1..{self.max_length} "
                                 f"(the server's max_model_len)")
            self.max_length = int(max_length)
        # what the config says (facts.py), as an in-process adapter of the folder would read
        # it; a state from the config alone (the server's tensors are out of reach), at the
        # server's dtype; none without a config: kind "unknown", bytes None (never 0)
        self.facts: ModelFacts | None = (config_facts(self.config_dir)
                                         if (self.config_dir / "config.json").is_file() else None)
        self.trained_length = None if self.facts is None else self.facts.trained_length
        self.name = name or f"served:{self.served_model}"  # the model's name, never a URL
        self.state_kind = ("unknown" if self.facts is None
                           else self.facts.state_at(8192, self.dtype).kind)

    # -- discovery --------------------------------------------------------------------------
    def _probe_all(self, model: str | None) -> tuple[str, int | None, dict, str, dict]:
        """Probe every server; (model, max_model_len, engine, score method, model card) where
        all agree. A list of servers that disagree would mix two engines' (or two weights')
        numbers under one name."""
        found = [self._probe(0, model)]
        urls = self.client.base_urls
        for i in range(1, len(urls)):
            found.append(self._probe(i, found[0]["model"]))
            for field in ("engine", "version", "max_model_len", "score_method", "card"):
                a, b = found[0].get(field), found[i].get(field)
                if a != b:
                    raise ValueError(f"served: the servers disagree on {field}: {urls[0]} has "
                                     f"{a!r}, {urls[i]} has {b!r}; one model name must mean one "
                                     f"engine and one configuration")
        first = found[0]
        return (first["model"], first["max_model_len"],
                {k: first[k] for k in ("engine", "version") if first.get(k)},
                first["score_method"], first["card"])

    def _probe(self, index: int, model: str | None) -> dict:
        url = self.client.base_urls[index]
        listing = self.client.get_json("/models", index=index)
        try:
            entries = {m["id"]: m for m in listing["data"]}
        except (KeyError, TypeError):
            raise ServerError(f"{url}/models: expected an OpenAI model list "
                              f"({{data: [{{id: ...}}]}}), got {str(listing)[:200]}") from None
        if len(entries) != len(listing["data"]):  # which card is the model's would be a guess
            ids = [m["id"] for m in listing["data"]]
            twice = sorted({str(i) for i in ids if ids.count(i) > 1})
            raise ServerError(f"{url}/models: lists {', '.join(twice)[:200]} more than once; "
                              f"expected one entry a model")
        if model is None:
            if len(entries) != 1:
                raise ValueError(f"served: the server lists {len(entries)} models "
                                 f"({', '.join(entries)}); choose one with model=NAME")
            model = next(iter(entries))
        if model not in entries:
            listed = ", ".join(map(str, entries))
            raise ValueError(f"served: model={model!r} is not served at {url} (it serves: "
                             f"{listed})" + ("; every server of a list must serve the same "
                                             "model" if index else ""))
        limit = entries[model].get("max_model_len")
        if limit is not None and not (type(limit) is int and limit > 0):
            raise ServerError(f"{url}/models: max_model_len {str(limit)[:40]!r} of {model!r}: "
                              f"expected a whole number of tokens")
        version = self.client.get_optional("/version", index=index)
        engine = ({"engine": "vllm", "version": str(version["version"])}
                  if isinstance(version, dict) and "version" in version else {})
        return {"model": model, "max_model_len": int(limit) if limit else None, **engine,
                "score_method": self._probe_scoring(index, model),
                "card": self._card(entries[model], url)}

    @staticmethod
    def _card(entry: dict, url: str) -> dict:
        """The served model as the server reports it (/v1/models: id, root, parent, owned_by,
        max_model_len and whatever else it lists), less the fields that change by the call. A
        root that is a folder of this machine's (a server on it) is keyed by its weights'
        content instead of its path: a clone elsewhere serves the same model, and weights
        overwritten in place are another."""
        from evalkit.model_adapters.weights import weights_hash

        card = {str(k): v for k, v in entry.items() if k not in VOLATILE}
        try:  # it goes into config.json and results.json: no NaN or Infinity
            json.dumps(card, allow_nan=False)
        except ValueError:
            raise ServerError(f"{url}/models: the entry of {entry.get('id')!r} holds a "
                              f"non-finite number (NaN or Infinity); expected a JSON model "
                              f"card") from None
        root = card.get("root")
        if isinstance(root, str) and root.startswith("/") and on_this_machine(url):
            files = sorted(Path(root).glob("*.safetensors")) if Path(root).is_dir() else []
            if files:
                card["root"] = {"folder": Path(root).name, "weights_hash": weights_hash(files)}
        return card

    def _probe_scoring(self, index: int, model: str) -> str:
        """prompt_logprobs where the server offers them (vLLM, SGLang), else echo+logprobs; a
        server that takes neither, or no token-id prompts, is refused here, before any probe."""
        ids = self._canary_ids()
        post = lambda **kw: self.client.post_json(
            "/completions", {**self._body([ids], **kw), "model": model}, index=index)
        try:
            out = post(max_tokens=1, prompt_logprobs=0)
            self._fingerprint = out.get("system_fingerprint")
            if out["choices"][0].get("prompt_logprobs"):
                return "prompt_logprobs"
        except ServerError as e:
            if e.status != 400:  # 400: the server does not know prompt_logprobs
                raise
        out = post(**ECHO)
        self._fingerprint = out.get("system_fingerprint")
        if not (out["choices"][0].get("logprobs") or {}).get("token_logprobs"):
            raise ServerError(f"served: {self.client.base_urls[index]} returns neither "
                              f"prompt_logprobs nor echoed token log-probabilities for a "
                              f"token-id prompt; evalkit needs one of them to score")
        self._echoed(out["choices"][0], ids, 1)  # what the scores will rely on, checked once
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
        return {"model": getattr(self, "served_model", None),
                "prompt": prompt if len(prompt) > 1 else prompt[0], **NEUTRAL, **kw}

    @contextlib.contextmanager
    def metered(self) -> Iterator[Sent]:
        """Count what this thread sends inside the block (requests run on the caller's
        thread, so concurrent samples on their own threads count apart)."""
        sent, outer = Sent(), getattr(self._local, "sent", None)
        self._local.sent = sent
        try:
            yield sent
        finally:
            self._local.sent = outer

    def _send(self, prompts: list[list[int]]) -> None:
        """Count a request of `prompts` (inside metered(); else nothing)."""
        sent = getattr(self._local, "sent", None)
        if sent is not None:
            sent.tokens += sum(map(len, prompts))
            sent.requests += 1

    def abort(self) -> None:
        """From any thread (the runner's Ctrl-C / SIGTERM): every request in flight and every
        later one raises ServerError(cause="cancelled") within about a second."""
        self.client.abort()

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
        prompt = [list(state.ids)]
        body = self._body(prompt, max_tokens=budget, **({"stop": list(stop)} if stop else {}))
        self._send(prompt)
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
        self._send(prompts)
        if self.score_method == "prompt_logprobs":
            out = self.client.post_json("/completions", self._body(prompts, max_tokens=1,
                                                                   prompt_logprobs=0))
        else:
            out = self.client.post_json("/completions", self._body(prompts, **ECHO))
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
            vals = self._echoed(choice, prompt, n)
        total = math.fsum(_logprob(v) for v in vals)
        if not math.isfinite(total):
            raise FloatingPointError(f"{self.name}: the server returned non-finite "
                                     f"log-probabilities {vals}")
        return total

    def _echoed(self, choice: dict, prompt: list[int], n: int) -> list:
        """The last `n` prompt tokens' echoed log-probabilities, as lm-eval slices them: the
        ones after the context, never what the server generated after the prompt. The echo
        must be the prompt itself plus at most the one token asked for."""
        logprobs = choice.get("logprobs") or {}
        lp, tokens = logprobs.get("token_logprobs") or [], logprobs.get("tokens")
        if len(lp) > len(prompt) + 1:
            raise ServerError(f"{self.name}: {len(lp)} echoed log-probabilities for a "
                              f"{len(prompt)}-token prompt and max_tokens=1: longer than the "
                              f"prompt and one generated token, so which are the prompt's is a "
                              f"guess; evalkit does not score it")
        if len(lp) < len(prompt):
            raise ServerError(f"{self.name}: {len(lp)} echoed log-probabilities for a "
                              f"{len(prompt)}-token prompt: the echo does not cover it")
        if not isinstance(tokens, list) or len(tokens) != len(lp):
            raise ServerError(f"{self.name}: the echo has {len(lp)} log-probabilities but no "
                              f"matching list of tokens to check them against the ids sent")
        bad = next((k for k, (t, i) in enumerate(zip(tokens, prompt))
                    if t not in self._forms(i)), None)
        if bad is not None and not self._same_text(tokens[:len(prompt)], prompt):
            raise ServerError(f"{self.name}: echoed token {bad} is {tokens[bad]!r}, not the id "
                              f"{prompt[bad]} sent ({self._forms(prompt[bad])[1]!r}): the server "
                              f"scored other tokens than the ones evalkit sent")
        vals = lp[len(prompt) - n:len(prompt)]
        if any(v is None for v in vals):
            raise ServerError(f"{self.name}: the echo has no log-probability for a "
                              f"continuation token ({vals})")
        return vals

    def _forms(self, token: int) -> tuple[str, ...]:
        """How a server may echo a token: vLLM's "token_id:N", its text, its vocabulary entry
        (kept per adapter: long prompts repeat the same ids)."""
        forms = self._token_forms.get(token)
        if forms is None:
            piece = self.tokenizer.convert_ids_to_tokens(token)
            forms = self._token_forms[token] = (f"token_id:{token}",
                                                self.tokenizer.decode([token]), piece,
                                                str(piece).replace("\u2581", " "))
        return forms

    def _same_text(self, tokens: list, prompt: list[int]) -> bool:
        """Echoed pieces a server renders its own way still have to spell the prompt's text."""
        text = "".join(t for t in tokens if isinstance(t, str)).replace("\u2581", " ")
        return text == self.tokenizer.decode(prompt) and len(tokens) == len(prompt)

    def state_parts(self, state: ServedState) -> StateBytes | None:
        return None if self.facts is None else self.facts.state_at(len(state.ids), self.dtype)

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
                "served_card": self.served_card,
                "tokenizer_hash": tokenizer_hash(self.tokenizer),
                "server": {**self.server, "system_fingerprint": self._fingerprint},
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
    return _logprob(entry.get("logprob") if isinstance(entry, dict) else entry)


def _logprob(value: Any) -> float:
    """A log-probability as a server sends it: a JSON number at most 0 (a string is not one:
    float() would read "1_0" or " 5 "; a positive one is no probability). Non-finite numbers
    pass here and are refused with the sum, naming them."""
    if type(value) not in (int, float) or value > 1e-6:
        raise ServerError(f"a log-probability {str(value)[:40]!r}: expected a number <= 0")
    return float(value)


def public_spec(spec: str) -> str:
    """A `served:URL[|URL...]` spec as it may be printed, stored or used as a model name: each
    URL cut to scheme://host[:port]/path (no credentials, query or fragment); other specs as
    they are."""
    head, sep, rest = str(spec).partition(":")
    if head != "served" or not sep:
        return str(spec)
    return "served:" + "|".join(public_url(u) for u in rest.split("|") if u)


@register_model("served", kind="served", state_kind="measured",
                description="a model behind an OpenAI-compatible server (vLLM, SGLang, "
                            "llama.cpp): served:http://HOST:PORT/v1 with model=, tokenizer=DIR")
def load_served(path: str | None, *, base_url: str | list[str] | None = None,
                model: str | None = None, tokenizer: str | None = None,
                config: str | None = None, api_key_env: str | None = None,
                concurrency: int = 8, timeout_s: float = 300.0, retries: int = 3,
                backoff_s: float = 0.5, dtype: str = "fp32", name: str | None = None,
                max_length: int | None = None, trust_env: bool | None = None) -> ServedAdapter:
    """`served:URL` (several: URL|URL) or `served` with base_url= (a URL or a list)."""
    if path and base_url:
        raise ValueError("served: give the URL once, as served:URL or as base_url=")
    if not (path or base_url):
        raise ValueError("served: needs a server: served:http://HOST:PORT/v1 or base_url=")
    return ServedAdapter(path or base_url, model=model, tokenizer=tokenizer, config=config,
                         api_key_env=api_key_env, concurrency=concurrency, timeout_s=timeout_s,
                         retries=retries, backoff_s=backoff_s, dtype=dtype, name=name,
                         max_length=max_length, trust_env=trust_env)
