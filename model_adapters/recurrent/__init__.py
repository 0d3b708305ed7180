"""Recurrent and hybrid transformers models behind the "hf" loader: every causal LM whose cache
holds recurrent states or conv tails (beside attention or not), its state counted by role from
the tensors it holds, never from a list of family names.

Modules: `discover` (every such family the installed transformers ships), `family` (which adapter
a config needs), `forward` (one forward through whatever holds the state: a cache, a tensor list,
the model's modules), `stepwise` (the load-time probe for models that drop their state on a
multi-token forward), `adapter` (RecurrentAdapter), `formula` (state bytes by role from a config),
`measure` (state bytes from a prefill of a random model), `tiny_configs` and `family_table` (the
README's family table, measured on tiny models).

Nothing is imported here: the adapter builds on the softmax package's loader, which in turn
reads `family` and `measure` for memory matching, so eager imports would make a cycle.
"""
