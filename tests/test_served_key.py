"""Issue 59's hostile review, the API key's findings, each as the review reproduced it: a fake
OpenAI-compatible server of the test's own on 127.0.0.1 (test_served_client.py's `Fake`), the
real client and runner.

    11  the key never reaches an environment proxy: a server on this machine is found by
        resolving its host (127.1, 0.0.0.0, [::ffff:127.0.0.1], "localhost.", the host name,
        2130706433), and a plain-http server is never proxied with a key
    12  every text from a server is redacted of the key before it is stored or printed
    13  URL path parameters (/v1;token=...) are refused like a query
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from evalkit.model_adapters.served.api_key import REDACTED
from evalkit.model_adapters.served.client import Client, ServerError
from evalkit.model_adapters.served.urls import clean_url, on_this_machine, public_url
from helpers import TINY_TOKENIZER
from test_served_client import BODY, Fake, bounded, client
from test_served_hostile import KEY, KEY_ENV, _ok, _proxy_env
from test_served_runner import run, suite_file

# -- 11: loopback by resolving, and no key through a proxy -------------------------------------
SPELLINGS = ["127.1", "0.0.0.0", "[::ffff:127.0.0.1]", "localhost.", "2130706433", "HOSTNAME",
             "127.0.0.1", "localhost"]


@pytest.mark.parametrize("host", SPELLINGS)
def test_this_machine_spelled_otherwise_never_goes_through_a_proxy(monkeypatch, host):
    """The review saw the proxy receive `Authorization: Bearer <key>` for each of these."""
    host = socket.gethostname() if host == "HOSTNAME" else host
    with Fake(lambda h, b: h.json(502, {"error": "the proxy"})) as proxy, Fake(_ok) as srv:
        _proxy_env(monkeypatch, proxy)
        url = f"http://{host}:{srv.server_address[1]}/v1"
        assert on_this_machine(url)
        c = Client([url], api_key_env=KEY_ENV, timeout_s=3.0, retries=0)
        out, _ = bounded(lambda: c.post_json("/completions", BODY))
        # the host name may resolve to an address the fake (on 127.0.0.1) does not listen on:
        # then the request fails, but directly, never through the proxy
        assert proxy.hits == 0 and not proxy.headers_seen, proxy.headers_seen
        if not isinstance(out, BaseException):
            assert srv.hits == 1 and srv.headers_seen[0]["Authorization"] == f"Bearer {KEY}"


def test_a_plain_http_server_elsewhere_gets_no_proxy_with_a_key(monkeypatch):
    """Not this machine (192.0.2.1, TEST-NET-1: never reached): with a key, a plain-http
    request would hand it to the proxy in the clear, so it goes direct (and fails to connect);
    without a key the proxy is used, as the environment asks; trust_env=true with a key on
    http is refused, naming why."""
    far = "http://192.0.2.1:9/v1"
    assert not on_this_machine(far)
    with Fake(lambda h, b: h.json(502, {"error": "the proxy"})) as proxy:
        _proxy_env(monkeypatch, proxy)
        c = Client([far], api_key_env=KEY_ENV, timeout_s=1.0, retries=0)
        err, _ = bounded(lambda: c.post_json("/completions", BODY))
        assert isinstance(err, ServerError) and proxy.hits == 0, err
        c = Client([far], timeout_s=2.0, retries=0)
        err, _ = bounded(lambda: c.post_json("/completions", BODY))
        assert isinstance(err, ServerError) and err.status == 502 and proxy.hits == 1, err
        assert "Authorization" not in proxy.headers_seen[0]
        with pytest.raises(ValueError, match="a proxy would read the key in the clear"):
            Client([far], api_key_env=KEY_ENV, trust_env=True)


def test_names_that_do_not_resolve_or_are_elsewhere_are_not_this_machine():
    assert not on_this_machine("http://no-such-host.invalid:8000/v1")
    assert not on_this_machine("http://192.0.2.7:8000/v1")
    assert not on_this_machine("http://[2001:db8::1]:8000/v1")
    assert on_this_machine("http://[::1]:8000/v1") and on_this_machine("http://[::]:1/v1")


# -- 12: the key redacted from every server text ------------------------------------------------
def _echo_key(status: int, at: int = 100):
    def reply(h, body) -> None:  # an error page that quotes the request's headers
        said = "x" * at + f" your header was {h.headers['Authorization']} and more" * 3
        h.raw(status, said.encode(), {"Content-Type": "text/plain"})
    return reply


@pytest.mark.parametrize("at", [100, 270])
@pytest.mark.parametrize("status", [403, 503])
def test_an_error_body_that_echoes_the_key_is_redacted(monkeypatch, status, at):
    """The key inside the 300 characters an error keeps, or straddling them (at 270 the key
    starts at 294): no part of it is left."""
    monkeypatch.setenv(KEY_ENV, KEY)
    with Fake(_echo_key(status, at)) as srv:
        err, _ = bounded(lambda: client(srv.url, api_key_env=KEY_ENV).post_json("/completions",
                                                                                BODY))
    assert isinstance(err, ServerError), err
    assert KEY[:6] not in str(err) and f"HTTP {status}" in str(err), str(err)
    assert REDACTED in str(err) or at > 200


def test_answers_and_model_lists_are_redacted(monkeypatch):
    """A key split over two stream chunks, in a scoring answer, JSON-escaped, in /v1/models:
    what the caller gets holds none of it."""
    monkeypatch.setenv(KEY_ENV, KEY)
    half = len(KEY) // 2

    def reply(h, body):
        if body.get("stream"):
            h.sse([" the key is " + KEY[:half], KEY[half:] + " ok"])
        else:
            h.raw(200, ('{"choices": [{"index": 0, "text": "' + KEY.replace("-", "\\u002d")
                        + '"}]}').encode(), {"Content-Type": "application/json"})

    with Fake(reply, models=[{"id": "m", "root": f"/models/{KEY}"}]) as srv:
        c = client(srv.url, api_key_env=KEY_ENV)
        text, last, _ = c.stream_completion(BODY)
        scored = c.post_json("/completions", BODY)
        listing = c.get_json("/models")
    assert text == f" the key is {REDACTED} ok"
    assert KEY not in json.dumps([last, scored, listing])
    assert scored["choices"][0]["text"] == REDACTED
    assert listing["data"][0]["root"] == f"/models/{REDACTED}"


@pytest.mark.parametrize("key,url,why", [
    ("EMPTY", "http://127.0.0.1:9/v1", "shorter than 8 characters"),
    ("sk-with a-space-123", "http://127.0.0.1:9/v1", "holds a space"),
    ("sk-newline\nX-Leak: 1", "http://127.0.0.1:9/v1", "holds a space"),
    ("sk-in-the-path-0123", "http://127.0.0.1:9/sk-in-the-path-0123/v1", "also in the URL")])
def test_a_key_that_cannot_be_kept_in_the_header_is_refused(monkeypatch, key, url, why):
    """Too short to redact without editing answers, not a header's characters (httpx's refusal
    would quote it), or already in the URL: refused, without repeating it."""
    monkeypatch.setenv(KEY_ENV, key)
    with pytest.raises(ValueError, match=why) as e:
        Client([url], api_key_env=KEY_ENV)
    assert key not in str(e.value)


def test_evalkit_run_stores_and_prints_no_key(tmp_path, monkeypatch, capsys):
    """The review's case: a 403 whose body echoed the key put it into stdout and samples.jsonl."""
    monkeypatch.setenv(KEY_ENV, KEY)

    def reply(h, body):
        if body.get("stream"):
            _echo_key(403)(h, body)
        else:  # the adapter's load-time scoring check
            h.json(200, {"choices": [{"index": 0, "text": "", "prompt_logprobs": [None] + [
                {str(t): {"logprob": -1.0}} for t in body["prompt"][1:]]}]})

    with Fake(reply) as srv:
        suite = suite_file(tmp_path, srv.url, samples=1, lengths=(64,), depths=(0.5,),
                           api_key_env=KEY_ENV)
        rc, rows = run(suite, tmp_path / "run")
    out = capsys.readouterr()
    assert rc == 1 and rows and all("HTTP 403" in r["error"] for r in rows), rows
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert files and not [p for p in files if KEY[:6].encode() in p.read_bytes()]
    assert KEY[:6] not in out.out + out.err and REDACTED in rows[0]["error"]


