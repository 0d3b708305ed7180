"""evalkit models as lm-eval models: `lm_eval --model evalkit --model_args name=...`.

`EvalkitLM` is an `lm_eval.api.model.LM` (via lm-eval's `TemplateLM`) registered under
"evalkit". It wraps `evalkit.load_model(name, **options)`: every model_arg other than the
bridge's own (below) is an option of that model (device, dtype, max_length, window, ...).

    from lm_eval import simple_evaluate
    simple_evaluate(model="evalkit", model_args={"name": "smollm2-135m", "dtype": "fp32"}, ...)
    simple_evaluate(model=EvalkitLM(name="oracle"), ...)

Command line: lm-eval 0.4.13 finds models only in its own registry (no plugin entry points:
`lm_eval.api.registry.get_model` looks names up in `model_registry`, filled by
`lm_eval.models.MODEL_MAPPING` and by `@register_model` at import). So this module has to be
imported before lm-eval resolves `--model`; `python -m evalkit.lm_eval.cli run --model evalkit
...` (console script `evalkit-lm-eval`) does that and is otherwise the stock `lm-eval` command.
`python -m evalkit.lm_eval.cli --install-hook` makes the plain `lm-eval` command know "evalkit"
too (see evalkit/lm_eval/cli.py).

Bridge options (model_args): name (required), add_bos_token, prefix_token_id, max_gen_toks
(default 256, as lm-eval's hf), check_greedy (default true), share_prefix (default 0),
batch_size / max_batch_size (accepted, ignored: requests run one state at a time).

Semantics, matched to lm-eval's `hf` model so both give the same numbers on the same weights:
- tokenization: lm-eval's own (`TemplateLM.loglikelihood` / `_encode_pair`: the context is
  encoded with the tokenizer's default special tokens, the continuation is what the whole
  string adds; an empty context becomes [prefix_token_id] = BOS, else EOS). Generation prompts
  are encoded like hf's `tok_batch_encode` (no chat template unless lm-eval applies one).
- loglikelihood: requests are grouped by context ids: one `prefill` serves every continuation
  of that context (`score` never changes a state). With share_prefix=N > 0, contexts that share
  at least N leading tokens are prefilled once and `fork`ed + `extend`ed for the rest (faster;
  may differ from a fresh prefill by float reassociation, so off by default).
  is_greedy: the continuation equals (as text) the model's greedy continuation of the same
  number of tokens; check_greedy=false skips that extra decoding and reports False.
- loglikelihood_rolling: lm-eval's rolling windows (`get_rolling_token_windows`, context_len=1,
  prefix token first) of the model's max_length. A model with max_length None (a recurrent state
  has no window) gets one window: the whole text streams through the state in one pass, each
  token conditioned on everything before it -- the windows collapse to a single prefill+score.
- generate_until: greedy only (do_sample=True is an error), stops at the `until` strings and at
  EOS (lm-eval adds the EOS string to `until`), at most max_gen_toks tokens, stop string cut.
- lengths: nothing is ever truncated. A request longer than the model's max_length (hf would
  cut it from the left with a warning) raises ValueError naming the request.
"""
from __future__ import annotations

import logging
from typing import Any, Iterator, Sequence

# Import lm-eval's model table before registering: get_model() loads it only while the registry
# is empty, so registering "evalkit" first would hide "hf" and the other built-in models.
import lm_eval.models  # noqa: F401
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (handle_stop_sequences, has_bos_prefix, normalize_gen_kwargs,
                                  postprocess_generated_text)
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from evalkit.model_adapters.models import load_model, option_types, resolve_spec

log = logging.getLogger(__name__)

