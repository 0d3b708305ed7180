"""A cache key holds every input of a score, and a load is what was offered (issue 59, the
second hostile review): each test below is one of its findings, reproduced as the review did,
against the fake one-slot server of test_served_runner.py (on 127.0.0.1, started and stopped
by the test) where a server is needed.

- 3: `--resume` of a finished open-loop run with failures re-sent only the failed requests, at
  their old offsets, so the failures vanished under a load a fraction of the label's; now the
  whole schedule is offered again.
- 4: with a shared --cache-dir, an open-loop run reused samples measured under another
  schedule (the same rate over a smaller plan); 10: the key carried the rate to 6 significant
  figures, so poisson:12.34567 and :12.34571 shared entries. Now the key holds the schedule
  exactly.
- 7: a --plugins model edited between two runs answered from the first run's cache; also when
  the edit is in a module the plugin imports.
- 8 (resume side): a served model redeployed under the same name (its /v1/models card
  changed) was resumed into the same run and answered from the cache.
- 9: the weights hash was remembered on (path, size, mtime): a same-size overwrite with the
  mtime put back kept the old hash.
- Mamba-2 identity: a served model's hash held its tokenizer option's path, so the same folder
  in two clones was two models; now the folder is keyed by its content.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

from helpers import TINY_TOKENIZER
from test_served_runner import OneSlot, run, suite_file

REPO = Path(__file__).resolve().parents[1]


def _folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _sent(srv: OneSlot) -> int:
    return len(srv.greedy)


# -- 3: a resumed open loop offers its whole schedule -----------------------------------------

def test_resume_of_an_open_loop_run_with_failures_offers_the_whole_schedule(tmp_path, capsys):
    refuse = {2, 5, 7}  # a 400 is not retried: three failures in the first invocation
    with OneSlot(0.02, fault=lambda n: (400, 0.0) if n in refuse else None) as srv:
        suite = suite_file(tmp_path, srv.url, samples=2, concurrency=1)
        rc, first = run(suite, tmp_path / "run", "--arrivals", "poisson:4")
        assert rc == 1 and sum(bool(r["error"]) for r in first) == 3 and len(first) == 8
        said = capsys.readouterr().err
        srv.fault = lambda n: None
        before = _sent(srv)
        rc, again = run(suite, tmp_path / "run", "--arrivals", "poisson:4", "--resume")
        resent = _sent(srv) - before
        assert rc == 0 and resent == 8  # not the three failed requests alone
        assert "3 of 8 requests failed; they count as measured" in said
        assert "8 to send here" in capsys.readouterr().err
        # the same schedule: each request at the due time it had
        assert ({(r["probe_hash"], r["question"]): r["due_s"] for r in again}
                == {(r["probe_hash"], r["question"]): r["due_s"] for r in first})
        # a finished schedule without failures is reused whole
        rc, third = run(suite, tmp_path / "run", "--arrivals", "poisson:4", "--resume")
        assert rc == 0 and _sent(srv) - before == 8
    assert [r["latency_s"] for r in third] == [r["latency_s"] for r in again]


# -- 4 and 10: the schedule, exactly, in the key ------------------------------------------------

def test_a_shared_cache_never_reuses_a_sample_of_another_schedule(tmp_path):
    """The same rate over a smaller plan is another schedule (other due times, other
    neighbours); so is a rate 4e-5 away. The same schedule again is reused whole."""
    cache = ["--cache-dir", str(tmp_path / "cache")]
    with OneSlot(0.02) as srv:
        small = suite_file(_folder(tmp_path / "s"), srv.url, samples=2, lengths=(64,), concurrency=1)
        whole = suite_file(_folder(tmp_path / "w"), srv.url, samples=2, lengths=(64, 128), concurrency=1)
        sent = []
        for suite, out, rate in ((small, "a", "poisson:12.34567"),
                                 (whole, "b", "poisson:12.34567"),   # 4: a larger plan
                                 (whole, "c", "poisson:12.34571"),   # 10: another rate
                                 (whole, "d", "poisson:12.34571")):  # the same: reused
            before = _sent(srv)
            rc, rows = run(suite, tmp_path / out, "--arrivals", rate, *cache)
            assert rc == 0, out
            sent.append(_sent(srv) - before)
    assert sent == [4, 8, 8, 0]


# -- 8, resume side: a redeployed served model --------------------------------------------------

def test_a_redeployed_served_model_is_refused_on_resume_and_not_answered_from_cache(
        tmp_path, capsys):
    card = {"id": "fake", "max_model_len": 4096, "root": "weights-2026-01", "owned_by": "me"}
    with OneSlot(0.01) as srv:
        srv.models = [dict(card)]
        suite = suite_file(tmp_path, srv.url, samples=1, concurrency=1)
        cache = ["--cache-dir", str(tmp_path / "cache")]
        assert run(suite, tmp_path / "run", *cache)[0] == 0
        done = (tmp_path / "run" / "samples.jsonl").read_bytes()
        srv.models = [{**card, "root": "weights-2026-02"}]  # the same name, other weights
        capsys.readouterr()
        before = _sent(srv)
        rc, _ = run(suite, tmp_path / "run", "--resume", *cache)
        err = capsys.readouterr().err
        assert rc == 2 and _sent(srv) == before, err
        assert "is not the model this run started with" in err and "Traceback" not in err
        assert (tmp_path / "run" / "samples.jsonl").read_bytes() == done
        rc, rows = run(suite, tmp_path / "new", *cache)  # a new run: nothing from the cache
        assert rc == 0 and _sent(srv) - before == len(rows) == 4


# -- Mamba-2: the tokenizer folder by content, not by path --------------------------------------

def test_a_served_models_hash_is_its_folders_content_not_its_path(tmp_path):
    """The same tokenizer folder in two places (two clones) is one model: the second run is
    answered from the first's cache. The folder edited is another model."""
    copies = [shutil.copytree(TINY_TOKENIZER, tmp_path / where / "tok") for where in ("a", "b")]
    cache = ["--cache-dir", str(tmp_path / "cache")]
    hashes, sent = [], []
    with OneSlot(0.01) as srv:
        for i, tok in enumerate([*copies, copies[1]]):
            if i == 2:  # edit the second copy in place
                cfg = tok / "tokenizer_config.json"
                cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "model_max_length": 77}))
            suite = suite_file(_folder(tmp_path / f"s{i}"), srv.url, samples=1, lengths=(64,),
                               concurrency=1, tokenizer=str(tok))
            before = _sent(srv)
            rc, rows = run(suite, tmp_path / f"r{i}", *cache)
            assert rc == 0 and len(rows) == 2
            hashes.append({r["model_hash"] for r in rows})
            sent.append(_sent(srv) - before)
    assert hashes[0] == hashes[1] != hashes[2] and len(hashes[0]) == 1
    assert sent == [2, 0, 2]


