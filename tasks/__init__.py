"""Built-in task plugins, installed as `evalkit.tasks`.

Each `*.yaml` file here is a task spec (see evalkit.taskspec) that points at a generator:
needle.py (needles in a haystack), multikey.py (key -> value facts, load sweeps, MQAR-like),
conversation.py (facts stated and updated in a chat). common.py holds the shared haystacks,
exact-length fitting, and the stop convention. data/ holds the public-domain haystack text.
build_tokenizer.py builds the shared tiny tokenizer in model_adapters/tiny/tokenizer/.
"""
