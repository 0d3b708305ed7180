"""A served model's base URL: checked (clean_url), shown (public_url), placed (is_loopback).

A URL may carry secrets, in credentials (user:password@) or a query (?token=...): such a URL
is refused, and no message here repeats any part of it, so a secret never reaches a log, an
error line, a run folder or a board. What may be shown or stored is scheme://host[:port]/path.
"""
from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def clean_url(url: str) -> str:
    """`url` without a trailing slash, checked to be http(s)://host[:port]/path. Credentials,
    a query or a fragment are refused, and no message repeats the URL: they may hold a secret."""
    text = str(url).strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:  # a bad port or host: urllib's message would quote it
        raise ValueError("base_url: not a URL with a valid host and port; expected "
                         "http://HOST:PORT/v1 (an OpenAI-compatible server's API root)") from None
    if "@" in parts.netloc:
        raise ValueError("base_url: put no credentials in the URL (user:password@ is refused "
                         "and not repeated here); pass the key through api_key_env=NAME (the "
                         "environment variable holding it)")
    if parts.query or parts.fragment or "?" in text or "#" in text:
        raise ValueError("base_url: a query string or fragment (?... or #...) is refused and not "
                         "repeated here (it may hold a token, and is never sent); give the API "
                         "root alone, http://HOST:PORT/v1, and the key through api_key_env=NAME")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("base_url: expected http://HOST:PORT/v1 or https://... (an "
                         "OpenAI-compatible server's API root)")
    return public_url(text)


def public_url(url: str) -> str:
    """`url` as it may be shown, stored or used as a name: scheme://host[:port]/path, without
    credentials, query or fragment. Never raises (an unreadable URL gives a placeholder)."""
    try:
        parts = urlsplit(str(url).strip())
        port = parts.port
    except ValueError:
        return "<unreadable URL>"
    if not parts.hostname:
        return "<unreadable URL>"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    scheme = f"{parts.scheme}://" if parts.scheme else ""
    return f"{scheme}{host}{f':{port}' if port else ''}{parts.path.rstrip('/')}"


def is_loopback(url: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: a server on this machine."""
    host = urlsplit(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