# -- 7: a plugin's code, and what it imports, in the key ----------------------------------------

PLUGIN = '''
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
import plugin_helper  # a neighbour: its code is the plugin's too

from evalkit.model_adapters.models import MODELS, register_model
from evalkit.model_adapters.reference import InductionAdapter
from evalkit.tokenization import load_tokenizer

ANSWER = None  # None: the oracle's own answer


class Edited(InductionAdapter):
    def generate(self, state, max_new_tokens, stop=None):
        said = ANSWER if ANSWER is not None else super().generate(state, max_new_tokens, stop)
        return plugin_helper.shape(said)


if "edited-oracle" not in MODELS:
    @register_model("edited-oracle", kind="reference", state_kind="memory",
                    description="an oracle whose code the test edits")
    def make(path, *, tokenizer):
        return Edited("edited-oracle", load_tokenizer(tokenizer))
'''


def test_an_edited_plugin_or_its_import_is_not_answered_from_the_cache(tmp_path):
    """Each run is its own process, as a user's runs are: the plugin, then the module it
    imports, edited between runs sharing one --cache-dir; each run says what its code says."""
    from runner_support import TOY_TASKS, build_tokenizer

    tok = build_tokenizer(tmp_path / "tok")
    folder = tmp_path / "plugin"
    folder.mkdir()
    plugin, helper = folder / "edited_plugin.py", folder / "plugin_helper.py"
    plugin.write_text(PLUGIN)
    helper.write_text("def shape(said):\n    return said\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "models": [{"name": "edited", "spec": "edited-oracle",
                    "options": {"tokenizer": str(tok)}}],
        "tasks": ["toy_recall"], "include": [str(TOY_TASKS)], "plugins": [str(plugin)],
        "lengths": [64], "depths": [0.5], "loads": [1], "samples": 2, "seed": 0}))

    def evaluate(out: str) -> list[dict]:
        proc = subprocess.run(
            [sys.executable, "-m", "evalkit", "run", "--config", str(suite), "--output",
             str(tmp_path / out), "--cache-dir", str(tmp_path / "cache"), "--no-progress"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,
            env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        rows = [json.loads(l) for l in (tmp_path / out / "samples.jsonl").read_text().splitlines()]
        assert rows and all(r["error"] is None for r in rows)
        return rows

    right = evaluate("first")
    assert all(r["scores"]["exact_match"] == 1.0 for r in right)
    again = evaluate("again")  # nothing changed: answered from the cache
    assert [r["latency_s"] for r in again] == [r["latency_s"] for r in right]
    plugin.write_text(PLUGIN.replace("ANSWER = None", "ANSWER = ' 0000'"))
    wrong = evaluate("plugin-edited")
    assert all(r["scores"]["exact_match"] == 0.0 for r in wrong)
    assert {r["prediction"] for r in wrong} == {" 0000"}
    helper.write_text("def shape(said):\n    return ' 9999'\n")
    assert {r["prediction"] for r in evaluate("helper-edited")} == {" 9999"}
    prov = json.loads((tmp_path / "helper-edited" / "provenance.json").read_text())
    assert any(u.startswith("plugin_helper.py:") for u in prov["user_code"])


# -- 9: the weights hash -------------------------------------------------------------------------

_HASH = "from evalkit.model_adapters.weights import file_sha256; import sys; print(file_sha256(sys.argv[1]))"


def test_a_same_size_overwrite_with_the_mtime_put_back_is_hashed_again(tmp_path, monkeypatch):
    """In this process (its memo) and in a new one (the memo on disk under $EVALKIT_CACHE)."""
    import hashlib
    import time

    from evalkit.model_adapters import weights

    monkeypatch.setenv("EVALKIT_CACHE", str(tmp_path / "ekcache"))
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"a" * 4096)
    st = f.stat()
    time.sleep(0.05)

    def fresh_process() -> str:
        return subprocess.run([sys.executable, "-c", _HASH, str(f)], capture_output=True,
                              text=True, timeout=120, check=True,
                              env={**os.environ, "EVALKIT_CACHE": str(tmp_path / "ekcache")}
                              ).stdout.strip()

    old_here, old_there = weights.file_sha256(f), fresh_process()
    assert old_here == old_there == hashlib.sha256(b"a" * 4096).hexdigest()
    with open(f, "r+b") as fh:  # the same size, in place (the same inode)
        fh.write(b"b" * 4096)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the mtime put back
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    new = hashlib.sha256(b"b" * 4096).hexdigest()
    assert weights.file_sha256(f) == new
    assert fresh_process() == new


# -- beyond the list: a checkpoint's config.json, by content -------------------------------------

def test_a_checkpoints_config_is_keyed_by_content_not_by_its_folder(tmp_path):
    """The weights' hash is in every identity, the config.json beside them was not: an edited
    config (another epsilon, rope, window: other scores from the same weights) kept the model
    hash, and so the cached samples. The same folder in two places is still one model, and a
    served URL never enters the hash."""
    from evalkit.model_adapters.embedded import TINY_DIR
    from evalkit.runner.run import model_hash

    ident = {"name": "m", "weights_hash": "w"}  # the adapter's part, fixed here
    a, b = (shutil.copytree(TINY_DIR / "recall-mamba2-tiny", tmp_path / w / "ckpt",
                            ignore=shutil.ignore_patterns("*.safetensors")) for w in "ab")
    assert model_hash(f"hf:{a}", ident, {}) == model_hash(f"hf:{b}", ident, {})
    cfg = b / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "layer_norm_epsilon": 1e-3}))
    assert model_hash(f"hf:{a}", ident, {}) != model_hash(f"hf:{b}", ident, {})
    served = [model_hash(f"served:http://127.0.0.1:{port}/v1", ident, {}) for port in (1, 2)]
    assert served[0] == served[1]


