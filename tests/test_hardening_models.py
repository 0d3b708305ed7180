"""Hardening (issue 12), model side: a bad checkpoint, tokenizer or model option gives one line
naming the file or option through the real CLI (exit 2), never a traceback; an int8 tensor is
never cast to float; an empty gold is refused by probes and by every generation metric."""
import itertools
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from evalkit import scoring
from evalkit.cli import main
from evalkit.model_adapters.models import MODELS, ModelOptionError, load_model, model_names, resolve_spec
from evalkit.probe import Question
from helpers import REPO

TINY = REPO / "model_adapters" / "tiny"
_RUNS = itertools.count()
BUILTIN = [n for n in model_names() if MODELS.origin(n).startswith("evalkit.model_adapters.")]

# transformers binds its log handler to the sys.stderr of its first log call; bind it now, not
# to a capsys stream that is closed after its test ("--- Logging error ---" in later tests)
transformers_logging = pytest.importorskip("transformers.utils.logging")
transformers_logging.get_logger("transformers")


def run_cli(capsys, tmp_path, spec, *model_args):
    argv = ["run", "--models", spec, "--tasks", "needle", "--lengths", "256", "--samples", "1",
            "--output", str(tmp_path / f"run-{next(_RUNS)}"), "--no-progress"]
    if model_args:
        argv += ["--model-args", ",".join(model_args)]
    rc = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    return rc, errors[0]


def copy(tmp_path, which):
    dst = tmp_path / which
    shutil.copytree(TINY / which, dst)
    return dst


def _truncate(folder):
    w = folder / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100_000])
    return w


def _garbage(folder):
    w = folder / "model.safetensors"
    w.write_bytes(bytes(range(256)) * 20)
    return w


def _bad_index(folder):
    (folder / "model.safetensors").rename(folder / "shard-1.safetensors")
    index = folder / "model.safetensors.index.json"
    index.write_text('{"weight_map": ')
    return index


def _bad_tokenizer_json(folder):
    tok = folder / "tokenizer.json"
    tok.write_text('{"version": ')
    return tok


def _non_utf8_config(folder):
    cfg = folder / "config.json"
    cfg.write_bytes(b"\x84" + cfg.read_bytes())
    return cfg


def _no_tokenizer(folder):
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / f).unlink()
    return folder


def _bad_trained_length(folder):
    cfg = folder / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "trained_length": "abc"}))
    return cfg


@pytest.mark.parametrize("loader,which", [("gla", "recall-gla-tiny"), ("hf", "recall-softmax-tiny")])
@pytest.mark.parametrize("corrupt,expected", [
    (_truncate, "not a complete safetensors file"),
    (_garbage, "not a complete safetensors file"),
    (_bad_index, "not valid JSON"),
    (_bad_tokenizer_json, "not valid JSON"),
    (_non_utf8_config, "not valid JSON"),
    (_no_tokenizer, "holds no tokenizer"),
])
def test_a_corrupt_checkpoint_is_one_line_naming_the_file(capsys, tmp_path, loader, which,
                                                          corrupt, expected):
    folder = copy(tmp_path, which)
    bad = corrupt(folder)
    rc, line = run_cli(capsys, tmp_path, f"{loader}:{folder}")
    assert rc == 2 and str(bad) in line and expected in line


def test_a_non_integer_trained_length_names_the_config(capsys, tmp_path):
    cfg = _bad_trained_length(copy(tmp_path, "recall-gla-tiny"))
    rc, line = run_cli(capsys, tmp_path, f"gla:{cfg.parent}")
    assert rc == 2 and f"{cfg}: trained_length must be a positive integer" in line


def test_a_truncated_gguf_is_one_line_naming_the_file(capsys, tmp_path):
    from evalkit.model_adapters.embedded import smollm2_gguf_path

    try:
        src = smollm2_gguf_path()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        pytest.skip(str(e))
    for size in (100, 3_000_000):  # inside the header; inside the tensors
        gguf = tmp_path / f"cut-{size}.gguf"
        with open(src, "rb") as f:
            gguf.write_bytes(f.read(size))
        rc, line = run_cli(capsys, tmp_path, f"hf:{gguf}")
        assert rc == 2 and "cannot read this GGUF file" in line and gguf.name in line


