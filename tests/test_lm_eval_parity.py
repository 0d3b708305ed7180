"""lm-eval's own niah_single_1 (RULER) at 1024 tokens on smollm2-135m: evalkit's model through
the bridge and lm-eval's own `hf` model on the converted checkpoint agree sample for sample.

Offline: niah_single_1 builds its data locally (the "repeat" haystack, sized with the model's
tokenizer). Importing lm-eval's RULER module calls nltk.download("punkt_tab") when NLTK's
punkt_tab is absent, although only the essay haystacks use it: evalkit refuses that download
(evalkit.lm_eval.ruler_nltk), and for lm-eval's own `hf` path an empty punkt_tab folder on
nltk's search path stops the attempt; a socket guard proves nothing reaches the network.
"""
import json
import os
import socket
from pathlib import Path

import pytest

# Samples per run: each is a 1K-token prefill plus a short greedy answer, through both models
# (~6 s of 2-core CPU per sample and model). EVALKIT_PARITY_N raises it for a fuller check.
N = int(os.environ.get("EVALKIT_PARITY_N", "3"))
SEED = 0
META = {"max_seq_lengths": [1024]}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def no_network(tmp_path_factory):
    import nltk

    stub = tmp_path_factory.mktemp("nltk_data")
    (stub / "tokenizers" / "punkt_tab").mkdir(parents=True)
    nltk.data.path.insert(0, str(stub))
    attempts = []
    real_connect, real_create = socket.socket.connect, socket.create_connection

    def refuse(*args, **kwargs):
        attempts.append(args[1:] or args)
        raise OSError("network disabled in this test")

    socket.socket.connect, socket.create_connection = refuse, refuse
    try:
        yield attempts
    finally:
        socket.socket.connect, socket.create_connection = real_connect, real_create
        nltk.data.path.remove(str(stub))


def ruler_dir() -> str:
    import lm_eval.tasks

    # lm-eval's own RULER folder; indexing only it skips the ~10 s full task index.
    return str(Path(lm_eval.tasks.__file__).parent / "ruler")


@pytest.fixture(scope="module")
def converted():
    from evalkit.model_adapters.embedded import convert_gguf_once

    return convert_gguf_once()


@pytest.fixture(scope="module")
def through_evalkit(no_network, converted, tmp_path_factory):
    from evalkit.lm_eval.run import LmEvalTasks, run_lm_eval_tasks

    out = tmp_path_factory.mktemp("lm_eval_parity")
    tasks = LmEvalTasks(["niah_single_1"], include_path=ruler_dir(), include_defaults=False)
    res = run_lm_eval_tasks(["smollm2-135m"], tasks, output_dir=out, limit=N,
                            max_seq_lengths=META["max_seq_lengths"],
                            model_options={"smollm2-135m": {"dtype": "fp32", "device": "cpu"}},
                            seed=SEED)
    assert res["failed"] == 0 and res["problems"] == [], res["problems"]
    res = res["models"]["smollm2-135m"]
    path = Path(res["evalkit_files"]["samples"]["niah_single_1"])
    samples = [json.loads(x) for x in path.read_text().splitlines()]
    saved = json.loads(Path(res["evalkit_files"]["results"]).read_text())
    return res, saved, samples


@pytest.fixture(scope="module")
def through_hf(no_network, converted):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=ruler_dir(), include_defaults=False,
                     metadata={**META, "tokenizer": str(converted)})
    res = simple_evaluate(model="hf", model_args={"pretrained": str(converted), "dtype": "float32"},
                          device="cpu", batch_size=1, tasks=["niah_single_1"], task_manager=tm,
                          limit=N, log_samples=True, bootstrap_iters=0, random_seed=SEED,
                          numpy_random_seed=SEED, torch_random_seed=SEED,
                          fewshot_random_seed=SEED)
    return res, res["samples"]["niah_single_1"]


def test_same_samples_same_answers_same_scores(through_evalkit, through_hf, no_network):
    ek_res, ek_saved, ek = through_evalkit
    hf_res, hf = through_hf
    assert len(ek) == len(hf) == min(N, 500)
    ek, hf = sorted(ek, key=lambda s: s["doc_id"]), sorted(hf, key=lambda s: s["doc_id"])
    for a, b in zip(ek, hf):
        # the same document, prompt and generation settings...
        assert a["doc"]["input"] == b["doc"]["input"] and a["doc"]["outputs"] == b["doc"]["outputs"]
        assert a["doc"]["max_length"] == 1024
        assert list(a["arguments"][0]) == list(b["arguments"][0])
        # ...the same greedy answer and the same per-sample score
        assert a["filtered_resps"] == b["filtered_resps"], (a["doc_id"], a["filtered_resps"],
                                                           b["filtered_resps"])
        assert a["1024"] == b["1024"]
    score = ek_res["results"]["niah_single_1"]["1024,none"]
    assert score == hf_res["results"]["niah_single_1"]["1024,none"]
    assert ek_saved["results"]["niah_single_1"]["1024,none"] == score
    print(f"\nniah_single_1@1024, smollm2-135m, {N} samples: evalkit {score} = hf "
          f"{hf_res['results']['niah_single_1']['1024,none']}; answers "
          f"{[s['filtered_resps'][0] for s in ek]}")
    assert no_network == [], f"network was attempted: {no_network}"
