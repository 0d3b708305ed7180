"""Loading a GLA checkpoint is silent: AutoTokenizer is not made to parse a config.json whose
model type (gla) transformers does not know. The tokenizer it gives is unchanged."""
from __future__ import annotations

import logging
import shutil

import pytest

from evalkit.model_adapters.models import load_model
from evalkit.tokenization import load_tokenizer, tokenizer_hash

from helpers import REPO, TINY_TOKENIZER

# tokenizer_hash of the shipped tiny BPE (vocab, specials, chat template, BOS rule)
TINY_HASH = "79c9583c31d4e77059ada4925d0acec9bdefb8ab7936a956ddc998decb616e5b"
MISMATCH = "to instantiate a model of type"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def transformers_log():
    """Every message transformers logs (its logger does not propagate to the root, so caplog
    alone would see nothing)."""
    logger = logging.getLogger("transformers")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_gla_load_logs_no_model_type_warning(transformers_log):
    model = load_model("recall-gla-tiny")
    assert not [m for m in transformers_log if MISMATCH in m], transformers_log
    assert tokenizer_hash(model.tokenizer) == TINY_HASH
    assert model.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    ) == load_tokenizer(TINY_TOKENIZER).apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)


def test_handler_sees_the_warning_when_transformers_parses_the_config(transformers_log):
    # the capture is live: transformers' own generic-config parse of the GLA config.json warns
    from transformers import PreTrainedConfig

    PreTrainedConfig.from_pretrained(str(REPO / "model_adapters/tiny/recall-gla-tiny"))
    assert [m for m in transformers_log if MISMATCH in m]


@pytest.mark.parametrize("folder", ["tokenizer", "recall-gla-tiny", "recall-softmax-tiny"])
def test_shipped_tokenizer_folders_keep_their_hash(folder):
    assert tokenizer_hash(load_tokenizer(REPO / "model_adapters/tiny" / folder)) == TINY_HASH


def test_unknown_model_type_takes_tokenizer_config_class(tmp_path, transformers_log):
    # a folder for some other architecture transformers lacks, with a malformed-type tokenizer_class
    src = REPO / "model_adapters/tiny/recall-gla-tiny"
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src / name, tmp_path / name)
    (tmp_path / "config.json").write_text('{"model_type": "not-in-transformers", '
                                          '"tokenizer_class": 7}')
    tok = load_tokenizer(tmp_path)
    assert type(tok).__name__ == "TokenizersBackend" and tokenizer_hash(tok) == TINY_HASH
    assert not [m for m in transformers_log if MISMATCH in m]