# generation kwargs whose only value greedy decoding can honour
_GREEDY_KEYS = {"do_sample", "temperature", "until", "max_gen_toks"}


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefix_groups(prompts: Sequence[tuple[int, ...]], share_prefix: int = 0
                  ) -> list[tuple[tuple[int, ...], list[tuple[int, ...]]]]:
    """Group distinct prompts for prefill: [(shared prefix, [prompts...])].

    share_prefix=0: one group per distinct prompt (the prefix is the prompt itself). Otherwise
    lexicographically adjacent prompts whose common prefix stays >= share_prefix tokens share
    one prefill of that prefix.
    """
    distinct = sorted(set(prompts))
    if share_prefix <= 0:
        return [(p, [p]) for p in distinct]
    groups: list[tuple[tuple[int, ...], list[tuple[int, ...]]]] = []
    for p in distinct:
        if groups:
            prefix, members = groups[-1]
            n = _lcp(prefix, p)
            if n >= share_prefix and n > 0:
                groups[-1] = (prefix[:n], members + [p])
                continue
        groups.append((p, [p]))
    return groups


def _args_key(arg_dict: dict, additional_config: dict | None) -> str:
    return repr((sorted(arg_dict.items()), sorted((additional_config or {}).items())))


@register_model("evalkit")
class EvalkitLM(TemplateLM):
    """An evalkit model adapter behind lm-eval's LM interface."""

    def __init__(self, name: str | None = None, *, add_bos_token: bool | None = None,
                 prefix_token_id: int | None = None, max_gen_toks: int = 256,
                 check_greedy: bool = True, share_prefix: int = 0,
                 batch_size: Any = None, max_batch_size: Any = None,
                 _lm_eval_device: str | None = None, **options: Any) -> None:
        super().__init__()
        if not name:
            raise ValueError("the evalkit lm-eval model needs name=<evalkit model>, e.g. "
                             "--model_args name=smollm2-135m (see `evalkit models`)")
        self.model_name = str(name)
        self.adapter = self._load(self.model_name, options, _lm_eval_device)
        self.tokenizer = self.adapter.tokenizer
        self.add_bos_token = add_bos_token
        self.custom_prefix_token_id = prefix_token_id
        self._max_gen_toks = int(max_gen_toks)
        self.check_greedy = bool(check_greedy)
        self.share_prefix = int(share_prefix)
        self.options = dict(options)
        # Accepted so `--batch_size` works; requests run one state at a time.
        self.batch_size_arg = batch_size
        self._ignored_warned: set[str] = set()

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        # lm-eval passes --device (default "cuda:0"), --batch_size and --max_batch_size here.
        # Only a device the user put in model_args must reach the model; lm-eval's own is a
        # hint (reference models take no device), see _load.
        preloaded = cls._preloaded.pop(_args_key(arg_dict, additional_config), None)
        if preloaded is not None:
            return preloaded
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        args = dict(arg_dict)
        device = extra.pop("device", None)
        for k, v in extra.items():
            args.setdefault(k, v)
        return cls(**args, _lm_eval_device=device)

    # One-shot handover: instances built early by `preload`, by their construction arguments.
    _preloaded: dict[str, "EvalkitLM"] = {}

    @classmethod
    def preload(cls, arg_dict: dict, additional_config: dict | None = None) -> "EvalkitLM":
        """Build now the model lm-eval will create from these arguments, and hand this instance
        to that creation (the lm-eval wrapper needs the tokenizer before lm-eval builds tasks)."""
        lm = cls.create_from_arg_obj(arg_dict, additional_config)
        cls._preloaded[_args_key(arg_dict, additional_config)] = lm
        return lm

    @staticmethod
    def _load(name: str, options: dict, hint_device: str | None) -> Any:
        # lazy: it imports the GLA package, which only a model load needs
        from evalkit.model_adapters.device import cpu_if_no_cuda

        if "device" in options:
            options["device"] = cpu_if_no_cuda(options["device"])
            return load_model(name, **options)
        if hint_device is None:
            return load_model(name, **options)
        accepted = option_types(resolve_spec(name)[0])
        if accepted is not None and "device" not in accepted:
            log.info("evalkit model %r takes no device option; ignoring --device %s",
                     name, hint_device)
            return load_model(name, **options)
        return load_model(name, device=cpu_if_no_cuda(hint_device), **options)

    # -- lm-eval's tokenization hooks --------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        if self.custom_prefix_token_id is not None:
            return int(self.custom_prefix_token_id)
        if self.tokenizer.bos_token_id is not None:
            return self.tokenizer.bos_token_id
        return self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int | None:
        return self.adapter.max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", self.model_name)).replace("/", "__")

    def _special_kwargs(self, add_special_tokens: bool | None) -> dict:
        if add_special_tokens is not None:
            return {"add_special_tokens": add_special_tokens}
        if self.add_bos_token is not None:
            return {"add_special_tokens": self.add_bos_token}
        return {}

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   **kwargs: Any) -> list[int]:
        """As lm-eval's hf `tok_encode` (no truncation)."""
        kw = self._special_kwargs(add_special_tokens)
        if add_special_tokens is None and has_bos_prefix(
                string, self.tokenizer.decode(self.prefix_token_id)):
            kw["add_special_tokens"] = False  # the text already carries its BOS
        return list(self.tokenizer.encode(string, **kw))

    def _encode_prompt(self, string: str) -> list[int]:
        """As lm-eval's hf `tok_batch_encode` for one generation prompt (no truncation)."""
        if has_bos_prefix(string, getattr(self.tokenizer, "bos_token", None)):
            kw = {"add_special_tokens": False}
        else:
            kw = self._special_kwargs(None)
        return list(self.tokenizer(string, **kw)["input_ids"])

    def tok_decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens)

    # -- states ------------------------------------------------------------------------------
    def _states(self, prompts: Sequence[tuple[int, ...]], desc: str, disable_tqdm: bool
                ) -> Iterator[tuple[tuple[int, ...], Any]]:
        """(prompt, state after it) for every distinct prompt, one prefill per prefix group.
        The yielded state is only read (score/generate) before the next one is made."""
        groups = prefix_groups(prompts, self.share_prefix)
        bar = tqdm(total=len(set(prompts)), desc=desc, disable=disable_tqdm)
        for prefix, members in groups:
            base = self.adapter.prefill(list(prefix))
            for p in members:
                if len(p) == len(prefix):
                    yield p, base
                else:  # extend consumes its state: fork keeps the shared prefix intact
                    yield p, self.adapter.extend(self.adapter.fork(base), list(p[len(prefix):]))
                bar.update(1)
        bar.close()

    def _check_length(self, n_input: int, what: str, text: str) -> None:
        limit = self.max_length
        if limit is not None and n_input > limit:
            head = text[:60].replace("\n", " ")
            raise ValueError(
                f"evalkit model {self.model_name!r}: {what} needs {n_input} tokens, more than its "
                f"max_length {limit}; evalkit never truncates (lm-eval's hf model would cut the "
                f"context from the left). Request starts: {head!r}")

    # -- loglikelihood -----------------------------------------------------------------------
    def _greedy_text(self, state: Any, n: int, memo: dict[int, str]) -> str:
        if n not in memo:
            memo[n] = self.adapter.generate(state, n, None)
        return memo[n]

    def _loglikelihood_tokens(self, requests: list[tuple[Any, list[int], list[int]]],
                              disable_tqdm: bool = False,
                              **kwargs: Any) -> list[tuple[float, bool]]:
        by_ctx: dict[tuple[int, ...], list[int]] = {}
        for i, (key, ctx_enc, cont_enc) in enumerate(requests):
            context = key[0] if key else self.tok_decode(ctx_enc[-40:])
            if not cont_enc:
                raise ValueError(f"evalkit model {self.model_name!r}: empty continuation after "
                                 f"context {context[-40:]!r}")
            # The model reads ctx + cont[:-1] (the last continuation token is only predicted).
            self._check_length(len(ctx_enc) + len(cont_enc) - 1, "a loglikelihood request", context)
            by_ctx.setdefault(tuple(ctx_enc), []).append(i)
        out: list[tuple[float, bool] | None] = [None] * len(requests)
        for ctx, state in self._states(list(by_ctx), "evalkit loglikelihood", disable_tqdm):
            idx = by_ctx[ctx]
            conts = [list(requests[i][2]) for i in idx]
            scores = self.adapter.score(state, conts)
            memo: dict[int, str] = {}
            for i, cont, lp in zip(idx, conts, scores):
                greedy = False
                if self.check_greedy:
                    text = self._greedy_text(state, len(cont), memo)
                    greedy = text in (self.tok_decode(cont), self.tok_decode(cont, False))
                out[i] = (float(lp), greedy)
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], out[i])
        return out  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        jobs: list[tuple[int, list[int], list[int]]] = []  # (request, context ids, scored ids)
        for r, req in enumerate(requests):
            (string,) = req.args
            tokens = self.tok_encode(string)
            if self.max_length is None:  # a state has no window: one pass over the whole text
                windows = [([self.prefix_token_id], tokens)] if tokens else []
            else:
                windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                    token_list=tokens, prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)]
            jobs.extend((r, ctx, cont) for ctx, cont in windows)
        pairs = [(None, ctx, cont) for _, ctx, cont in jobs]  # None: no per-window cache entry
        saved, self.check_greedy = self.check_greedy, False  # is_greedy is unused here
        try:
            scores = self._loglikelihood_tokens(pairs, disable_tqdm=disable_tqdm) if pairs else []
        finally:
            self.check_greedy = saved
        totals = [0.0] * len(requests)
        for (r, _, _), (lp, _) in zip(jobs, scores):
            totals[r] += lp
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # -- generation --------------------------------------------------------------------------
    def _gen_settings(self, gen_kwargs: dict) -> tuple[list[str], int]:
        if not isinstance(gen_kwargs, dict):
            raise ValueError(f"generation kwargs must be a dict, got {type(gen_kwargs).__name__}")
        kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
        if kwargs.get("do_sample"):
            raise ValueError(f"evalkit model {self.model_name!r} decodes greedily only; the task "
                             f"asks for sampling ({gen_kwargs})")
        ignored = sorted(set(kwargs) - _GREEDY_KEYS - self._ignored_warned)
        if ignored:
            self._ignored_warned.update(ignored)
            log.warning("evalkit model %r: ignoring generation kwargs %s (greedy decoding only)",
                        self.model_name, ignored)
        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False) \
            if self.eot_token_id is not None else None
        until = handle_stop_sequences(kwargs.get("until"), eos=eos)
        return until, int(kwargs["max_gen_toks"])

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        jobs = []
        for req in requests:
            context, gen_kwargs = req.args
            until, max_gen = self._gen_settings(gen_kwargs)
            ids = tuple(self._encode_prompt(context))
            if not ids:
                raise ValueError(f"evalkit model {self.model_name!r}: empty generation prompt")
            self._check_length(len(ids) + max_gen, f"a prompt of {len(ids)} tokens plus "
                               f"max_gen_toks={max_gen}", context)
            jobs.append((ids, until, max_gen))
        out: list[str | None] = [None] * len(requests)
        by_ids: dict[tuple[int, ...], list[int]] = {}
        for i, (ids, _, _) in enumerate(jobs):
            by_ids.setdefault(ids, []).append(i)
        for ids, state in self._states(list(by_ids), "evalkit generate_until", disable_tqdm):
            for i in by_ids[ids]:
                _, until, max_gen = jobs[i]
                text = self.adapter.generate(state, max_gen, until)
                out[i] = postprocess_generated_text(text, until, None)
                self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
        return out  # type: ignore[return-value]

    # -- chat and provenance -----------------------------------------------------------------
    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"evalkit model {self.model_name!r}: its tokenizer has no chat "
                             f"template; run without --apply_chat_template")
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt)

    def get_model_info(self) -> dict:
        n_params = self.adapter.num_parameters
        return {"evalkit_model": self.model_name,
                "evalkit_options": {k: str(v) for k, v in self.options.items()},
                "evalkit_identity": self.adapter.identity(),
                "model_num_parameters": n_params() if n_params is not None else -1}

