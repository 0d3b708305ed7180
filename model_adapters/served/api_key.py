"""The served client's API key: read from an environment variable, checked, and redacted from
every text a server sends back (error pages, answers, model lists) before anything stores or
prints it. The key itself travels only as the Authorization header (client.py)."""
from __future__ import annotations

import json
import os
from typing import Any, Sequence
from urllib.parse import quote

MIN_KEY_CHARS = 8         # a shorter key could be an everyday word: redacting it would edit answers
REDACTED = "<api key redacted>"


class ApiKey:
    """`env` names the variable; `key` is None without one (then nothing is redacted)."""

    def __init__(self, env: str | None = None, key: str | None = None) -> None:
        self.env, self.key = env, key
        self.forms = _key_forms(key) if key else []

    @classmethod
    def from_env(cls, env: str | None, base_urls: Sequence[str]) -> "ApiKey":
        """The key in $`env` (none when `env` is unset), refused with a line that never quotes
        it: unset, unprintable in a header, also in a URL, or too short to redact safely."""
        if not env:
            return cls()
        key = os.environ.get(env)
        if not key:
            raise ValueError(f"served: api_key_env={env}: that environment variable "
                             f"is not set (it should hold the server's API key)")
        if not (key.isascii() and key.isprintable()) or any(c.isspace() for c in key):
            # a header cannot carry it as is, and httpx's refusal would quote it
            raise ValueError(f"served: api_key_env={env}: the key holds a space, a "
                             f"control or a non-ASCII character (not repeated here); an API "
                             f"key is printable ASCII")
        if any(key in u for u in base_urls):
            raise ValueError(f"served: api_key_env={env}: the key is also in the "
                             f"URL (not repeated here); give the API root alone")
        if len(key) < MIN_KEY_CHARS:
            raise ValueError(f"served: api_key_env={env}: the key is shorter than "
                             f"{MIN_KEY_CHARS} characters; every text a server sends back is "
                             f"redacted of it, which for so short a key would edit the "
                             f"model's answers (a server without a key needs no api_key_env)")
        return cls(env, key)

    def redact(self, text: str) -> str:
        """`text` with the key (as sent, JSON-escaped or percent-encoded) replaced by REDACTED."""
        if not self.forms or not isinstance(text, str):
            return text
        for form in self.forms:
            text = text.replace(form, REDACTED)
        return text

    def parsed(self, data: bytes) -> Any:
        """JSON `data` parsed and scrubbed, walking it only where the key could be in it: a
        form of it in the bytes, or an escape (\\u...; \\/ for a key with a /) that could
        spell it otherwise. Answers of 100k prompt_logprobs rows are not walked for nothing."""
        obj = json.loads(data)
        if not self.forms:
            return obj
        if (any(f.encode() in data for f in self.forms) or b"\\u" in data
                or ("/" in self.key and b"\\/" in data)):
            return self.scrub(obj)
        return obj

    def scrub(self, obj: Any) -> Any:
        """A parsed JSON answer with every string (keys too) redacted of the key."""
        if not self.forms:
            return obj
        if isinstance(obj, str):
            return self.redact(obj)
        if isinstance(obj, list):
            return [self.scrub(v) for v in obj]
        if isinstance(obj, dict):
            return {self.redact(k): self.scrub(v) for k, v in obj.items()}
        return obj


def _key_forms(key: str) -> list[str]:
    """The ways a server may write `key` back: as sent, JSON-escaped (with / as \\/ too),
    percent-encoded; longest first, so a longer form is replaced whole."""
    escaped = json.dumps(key)[1:-1]
    forms = {key, escaped, escaped.replace("/", "\\/"), quote(key, safe="")}
    return sorted(forms, key=len, reverse=True)
