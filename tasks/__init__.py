"""Built-in task plugins, installed as `evalkit.tasks`.

Each `*.yaml` file here is a task spec (see evalkit.taskspec) that points at a generator:
needle.py (needles in a haystack), multikey.py (key -> value facts, load sweeps),
conversation.py (facts stated and updated in a chat), mqar.py (Zoology's multi-query
associative recall on token ids). They build their probes with the kit in evalkit.probes
(haystacks, value makers, exact-length fitting, the stop convention).
"""
