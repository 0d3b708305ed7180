"""Task mqar (Zoology's MQAR as probes): the generator's layout and gap law, the symbol
tokenizer (one token per symbol, reproducible build), the metric on a worked example, and
probes through the real runner (one streamed prefill per probe, exact lengths)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from evalkit import scoring
from evalkit.cell_stats import wilson
from evalkit.cli import main
from evalkit.leaderboard.load import load_run
from evalkit.leaderboard.recall_state import (BASED_TEST_MIX, PublishedError, board_figure,
                                              board_table, comparison_markdown,
                                              load_published, mqar_points, published_comparison,
                                              published_keys, recall_state_plot)
from evalkit.render import probe_length, render
from evalkit.result import SampleResult
from evalkit.runner import aggregate
from evalkit.runner.plan import Request, build_plan
from evalkit.runner.suite import SuiteError, load_suite
from evalkit.tasks import mqar
from evalkit.taskspec import discover, generate_probes, grid
from evalkit.tokenization import encode, load_tokenizer

from helpers import REPO

TOKENIZER = REPO / "model_adapters" / "mqar" / "tokenizer"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TOKENIZER)


# -- the generator -----------------------------------------------------------------------------

def test_layout_matches_a_hand_built_sequence():
    """Every example is: the pairs, then the filler with each key once at an even offset; the
    target at a query is its key's value; built here by hand from the drawn keys/values/gaps."""
    V, L, n = 16, 16, 2
    ids, targets = mqar.mqar_batch(200, L, n, seed=7, vocab_size=V)
    for row, tgt in zip(ids, targets):
        keys, values = row[0:2 * n:2], row[1:2 * n:2]
        assert len(set(keys)) == n and all(1 <= k < V // 2 for k in keys)
        assert len(set(values)) == n and all(V // 2 <= v < V for v in values)
        pos = np.flatnonzero(tgt != mqar.IGNORE)
        assert len(pos) == n and all((p - 2 * n) % 2 == 0 and p >= 2 * n for p in pos)
        hand = [int(x) for kv in zip(keys, values) for x in kv] + [mqar.FILLER] * (L - 2 * n)
        hand_t = [mqar.IGNORE] * L
        for p in pos:
            j = list(keys).index(row[p])
            hand[p], hand_t[p] = int(keys[j]), int(values[j])
        assert row.tolist() == hand and tgt.tolist() == hand_t
    # deterministic: a pure function of the seed, row i the same in any batch size
    again, _ = mqar.mqar_batch(200, L, n, seed=7, vocab_size=V)
    assert (again == ids).all()


def test_worked_example_streams_as_documented():
    ids = np.array([3, 12, 6, 9, 0, 0, 6, 0, 0, 0, 0, 0, 3, 0, 0, 0])
    targets = np.full(16, mqar.IGNORE)
    targets[6], targets[12] = 9, 12
    segments, qs = mqar.stream(ids, targets, 2, vocab_size=16)
    assert segments == ["k3 v12 k6 v9 _ _ k6", "_ _ _ _ _ k3", "_ _ _"]
    assert [(q.gold, q.after_segment, q.fact_token, q.distance) for q in qs] == [
        (("v9",), 1, 2, 4), (("v12",), 2, 0, 12)]
    assert all(q.text == q.answer_prefix == "" and q.max_new_tokens == 1 for q in qs)


def test_gap_distribution_follows_the_power_law():
    """load 1: the query's slot g has P(g) = gap_probabilities(S). 20,000 draws over S = 30
    slots (the rarest expects ~150): a chi-square test rejects at p < 1e-3 only when the
    law is wrong (fixed seed, so the test is not flaky; a wrong exponent gives p ~ 0)."""
    L, n, N = 62, 1, 20_000
    _, targets = mqar.mqar_batch(N, L, n, seed=3, vocab_size=64)  # gaps do not depend on V
    pos = np.argmax(targets != mqar.IGNORE, axis=1)
    slots = (L - 2 * n) // 2
    counts = np.bincount((pos - 2 * n) // 2, minlength=slots)
    expected = N * mqar.gap_probabilities(slots)
    assert expected.min() > 100
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    # the uniform law (what a missing power would give) is rejected
    assert stats.chisquare(counts, np.full(slots, N / slots)).pvalue < 1e-6


# -- the tokenizer -----------------------------------------------------------------------------

def test_one_token_per_symbol_for_every_symbol(tok):
    words = mqar.symbols()
    assert len(words) == len(tok) == mqar.VOCAB_SIZE == 8192
    assert words[0] == "_" and words[1] == "k1" and words[4095] == "k4095"
    assert words[4096] == "v4096" and words[8191] == "v8191"
    assert encode(tok, " ".join(words)) == list(range(8192))
    assert all(encode(tok, w) == [i] for i, w in enumerate(words))
    assert tok.decode(list(range(8192))) == " ".join(words)
    assert tok("k1 v4096", add_special_tokens=True)["input_ids"] == [1, 4096]  # no BOS/EOS


def test_an_unknown_word_is_an_error_not_an_unk(tok):
    with pytest.raises(Exception, match="Missing \\[UNK\\]"):
        encode(tok, "k1 hello")
    with pytest.raises(Exception):
        encode(tok, "k8192")  # an id beyond the vocabulary is not a symbol


def test_tokenizer_build_is_byte_identical():
    out = subprocess.run([sys.executable, "-m", "evalkit.model_adapters.build_mqar_tokenizer",
                          "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# -- probes ------------------------------------------------------------------------------------

def test_probes_are_exact_and_stream_once(tok):
    spec = discover().get("mqar")
    points = grid(spec, lengths=[128], loads=[8], samples=5)
    probes = list(generate_probes(spec, tok, points))  # runs evalkit.probe_checks too
    items = []
    for p in probes:
        r = render(p, tok)
        stream_ids = [t for piece in r.context for t in piece]
        ids, _ = mqar.mqar_batch(1, 128, 8, seed=p.meta.seed)
        assert stream_ids == ids[0].tolist()                  # the generator's ids, exactly
        assert p.meta.actual_length == probe_length(p, tok) == 128 and p.meta.tolerance == 0
        assert all(q == () for q in r.questions)              # a question adds no token
        pairs = dict(zip(ids[0][0:16:2].tolist(), ids[0][1:16:2].tolist()))
        for qi, q in enumerate(p.questions):
            prompt = r.prompt(qi, q.after_segment)  # the stream up to and including its key
            assert prompt == stream_ids[:len(prompt)] and 1 <= prompt[-1] < 4096
            assert q.gold == (f"v{pairs[prompt[-1]]}",) and q.kind == "mqar"
            assert len(prompt) == q.fact_token + q.distance + 1
            items.append(Request(p, qi, r))
    plan = build_plan(items)
    # one unit (prefill) per probe; everything after streams through the same state, and
    # each token up to the last query is fed once (the tail after it is never needed)
    assert len(plan.units) == len(probes)
    assert plan.tokens_prefilled == sum(
        max(r.prefix_length(q.after_segment) for q in p.questions)
        for p, r in ((p, render(p, tok)) for p in probes))


def test_other_tokenizers_are_refused_naming_the_tokenizer(tiny_tokenizer):
    spec = discover().get("mqar")
    with pytest.raises(ValueError, match=r"^tokenizer=\w{12}: .*model_adapters/mqar/tokenizer"):
        spec.generator(spec.params, task="mqar", version="1", tokenizer=tiny_tokenizer,
                       length=64, depth=0.5, load=4, seed=1)


def test_bad_shapes_name_the_field(tok):
    spec = discover().get("mqar")
    with pytest.raises(ValueError, match=r"^length=64 cannot hold load=17"):
        spec.generator(spec.params, task="mqar", version="1", tokenizer=tok,
                       length=64, depth=0.5, load=17, seed=1)


# -- the metric --------------------------------------------------------------------------------

def test_metric_on_a_worked_example():
    """Two probes: 1 of 2 queries right, 3 of 3 right. Zoology: (0.5 + 1.0) / 2 = 0.75 (the
    mean over queries would be 4/5 = 0.8)."""
    preds = np.array([[0, 9, 0, 5], [7, 7, 8, 0]])
    targets = np.array([[-100, 9, -100, 6], [7, 7, 8, -100]])
    assert mqar.accuracy(preds, targets) == 0.75
    m = scoring.get(scoring.MQAR_METRIC)
    assert m.per_probe and m.applies_to("mqar") and not m.applies_to("recall")
    assert scoring.score_sample("v9", ["v9"], question_kind="mqar")[m.name] == 1.0
    assert m.name not in scoring.score_sample("v9", ["v9"], question_kind="recall")
    right = {"a": [1, 0], "b": [1, 1, 1]}
    samples = [SampleResult(model="m", model_hash="h", task="mqar", task_version="1",
                            probe_id=pid, probe_hash=pid, question=i, kind="mqar",
                            target_length=64, prompt_tokens=1, prompt_chars=1, depth=0.5,
                            load=4, distance=1, seed=0, prediction="v", gold=["v"],
                            scores={m.name: float(x)})
               for pid, xs in right.items() for i, x in enumerate(xs)]
    [row] = aggregate.rows(samples, {})
    summary = row["metrics"][m.name]
    assert summary["mean"] == 0.75 and summary["n_probes"] == 2 and summary["n"] == 5
    lo, hi = summary["lo"], summary["hi"]  # a bootstrap over the two probes, not Wilson
    assert 0.5 <= lo <= 0.75 <= hi <= 1.0 and (lo, hi) != wilson(0.75, 2)
    assert aggregate.rows(samples, {}) == [row]  # the bootstrap is seeded by the values


# -- end to end --------------------------------------------------------------------------------

def _suite(tmp_path, models: str):
    cfg = tmp_path / "mqar-test.yaml"
    cfg.write_text(f"""name: mqar-test
models: {models}
tasks:
  - name: mqar
    cells: [{{length: 64, load: 4, samples: 3}}, {{length: 256, load: 64, samples: 2}}]
seed: 0
""")
    return cfg


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    """oracle and a forgetful copier (64 memory entries) through `evalkit run` on two cells."""
    tmp = tmp_path_factory.mktemp("mqar-e2e")
    cfg = _suite(tmp, f"[{{name: oracle, options: {{tokenizer: {TOKENIZER}}}, published: attention}}, "
                      f"{{name: forgetful, options: {{tokenizer: {TOKENIZER}, capacity: 64}}, "
                      f"published: gla-d64}}]")
    out = tmp / "run"
    assert main(["run", "--config", str(cfg), "--output", str(out), "--no-progress"]) == 0
    return out


def test_oracle_recalls_everything_and_forgetful_less_through_evalkit_run(e2e):
    res = json.loads((e2e / "results.json").read_text())
    acc = {(r["model"], r["load"]): r["metrics"][scoring.MQAR_METRIC] for r in res["rows"]}
    assert acc[("oracle", 4)]["mean"] == acc[("oracle", 64)]["mean"] == 1.0
    assert acc[("oracle", 64)]["n"] == 128 and acc[("oracle", 64)]["n_probes"] == 2
    assert acc[("forgetful", 64)]["mean"] < 0.5, acc
    # one prefill per probe, streamed: tokens fed = per probe, its last query's position + 1
    samples = [json.loads(x) for x in (e2e / "samples.jsonl").read_text().splitlines()]
    last = {}
    for s in samples:
        last[(s["model"], s["probe_id"])] = max(last.get((s["model"], s["probe_id"]), 0),
                                                 s["prompt_tokens"])
    fed = {p["model"]: p["tokens_prefilled"] for p in res["prefill"]["by_model_task"]}
    assert fed["oracle"] == sum(v for (m, _), v in last.items() if m == "oracle")
    assert {r["state_kind"] for r in res["rows"]} == {"memory"}
    assert res["models"]["forgetful"]["published"] == "gla-d64"


def test_board_cells_are_results_json_cells(e2e):
    """One aggregation of a cell (evalkit.cell_stats): the board's rows carry results.json's
    mean and interval to the bit, per probe for mqar (a bootstrap over probes, not questions)."""
    from evalkit.cell_stats import mean_ci
    from evalkit.leaderboard.board import build

    res = json.loads((e2e / "results.json").read_text())
    board = build([load_run(e2e)])
    m = scoring.MQAR_METRIC
    rows = board.rows.set_index(["model", "load"])
    for r in res["rows"]:
        row = rows.loc[(r["model"], r["load"])]
        ours = [None if np.isnan(v) else v for v in (row[m], row[f"{m}_lo"], row[f"{m}_hi"])]
        assert ours == [r["metrics"][m][k] for k in ("mean", "lo", "hi")]
        assert row[["recall", "recall_lo", "recall_hi"]].tolist() == \
            row[[m, f"{m}_lo", f"{m}_hi"]].tolist()
    # a cell whose probes differ: the board's interval is over probe means, not questions
    from evalkit.leaderboard.tables import aggregate

    s = board.samples[(board.samples["model"] == "forgetful") & (board.samples["load"] == 64)]
    s = s.assign(**{f"score.{m}": [float(i < 3 or h == s["probe_hash"].iat[-1])
                                   for i, h in enumerate(s["probe_hash"])]})
    probes = scoring.probe_means(list(zip(s["probe_hash"], s[f"score.{m}"])))
    assert len(probes) == 2 and probes[0] < probes[1] == 1.0
    row = aggregate(s, ["model"], [m]).iloc[0]
    assert (row[m], row[f"{m}_lo"], row[f"{m}_hi"]) == mean_ci(probes, over_probes=True)
    assert row[f"{m}_lo"] != mean_ci(s[f"score.{m}"].tolist(), over_probes=False)[1]


# -- the board: accuracy vs state bytes next to the published points ---------------------------

PUBLISHED = REPO / "configs" / "published" / "based_mqar.yaml"


def test_published_points_load_and_bad_files_name_the_field(tmp_path):
    pub = load_published(PUBLISHED)
    assert [p.key for p in pub.points] == ["gla-d64", "gla-d128", "gla-d256", "attention"]
    assert pub.get("gla-d128").accuracy == 0.77 and pub.get("gla-d256").state_bytes == 68600
    assert [tuple(c) for c in pub.test_mix] == list(BASED_TEST_MIX)
    bad = tmp_path / "bad.yaml"
    bad.write_text(PUBLISHED.read_text().replace("accuracy: 0.77", "accuracy: 1.7"))
    with pytest.raises(PublishedError, match=r"bad.yaml: field points.1.accuracy: .*1.7"):
        load_published(bad)
    bad.write_text(PUBLISHED.read_text().replace('source: "2402.18668"', 'source: "2402.1"', 1))
    with pytest.raises(PublishedError, match=r"points.0.source"):
        load_published(bad)


def test_plot_and_table_from_a_real_run(e2e, tmp_path):
    run = load_run(e2e)
    cells = [(64, 4), (256, 64)]
    pts = mqar_points(run.samples, cells=cells)
    assert list(pts["model"]) == ["forgetful", "oracle"]
    oracle = pts.set_index("model").loc["oracle"]
    assert oracle["accuracy"] == oracle["lo"] == oracle["hi"] == 1.0 and oracle["n_probes"] == 5
    f = pts.set_index("model").loc["forgetful"]
    assert f["lo"] <= f["accuracy"] <= f["hi"] and f["accuracy"] < 1.0
    assert f["per_cell"]["64/4"] == pytest.approx(  # equal weight per cell
        2 * f["accuracy"] - f["per_cell"]["256/64"])
    assert mqar_points(run.samples).empty  # the full Based mix was not run: no point
    pub = load_published(PUBLISHED)
    keys = published_keys(run.models)
    assert keys == {"oracle": "attention", "forgetful": "gla-d64"}
    table = published_comparison(pts, pub, keys)
    row = table.set_index("model").loc["forgetful"]
    assert row["published_accuracy"] == 0.53
    assert row["difference"] == pytest.approx(f["accuracy"] - 0.53)
    md = comparison_markdown(table)
    assert "| forgetful | gla-d64 |" in md and "≈ 0.53" in md and "arXiv 2402.18668" in md
    with pytest.raises(ValueError, match="'gla-d512' is not in based-mqar"):
        published_comparison(pts, pub, {"oracle": "gla-d512"})
    png = recall_state_plot(pts, pub, tmp_path / "plots" / "mqar.png")
    assert png is not None and png.stat().st_size > 10_000
    assert recall_state_plot(pts.iloc[0:0], pub, tmp_path / "none.png") is None
    # the board's README hook: no complete Based mix here, so a note instead of the table
    assert board_figure(run.samples, tmp_path / "b.png") is None
    assert "No model here names a published point" in board_table(run.samples, run.models)


def test_suite_cells_are_checked(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("models: [oracle]\ntasks:\n  - {name: mqar, lengths: [64], "
                   "cells: [{length: 64, load: 4}]}\n")
    with pytest.raises(SuiteError, match="either cells or lengths/loads"):
        load_suite(cfg)
    suite = load_suite(REPO / "configs" / "mqar.yaml")
    [task] = suite.tasks
    assert [(c.length, c.load, c.samples) for c in task.cells] == [
        (L, n, -(-1000 // n)) for L, n in [(64, 4), (64, 8), (64, 16), (128, 32), (256, 64),
                                           (512, 128), (1024, 256), (2048, 512), (4096, 1024)]]


@pytest.mark.parametrize("mixer", ["gla", "attn", "swa"])
def test_a_twin_checkpoint_reads_each_query_where_it_occurs(tmp_path, mixer):
    """The lead's twins load through the gla adapter with this tokenizer: a random (peaked)
    two-layer twin (gated convolution, then GLA / attention / a 16-token window; vocabulary
    8,192) answers every query through `evalkit run`'s streamed, batched prefill exactly as it
    answers the query's own prefix prefilled from scratch."""
    import shutil

    from evalkit.model_adapters.gla.config import GLAConfig
    from evalkit.model_adapters.models import load_model

    from helpers import save_peaked_gla

    folder = tmp_path / f"twin-{mixer}"
    folder.mkdir()
    for f in TOKENIZER.iterdir():
        shutil.copy(f, folder / f.name)
    attn = None if mixer == "gla" else {"layers": [1], "num_heads": 1,
                                         "window_size": 16 if mixer == "swa" else None}
    cfg = GLAConfig(attn=attn, vocab_size=8192, hidden_size=32, num_heads=2,
                    num_hidden_layers=2, use_short_conv=False,
                    gated_conv={"layers": [0], "kernel_size": 3}, use_mlp=False,
                    tie_word_embeddings=True, pad_token_id=0, bos_token_id=None,
                    eos_token_id=None)
    save_peaked_gla(cfg, folder, 10)
    spec = f"gla:{folder}"
    cfg_file = tmp_path / "suite.yaml"
    cfg_file.write_text(f"name: t\nmodels: [{{name: g, spec: '{spec}', options: "
                        f"{{chunk_size: 16}}}}]\nbatch_size: 4\ntasks:\n  - {{name: mqar, cells: "
                        f"[{{length: 64, load: 4, samples: 2}}, {{length: 128, load: 16, samples: 1}}]}}\n")
    out = tmp_path / "run"
    assert main(["run", "--config", str(cfg_file), "--output", str(out), "--no-progress"]) == 0
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 4 + 16 and all(s["error"] is None for s in samples)
    model = load_model(spec, chunk_size=16)
    words = set(mqar.symbols())
    for s in samples:
        assert s["prediction"] in words  # one symbol, one token
        ids, _ = mqar.mqar_batch(1, s["target_length"], s["load"], seed=s["seed"])
        prefix = ids[0][:s["prompt_tokens"]].tolist()
        alone = model.generate(model.prefill(prefix), 1)
        assert s["prediction"] == alone, s
