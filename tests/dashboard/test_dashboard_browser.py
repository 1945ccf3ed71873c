"""The dashboard in a real browser: `k2bench dashboard` on a free port, headless Chromium loads every
page, waits for the Plotly chart, saves a screenshot and checks what is on screen.

Needs Debian's chromium and chromium-driver (.ci/run installs them); skips only when they are absent.
Selenium is pointed at /usr/bin/chromedriver, so Selenium Manager never tries to download a driver.

With K2BENCH_WRITE_SCREENSHOTS=1 the screenshots go to docs/img/ (the documentation shows them),
as palette PNGs small enough to commit; otherwise to the test's temporary folder.
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
REPO = Path(__file__).resolve().parents[2]
PAGES = {
    # the published MI355X mark is for another model and workload: hidden, and the page says why
    "Frontier": ["Throughput per GPU vs interactivity", "Interactivity (tok/s/user)", "Throughput (tok/s/GPU)",
                 "c32", "bundled 1.0", "vllm 1.0", "Published reference hidden", "Download frontier as CSV"],
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
    # where a user's own sweeps go (results/k2bench.db of the folder the dashboard runs in), so the
    # sidebar of the screenshots shows that rather than a temporary path
    (tmp_path / "results").mkdir()
    fxdb.build(f"sqlite:///{tmp_path / 'results' / 'k2bench.db'}")
    port = free_port()
    env = dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    proc = subprocess.Popen([sys.executable, "-m", "k2bench.harness.cli", "dashboard", "--db", "sqlite:///results/k2bench.db",
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
    out = REPO / "docs" / "img" if os.environ.get("K2BENCH_WRITE_SCREENSHOTS") == "1" else tmp_path / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    return out


def save_screenshot(browser, path: Path) -> None:
    """The browser's PNG reduced to a 256-colour palette: the pages are flat colours and text, so
    it reads the same at a fraction of the size."""
    from PIL import Image

    raw = path.with_suffix(".raw.png")
    assert browser.save_screenshot(str(raw))
    with Image.open(raw) as img:
        img.convert("RGB").quantize(colors=256).save(path, optimize=True)
    raw.unlink()


def svg_texts(browser, selector: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.get_attribute("textContent") for e in browser.find_elements(By.CSS_SELECTOR, selector)]


def tick_values(browser, axis: str) -> list[float]:
    """The numbers on a chart's axis ticks as drawn (Plotly writes 1.5k, −200 with a minus sign)."""
    out = []
    for text in svg_texts(browser, f".js-plotly-plot .{axis}tick text"):
        t = text.replace("\u2212", "-").replace(",", "")
        scale = 1000.0 if t.endswith("k") else 1.0
        out.append(float(t.rstrip("k")) * scale)
    return out


def drawn_lines(browser) -> int:
    """How many scatter traces of the first chart are drawn as a line with at least one segment."""
    return sum(1 for d in (e.get_attribute("d") for e in browser.find_elements(
        "css selector", ".js-plotly-plot .scatterlayer .js-line")) if d and "L" in d)


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
        # the chart's foot at the window's foot: the controls and tables above it stay in the picture
        browser.execute_script("arguments[0].scrollIntoView({block: 'end'})", charts[0])
        time.sleep(0.3)
        shot = shots / f"{name}.png"
        save_screenshot(browser, shot)
        assert 10_000 < shot.stat().st_size < 200_000, (shot, shot.stat().st_size)
        assert "Traceback" not in browser.page_source
        if name == "compare":  # default: the newest run (the regression) against its predecessor
            body = browser.find_element(By.TAG_NAME, "body").text
            assert re.search(r"-\d+\.\d% vs A", body), body[:2000]
        if page == "Frontier":
            # the axes fit the user's points: no tick out at the published 5,370 tok/s/GPU
            top = max(fxdb.expected_tput(e, c, len(fxdb.COMMITS) - 1) for e in fxdb.ENGINES for c in fxdb.LEVELS)
            assert max(tick_values(browser, "y")) < 1.5 * top
            legend = svg_texts(browser, ".js-plotly-plot .legendtext")
            assert sorted(legend) == ["bundled 1.0", "vllm 1.0"], legend
            assert drawn_lines(browser) == 2  # one frontier line per configuration
        if page == "History":  # the default axis starts at zero, so a 20% drop looks like 20%
            assert min(tick_values(browser, "y")) == 0


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
        body = browser.find_element(By.TAG_NAME, "body").text
        assert "No benchmark runs in this database yet" in body
        assert "k2bench sweep --isl 512 --osl 64 --conc 4..16" in body and "on a GPU node" in body
        assert not browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()


def test_frontier_e2e_view_draws_its_frontier_lines(server, browser):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{server}/?page=Frontier")
    # Plotly redraws the chart after the click: an element read mid-redraw is stale, so look again
    wait = WebDriverWait(browser, 60, ignored_exceptions=(StaleElementReferenceException,))
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".js-plotly-plot .main-svg")))
    option = wait.until(ec.element_to_be_clickable(
        (By.XPATH, "//label[.//p[normalize-space()='Throughput vs E2E latency']]")))
    option.click()
    wait.until(lambda d: "Throughput per GPU vs E2E latency" in svg_texts(d, ".js-plotly-plot .gtitle"))
    wait.until(lambda d: drawn_lines(d) == 2)  # each configuration's frontier, as the caption says
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "lines join each configuration's Pareto-optimal levels" in body


def test_run_detail_for_a_run_it_cannot_show_says_so(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{server}/?page=Run+detail&run=999")
    WebDriverWait(browser, 60).until(
        lambda d: "There is no run 999 in this database" in d.find_element(By.TAG_NAME, "body").text)
    time.sleep(1.0)  # the page has finished: nothing else arrives
    assert not browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")
    assert "Engine flags" not in browser.find_element(By.TAG_NAME, "body").text