@pytest.mark.parametrize("loader,which", [("gla", "recall-gla-tiny"), ("hf", "recall-softmax-tiny")])
def test_an_int8_tensor_is_refused_not_cast(capsys, tmp_path, loader, which):
    folder = copy(tmp_path, which)
    w = folder / "model.safetensors"
    tensors = load_file(str(w))
    name = sorted(k for k in tensors if k.endswith("q_proj.weight"))[0]
    tensors[name] = tensors[name].to(torch.int8)
    save_file(tensors, str(w), metadata={"format": "pt"})
    rc, line = run_cli(capsys, tmp_path, f"{loader}:{folder}")
    assert rc == 2 and str(w) in line and repr(name) in line and "I8" in line


def _spec(name, tmp_path):
    """A loadable spec for every built-in model (path loaders get a checkpoint)."""
    info, _ = resolve_spec(name)
    if info.describe is None or name == "laplace":
        return f"{name}:{TINY / ('recall-softmax-tiny' if info.kind == 'softmax' else 'recall-gla-tiny')}"
    return name


@pytest.mark.parametrize("name", BUILTIN)
def test_an_unknown_option_names_it_and_lists_the_accepted_ones(tmp_path, name):
    with pytest.raises(ModelOptionError, match=r"unknown option\(s\) colour \(accepted: .*max_length"):
        load_model(_spec(name, tmp_path), colour="red")


@pytest.mark.parametrize("name", BUILTIN)
def test_a_mistyped_option_names_it(tmp_path, name):
    with pytest.raises(ModelOptionError,
                       match=r"option max_length='abc': expected an integer or none$"):
        load_model(_spec(name, tmp_path), max_length="abc")


def test_option_errors_through_the_cli(capsys, tmp_path):
    rc, line = run_cli(capsys, tmp_path, "recall-softmax-tiny", "colour=red")
    assert rc == 2 and "unknown option(s) colour" in line and "window" in line
    rc, line = run_cli(capsys, tmp_path, "recall-softmax-tiny", "window=abc")
    assert rc == 2 and "option window='abc': expected an integer or none" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("name", ["recall-gla-tiny", "recall-softmax-tiny"])
def test_cuda_without_cuda_is_one_line_naming_the_option(capsys, tmp_path, name):
    rc, line = run_cli(capsys, tmp_path, name, "device=cuda")
    assert rc == 2 and "'cuda'" in line and "CUDA is not available" in line


def test_an_empty_gold_is_a_bad_probe():
    for gold in [("",), ("4821", "  ")]:
        with pytest.raises(ValueError, match="non-empty strings"):
            Question(text="q?", answer_prefix="a:", gold=gold)


@pytest.mark.parametrize("metric", [m.name for m in scoring.of_kind(scoring.GENERATION)])
def test_no_generation_metric_scores_an_empty_gold(metric):
    fn = scoring.get(metric).fn
    for prediction in ("", " 4821"):
        with pytest.raises(ValueError, match="empty gold cannot be scored"):
            fn(prediction, [""])
    with pytest.raises(ValueError, match="empty gold"):
        scoring.score_sample("", [""])


@pytest.mark.parametrize("source,expected", [
    ("raise RuntimeError('boom')\n", "importing it failed: RuntimeError: boom"),
    ("import no_such_module_xyz\n", "importing it failed: ModuleNotFoundError: No module named"),
    ("def (:\n", "importing it failed: SyntaxError")])
def test_a_plugin_that_fails_to_import_is_one_line_naming_it(capsys, tmp_path, source, expected):
    plugin = tmp_path / "plug.py"
    plugin.write_text(source)
    for argv in (["models", "--plugins", str(plugin)],
                 ["run", "--plugins", str(plugin), "--models", "oracle", "--tasks", "needle",
                  "--lengths", "256", "--output", str(tmp_path / "r"), "--no-progress"]):
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert f"{plugin}: {expected}" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv,flag", [(["models", "--tokens"], "--tokens"),
                                       (["state", "laplace", "--context"], "--context")])
def test_token_counts_are_bounded_by_the_probe_limit(capsys, argv, flag):
    for bad in (str(10 ** 30), "1048577", "0"):
        assert main([*argv, bad]) == 2
        err = capsys.readouterr().err
        assert f"{flag} must be between 1 and 1,048,576 tokens" in err and "Traceback" not in err
    assert main([*argv, "1048576"]) == 0
    assert "1048576" in capsys.readouterr().out.replace(",", "")
