"""configs/standard-cpu.yaml: its grid, resolved without any checkpoint (the family's may not
be trained yet): >= 30 probes per cell, one grid per task shared by every model (paired), the
capacity family, its twin, the memory-matched window and the references, GLAs out to 8K."""
from collections import Counter
from pathlib import Path

from evalkit.model_adapters.embedded import TINY_MODELS
from evalkit.runner.suite import load_suite, resolve

ROOT = Path(__file__).resolve().parents[1]


def test_standard_cpu_grid_is_paired_with_30_probes_per_cell():
    suite = load_suite(ROOT / "configs" / "standard-cpu.yaml")
    r = resolve(suite, "configs/standard-cpu.yaml")
    names = {m.name: m for m in r.models}
    family = [n for n, (kind, text) in TINY_MODELS.items() if "capacity family" in text]
    assert set(family) <= set(names) and {"oracle", "forgetful"} <= set(names)
    matched = [m for m in r.models if m.options.get("match_state_of")]
    assert [(m.spec, m.options["match_state_of"]) for m in matched] == [
        ("recall-softmax-cap", "recall-gla-140k")]
    for task in r.tasks:
        cells = Counter((p.length, p.depth, p.load) for p in task.points)
        assert min(cells.values()) >= 30, (task.name, cells)
        assert len({p.seed for p in task.points}) == len(task.points)  # distinct probes
    by_name = {t.name: t for t in r.tasks}
    assert max(by_name["needle"].lengths) >= 8192
    mqar = by_name["mqar_words"]
    assert max(mqar.loads) >= 256 and min(mqar.loads) == 1 and max(mqar.lengths) >= 8192


def test_standard_cpu_capacity_length_is_inside_the_family_training_range():
    """The capacity figure's length must be one the softmax twin was trained on, or its line
    would be flagged over-length."""
    from evalkit.cli.train import load_config

    cfg = load_config(str(ROOT / "configs" / "train_capacity.yaml"))
    r = resolve(load_suite(ROOT / "configs" / "standard-cpu.yaml"))
    mqar = next(t for t in r.tasks if t.name == "mqar_words")
    assert min(mqar.lengths) + 128 <= cfg.seq_len
    assert min(mqar.lengths) <= max(max(st.lengths) for st in cfg.stages)  # trained on
    assert [m.name for m in cfg.models] == [n for n, (_, text) in TINY_MODELS.items()
                                            if "capacity family" in text]