# -- 13: path parameters refused like a query ---------------------------------------------------
@pytest.mark.parametrize("url", ["http://127.0.0.1:9/v1;token=s3cr3t-semi",
                                 "http://127.0.0.1:9/v1;s3cr3t-semi",
                                 "http://127.0.0.1:9/v1%3Btoken=s3cr3t-semi",
                                 "http://127.0.0.1:9/v1,token=s3cr3t-semi",
                                 "http://127.0.0.1:9/v1/&token=s3cr3t-semi",
                                 "http://127.0.0.1:9/v1/@s3cr3t-semi"])
def test_path_parameters_are_refused_without_repeating_them(url):
    with pytest.raises(ValueError) as e:
        clean_url(url)
    assert "path parameter" in str(e.value) and "s3cr3t" not in str(e.value)
    assert "s3cr3t" not in public_url(url)


def test_evalkit_run_refuses_a_path_parameter_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "evalkit", "run", "--models",
                        "served:http://127.0.0.1:9/v1;token=s3cr3t-semi", "--model-args",
                        f"tokenizer={TINY_TOKENIZER}", "--tasks", "needle", "--lengths", "256",
                        "--output", str(out)], capture_output=True, text=True, timeout=120,
                       env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert p.returncode != 0 and "its URL holds credentials or a query string" in p.stderr, \
        p.stderr
    assert "s3cr3t" not in p.stdout + p.stderr and not out.exists()