def test_a_resume_after_a_folder_the_model_names_was_edited_is_refused(tmp_path):
    """The tokenizer folder an option names, edited between the run and its resume (a field
    the tokenizer's own hash does not read): its samples would mix two models, so the resume
    is refused, saying what kind of change it was."""
    import pytest

    from evalkit.runner.suite import SuiteError
    from runner_support import build_tokenizer, run as run_in_process, suite_dict

    tok = build_tokenizer(tmp_path / "tok")
    suite = suite_dict(tok, lengths=[64], depths=[0.5], loads=[1], samples=1)
    assert run_in_process(suite, tmp_path / "r").failed == 0
    cfg = tok / "tokenizer_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "model_max_length": 77}))
    with pytest.raises(SuiteError, match="a folder an option names, was edited"):
        run_in_process(suite, tmp_path / "r", resume=True)


_IMPORT = """import sys, json
sys.path.insert(0, sys.argv[1])
from evalkit.user_modules import code_of, owned_imports
with owned_imports("owner"):
    import stale_mod
print(json.dumps([stale_mod.VALUE, code_of(["owner"])]))"""


def test_a_stale_bytecode_file_is_keyed_as_the_code_that_ran(tmp_path):
    """Python runs a __pycache__ file whose recorded size and mtime match the source: a
    same-size edit with the mtime put back runs the old code. The key then names that code
    (the source's hash plus the .pyc's), never the new source's alone."""
    mod = tmp_path / "stale_mod.py"
    mod.write_text("VALUE = 1111\n")

    def load() -> list:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        out = subprocess.run([sys.executable, "-c", _IMPORT, str(tmp_path)], env=env,
                             capture_output=True, text=True, timeout=120, check=True).stdout
        return json.loads(out)

    first, again = load(), load()  # the second reads the .pyc the first wrote: the same key
    assert first == again and first[0] == 1111 and (tmp_path / "__pycache__").is_dir()
    st = mod.stat()
    mod.write_text("VALUE = 2222\n")
    os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns))
    value, code = load()
    assert value == 1111  # Python ran the old bytecode ...
    assert code != first[1] and "+pyc:" in code[0]  # ... and the key says so
    shutil.rmtree(tmp_path / "__pycache__")
    value, fresh = load()
    assert value == 2222 and fresh != code and "+pyc:" not in fresh[0]
