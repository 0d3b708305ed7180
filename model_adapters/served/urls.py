"""A served model's base URL: checked (clean_url, holds_secret), shown (public_url), placed
(on_this_machine).

A URL may carry secrets, in credentials (user:password@), a query (?token=...), a fragment or
path parameters (/v1;token=...): such a URL is refused, and no message here repeats any part of
it, so a secret never reaches a log, an error line, a run folder or a board. A path is the API
root's plain segments alone (letters, digits, - . _ ~ /): anything else in it (; , = % ...)
is where a token hides. What may be shown or stored is scheme://host[:port]/path.
"""
from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import SplitResult, urlsplit

# an API root's path: /v1, /openai/v1, ... (RFC 3986's unreserved characters and "/")
_PATH = re.compile(r"[A-Za-z0-9._~/-]*", re.ASCII)


def _split(text: str) -> SplitResult | None:
    try:
        parts = urlsplit(text)
        parts.port  # a bad port raises here
    except ValueError:
        return None
    return parts


def holds_secret(url: str) -> bool:
    """Whether `url` has a place a secret can hide: credentials, a query, a fragment, path
    parameters or any other character than a plain path's."""
    text = str(url).strip()
    parts = _split(text)
    if parts is None:
        return "@" in text or "?" in text or "#" in text or ";" in text
    return ("@" in parts.netloc or bool(parts.query or parts.fragment) or "?" in text
            or "#" in text or not _PATH.fullmatch(parts.path))


def clean_url(url: str) -> str:
    """`url` without a trailing slash, checked to be http(s)://host[:port]/path. Credentials,
    a query, a fragment or path parameters are refused, and no message repeats the URL: they
    may hold a secret."""
    text = str(url).strip()
    parts = _split(text)
    if parts is None:  # a bad port or host: urllib's message would quote it
        raise ValueError("base_url: not a URL with a valid host and port; expected "
                         "http://HOST:PORT/v1 (an OpenAI-compatible server's API root)")
    if "@" in parts.netloc:
        raise ValueError("base_url: put no credentials in the URL (user:password@ is refused "
                         "and not repeated here); pass the key through api_key_env=NAME (the "
                         "environment variable holding it)")
    if holds_secret(text):
        raise ValueError("base_url: a query string, fragment or path parameter (?... #... ;... "
                         "or any character but letters, digits, - . _ ~ / in the path) is "
                         "refused and not repeated here (it may hold a token, and is never "
                         "sent); give the API root alone, http://HOST:PORT/v1, and the key "
                         "through api_key_env=NAME")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("base_url: expected http://HOST:PORT/v1 or https://... (an "
                         "OpenAI-compatible server's API root)")
    return public_url(text)


def public_url(url: str) -> str:
    """`url` as it may be shown or stored: scheme://host[:port]/path, without credentials,
    query, fragment or path parameters (a path with other characters than a plain one's
    shows as <path withheld>). Never raises (an unreadable URL gives a placeholder)."""
    parts = _split(str(url).strip())
    if parts is None or not parts.hostname:
        return "<unreadable URL>"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    scheme = f"{parts.scheme}://" if parts.scheme else ""
    path = parts.path.rstrip("/") if _PATH.fullmatch(parts.path) else "/<path withheld>"
    return f"{scheme}{host}{f':{parts.port}' if parts.port else ''}{path}"


def on_this_machine(url: str) -> bool:
    """Whether every address `url`'s host resolves to is this machine's: loopback (127/8,
    ::1, IPv4-mapped ::ffff:127.x), unspecified (0.0.0.0, ::: connecting to it reaches this
    machine) or an address of one of its interfaces (its host name's). Decided by resolving,
    never by spelling: 127.1, 2130706433, "localhost." and the host name are all loopback
    spelled otherwise. A name that does not resolve is not this machine, except localhost's
    (RFC 6761 reserves it, with or without the final dot)."""
    parts = _split(str(url).strip())
    host = parts.hostname if parts is not None else None
    if not host:
        return False
    if host.rstrip(".") == "localhost" or host.rstrip(".").endswith(".localhost"):
        return True  # RFC 6761: loopback whatever a resolver says (some know no "localhost.")
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(_local(family, addr) for family, _, _, _, addr in infos)


def _local(family: int, sockaddr: tuple) -> bool:
    ip = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    for a in (ip, mapped):
        if a is not None and (a.is_loopback or a.is_unspecified):
            return True
    try:  # an address only this machine can bind is one of its interfaces'
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((sockaddr[0], 0, *sockaddr[2:]))
        return True
    except OSError:
        return False
