"""Issue 41, item 5: a served model's URL with credentials or a query string is refused by
`evalkit run` before anything is loaded, printed or written, and no output repeats it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import TINY_TOKENIZER

SECRET = "s3cretTOKEN42"


@pytest.mark.parametrize("url", [f"http://user:{SECRET}@127.0.0.1:9/v1",
                                 f"http://127.0.0.1:9/v1?token={SECRET}",
                                 f"http://127.0.0.1:9/v1#{SECRET}"])
@pytest.mark.parametrize("where", ["command line", "suite"])
def test_a_secret_in_a_served_url_is_refused_and_never_repeated(tmp_path, url, where):
    out = tmp_path / "run"
    if where == "suite":   # a bare-string model entry: the spec would also be its name
        suite = tmp_path / "suite.yaml"
        suite.write_text(f"name: s\nmodels:\n  - served:{url}\ntasks: [needle]\n")
        args = ["--config", str(suite)]
    else:
        args = ["--models", f"served:{url}", "--model-args", f"tokenizer={TINY_TOKENIZER}",
                "--tasks", "needle", "--lengths", "256"]
    p = subprocess.run([sys.executable, "-m", "evalkit", "run", *args, "--output", str(out)],
                       capture_output=True, text=True, timeout=120,
                       env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert p.returncode != 0
    assert "credentials or a query string" in p.stderr
    assert SECRET not in p.stdout + p.stderr
    assert not out.exists()


def test_an_option_that_is_one_variable_reads_as_yaml(tmp_path, monkeypatch):
    """`concurrency: ${C}` with C=4 is the number 4 (the served board passes it so); a string
    option and a spec stay strings; an unset variable is an error naming the key."""
    from evalkit.runner.suite import SuiteError, load_suite, resolve
    suite = tmp_path / "s.yaml"
    suite.write_text("name: s\nmodels:\n  - {name: m, spec: oracle, options: {}}\n"
                     "  - {name: g, spec: 'gla:${CKPT}', options: {chunk_size: '${C}'}}\n"
                     "tasks: [needle]\n")
    from evalkit.runner import suite_vars
    monkeypatch.setenv("C", "64")
    monkeypatch.setenv("CKPT", "123")
    assert suite_vars.expand("${C}", "s", "models.1.options.chunk_size") == 64
    assert suite_vars.expand("${CKPT}", "s", "models.1.options.path") == 123
    assert suite_vars.expand("x${C}", "s", "models.1.options.name") == "x64"
    assert suite_vars.expand("${CKPT}", "s", "models.1.spec") == "123"
    monkeypatch.delenv("C")
    with pytest.raises(SuiteError, match="C is not set"):
        resolve(load_suite(suite), str(suite))


@pytest.mark.parametrize("value, expect", [("false", False), ("true", True), ("maybe", None)])
def test_forced_choice_can_come_from_one_variable(tmp_path, monkeypatch, value, expect):
    """`forced_choice: ${FC}`: one suite for the served board's scored (unloaded) and
    greedy-only (loaded) runs; anything but true/false is an error naming the key."""
    from evalkit.runner.suite import SuiteError, load_suite, resolve
    suite = tmp_path / "s.yaml"
    suite.write_text("name: s\nmodels:\n  - {name: m, spec: oracle, forced_choice: '${FC}'}\n"
                     "tasks: [needle]\n")
    monkeypatch.setenv("FC", value)
    if expect is None:
        with pytest.raises(SuiteError, match=r"models\.0\.forced_choice.*expected true or false"):
            resolve(load_suite(suite), str(suite))
    else:
        assert resolve(load_suite(suite), str(suite)).models[0].forced_choice is expect
    suite.write_text("name: s\nmodels:\n  - {name: m, spec: oracle, forced_choice: 'off'}\n"
                     "tasks: [needle]\n")
    with pytest.raises(SuiteError, match="expected true, false or one"):
        resolve(load_suite(suite), str(suite))
