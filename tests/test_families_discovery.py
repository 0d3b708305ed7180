"""Every causal-LM class of the installed transformers whose cache or config marks a recurrent,
convolutional or hybrid layer, found by walking transformers' own registry (no list kept here),
built as a tiny random model (model_adapters/recurrent/tiny_configs.py), saved, and loaded through `hf:DIR`:

(a) evalkit's bytes = an independent walk of every floating-point tensor the returned cache
    object holds (and the tensors the model leaves on its modules where it returns none), at two
    lengths at fp32 and the longer at bf16; the config formula (the second figure) agrees, role by role;
(b) the fixed part is flat in the length and the growing part = attention layers x KV row x
    tokens x dtype size;
(c) a forked cache gives the same log-probabilities (within 1e-5 at fp32) and greedy answer
    as a fresh prefill of context + question.

A class the next transformers adds is picked up here and fails by its model_type until it is
supported or refused with a reason."""
from __future__ import annotations

import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from helpers import TINY_TOKENIZER

from evalkit.model_adapters.recurrent.discover import recurrent_families
from evalkit.model_adapters.recurrent.tiny_configs import tiny_config

VOCAB = 2048  # the tiny tokenizer's
SHORT, LONG = 16, 48
ATTENTION_TYPES = {"full_attention", "hybrid", "indexed_attention"}


FAMILIES = recurrent_families()
# Refused families and the reason no implementation could avoid: none at present.
REFUSED: dict[str, str] = {}


def _config(model_type: str):
    import transformers

    cls = getattr(transformers, dict(FAMILIES)[model_type])
    return tiny_config(cls.config_class, VOCAB)


def _build(model_type: str, folder) -> str:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(model_type))
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)  # peaked: stable greedy choices
    model.save_pretrained(str(folder))
    for f in TINY_TOKENIZER.iterdir():
        shutil.copy(f, folder / f.name)
    return str(folder)


@pytest.fixture(scope="module", params=[m for m, _ in FAMILIES])
def family(request, tmp_path_factory):
    from evalkit.model_adapters.models import load_model

    mt = request.param
    if mt in REFUSED:
        pytest.skip(f"refused: {REFUSED[mt]}")
    folder = _build(mt, tmp_path_factory.mktemp(mt))
    return mt, folder, load_model(f"hf:{folder}", prefill_chunk=5)


def test_the_walk_finds_the_known_families():
    """The walk is not vacuous: the families evalkit first ran, and this issue's, are found."""
    found = {m for m, _ in FAMILIES}
    assert {"mamba", "rwkv", "jamba", "zamba2", "lfm2", "qwen3_next", "xlstm", "minimax",
            "recurrent_gemma", "granitemoehybrid", "kimi_linear"} <= found
    assert "llama" not in found and "gpt2" not in found


def independent_bytes(holder, model) -> int:
    """Every floating-point tensor reachable from the holder object (attributes, dicts, lists,
    tuples), counted once; for a model that returns no cache, the tensors its modules hold."""
    seen: set[int] = set()
    total = 0

    def walk(o, depth=0):
        nonlocal total
        if depth > 6 or id(o) in seen:
            return
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            total += o.nbytes if o.is_floating_point() else 0
        elif isinstance(o, dict):
            for v in o.values():
                walk(v, depth + 1)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v, depth + 1)
        elif hasattr(o, "__dict__") and not isinstance(o, (torch.nn.Module, type)) \
                and type(o).__module__.split(".")[0] in ("transformers", "evalkit"):
            for k, v in vars(o).items():
                if k != "config":
                    walk(v, depth + 1)

    walk(holder)
    return total


