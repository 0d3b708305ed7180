"""Served models: an OpenAI-compatible completions server (vLLM, SGLang, llama.cpp) behind the
evalkit adapter protocol. client.py speaks HTTP; adapter.py is the protocol; state.py reads the
state's kind and bytes from the model's config."""
