"""The hostile campaign's cases (hostile.py runs and classifies them)."""
from __future__ import annotations

from support import *  # noqa: F401,F403  (the helpers every case uses)
from support import Case, Path


def cases() -> list[Case]:
    C: list[Case] = []
    add = C.append
    big_yaml = "task: t\ngenerator: gen:generate\ndescription: '" + "x" * (2 << 20) + "'\n"
    alias_bomb = "task: t\ngenerator: gen:generate\nparams: {a: &a [1,1,1,1,1,1,1,1,1], b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b], d: [*c,*c,*c,*c,*c,*c,*c,*c,*c]}\n"

    # tasks --------------------------------------------------------------------------------
    add(Case("tasks: --include missing", evalkit("tasks", "--include", "nope"), ("nope",)))
    add(Case("tasks: --include a text file", lambda t: evalkit("tasks", "--include", write(t / "x.txt", "hello")), ("x.txt",)))
    add(Case("tasks: unknown key", lambda t: evalkit("tasks", "--include", user_task(t / "u", yaml_extra="colour: red\n")), ("t.yaml", "colour")))
    add(Case("tasks: wrong type", lambda t: evalkit("tasks", "--include", write(t / "u" / "t.yaml", "task: t\ngenerator: gen:generate\ndefaults: {samples: many}\n").parent), ("t.yaml", "samples")))
    add(Case("tasks: alias bomb", lambda t: evalkit("tasks", "--include", write(t / "u" / "t.yaml", alias_bomb).parent), ("t.yaml", "alias")))
    add(Case("tasks: 2 MB yaml", lambda t: evalkit("tasks", "--include", write(t / "u" / "t.yaml", big_yaml).parent), ("t.yaml",)))
    add(Case("tasks: name clash with built-in", lambda t: evalkit("tasks", "--include", write(t / "u" / "n.yaml", "task: needle\ngenerator: evalkit.tasks.needle:generate\n").parent), ("needle",)))
    add(Case("tasks: yaml python tag", lambda t: evalkit("tasks", "--include", write(t / "u" / "t.yaml", "task: !!python/object/apply:os.system ['touch PWNED']\n").parent), ("t.yaml",),
             check=lambda t, p: "executed a tag" if (t / "PWNED").exists() else None))
    add(Case("tasks: binary garbage yaml", lambda t: evalkit("tasks", "--include", write(t / "u" / "t.yaml", os.urandom(4096)).parent), ("t.yaml",)))
    add(Case("tasks: list at top level", lambda t: evalkit("tasks", "--include", write(t / "u" / "t.yaml", "- a\n- b\n").parent), ("t.yaml",)))

    # validate -----------------------------------------------------------------------------
    for label, (fault, word) in FAULTS.items():
        add(Case(f"validate: generator {label}", lambda t, f=fault: evalkit("validate", user_task(t / "u", f)),
                 ("t.yaml", "gen:generate", word)))
    add(Case("validate: empty folder", lambda t: evalkit("validate", (t / "e").mkdir() or t / "e"), ("e", "no task files")))
    add(Case("validate: missing path", evalkit("validate", "nope"), ("nope",)))
    add(Case("validate: module raises at import", lambda t: evalkit("validate", write(user_task(t / "u") / "gen.py", "raise RuntimeError('boom')\n").parent), ("t.yaml", "gen", "boom")))
    add(Case("validate: module syntax error", lambda t: evalkit("validate", write(user_task(t / "u") / "gen.py", "def (:\n").parent), ("t.yaml", "gen")))
    add(Case("validate: no generate function", lambda t: evalkit("validate", write(user_task(t / "u") / "gen.py", "from pydantic import BaseModel\nclass Params(BaseModel): pass\n").parent), ("t.yaml", "generate")))
    add(Case("validate: no Params", lambda t: evalkit("validate", write(user_task(t / "u") / "gen.py", "def generate(*a, **k): pass\n").parent), ("t.yaml", "Params")))
    add(Case("validate: generator never returns", lambda t: evalkit("validate", user_task(t / "u", "while True: pass")), ("t.yaml", "did not return"), env={"EVALKIT_GENERATOR_TIMEOUT_S": "3"}))
    add(Case("validate: bad timeout env", lambda t: evalkit("validate", user_task(t / "u")), ("EVALKIT_GENERATOR_TIMEOUT_S",), env={"EVALKIT_GENERATOR_TIMEOUT_S": "nan"}))
    add(Case("validate: generator signature wrong", lambda t: evalkit("validate", write(user_task(t / "u") / "gen.py", "from pydantic import BaseModel\nclass Params(BaseModel): pass\ndef generate(x): return x\n").parent), ("t.yaml", "TypeError")))
    add(Case("validate: --tokenizer missing", lambda t: evalkit("validate", user_task(t / "u"), "--tokenizer", t / "nope"), ("nope",)))
    add(Case("validate: --tokenizer folder without tokenizer", lambda t: evalkit("validate", user_task(t / "u"), "--tokenizer", (t / "tk").mkdir() or t / "tk"), ("tk",)))
    add(Case("validate: defaults length 0", lambda t: evalkit("validate", write(user_task(t / "u") / "t.yaml", "task: t\ngenerator: gen:generate\ndefaults: {lengths: [0]}\n").parent), ("t.yaml", "lengths")))
    add(Case("validate: defaults depth nan", lambda t: evalkit("validate", write(user_task(t / "u") / "t.yaml", "task: t\ngenerator: gen:generate\ndefaults: {depths: [.nan]}\n").parent), ("t.yaml", "depths")))
    add(Case("validate: defaults length 10**9", lambda t: evalkit("validate", write(user_task(t / "u") / "t.yaml", "task: t\ngenerator: gen:generate\ndefaults: {lengths: [1000000000]}\n").parent), ("t.yaml", "length")))
    add(Case("validate: two gen.py folders (ok)", lambda t: evalkit("validate", user_task(t / "a"), user_task(t / "b")), expect="ok"))

    # generate -----------------------------------------------------------------------------
    g = lambda t, *extra: evalkit("generate", "needle", "--tokenizer", TOK, "--lengths", "256", "--samples", "1", *extra)
    add(Case("generate: --out is a folder", lambda t: g(t, "--out", (t / "d").mkdir() or t / "d"), ("d",)))
    add(Case("generate: --out under a missing folder (made)", lambda t: g(t, "--out", t / "no" / "p.jsonl"), expect="ok",
             check=lambda t, p: None if (t / "no" / "p.jsonl").is_file() else "not written"))
    add(Case("generate: --out under a file", lambda t: g(t, "--out", write(t / "f", "x") / "p.jsonl"), ("f",)))
    for flag, val, word in (("--samples", "0", "samples"), ("--samples", "1000000000", "samples"),
                            ("--lengths", "99999999", "length"), ("--loads", "10000000", "load"),
                            ("--depths", "nan", "depth"), ("--depths", "2", "depth"),
                            ("--lengths", "abc", "lengths"), ("--lengths", ",", "lengths"),
                            ("--seed", "x", "seed"), ("--lengths", "-5", "length")):
        add(Case(f"generate: {flag} {val}", lambda t, f=flag, v=val: evalkit("generate", "needle", "--tokenizer", TOK, f, v, "--out", t / "p.jsonl"), (word,)))
    add(Case("generate: unknown task", lambda t: evalkit("generate", "nedle", "--tokenizer", TOK, "--out", t / "p.jsonl"), ("nedle",)))
    add(Case("generate: --tokenizer missing", lambda t: evalkit("generate", "needle", "--tokenizer", t / "nope", "--out", t / "p.jsonl"), ("nope",)))
    add(Case("generate: corrupt tokenizer.json", lambda t: evalkit("generate", "needle", "--tokenizer", write(t / "tk" / "tokenizer.json", "{not json").parent, "--out", t / "p.jsonl"), ("tokenizer.json",)))
    add(Case("generate: too many facts for length", lambda t: g(t, "--loads", "500", "--out", t / "p.jsonl"), ("load",)))
    add(Case("generate: --dataset into a folder with user files (kept)", lambda t: (write(t / "ds" / "mine.txt", "keep"), g(t, "--out", t / "p.jsonl", "--dataset", t / "ds"))[1],
             expect="ok", check=lambda t, p: None if (t / "ds" / "mine.txt").read_text() == "keep" else "user file lost"))
    add(Case("generate: --parquet is a folder", lambda t: g(t, "--out", t / "p.jsonl", "--parquet", (t / "pq").mkdir() or t / "pq"), ("pq",)))
    add(Case("generate: existing --out is replaced (ok)", lambda t: (write(t / "p.jsonl", "old\n"), g(t, "--out", t / "p.jsonl"))[1], expect="ok",
             check=lambda t, p: None if (t / "p.jsonl").read_text().startswith("{") else "not written"))

    # models / state -------------------------------------------------------------------------
    add(Case("models: --plugins missing", evalkit("models", "--plugins", "nope.py"), ("nope.py",)))
    add(Case("models: plugin raises", lambda t: evalkit("models", "--plugins", write(t / "p.py", "raise RuntimeError('boom')\n")), ("p.py", "boom")))
    add(Case("models: plugin imports a missing module", lambda t: evalkit("models", "--plugins", write(t / "p.py", "import no_such_module_xyz\n")), ("p.py", "no_such_module_xyz")))
    add(Case("models: plugin syntax error", lambda t: evalkit("models", "--plugins", write(t / "p.py", "def (:\n")), ("p.py", "SyntaxError")))
    add(Case("models: --tokens -1", evalkit("models", "--tokens", "-1"), ("tokens",)))
    add(Case("models: --tokens 10**30", evalkit("models", "--tokens", str(10 ** 30)), ("tokens",)))
    add(Case("models: plugin registers a duplicate name", lambda t: evalkit("models", "--plugins", write(t / "p.py", "from evalkit.model_adapters.models import register_model\n@register_model('oracle', kind='x', state_kind='x', description='d')\ndef f(path): pass\n")), ("oracle",)))
    add(Case("state: missing", evalkit("state", "nope"), ("nope",)))
    add(Case("state: garbage config.json", lambda t: evalkit("state", write(t / "c" / "config.json", "{oops")), ("config.json",)))
    add(Case("state: config wrong types", lambda t: evalkit("state", write(t / "c" / "config.json", json.dumps({"model_type": "gla", "hidden_size": "big", "num_hidden_layers": 2}))), ("hidden_size",)))
    add(Case("state: --context -5", evalkit("state", "laplace", "--context", "-5"), ("context",)))
    add(Case("state: --context 10**30", evalkit("state", "laplace", "--context", str(10 ** 30)), ("context",)))
    add(Case("state: --dtype bogus", evalkit("state", "laplace", "--dtype", "int3"), ("dtype",)))
    add(Case("state: folder without config", lambda t: evalkit("state", (t / "c").mkdir() or t / "c"), ("c",)))

    # run: bad input ---------------------------------------------------------------------------
    r = lambda t, *a: evalkit("run", "--tasks", "needle", "--lengths", "256", "--depths", "0.5", "--samples", "1", "--no-progress", "--output", t / "r", *a)
    for label, extra, word in (
            ("unknown model", ["--models", "orakle"], "orakle"),
            ("unknown model option", ["--models", "oracle", "--model-args", "colour=red"], "colour"),
            ("garbage model args", ["--models", "oracle", "--model-args", "x"], "model-args"),
            ("forgetful capacity 0", ["--models", "forgetful", "--model-args", "capacity=0"], "capacity"),
            ("forgetful capacity abc", ["--models", "forgetful", "--model-args", "capacity=abc"], "capacity"),
            ("device=cuda on cpu", ["--models", "recall-gla-tiny", "--model-args", "device=cuda"], "device"),
            ("device=neuron", ["--models", "recall-gla-tiny", "--model-args", "device=neuron"], "device"),
            ("dtype bogus", ["--models", "recall-gla-tiny", "--model-args", "dtype=int3"], "dtype"),
            ("--batch-size 0", ["--models", "oracle", "--batch-size", "0"], "batch"),
            ("--threads 0", ["--models", "oracle", "--threads", "0"], "threads"),
            ("--limit -1", ["--models", "oracle", "--limit", "-1"], "limit"),
            ("--limit 1.5", ["--models", "oracle", "--limit", "1.5"], "limit"),
            ("--samples 10**9", ["--models", "oracle", "--samples", "1000000000"], "samples"),
            # recall-gla-tiny is recurrent: no maximum (its trained length is only recorded)
            ("length beyond model max", ["--models", "recall-softmax-tiny", "--lengths", "1000000"], "1000000"),
            ("length beyond the probe limit", ["--models", "recall-gla-tiny", "--lengths", "2000000"], "1,048,576"),
            ("length 10**8", ["--models", "oracle", "--lengths", "100000000"], "length"),
            ("unknown task", ["--models", "oracle", "--tasks", "nedle"], "nedle"),
            ("unknown lm-eval task", ["--models", "oracle", "--lm-eval-tasks", "no_such_task_xyz"], "no_such_task_xyz"),
            ("same model twice", ["--models", "oracle,oracle"], "oracle"),
            ("missing gla checkpoint", ["--models", "gla:/nonexistent/ckpt"], "/nonexistent/ckpt"),
            ("plugin missing", ["--models", "oracle", "--plugins", "nope.py"], "nope.py"),
            ("plugin raises", ["--models", "oracle", "--plugins", "boom.py"], "boom.py")):
        add(Case(f"run: {label}", lambda t, e=extra: r(t, *e), (word,), setup=lambda t: write(t / "boom.py", "raise RuntimeError('boom')\n"),
                 check=lambda t, p: "left a run folder behind" if (t / "r").exists() else None))
    add(Case("run: --output is a file", lambda t: evalkit("run", *GOOD_RUN, "--output", write(t / "f", "x")), ("f",)))
    add(Case("run: --output under a file", lambda t: evalkit("run", *GOOD_RUN, "--output", write(t / "f", "x") / "r"), ("f",)))
    add(Case("run: --cache-dir is a file", lambda t: evalkit("run", *GOOD_RUN, "--output", t / "r", "--cache-dir", write(t / "c", "x")), ("c",)))
    add(Case("run: --resume a file", lambda t: evalkit("run", "--resume", write(t / "f", "x"), "--no-progress"), ("f",)))
    add(Case("run: --resume missing, no config", lambda t: evalkit("run", "--resume", t / "nope", "--no-progress"), ("nope",)))
    add(Case("run: --output an existing finished run", lambda t: evalkit("run", *GOOD_RUN, "--output", copy_run(t)), ("run",)))
    add(Case("run: --config missing", evalkit("run", "--config", "nope.yaml"), ("nope.yaml",)))
    add(Case("run: --config unknown key", lambda t: evalkit("run", "--config", write(t / "s.yaml", "models: [oracle]\ntasks: [needle]\ncolour: red\n")), ("s.yaml", "colour")))
    add(Case("run: --config wrong type", lambda t: evalkit("run", "--config", write(t / "s.yaml", "models: [oracle]\ntasks: [needle]\nsamples: many\n")), ("s.yaml", "samples")))
    add(Case("run: --config alias bomb", lambda t: evalkit("run", "--config", write(t / "s.yaml", "a: &a [1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a]\nc: [*b,*b,*b,*b,*b,*b,*b,*b]\nmodels: [oracle]\n")), ("s.yaml", "alias")))
    add(Case("run: --config 2 MB", lambda t: evalkit("run", "--config", write(t / "s.yaml", "name: '" + "x" * (2 << 20) + "'\n")), ("s.yaml",)))
    add(Case("run: --config unset ${VAR}", lambda t: evalkit("run", "--config", write(t / "s.yaml", "models: [{name: g, spec: 'gla:${NO_SUCH_VAR_X}'}]\ntasks: [needle]\n")), ("NO_SUCH_VAR_X",)))
    add(Case("run: --config generation.max_new_tokens 0", lambda t: evalkit("run", "--config", write(t / "s.yaml", "models: [oracle]\ntasks: [needle]\ngeneration: {max_new_tokens: 0}\n")), ("max_new_tokens",)))
    add(Case("run: user generator returns None", lambda t: r(t, "--models", "oracle", "--tasks", "t", "--include", user_task(t / "u", "probe = None")), ("t.yaml", "None")))
    add(Case("run: user generator short probe", lambda t: r(t, "--models", "oracle", "--tasks", "t", "--include", user_task(t / "u", FAULTS["short probe (22 tokens for 256)"][0])), ("t.yaml", "tokens")))

    # run: corrupt checkpoints -----------------------------------------------------------------
    def ckpt(t: Path, edit: Callable[[Path], None]) -> list[str]:
        c = t / "ckpt"
        shutil.copytree(GLA, c)
        edit(c)
        return evalkit("run", "--models", f"gla:{c}", "--tasks", "needle", "--lengths", "256",
                       "--depths", "0.5", "--samples", "1", "--no-progress", "--output", t / "r")

    def truncate(name: str, keep: int = 100):
        def edit(c: Path) -> None:
            f = next(c.rglob(name))
            f.write_bytes(f.read_bytes()[:keep])
        return edit

    def garble(name: str):
        def edit(c: Path) -> None:
            f = next(c.rglob(name))
            data = bytearray(f.read_bytes())
            for i in range(0, len(data), max(1, len(data) // 50)):
                data[i] ^= 0xFF
            f.write_bytes(bytes(data))
        return edit

    def remove(name: str):
        return lambda c: next(c.rglob(name)).unlink()

    for label, edit, word in (("truncated safetensors", truncate("*.safetensors"), "safetensors"),
                              ("garbage safetensors", lambda c: next(c.rglob("*.safetensors")).write_bytes(os.urandom(5000)), "safetensors"),
                              ("garbled config.json", garble("config.json"), "config.json"),
                              ("truncated config.json", truncate("config.json", 20), "config.json"),
                              ("config norm_eps NaN", lambda c: next(c.rglob("config.json")).write_text(json.dumps({**json.loads(next(c.rglob("config.json")).read_text()), "norm_eps": float("nan")})), "samples failed"),  # documented: the sample fails with its error
                              ("config trained_length abc", lambda c: next(c.rglob("config.json")).write_text(json.dumps({**json.loads(next(c.rglob("config.json")).read_text()), "trained_length": "abc"})), "trained_length"),
                              ("missing safetensors", remove("*.safetensors"), "safetensors"),
                              ("missing config.json", remove("config.json"), "config.json"),
                              ("truncated tokenizer.json", truncate("tokenizer.json"), "tokenizer"),
                              ("missing tokenizer.json", remove("tokenizer.json"), "tokenizer")):
        add(Case(f"run: checkpoint {label}", lambda t, e=edit: ckpt(t, e), (word,)))

    # run: fault scenarios -------------------------------------------------------------------------
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        add(Case(f"run: {signal.Signals(sig).name} then --resume", [], scenario=interrupt_then_resume(sig), timeout=900))
    add(Case("run: corrupt cache entries (truncated)", [], scenario=corrupt_cache_then_run(lambda f: f.write_bytes(f.read_bytes()[:40]))))
    add(Case("run: corrupt cache entries (hand-edited)", [], scenario=corrupt_cache_then_run(lambda f: f.write_text(f.read_text().replace("4", "5")))))
    add(Case("run: corrupt cache entries (NaN)", [], scenario=corrupt_cache_then_run(lambda f: f.write_text(f.read_text().replace("1.0", "NaN")))))
    add(Case("run: two runs, one --output", [], scenario=concurrent(two_runs_same_output, verify_one_run)))
    add(Case("run: two --resume on one folder", [], scenario=concurrent(two_resumes, verify_resumed)))
    add(Case("run: --resume after samples.jsonl hand-edited rebuilds it (ok)", lambda t: (lambda d: (write(d / "samples.jsonl", (d / "samples.jsonl").read_text().replace("1.0", "0.0")), evalkit("run", "--resume", d, "--no-progress"))[1])(copy_run(t)),
             expect="ok", check=lambda t, p: None if comparable(t / "run") == comparable(GOLDEN["oracle"]) else "results differ"))
    add(Case("run: --resume with DONE removed (ok)", lambda t: (lambda d: ((d / "DONE").unlink(), evalkit("run", "--resume", d, "--no-progress"))[1])(copy_run(t)),
             expect="ok", check=lambda t, p: None if comparable(t / "run") == comparable(GOLDEN["oracle"]) else "results differ"))

    # publish -------------------------------------------------------------------------------
    def corrupt_run(edit: Callable[[Path], None]):
        def cmd(t: Path) -> list[str]:
            d = copy_run(t)
            edit(d)
            return evalkit("publish", d, "--to", t / "lb", "--bootstrap", "200")
        return cmd
    for label, edit, word in (
            ("samples.jsonl truncated", lambda d: (d / "samples.jsonl").write_bytes((d / "samples.jsonl").read_bytes()[:50]), "samples.jsonl"),
            ("samples.jsonl garbage line", lambda d: (d / "samples.jsonl").write_text((d / "samples.jsonl").read_text() + "{oops\n"), "samples.jsonl"),
            ("samples.jsonl empty", lambda d: (d / "samples.jsonl").write_text(""), "samples.jsonl"),
            ("samples.jsonl NaN score", lambda d: (d / "samples.jsonl").write_text((d / "samples.jsonl").read_text().replace("1.0", "NaN", 1)), "samples.jsonl"),
            ("samples.jsonl missing", lambda d: (d / "samples.jsonl").unlink(), "samples.jsonl"),
            ("results.json garbage", lambda d: (d / "results.json").write_text("{oops"), "results.json"),
            ("results.json missing", lambda d: (d / "results.json").unlink(), "results.json"),
            ("results.json a list", lambda d: (d / "results.json").write_text("[]"), "results.json"),
            ("DONE missing", lambda d: (d / "DONE").unlink(), "DONE"),
            ("provenance.json garbage", lambda d: (d / "provenance.json").write_text("{oops"), "provenance.json"),
            ("provenance.json garbage, DONE without checksums", lambda d: (old_done(d), (d / "provenance.json").write_text("{oops")), "provenance.json"),
            ("samples.jsonl score hand-edited (valid JSON)", lambda d: (d / "samples.jsonl").write_text((d / "samples.jsonl").read_text().replace('"exact_match": 1.0', '"exact_match": 0.0', 1)), "samples.jsonl"),
            ("results.json hand-edited (valid JSON)", lambda d: (d / "results.json").write_text((d / "results.json").read_text().replace("1.0", "0.5", 1)), "results.json"),
            ("samples.jsonl one byte flipped", lambda d: (d / "samples.jsonl").write_bytes(flip_byte((d / "samples.jsonl").read_bytes())), "samples.jsonl"),
            ("samples.jsonl non-UTF-8, DONE without checksums", lambda d: (old_done(d), (d / "samples.jsonl").write_bytes(b"\xfb" + (d / "samples.jsonl").read_bytes())), "samples.jsonl:1"),
            ("DONE sha256 field garbage", lambda d: write(d / "DONE", json.dumps({**json.loads((d / "DONE").read_text()), "sha256": "x"})), "DONE"),
            # a hand edit: the checksum in DONE names the file before any field is read
            ("unknown metric in samples", lambda d: (d / "samples.jsonl").write_text((d / "samples.jsonl").read_text().replace("exact_match", "exact_matchx")), "samples.jsonl"),
            ("unknown metric in samples, DONE without checksums", lambda d: (old_done(d), (d / "samples.jsonl").write_text((d / "samples.jsonl").read_text().replace("exact_match", "exact_matchx"))), "exact_matchx")):
        add(Case(f"publish: {label}", corrupt_run(edit), (word,),
                 check=lambda t, p: "wrote a leaderboard from a corrupt run" if (t / "lb").exists() and any((t / "lb").iterdir()) else None))
    pub = lambda t, *a: evalkit("publish", copy_run(t), "--to", t / "lb", *a)
    add(Case("publish: missing run dir", lambda t: evalkit("publish", t / "nope", "--to", t / "lb"), ("nope",)))
    add(Case("publish: --bootstrap 10**9", lambda t: pub(t, "--bootstrap", "1000000000"), ("bootstrap",)))
    add(Case("publish: --bootstrap 0", lambda t: pub(t, "--bootstrap", "0"), ("bootstrap",)))
    add(Case("publish: --to a file", lambda t: evalkit("publish", copy_run(t), "--to", write(t / "f", "x")), ("f",)))
    add(Case("publish: --threshold 2", lambda t: pub(t, "--threshold", "2"), ("threshold",)))
    add(Case("publish: --threshold nan", lambda t: pub(t, "--threshold", "nan"), ("threshold",)))
    add(Case("publish: --primary-metric bogus", lambda t: pub(t, "--primary-metric", "bogus"), ("bogus",)))
    add(Case("publish: --gap bad format", lambda t: pub(t, "--gap", "oracle"), ("gap",)))
    add(Case("publish: --gap unknown model", lambda t: pub(t, "--gap", "oracle:nobody"), ("nobody",)))
    add(Case("publish: empty folder of runs", lambda t: evalkit("publish", (t / "runs").mkdir() or t / "runs", "--to", t / "lb"), ("runs",)))
    add(Case("publish: --to a non-leaderboard folder with user files", lambda t: (write(t / "lb" / "NOTES.md", "mine"), write(t / "lb" / "extra" / "a.txt", "mine"), pub(t, "--bootstrap", "200"))[2],
             ("lb",)))  # refused, and the data-loss snapshot checks both files
    add(Case("publish: republish keeps user files in a leaderboard (ok)", lambda t: (sh(pub(t, "--bootstrap", "200"), t, 120), write(t / "lb" / "NOTES.md", "mine"),
                                                                                   evalkit("publish", t / "run", "--to", t / "lb", "--bootstrap", "200"))[2],
             expect="ok", check=lambda t, p: None if (t / "lb" / "NOTES.md").read_text() == "mine" else "NOTES.md lost"))
    add(Case("publish: a run from before DONE held checksums (ok)", lambda t: evalkit("publish", old_done(copy_run(t)), "--to", t / "lb", "--bootstrap", "200"), expect="ok"))
    add(Case("publish: two runs (ok)", lambda t: evalkit("publish", copy_run(t), copy_run(t, "forgetful", "run2"), "--to", t / "lb", "--bootstrap", "200"), expect="ok"))
    add(Case("publish: two publishes at once", [], scenario=concurrent(two_publishes, verify_published)))

    # compare -------------------------------------------------------------------------------
    cmp_ = lambda t, *a: evalkit("compare", copy_run(t), copy_run(t, "oracle", "run2"), "--out", t / "cmp", *a)
    add(Case("compare: missing run", lambda t: evalkit("compare", t / "a", t / "b", "--out", t / "cmp"), ("a",)))
    add(Case("compare: --out is a file", lambda t: evalkit("compare", copy_run(t), copy_run(t, "forgetful", "run2"), "--out", write(t / "f", "x")), ("f",)))
    add(Case("compare: --bootstrap 10**9", lambda t: cmp_(t, "--bootstrap", "1000000000"), ("bootstrap",)))
    add(Case("compare: --metric bogus", lambda t: cmp_(t, "--metric", "bogus"), ("bogus",)))
    add(Case("compare: run B without DONE", lambda t: (lambda a, b: ((b / "DONE").unlink(), evalkit("compare", a, b, "--out", t / "cmp"))[1])(copy_run(t), copy_run(t, "forgetful", "run2")), ("DONE",)))
    add(Case("compare: run B results garbage", lambda t: (lambda a, b: ((b / "results.json").write_text("{x"), evalkit("compare", a, b, "--out", t / "cmp"))[1])(copy_run(t), copy_run(t, "forgetful", "run2")), ("results.json",)))
    add(Case("compare: run B samples hand-edited", lambda t: (lambda a, b: (write(b / "samples.jsonl", (b / "samples.jsonl").read_text().replace('"exact_match": 1.0', '"exact_match": 0.0', 1)), evalkit("compare", a, b, "--out", t / "cmp"))[1])(copy_run(t), copy_run(t, "oracle", "run2")), ("run2/samples.jsonl",),
             check=lambda t, p: "wrote a report from an edited run" if (t / "cmp").exists() else None))
    add(Case("compare: two runs of one model (ok)", lambda t: cmp_(t, "--bootstrap", "200"), expect="ok"))
    add(Case("compare: --out existing with user file (kept)", lambda t: (write(t / "cmp" / "mine.txt", "keep"), cmp_(t, "--bootstrap", "200"))[1],
             expect="ok", check=lambda t, p: None if (t / "cmp" / "mine.txt").exists() else "user file removed"))

    # train-tiny: argument and output checks only ---------------------------------------------------
    add(Case("train-tiny: --out a file", lambda t: evalkit("train-tiny", "--out", write(t / "f", "x")), ("f",), timeout=60))
    add(Case("train-tiny: --config missing", evalkit("train-tiny", "--config", "nope.yaml", "--out", "o"), ("nope.yaml",), timeout=60))
    add(Case("train-tiny: --config unknown key", lambda t: evalkit("train-tiny", "--config", write(t / "c.yaml", "colour: red\n"), "--out", t / "o"), ("c.yaml", "colour"), timeout=60))
    add(Case("train-tiny: --config alias bomb", lambda t: evalkit("train-tiny", "--config", write(t / "c.yaml", "a: &a [1,1,1,1]\nb: [*a,*a,*a,*a]\n"), "--out", t / "o"), ("c.yaml",), timeout=60))
    add(Case("train-tiny: --tokenizer missing", lambda t: evalkit("train-tiny", "--config", REPO / "configs" / "train_tiny.yaml", "--tokenizer", t / "nope", "--out", t / "o"), ("nope",), timeout=60))

    # lm-eval-export ----------------------------------------------------------------------------
    ex = lambda t, *a: evalkit("lm-eval-export", "--tasks", "needle", "--tokenizer", TOK, "--lengths", "256", "--samples", "1", *a)
    add(Case("lm-eval-export: --out a file", lambda t: ex(t, "--out", write(t / "f", "x")), ("f",)))
    add(Case("lm-eval-export: unknown task", lambda t: evalkit("lm-eval-export", "--tasks", "nedle", "--tokenizer", TOK, "--out", t / "o"), ("nedle",)))
    add(Case("lm-eval-export: --samples 0", lambda t: ex(t, "--samples", "0", "--out", t / "o"), ("samples",)))
    add(Case("lm-eval-export: --lengths 10**8", lambda t: evalkit("lm-eval-export", "--tasks", "needle", "--tokenizer", TOK, "--lengths", "100000000", "--out", t / "o"), ("length",)))
    add(Case("lm-eval-export: --depths nan", lambda t: ex(t, "--depths", "nan", "--out", t / "o"), ("depth",)))
    add(Case("lm-eval-export: --tokenizer missing", lambda t: evalkit("lm-eval-export", "--tasks", "needle", "--tokenizer", t / "nope", "--out", t / "o"), ("nope",)))
    add(Case("lm-eval-export: --out with user utils.py", lambda t: (write(t / "o" / "utils.py", "# mine\n"), ex(t, "--out", t / "o"))[1], ("utils.py",)))
    add(Case("lm-eval-export: user generator returns None", lambda t: evalkit("lm-eval-export", "--tasks", "t", "--include", user_task(t / "u", "probe = None"), "--tokenizer", TOK, "--out", t / "o"), ("t.yaml", "None")))
    add(Case("lm-eval-export: fresh folder (ok)", lambda t: ex(t, "--out", t / "o"), expect="ok"))

    # evalkit-lm-eval -------------------------------------------------------------------------------
    lm = [str(Path(PY).parent / "evalkit-lm-eval"), "run", "--model", "evalkit"]
    add(Case("evalkit-lm-eval: unknown model name", lm + ["--model_args", "name=no-such-model", "--tasks", "niah_single_1", "--limit", "1"], ("no-such-model",), timeout=180))
    add(Case("evalkit-lm-eval: unknown task", lm + ["--model_args", "name=oracle", "--tasks", "no_such_task_xyz"], ("no_such_task_xyz",), timeout=180))
    add(Case("evalkit-lm-eval: garbage model_args", lm + ["--model_args", "name", "--tasks", "niah_single_1"], ("model_args",), timeout=180))
    add(Case("evalkit-lm-eval: bad model option", lm + ["--model_args", "name=forgetful,capacity=abc", "--tasks", "niah_single_1", "--limit", "1"], ("capacity",), timeout=180))
    return C


# -- execution and classification -----------------------------------------------------------------