def module_state_bytes(model, ids) -> int:
    """A model that returns no cache (RecurrentGemma), run directly with a DynamicCache of its
    config: the floating tensors of that cache plus the plain tensors its modules then hold."""
    from transformers import DynamicCache

    for m in model.modules():  # a fresh sequence: no state left on any module
        for k, v in list(vars(m).items()):
            if isinstance(v, torch.Tensor) and not k.startswith("_"):
                setattr(m, k, None)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    on_modules = sum(v.nbytes for m in model.modules() for k, v in vars(m).items()
                     if isinstance(v, torch.Tensor) and not k.startswith("_")
                     and v.is_floating_point())
    return independent_bytes(cache, model) + on_modules


def _attention_row_bytes(cfg, itemsize: int) -> int:
    """One token's KV row summed over the full-attention layers, from the config."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    types = get_layer_types_and_kwargs(cfg)[0]
    passes = getattr(cfg, "loop_num_passes", None)  # a looped model caches its loop per pass
    if passes and getattr(cfg, "loop_layer_index_end", None) is not None:
        types = list(types) + list(types[cfg.loop_layer_index_start:cfg.loop_layer_index_end]) \
            * (passes - 1)
    n_attn = sum(t in ATTENTION_TYPES for t in types)
    if not n_attn or getattr(cfg, "num_attention_heads", None) is None:
        return 0  # no attention (RWKV, xLSTM: transformers reads every layer as full_attention)
    if getattr(cfg, "kv_lora_rank", None):  # MLA keeps its compressed latent and rope key
        row = cfg.kv_lora_rank + cfg.qk_rope_head_dim
    else:
        heads = cfg.num_attention_heads
        hd = getattr(cfg, "head_dim", None) or getattr(cfg, "attention_head_dim", None) \
            or cfg.hidden_size // heads
        row = 2 * (getattr(cfg, "num_key_value_heads", None) or heads) * hd
    indexer = getattr(cfg, "indexer_head_dim", None) if "indexed_attention" in types else 0
    return n_attn * (row + (indexer or 0) * (getattr(cfg, "indexer_kv_heads", None) or 1)) \
        * itemsize


def test_bytes_equal_the_cache_tensors_and_the_formula(family, tmp_path):
    from evalkit.model_adapters.cache_state import roles_of
    from evalkit.model_adapters.models import load_model
    from evalkit.model_adapters.recurrent.formula import roles_at

    mt, folder, a = family
    bf16 = load_model(f"hf:{folder}", dtype="bf16", prefill_chunk=5)
    assert bf16.stepwise or not a.stepwise, mt  # bf16 rounding must not hide a dropped state
    ids = list(range(3, 3 + LONG))
    for adapter, lengths in ((a, (SHORT, LONG)), (bf16, (LONG,))):
        for n in lengths:
            s = adapter.prefill(ids[:n])
            parts = adapter.state_parts(s)
            assert parts.total == independent_bytes(s.cache, adapter.model) > 0, (mt, n)
            assert parts.total == sum(t.nbytes for t in adapter.state_tensors(s))
            if type(s.cache).__name__ == "ModuleState":
                assert parts.total == module_state_bytes(adapter.model, ids[:n]), (mt, n)
            assert roles_of(s.cache) == roles_at(adapter.model.config, n, adapter.dtype), (mt, n)


def test_fixed_part_flat_and_growth_is_the_attention_layers(family):
    mt, _, a = family
    ids = list(range(3, 3 + LONG))
    short, long = a.state_parts(a.prefill(ids[:SHORT])), a.state_parts(a.prefill(ids))
    assert short.fixed == long.fixed
    cfg = a.model.config.get_text_config(decoder=True)
    assert long.growing - short.growing == _attention_row_bytes(cfg, 4) * (LONG - SHORT), mt


def test_fork_equals_a_fresh_prefill(family):
    mt, _, a = family
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (40,), generator=g).tolist()
    ctx, question = ids[:23], ids[23:]
    shared = a.prefill(ctx)
    forked = a.extend(a.fork(shared), question)
    fresh = a.prefill(ctx + question)
    lp = torch.log_softmax(forked.logits, -1)
    assert (lp - torch.log_softmax(fresh.logits, -1)).abs().max().item() < 1e-5, mt
    assert a.generate(forked, 4) == a.generate(fresh, 4), mt
    # scoring a continuation through forks leaves the shared state as it was
    cont = ids[30:36]
    first = a.score(shared, [cont])
    assert a.score(shared, [cont]) == first
    whole = a.prefill(ctx)
    want = a.score(whole, [cont])
    assert first == pytest.approx(want, abs=1e-5)


def test_stepwise_feeding_is_found_by_the_probe(family):
    """Mamba's zero-start scan needs token-by-token feeding after a prefill; Mamba-2's chunked
    scan does not: the load-time probe tells them apart (the fork test checks the result)."""
    mt, _, a = family
    if mt in ("mamba", "falcon_mamba", "jamba"):
        assert a.stepwise
    if mt in ("mamba2", "bamba", "qwen3_next", "lfm2"):
        assert not a.stepwise


def test_memory_matched_baseline_gets_the_fixed_part(family):
    """`match_state_of=hf:DIR` works for every family: a hybrid's fixed part only, a conv-only
    family's conv tails; measured on a random model of the config, equal to the loaded one's."""
    from evalkit.model_adapters.state_match import matched_state_bytes

    mt, folder, a = family
    fixed = a.state_parts(a.prefill(list(range(3, 11)))).fixed
    assert matched_state_bytes(f"hf:{folder}") == fixed > 0, mt


def test_the_readme_family_table_is_generated_from_the_code():
    """The README's table: one Markdown row per family, its roles, kind, bytes at each length
    (the config formula's, on the same tiny model) and the probe's stepwise verdict."""
    from evalkit.model_adapters.recurrent.family_table import family_rows, markdown
    from evalkit.model_adapters.recurrent.formula import roles_at

    rows = family_rows((20, 40), only=("mamba", "mamba2", "minimax"))
    assert [r["family"] for r in rows] == ["mamba", "mamba2", "minimax"]
    by = {r["family"]: r for r in rows}
    assert by["mamba"]["stepwise"] and not by["mamba2"]["stepwise"] and by["minimax"]["stepwise"]
    assert by["minimax"]["roles"] == ["kv", "recurrent"] and by["minimax"]["kind"] == "hybrid"
    assert by["mamba"][20] == by["mamba"][40]  # a fixed state
    cfg = _config("minimax")
    assert by["minimax"][40] - by["minimax"][20] == (
        roles_at(cfg, 40, torch.float32)["kv"] - roles_at(cfg, 20, torch.float32)["kv"])
    table = markdown(rows, (20, 40)).splitlines()
    assert table[0] == ("| family | kind | state by role | bytes at 20 | bytes at 40 | "
                        "token by token after a prefill |")
    assert table[4].startswith("| minimax | hybrid | kv, recurrent | ") and table[4].endswith("| yes |")


def test_the_published_family_table_is_the_generators():
    """docs/families.md holds the generator's table: one row per family the installed
    transformers ships (a family added by the next release fails here until the page is
    regenerated), and its rows equal the generator's, checked on three families."""
    from pathlib import Path

    from evalkit.model_adapters.recurrent.discover import recurrent_families
    from evalkit.model_adapters.recurrent.family_table import family_rows, markdown

    page = (Path(__file__).resolve().parents[1] / "docs" / "families.md").read_text()
    block = page.split("<!-- families table: generated -->", 1)[1].split(
        "<!-- end families table -->", 1)[0]
    published = {line.split("|")[1].strip(): line.strip()
                 for line in block.splitlines()[3:] if line.startswith("| ")}
    assert sorted(published) == sorted(mt for mt, _ in recurrent_families()), \
        "regenerate docs/families.md: python -m evalkit.model_adapters.recurrent.family_table"
    only = ("mamba", "mamba2", "minimax")
    for line in markdown(family_rows((256, 1024), only=only), (256, 1024)).splitlines()[2:]:
        assert published[line.split("|")[1].strip()] == line.strip()
