"""Headless Chromium for the HTML report's tests (Debian's chromium + chromedriver, driven by
selenium) with the network blocked, and the checks every opened page passes.

    browser = pytest.fixture(scope="module")(chromium)   # a test module's fixture: one driver per module
    logs = open_page(driver, Path("report.html"))       # loaded, drawn, no URL, no console error
    assert "section-attribution" in sections(driver)

Missing chromium, chromedriver or selenium FAILS the tests that use it (CI installs them: .ci/run).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def chromium() -> Iterator:
    """A headless Chromium whose requests cannot leave the machine; quit when the generator closes."""
    missing = [p for p in (CHROMIUM, DRIVER) if not Path(p).is_file() and not shutil.which(Path(p).name)]
    if missing:
        pytest.fail(f"the report's browser test needs {', '.join(missing)}: apt-get install chromium chromium-driver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("the report's browser test needs selenium: pip install 'hookrun[dev]'")
    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
                "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND"):  # no request can leave
        options.add_argument(arg)
    options.binary_location = CHROMIUM if Path(CHROMIUM).is_file() else shutil.which("chromium")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})  # performance: every request
    driver = webdriver.Chrome(service=Service(DRIVER if Path(DRIVER).is_file() else shutil.which("chromedriver")), options=options)
    yield driver
    driver.quit()


def open_page(driver, path: Path) -> list[dict]:
    """Load a report; its console entries. The page must have drawn itself and reference no URL."""
    driver.get_log("browser")  # (drop what earlier pages logged)
    driver.get_log("performance")
    driver.get(path.resolve().as_uri())
    for _ in range(100):
        if driver.execute_script("return document.body.dataset.ready") == "1":
            break
        time.sleep(0.1)
    assert driver.execute_script("return document.body.dataset.ready") == "1", "the page's script never finished"
    urls = driver.execute_script("return Array.from(document.querySelectorAll('[src],[href]')).map(e => e.getAttribute('src') || e.getAttribute('href'))")
    assert not [u for u in urls if re.match(r"^(https?:)?//", u or "")], urls
    from hookrun.analysis.report.page import plotly_js

    ours = path.read_text().replace(plotly_js(), "")  # (plotly.js's own source names its web site in strings)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", ours), "the file names a URL to load"
    events = [json.loads(e["message"])["message"] for e in driver.get_log("performance")]
    requested = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
    assert requested and all(u.startswith(("file:", "data:", "about:", "blob:")) for u in requested), requested
    logs = driver.get_log("browser")
    assert not [e for e in logs if e["level"] == "SEVERE"], logs
    return logs


def sections(driver) -> list[str]:
    return driver.execute_script("return Array.from(document.querySelectorAll('main > section')).map(s => s.id)")
