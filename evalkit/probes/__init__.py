"""The probe-building kit: facts and questions in, an exact-length measured Probe out.

A generator draws its facts, values and haystack start from `random.Random(seed)` and hands
them to `assemble()`, which lays the facts out at the requested depth, fits the haystack
gaps to the exact length, renders the probe for real and measures every field from the token
ids. Modules: words (word lists), haystack (texts and word streams), values (value and key
makers), fit (token measuring and gap fitting), layout (where items go), build (assemble).

Every built-in generator is a pure function of (params, seed, tokenizer, length, depth, load).
All random choices are drawn up front from `random.Random(seed)`, never from the global RNG
and never from the tokenizer. So one seed states the same facts under every tokenizer,
length and depth, and only the haystack around them changes.

Stop convention (runners and scorers rely on it)
------------------------------------------------
An answer continues the question's answer prefix as " " + value. A multi-value answer joins
its values in order with ", ". No value ever holds ".", ",", or a newline.

Every fact ends with "." right after its value(s). A model that copies the fact therefore
ends its answer by itself. Generation stops at the first string in
evalkit.render.ANSWER_STOP = ("\\n", ".") or at the tokenizer's end-of-sequence or
end-of-turn token (`<|end|>` in the tiny tokenizer). The prediction is the text before the
stop, stripped.

Length, tolerance, depth
------------------------
`length` is the token count of the final question's whole prompt, as defined by
`evalkit.render`: each segment is tokenized on its own, then the ids are joined. Fitting only
ever measures real token ids. First, the word count of each haystack gap is set by galloping
from an estimate taken from token offsets. Then the gap's start is moved a word at a time until
the count is exact.
- `meta.actual_length` is the real rendered length. Nearly always it equals the target.
  It always lies within `meta.tolerance` = tolerance(length) = max(2, length // 200) tokens.
- Every fact is its own context segment. So `fact_token`, the fact's start offset in the
  prompt ids, is exact. `Question.depth` = fact_token / (context_tokens - fact_tokens): the
  share of the other context tokens that come before the fact. It is 0.0 when the fact opens
  the context and 1.0 when the fact is the last thing before the question. It equals
  fact_token / context_tokens up to the fact's own length.
- Chat probes: the fact is the exchange that states it: the user turn (fact_token points at
  its template header) plus the assistant's acknowledgement. fact_tokens counts both, so
  depth 1.0 means that exchange is the last one before the question. Turns come in whole
  exchanges, so chat depths are exact only to within one exchange of about a dozen tokens:
  within 1 % from about 2K tokens on, a few % at 256.
- When facts fill most of the context (high loads), the asked fact can only sit where there
  is room for it. Question.depth always records where it actually is.
"""
from evalkit.probes.build import Ask, assemble, check_grid_point, probe_id, tolerance
from evalkit.probes.haystack import Haystack, WordStream, builtin_haystack, start_stream
from evalkit.probes.layout import Item, Layout, depth_order
from evalkit.probes.values import (candidates, common_words, lookalike_numbers, lookalike_word,
                                   make_values, pseudo_word)

__all__ = ["Ask", "Haystack", "Item", "Layout", "WordStream", "assemble", "builtin_haystack",
           "candidates", "check_grid_point", "common_words", "depth_order", "lookalike_numbers",
           "lookalike_word", "make_values", "probe_id", "pseudo_word", "start_stream", "tolerance"]
