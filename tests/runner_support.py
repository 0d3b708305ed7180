"""Shared pieces of the runner tests: a tiny BPE tokenizer built with `tokenizers`, the toy
task folder, and a helper to run a suite in-process."""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOY_TASKS = HERE / "runner_tasks"
PLUGIN = TOY_TASKS / "adapters_plugin.py"


def build_tokenizer(folder: Path) -> Path:
    """A small byte-level BPE with single-digit tokens and BOS, trained on the toy vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    import sys
    sys.path.insert(0, str(TOY_TASKS))
    try:
        import toy_tasks
    finally:
        sys.path.remove(str(TOY_TASKS))
    corpus = [f"The code for {k} is 1234\nWhat is the code for {k}?\n" for k in toy_tasks.KEYS]
    corpus += [f"{f}\n" for f in toy_tasks.FILLER] + ["user: assistant: Noted, part 0."]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus * 3, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    return folder


def suite_dict(tokenizer: Path, models=("oracle",), tasks=("toy_recall",), **extra) -> dict:
    """A suite mapping over the toy tasks, models given as names with the test tokenizer."""
    entries = []
    for m in models:
        if isinstance(m, dict):
            entries.append({**m, "options": {"tokenizer": str(tokenizer), **m.get("options", {})}})
        else:
            entries.append({"name": m, "options": {"tokenizer": str(tokenizer)}})
    return {"models": entries, "tasks": list(tasks), "include": [str(TOY_TASKS)],
            "plugins": [str(PLUGIN)], **extra}


def run(suite: dict, output: Path, *, resume: bool = False):
    from evalkit.runner import resolve, run_suite
    from evalkit.runner.suite import validate

    resolved = resolve(validate(suite, "test suite"), "test suite")
    return run_suite(resolved, output=output, resume=resume, progress=False)


def small_run(root: Path) -> Path:
    """A finished run in root/run: oracle and forgetful on the toy task, lengths 64 and 128,
    depths 0 and 1, 2 samples each."""
    models = ("oracle", {"name": "forgetful", "options": {"capacity": 300}})
    cfg = suite_dict(build_tokenizer(root / "tok"), models=models, lengths=[64, 128],
                     depths=[0.0, 1.0], loads=[1], samples=2)
    assert run(cfg, root / "run").failed == 0
    return root / "run"


def read_samples(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def without_latency(samples: list[dict]) -> list[dict]:
    return [{k: v for k, v in s.items() if k != "latency_s"} for s in samples]
