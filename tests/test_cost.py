"""`evalkit cost` through the CLI's main: measured figures on a tiny GLA and a tiny Llama config,
and the refusals (sizes out of range, a bad dtype, a context that would not fit in memory)."""
from __future__ import annotations

import json
import math

import pytest

from evalkit.model_adapters import cost, cost_model
from evalkit.cli import main

GLA = {"model_type": "gla", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
       "num_heads": 2, "expand_k": 0.5, "expand_v": 1.0, "use_short_conv": True, "conv_size": 4}
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 256,
         "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096}
KEYS = ("context", "prefill_tokens_per_s", "prefill_fraction_of_matmul_limit",
        "decode_ms_per_token", "decode_ratio", "peak_memory_bytes", "state_bytes_measured",
        "state_bytes_formula")


@pytest.fixture
def configs(tmp_path):
    out = {}
    for name, cfg in (("gla", GLA), ("llama", LLAMA)):
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(cfg))
        out[name] = str(p)
    return out


def run_json(capsys, *argv, dtype: str = "fp32") -> list[dict]:
    # fp32 unless a test asks: on a CPU without native bf16 (AVX2 only) the bf16 matmul limit
    # alone (a [2048, 3072] @ [3072, 3072] product) takes about 40 s
    assert main(["cost", *argv, "--json", "--threads", "1", "--dtype", dtype]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def finite(row: dict) -> None:
    for k, v in row.items():
        if isinstance(v, float):
            assert math.isfinite(v), (k, v)


def test_gla_cost(configs, capsys):
    rows = run_json(capsys, configs["gla"], "--contexts", "256,64", "--decode", "3")
    assert [r["context"] for r in rows] == [64, 256]  # ascending
    for r in rows:
        assert all(k in r for k in KEYS)
        finite(r)
        assert r["prefill_tokens_per_s"] > 0 and 0 < r["prefill_fraction_of_matmul_limit"] < 2
        assert r["decode_ms_per_token"] > 0 and r["decode_steps"] == 3
        assert r["peak_memory_bytes"] >= 0
        # the state is fixed: measured from the held tensors, equal to the config's formula
        assert r["state_bytes_measured"] == r["state_bytes_formula"]
        assert r["state_parts_measured"] == r["state_parts_formula"]
        assert r["state_parts_measured"]["kind"] == "recurrent"
    assert rows[0]["decode_ratio"] == 1.0
    assert rows[0]["state_bytes_measured"] == rows[1]["state_bytes_measured"]
    # 2 layers x (2 heads x 16 x 32 + 4 x (32 + 32 + 64)) fp32 values
    assert rows[0]["state_bytes_measured"] == 2 * (2 * 16 * 32 + 4 * 128) * 4
    assert rows[0]["state_bytes_at_model_dtype"] == rows[0]["state_bytes_measured"]  # fp32 run


def test_llama_cost_kv_grows(configs, capsys, monkeypatch):
    """The one bf16 run (the CLI's default dtype): the KV cache counted at 2 bytes a value.
    Its matmul limit is a 256-row product (an eighth of the real one's time), as the fraction
    is not checked here."""
    monkeypatch.setattr(cost, "MATMUL_SHAPE", (256, 3072, 3072))
    rows = run_json(capsys, configs["llama"], "--contexts", "32,128", "--decode", "2", dtype="bf16")
    for r in rows:
        assert all(k in r for k in KEYS)
        finite(r)
        assert r["state_parts_measured"]["kind"] == "kv"
        # 2 layers x K and V x 2 kv heads x 16 dims x T tokens, bf16
        assert r["state_bytes_measured"] == r["state_bytes_formula"] == 2 * 2 * 2 * 16 * r["context"] * 2
    assert rows[1]["state_bytes_measured"] == 4 * rows[0]["state_bytes_measured"]


def test_each_prefill_only_where_its_figures_are_asked(configs):
    """The benchmark's split: a prefill-only context is timed once, a decode-only context gets
    only the peak-memory prefill and the decode steps; both measure the state."""
    cm = cost_model.build_cost_model(configs["llama"], "fp32")
    res = cost.measure_cost(cm, [32, 64, 128], decode=2, prefill_contexts=[32, 128],
                            decode_contexts=[64, 128], threads=1, progress=False)
    rows = {r["context"]: r for r in res["rows"]}
    assert rows[32]["prefill_tokens_per_s"] > 0 and rows[32]["peak_memory_bytes"] is None
    assert rows[32]["decode_ms_per_token"] is None and rows[32]["decode_steps"] == 0
    assert rows[64]["prefill_tokens_per_s"] is None
    assert rows[64]["prefill_fraction_of_matmul_limit"] is None
    assert rows[64]["peak_memory_bytes"] >= 0 and rows[64]["decode_ms_per_token"] > 0
    assert rows[128]["prefill_fraction_of_matmul_limit"] > 0 and rows[128]["decode_steps"] == 2
    assert rows[64]["decode_ratio"] == 1.0  # ratios to the shortest decode context
    for r in rows.values():
        assert r["state_bytes_measured"] == r["state_bytes_formula"] == 2 * 2 * 2 * 16 * r["context"] * 4
    with pytest.raises(cost_model.CostError, match=r"contexts \[64\] are in neither"):
        cost.measure_cost(cm, [32, 64], prefill_contexts=[32], decode_contexts=[32], progress=False)
    with pytest.raises(cost_model.CostError, match=r"\[256\] are not among the contexts"):
        cost.measure_cost(cm, [32], decode_contexts=[32, 256], progress=False)


def test_table_output(configs, capsys):
    assert main(["cost", configs["gla"], "--contexts", "32", "--decode", "1", "--threads", "1",
                 "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "matmul limit" in out and "prefill tok/s" in out and "recurrent" in out


@pytest.mark.parametrize("argv, message", [
    (["--contexts", "0"], "--contexts: every context must be between 1 and 1,048,576"),
    (["--contexts", "2000000"], "between 1 and 1,048,576 tokens, got 2,000,000"),
    (["--contexts", "64,64"], "repeated context"),
    (["--contexts", ",".join(str(i) for i in range(1, 40))], "at most 16 context lengths"),
    (["--decode", "-1"], "--decode must be between 0 and 4,096"),
    (["--decode", "100000"], "--decode must be between 0 and 4,096"),
    (["--threads", "0"], "--threads must be between 1 and"),
    (["--dtype", "int8"], "--dtype must be one of fp32, bf16"),
    (["--dtype", "fp16"], "--dtype must be one of fp32, bf16"),
    (["--max-memory", "lots"], "--max-memory: expected a size"),
    (["--contexts", "4096", "--max-memory", "1M"], "context 4,096 would need about"),
])
def test_refusals(configs, capsys, argv, message):
    assert main(["cost", configs["llama"], *argv]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err


def test_over_memory_refused_before_allocating(configs, capsys, monkeypatch):
    """An absurd context against the machine's real available memory: refused with the need,
    before any weight is materialised."""
    built = []
    monkeypatch.setattr(cost_model.CostModel, "materialise", lambda self, seed=0: built.append(1))
    wide = dict(LLAMA, hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
                intermediate_size=128, vocab_size=256)
    path = configs["llama"].replace("llama.json", "wide.json")
    with open(path, "w") as f:
        json.dump(wide, f)
    assert main(["cost", path, "--contexts", "1048576"]) == 2
    err = capsys.readouterr().err
    assert "context 1,048,576 would need about" in err and "KV cache" in err
    assert "available (90% of" in err
    assert built == []


def test_unknown_and_configless_models(capsys):
    assert main(["cost", "no-such-model"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["cost", "smollm2-135m"]) == 2
    assert "has no config without a checkpoint" in capsys.readouterr().err


def test_laplace_formula_without_allocating():
    """The registered 3B config resolves, and its figures come from the meta model alone."""
    cm = cost_model.build_cost_model("laplace", "bf16")
    assert all(p.is_meta for p in cm.model.parameters())
    assert cm.parameters() == 3_029_243_904
    # held in fp32: twice the brief's bf16 figure of 29,491,200 B
    assert cm.shape.state_formula(8192).total == 2 * 29_491_200
    plan = cost.check_memory(cm, [2048], cost.SEGMENT, max_memory=1 << 40)
    assert plan["need_bytes"][2048] > cm.weight_bytes()
