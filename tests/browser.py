"""Headless Chromium for the board-page tests (Debian's chromium + chromium-driver, driven by
selenium), and what they read off a page. The `browser` fixture (conftest.py) skips without
chromium, naming what is missing, except under CI=true (`make setup-browser` installs it
there), where its absence fails the test."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

CHROMIUM = ("chromium", "chromium-browser")
DRIVER = "chromedriver"


def _binaries() -> tuple[str | None, str | None]:
    browser = next((p for p in map(shutil.which, CHROMIUM) if p), None)
    return browser, shutil.which(DRIVER)


def start_browser():
    """Yields a headless Chromium driver and quits it after (the `browser` fixture)."""
    browser, driver_path = _binaries()
    if not (browser and driver_path):
        missing = ", ".join(n for n, p in (("chromium", browser), ("chromedriver", driver_path))
                            if not p)
        why = (f"{missing} not found: install Debian's chromium and chromium-driver "
               f"(make setup-browser)")
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--disable-extensions", "--no-first-run"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver binary is given, so selenium-manager never looks for (or downloads) one.
    drv = webdriver.Chrome(options=opts, service=Service(executable_path=driver_path))
    try:
        yield drv
    finally:
        drv.quit()


def open_offline(drv, page: Path) -> list[dict]:
    """Load the page with the network emulated off; the console entries of this load."""
    drv.get_log("browser")  # drop what an earlier page logged
    drv.execute_cdp_cmd("Network.enable", {})
    drv.execute_cdp_cmd("Network.emulateNetworkConditions",
                        {"offline": True, "latency": 0, "downloadThroughput": -1,
                         "uploadThroughput": -1})
    drv.get(page.resolve().as_uri())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the page script draws synchronously on load
        if drv.execute_script("return document.readyState") == "complete" and \
                drv.execute_script("return document.querySelectorAll("
                                   "'#results-table tbody tr').length") > 0:
            break
        time.sleep(0.1)
    return drv.get_log("browser")


def errors(log: list[dict]) -> list[str]:
    return [e["message"] for e in log if e.get("level") == "SEVERE"]


def table_column(drv, key: str) -> list[str]:
    idx = drv.execute_script(
        "return Array.from(document.querySelectorAll('#results-table thead th'))"
        ".findIndex(th => th.dataset.key === arguments[0]);", key)
    assert idx >= 0, key
    return drv.execute_script(
        "return Array.from(document.querySelectorAll('#results-table tbody tr'))"
        ".map(tr => tr.children[arguments[0]].textContent);", idx)


def drawn(drv, selector: str) -> int:
    """How many marks Plotly drew under `selector` (heatmap images, scatter points)."""
    return drv.execute_script("return document.querySelectorAll(arguments[0]).length;", selector)


def screenshot(drv, path: Path) -> Path:
    drv.execute_script("window.scrollTo(0, 0)")
    height = drv.execute_script("return document.documentElement.scrollHeight")
    drv.set_window_size(1400, min(int(height) + 40, 12000))
    drv.save_screenshot(str(path))
    drv.set_window_size(1400, 1000)
    return path
