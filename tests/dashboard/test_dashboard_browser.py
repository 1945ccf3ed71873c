"""The dashboard in a real browser: `k2bench dashboard` on a free port, headless Chromium loads every
page, waits for the Plotly chart, saves a screenshot and checks what is on screen.

Needs Debian's chromium and chromium-driver (.ci/run installs them); skips only when they are absent.
Selenium is pointed at /usr/bin/chromedriver, so Selenium Manager never tries to download a driver.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dashboard_fixture as fxdb
import pytest
from conftest import free_port

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
                       reason="needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)"),
]

# page -> text that must be on screen once it has rendered (chart titles and axis labels come from the SVG)
PAGES = {
    "Frontier": ["Throughput per GPU vs interactivity", "Interactivity (tok/s/user)", "Throughput (tok/s/GPU)",
                 "c32", "MI355X", "Download frontier as CSV"],
    # defaults: the most recently run configuration (bundled, whose last commit regressed)
    "History": ["Throughput (tok/s/GPU) history", "run start (UTC)", "change point (regression)",
                "1 regression(s) flagged"],
    "Compare": ["Frontiers: A: run #", "Per-concurrency deltas (B relative to A)",
                "Throughput of B at matched interactivity"],
    "Run detail": ["TTFT distribution", "Inter-token latency CDF", "Request timeline", "Engine flags",
                   "max_num_seqs", "GPU power per GPU", "SM clock per GPU", "Server KV-cache usage", "Server queue"],
}
# further views of a page, opened by URL: (screenshot name, page, extra query, labels on screen)
VIEWS = [
    ("frontier_energy", "Frontier", "&view=Tokens+per+joule+vs+interactivity",
     ["Tokens per joule vs interactivity", "Tokens per joule", "c32"]),
    ("frontier_cost", "Frontier", "&view=Cost+vs+interactivity",
     ["Cost per million tokens vs interactivity", "Cost per million tokens ($/Mtok)", "c32"]),
]


def wait_healthy(url: str, proc: subprocess.Popen, deadline_s: float = 90.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"dashboard exited with {proc.returncode}: {proc.stdout.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"dashboard at {url} not healthy after {deadline_s}s")


@pytest.fixture
def server(tmp_path):
    fx = fxdb.build(f"sqlite:///{tmp_path / 'browser.db'}")
    port = free_port()
    env = dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    proc = subprocess.Popen([sys.executable, "-m", "k2bench.harness.cli", "dashboard", "--db", fx.url,
                             "--port", str(port)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if proc.poll() is not None:
                break
            os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                continue
        proc.stdout.close()


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1100",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot_dir(tmp_path: Path) -> Path:
    out = Path(os.environ.get("K2BENCH_SCREENSHOTS", tmp_path / "screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_every_page_renders_its_chart(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    shots = screenshot_dir(tmp_path)
    visits = [(page.lower().replace(" ", "_"), page, "", labels) for page, labels in PAGES.items()] + VIEWS
    for name, page, query, labels in visits:
        browser.get(f"{server}/?page={page.replace(' ', '+')}{query}")
        wait = WebDriverWait(browser, 60)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".js-plotly-plot .main-svg")))
        # Streamlit fills the page in as the script runs: wait until every expected label is there
        wait.until(lambda d, labels=labels: all(t in d.find_element(By.TAG_NAME, "body").text
                                                or t in d.page_source for t in labels))
        time.sleep(0.5)  # let Plotly finish laying out text before the screenshot
        charts = browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")
        assert charts and all(c.size["width"] > 200 and c.size["height"] > 200 for c in charts), page
        assert browser.find_element(By.TAG_NAME, "h1").text.startswith(page)
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", charts[0])
        time.sleep(0.3)
        shot = shots / f"{name}.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        assert "Traceback" not in browser.page_source
        if name == "compare":  # default: the newest run (the regression) against its predecessor
            body = browser.find_element(By.TAG_NAME, "body").text
            assert re.search(r"-\d+\.\d% vs A", body), body[:2000]


def test_empty_database_page_shows_the_command(tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from k2bench.harness.store import Store

    url_db = f"sqlite:///{tmp_path / 'empty.db'}"
    Store.open(url_db).close()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "k2bench.harness.cli", "dashboard", "--db", url_db,
                             "--port", str(port)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        browser.get(f"http://127.0.0.1:{port}/")
        WebDriverWait(browser, 60).until(
            lambda d: "k2bench sweep --isl 8192 --osl 1024 --conc 4..128" in d.find_element(By.TAG_NAME, "body").text)
        assert "No benchmark runs in this database yet" in browser.find_element(By.TAG_NAME, "body").text
        assert not browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
