"""Offline by default (issue 41): `evalkit run` sets the Hugging Face libraries' offline
switches unless --allow-downloads asks otherwise, and the lm-eval pre-check looks for the
data set's exact configuration in the `datasets` cache, not for any non-empty cache folder
(a hub `.no_exist` marker, or another configuration, is not the data set)."""
import json
import os
import textwrap

import pytest

from evalkit.cli import main as evalkit_main
from runner_support import PLUGIN, TOY_TASKS, build_tokenizer

SWITCHES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
PROBE = """\
import json, os
from evalkit.model_adapters.models import MODELS, load_model, register_model

def load_env_probe(path=None, *, tokenizer, record):
    import huggingface_hub.constants as hub
    with open(record, "w") as f:
        json.dump({**{k: os.environ.get(k) for k in %r}, "hub": hub.HF_HUB_OFFLINE}, f)
    return load_model("oracle", tokenizer=tokenizer)

if "env-probe" not in MODELS:
    register_model("env-probe", kind="reference", state_kind="memory",
                   description="records the offline switches it loads under")(load_env_probe)
"""


@pytest.mark.parametrize("allow", [False, True])
def test_run_is_offline_unless_downloads_are_allowed(tmp_path, monkeypatch, allow):
    for k in SWITCHES:
        monkeypatch.delenv(k, raising=False)
    plugin = tmp_path / "env_probe.py"
    plugin.write_text(PROBE % (SWITCHES,))
    record = tmp_path / "env.json"
    tok = build_tokenizer(tmp_path / "tok")
    args = ["run", "--models", "env-probe", "--model-args",
            f"tokenizer={tok},record={record}", "--plugins", str(plugin), "--plugins",
            str(PLUGIN), "--include", str(TOY_TASKS), "--tasks", "toy_recall", "--lengths",
            "64", "--depths", "0.5", "--loads", "1", "--samples", "1", "--output", str(tmp_path / "run"),
            "--no-progress"] + (["--allow-downloads"] if allow else [])
    import huggingface_hub.constants as hub
    before = hub.HF_HUB_OFFLINE
    assert evalkit_main(args) == 0
    seen = json.loads(record.read_text())
    if allow:
        assert [seen[k] for k in SWITCHES] == [None] * 3
    else:
        assert [seen[k] for k in SWITCHES] == ["1"] * 3 and seen["hub"] is True
    # the caller's process is as it was (evalkit_main runs in this one)
    assert all(k not in os.environ for k in SWITCHES) and hub.HF_HUB_OFFLINE == before


def test_offline_check_wants_the_exact_configuration(tmp_path, monkeypatch):
    import datasets.config
    import huggingface_hub.constants as hub

    from evalkit.lm_eval.run import LmEvalTasks

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "t.yaml").write_text(textwrap.dedent("""\
        task: t_exact
        dataset_path: SomeOrg/SomeData
        dataset_name: main
        test_split: test
        output_type: generate_until
        doc_to_text: "{{input}}"
        doc_to_target: "{{outputs}}"
        """))
    check = lambda: LmEvalTasks(["t_exact"], include_path=tasks, include_defaults=False)

    def prepared(config: str) -> None:
        folder = tmp_path / "datasets" / "SomeOrg___some_data" / config / "0.0.0" / "abc123"
        folder.mkdir(parents=True)
        (folder / "dataset_info.json").write_text(json.dumps({"config_name": config}))

    # what a failed offline lookup leaves in the hub cache: a marker that the file is absent
    marker = tmp_path / "hub" / "datasets--SomeOrg--SomeData" / ".no_exist" / "abc" / "README.md"
    marker.parent.mkdir(parents=True)
    marker.write_text("")
    with pytest.raises(ValueError, match=r"t_exact needs the hub data set SomeOrg/SomeData"):
        check()
    prepared("other")  # another configuration of it: still not this task's data
    with pytest.raises(ValueError, match=r"SomeOrg___some_data\)"):
        check()
    prepared("main")
    assert check().units == ["t_exact"]
