"""The board's held-out perplexity table, read from the shipped twins' cards."""
from __future__ import annotations

import json
import shutil

import pytest

from evalkit.leaderboard.perplexity import perplexity_table
from evalkit.leaderboard.readme import perplexity_section
from evalkit.model_adapters import linearized

GDN, SWA = "smollm2-135m-gdn-w64-s4", "smollm2-135m-swa-w64-s4"


def copy_card(spec: str, to) -> None:
    (to / spec).mkdir()
    shutil.copy2(linearized.TWINS_DIR / spec / "train_log.json", to / spec / "train_log.json")


def card(spec: str) -> dict:
    return json.loads((linearized.TWINS_DIR / spec / "train_log.json").read_text())["perplexity"]


def test_each_row_reads_its_own_model_from_the_cards():
    ids = {"smollm2-135m": {"spec": "smollm2-135m", "options": {}},
           GDN: {"spec": GDN, "options": {}},
           f"{GDN}-state-off": {"spec": GDN, "options": {"state_off": True}},
           SWA: {"spec": SWA, "options": {}},
           "oracle": {"spec": "oracle", "options": {}},         # no card: no row
           "gdn-bf16": {"spec": GDN, "options": {"dtype": "bf16"}}}  # not what the card measured
    t = perplexity_table(ids)
    got = {(r.model_label, r.length): r for r in t.itertuples()}
    gdn, swa = card(GDN), card(SWA)
    assert {m for m, _ in got} == {"smollm2-135m", GDN, f"{GDN}-state-off", SWA}
    for length in (1024, 2048, 4096):
        k = str(length)
        assert got[(GDN, length)].ppl == gdn[k]["twin"]["ppl"]
        assert got[(f"{GDN}-state-off", length)].ppl == gdn[k]["state_off"]["ppl"]
        assert got[(SWA, length)].ppl == swa[k]["twin"]["ppl"]
        parent = got[("smollm2-135m", length)]
        assert parent.ppl == gdn[k]["parent"]["ppl"] and parent.x_parent == 1.0
        assert got[(GDN, length)].x_parent == pytest.approx(gdn[k]["twin"]["ppl"] / parent.ppl)
        assert got[(GDN, length)].documents == len(gdn[k]["documents"])
    # the twin with a state is better than itself without it, and worse than its parent
    assert 1.0 < got[(GDN, 2048)].x_parent < got[(f"{GDN}-state-off", 2048)].x_parent
    text = perplexity_section(t)
    assert f"| {GDN}-state-off |" in text and "(1.00x)" in text and "Not measured by these runs" in text


def test_a_parent_measured_differently_by_two_cards_is_refused(tmp_path, monkeypatch):
    for spec in (GDN, SWA):
        copy_card(spec, tmp_path)
    log = tmp_path / SWA / "train_log.json"
    doc = json.loads(log.read_text())
    doc["perplexity"]["2048"]["parent"]["ppl"] *= 1.01
    log.write_text(json.dumps(doc))
    monkeypatch.setattr(linearized, "TWINS_DIR", tmp_path)
    with pytest.raises(ValueError, match=r"measured their parent smollm2-135m differently at 2048"):
        perplexity_table({GDN: {"spec": GDN}, SWA: {"spec": SWA}, "smollm2-135m": {}})


def test_a_card_without_its_fields_is_named(tmp_path, monkeypatch):
    copy_card(GDN, tmp_path)
    log = tmp_path / GDN / "train_log.json"
    doc = json.loads(log.read_text())
    del doc["perplexity"]["1024"]["twin"]
    log.write_text(json.dumps(doc))
    monkeypatch.setattr(linearized, "TWINS_DIR", tmp_path)
    with pytest.raises(ValueError, match=rf"{GDN}/train_log.json: field 'perplexity.1024'"):
        perplexity_table({GDN: {"spec": GDN}})
