"""Served models: an OpenAI-compatible completions server (vLLM, SGLang, llama.cpp) behind the
evalkit adapter protocol. client.py speaks HTTP; urls.py checks base URLs (no secret in them);
adapter.py is the protocol; state.py reads the state's kind and bytes from the model's config."""
