"""Softmax-attention adapter: any local Hugging Face causal LM folder or .gguf file, KV cache as state.

Registered as the path loader "hf" (`load_model("hf:/path/to/folder")`, or a bare path whose
config is not GLA); a folder whose cache would hold recurrent states or conv tails (Mamba, RWKV,
hybrids) is handed to `evalkit.model_adapters.recurrent.RecurrentAdapter`. Local files only;
`trust_remote_code` stays off unless the caller passes it; folders load from safetensors only. GGUF files go through transformers' GGUF loader (dequantised
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

Memory policies (the twins' window, any softmax model)
-----------------------------------------------------
`window=W,sinks=S` gives every KV head the twins' attention: the first S tokens and the last W
(the query counted), so `load_model("smollm2-135m", window=64, sinks=4)` is the board's
smollm2-135m-swa-w64-s4 reference (tests/test_memory_policy.py). Note the two meanings of W:
with `sinks` (or `keep_heads`) it is the twins' window; alone, or with `sink`, the KV budget
above. `keep_heads=K` keeps the K best KV heads by retrieval score whole and bounds the rest
(DuoAttention); the scores come from `heads=FILE` (an `evalkit heads` record of the same
weights) or are measured at load with the selection defaults and recorded in the identity.
State bytes are what each head keeps (whole heads: every token; bounded: at most S + W - 1).
Module `policy`; the record's format: `evalkit.heads_file` (core, beside the probes that measure it).

Length limit: the model never processes a token at a position >= max_length (default: the
config's max_position_embeddings); a prompt, extension, scored continuation or generation that
would need one raises instead of being cut.

Modules: `adapter` (SoftmaxAdapter and the "hf" loader), `kv_cache` (cache copies, byte
accounting, window mask and eviction), `policy` (memory policies), `describe` (figures from a config, no weights).
"""
from evalkit.model_adapters.softmax.adapter import SoftmaxAdapter
from evalkit.model_adapters.softmax.describe import describe_checkpoint, describe_row
from evalkit.model_adapters.softmax.kv_cache import KVProfile, kv_profile, matched_window

__all__ = ["KVProfile", "SoftmaxAdapter", "describe_checkpoint", "describe_row",
           "kv_profile", "matched_window"]
