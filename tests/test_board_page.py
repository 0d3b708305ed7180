"""The board as a page (issue 23): `evalkit publish` writes index.html, opened here in headless
Chromium (Debian's chromium + chromium-driver, driven by selenium) from file:// with the
network off. Boards come from small real runs (runner_support): the toy task with oracle and
forgetful, a one-model one-cell run, and a copy with one cell flagged only.

Without chromium the browser tests skip, naming what is missing, except under CI=true
(`make setup-browser` installs it there), where its absence fails them.
"""
from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest

from evalkit.leaderboard import publish
from evalkit.cell_stats import wilson
from browser import drawn, errors, open_offline, screenshot, table_column
from helpers import restamp
from runner_support import build_tokenizer, run, small_run, suite_dict

def csv_rows(board: Path) -> list[dict]:
    with open(board / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


# -- boards ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def a_run(tmp_path_factory) -> Path:
    return small_run(tmp_path_factory.mktemp("pagerun"))


@pytest.fixture(scope="module")
def board(a_run, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("pageboard") / "leaderboard"
    publish([a_run], dst)
    return dst


# -- without a browser ------------------------------------------------------------------------

def test_page_is_self_contained_and_deterministic(a_run, board, tmp_path):
    html = (board / "index.html").read_text(encoding="utf-8")
    assert "index.html" in json.loads((board / "results.json").read_text())["files"]
    # Nothing to fetch: no external script, stylesheet, image or frame.
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=\"(https?:)?//", html)
    assert "cdn." not in html.lower().split("<script>")[0]
    data = json.loads(re.search(r'<script type="application/json" id="board-data">(.*?)'
                                r"</script>", html, re.S).group(1).replace("<\\/", "</"))
    assert len(data["rows"]) == len(csv_rows(board))
    assert "NaN" not in json.dumps(data)  # atomic.dumps refuses it; null stands for nothing
    # The How-to-read text is the README's, rendered: one source.
    assert "Effective length" in html and "How to read" in (board / "README.md").read_text()
    again = tmp_path / "again"
    publish([a_run], again)
    assert (again / "index.html").read_bytes() == (board / "index.html").read_bytes()


def test_wilson_interval():
    lo, hi = wilson(1.0, 2)
    assert 0.3 < lo < 0.4 and hi == 1.0  # 2/2: [0.34, 1], not the point [1, 1]
    lo, hi = wilson(0.5, 100)
    assert lo == pytest.approx(0.404, abs=1e-3) and hi == pytest.approx(0.596, abs=1e-3)
    assert wilson(float("nan"), 3) == (None, None) and wilson(0.5, 0) == (None, None)
    # the interval holds p exactly at the edges (rounding gave lo = 1e-17 > 0 at p = 0, and a
    # negative error bar in the distance plot)
    for n in range(1, 200):
        assert wilson(0.0, n)[0] == 0.0 and wilson(1.0, n)[1] == 1.0


# -- in the browser -----------------------------------------------------------------------------

def test_page_in_headless_chromium(board, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    log = open_offline(browser, board / "index.html")
    rows = csv_rows(board)
    # One table row per results.csv row.
    assert len(table_column(browser, "model_label")) == len(rows)

    # Sorting by a column reorders the rows (ascending, then descending).
    before = table_column(browser, "target_length")
    browser.find_element(By.CSS_SELECTOR, '#results-table th[data-key="target_length"]').click()
    asc = [int(x) for x in table_column(browser, "target_length")]
    assert asc == sorted(asc) and [str(x) for x in asc] != before
    browser.find_element(By.CSS_SELECTOR, '#results-table th[data-key="target_length"]').click()
    desc = [int(x) for x in table_column(browser, "target_length")]
    assert desc == sorted(asc, reverse=True)

    # A filter narrows it to that model's rows.
    Select(browser.find_element(By.ID, "filter-model_label")).select_by_value("oracle")
    shown = table_column(browser, "model_label")
    assert shown == ["oracle"] * sum(r["model_label"] == "oracle" for r in rows)
    assert 0 < len(shown) < len(rows)
    Select(browser.find_element(By.ID, "filter-depth")).select_by_value("1")  # JSON 1.0 reads as 1
    assert len(table_column(browser, "model_label")) == sum(
        r["model_label"] == "oracle" and float(r["depth"]) == 1.0 for r in rows)

    # A recall cell's hover names its n and 95 % interval.
    title = browser.find_element(By.CSS_SELECTOR, "#results-table td.recall").get_attribute(
        "title")
    assert re.search(r"n = \d+, 95 % interval \[\d\.\d\d, \d\.\d\d\]", title), title

    # A heatmap and the state chart render (Plotly's SVG with marks in it).
    assert drawn(browser, ".heatmap svg.main-svg") > 0
    assert drawn(browser, ".heatmap .hm image") > 0
    assert drawn(browser, ".state-chart svg.main-svg") > 0
    assert drawn(browser, ".state-chart .scatterlayer .point") > 0
    # Hovering a point shows its model, value, n and interval (drawn from the page's data).
    hover = browser.execute_script("""
        const div = document.querySelector('.state-chart');
        Plotly.Fx.hover(div, [{curveNumber: 0, pointNumber: 0}]);
        return Array.from(div.querySelectorAll('.hoverlayer .hovertext'))
                    .map(e => e.textContent).join(' ');""")
    assert re.search(r"forgetful.*recall \d\.\d{3}, n = \d+, 95 % interval", hover), hover
    # Choosing another model redraws the heatmaps.
    Select(browser.find_element(By.ID, "heatmap-model")).select_by_value("forgetful")
    assert drawn(browser, ".heatmap .hm image") > 0

    # The gap table marks intervals that exclude zero; provenance is one click away.
    assert drawn(browser, "#gap-table tbody tr") > 0
    prov = browser.find_element(By.ID, "provenance-details")
    assert not prov.get_attribute("open")
    prov.find_element(By.TAG_NAME, "summary").click()
    run = json.loads((board / "results.json").read_text())
    assert next(iter(run["models"].values()))["hash"] in prov.text

    # Nothing fetched (every resource is inline), no console error.
    assert browser.execute_script(
        "return performance.getEntriesByType('resource').length") == 0
    log += browser.get_log("browser")
    assert errors(log) == []
    shot = screenshot(browser, tmp_path / "board-page.png")
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


def test_one_model_one_task_one_cell(browser, tmp_path):
    cfg = suite_dict(build_tokenizer(tmp_path / "tok"), models=("oracle",), lengths=[64],
                     depths=[0.0], loads=[1], samples=2)
    assert run(cfg, tmp_path / "run").failed == 0
    publish([tmp_path / "run"], tmp_path / "lb")
    log = open_offline(browser, tmp_path / "lb" / "index.html")
    assert len(table_column(browser, "model_label")) == 1
    assert drawn(browser, ".heatmap .hm image") > 0
    assert drawn(browser, ".state-chart .scatterlayer .point") > 0
    assert errors(log + browser.get_log("browser")) == []
    screenshot(browser, tmp_path / "one-cell.png")


def test_flagged_only_cell(a_run, browser, tmp_path):
    """Every sample of one cell flagged (not evaluated): a row with n = 0 and null recall."""
    dst = tmp_path / "run"
    shutil.copytree(a_run, dst, ignore=shutil.ignore_patterns("cache"))
    lines = (dst / "samples.jsonl").read_text().splitlines()
    out = []
    for line in lines:
        s = json.loads(line)
        if s["model"] == "forgetful" and s["target_length"] == 128 and s["depth"] == 1.0:
            s.update(flag="over_length", scores={}, prediction=None, state_bytes=0)
        out.append(json.dumps(s))
    (dst / "samples.jsonl").write_text("\n".join(out) + "\n")
    restamp(dst)
    publish([dst], tmp_path / "lb")
    rows = csv_rows(tmp_path / "lb")
    flagged = [r for r in rows if r["n"] == "0"]
    assert flagged and all(int(r["n_flagged"]) > 0 for r in flagged)
    log = open_offline(browser, tmp_path / "lb" / "index.html")
    assert len(table_column(browser, "model_label")) == len(rows)
    assert "—" in table_column(browser, "recall")
    assert drawn(browser, ".heatmap .hm image") > 0
    assert errors(log + browser.get_log("browser")) == []
    screenshot(browser, tmp_path / "flagged.png")


def test_page_opens_on_recall_vs_state_with_references_hidden(browser, tmp_path):
    """Beside a language model the page opens on recall against state bytes, the reference
    models (declared kind="reference") hidden in every view until the switch shows them."""
    from evalkit.runner import resolve, run_suite
    from evalkit.runner.suite import validate
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from helpers import TINY_TOKENIZER

    suite = {"name": "refs", "models": [{"name": "oracle", "options": {"tokenizer": str(TINY_TOKENIZER)}},
                                        "recall-gla-tiny"],
             "tasks": [{"name": "needle", "lengths": [96], "depths": [0.5], "samples": 2}]}
    out = run_suite(resolve(validate(suite, "test"), "test"), output=tmp_path / "run", progress=False)
    assert out.failed == 0
    publish([tmp_path / "run"], tmp_path / "lb")
    log = open_offline(browser, tmp_path / "lb" / "index.html")
    # The first section after the header is the recall-vs-state chart.
    first = browser.execute_script("return document.querySelector('main > section').id")
    assert first == "state"
    assert not browser.find_element(By.ID, "show-references").is_selected()
    assert set(table_column(browser, "model_label")) == {"recall-gla-tiny"}
    legend = lambda: browser.execute_script(  # noqa: E731
        "return Array.from(document.querySelectorAll('.state-chart .legendtext'))"
        ".map(e => e.textContent)")
    assert legend() == ["recall-gla-tiny (recurrent)"]
    assert Select(browser.find_element(By.ID, "heatmap-model")).first_selected_option.text == \
        "recall-gla-tiny"
    # One click shows them everywhere; the heatmap keeps the model it showed.
    browser.find_element(By.ID, "show-references").click()
    assert set(table_column(browser, "model_label")) == {"oracle", "recall-gla-tiny"}
    assert sorted(legend()) == ["oracle (memory)", "recall-gla-tiny (recurrent)"]
    options = [o.text for o in Select(browser.find_element(By.ID, "heatmap-model")).options]
    assert options == ["oracle", "recall-gla-tiny"]
    assert Select(browser.find_element(By.ID, "heatmap-model")).first_selected_option.text == \
        "recall-gla-tiny"
    assert errors(log + browser.get_log("browser")) == []
    screenshot(browser, tmp_path / "references.png")
